package core

import (
	"encoding/hex"
	"fmt"
)

// LeaseID identifies a lease: 128 random bits chosen by the proposer, so that knowing a
// lock's name never lets anyone release it.
type LeaseID [16]byte

// String returns the id as 32 lowercase hex characters, the form used on the wire.
func (id LeaseID) String() string { return hex.EncodeToString(id[:]) }

// IsZero reports whether id is the zero id, which is never a valid lease.
func (id LeaseID) IsZero() bool { return id == LeaseID{} }

// MarshalText implements encoding.TextMarshaler.
func (id LeaseID) MarshalText() ([]byte, error) { return []byte(id.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (id *LeaseID) UnmarshalText(b []byte) error {
	v, err := ParseLeaseID(string(b))
	if err != nil {
		return err
	}
	*id = v
	return nil
}

// ParseLeaseID parses the 32-hex-character form of a lease id. It returns an error
// wrapping ErrInvalid for anything else, including the all-zero id.
func ParseLeaseID(s string) (LeaseID, error) {
	var id LeaseID
	if len(s) != 2*len(id) {
		return id, fmt.Errorf("%w: lease id must be %d hex characters, got %d", ErrInvalid, 2*len(id), len(s))
	}
	if _, err := hex.Decode(id[:], []byte(s)); err != nil {
		return LeaseID{}, fmt.Errorf("%w: lease id is not hex", ErrInvalid)
	}
	if id.IsZero() {
		return id, fmt.Errorf("%w: lease id is zero", ErrInvalid)
	}
	return id, nil
}

// Class is the declared purpose of a lock. See the package leasehold.v1 LockClass.
type Class uint8

// The lock classes. The numbers match leasehold.v1.LockClass.
const (
	ClassUnspecified Class = 0
	Efficiency       Class = 1
	Correctness      Class = 2
)

func (c Class) String() string {
	switch c {
	case Efficiency:
		return "efficiency"
	case Correctness:
		return "correctness"
	default:
		return "unspecified"
	}
}

// Holder describes who holds or waits for a lock. It is informative only.
type Holder struct {
	Host string `json:"host,omitempty"`
	PID  uint32 `json:"pid,omitempty"`
	Note string `json:"note,omitempty"`
}

// EndReason says why a lease ended.
type EndReason uint8

// Why a lease ended.
const (
	EndUnknown EndReason = 0
	EndExpired EndReason = 1
	EndRevoked EndReason = 2
	// EndDisconnected: a lease granted with release on disconnect (G7) was revoked
	// because the node holding its client's connection saw that connection end.
	EndDisconnected EndReason = 3
)

func (r EndReason) String() string {
	switch r {
	case EndExpired:
		return "expired"
	case EndRevoked:
		return "revoked"
	case EndDisconnected:
		return "disconnected"
	default:
		return "unknown"
	}
}

// Op names a command.
type Op uint8

// The commands of the replicated log. Values are part of the log format: never reuse or
// renumber them.
const (
	// OpGrant creates lease Lease with TTL TTLMillis.
	OpGrant Op = 1
	// OpRevoke ends lease Lease on the client's request.
	OpRevoke Op = 2
	// OpExpire ends lease Lease because the leader's countdown ran out. For a lease that
	// no longer exists it returns ErrLeaseNotFound and changes nothing, so a late or
	// repeated expiry is harmless.
	OpExpire Op = 3
	// OpAcquire takes lock Name (Class must be Correctness) for Lease, queueing if Wait,
	// in Mode (a semaphore with Limit); or, with Names instead of Name, the lock set of
	// those names, under one token.
	OpAcquire Op = 4
	// OpRelease gives up lock Name held by Lease under Token (every lock of the lock
	// set Name is one of).
	OpRelease Op = 5
	// OpCancelWait takes Lease out of Name's queue (its wait ran out or was cancelled),
	// or out of every queue of the lock set Name is one of.
	OpCancelWait Op = 6
	// OpForceRelease releases Name whoever holds it and consumes a token. The holder's
	// lease keeps the lock among its lost locks (LostLock) until it ends.
	OpForceRelease Op = 7
	// OpEndDelay ends Name's lock-delay and grants the next waiter.
	OpEndDelay Op = 8
	// OpReserve reserves Count tokens from the sequence for the leader's efficiency
	// locks. The result's Token is the first reserved token.
	OpReserve Op = 9
	// OpPut writes Value to Key, fenced by (Name, Token) when Token is set (with
	// RequireHolder: only by the current holder), compared to Version when CheckVersion.
	OpPut Op = 10
	// OpDelete deletes Key with the same checks as OpPut.
	OpDelete Op = 11
	// OpSetMember records that node Node serves its API at Addr and its fast lane at
	// FastLane ("" when it has none).
	OpSetMember Op = 12
	// OpRemoveMember forgets node Node.
	OpRemoveMember Op = 13
	// OpSetClusterID names the cluster: ClusterID, 32 lowercase hex characters. The
	// first one applied stays; a later one with another ID fails with ErrClusterID
	// and changes nothing, and one with the same ID changes nothing.
	OpSetClusterID Op = 14
	// OpDisconnect ends lease Lease as OpRevoke does, for release on disconnect (G7):
	// the node holding the client's connection saw it end. The lease is remembered as
	// ended by EndDisconnected.
	OpDisconnect Op = 30
)

func (o Op) String() string {
	names := [...]string{"", "grant", "revoke", "expire", "acquire", "release", "cancel-wait", "force-release", "end-delay", "reserve", "put", "delete", "set-member", "remove-member", "set-cluster-id"}
	if int(o) < len(names) && o != 0 {
		return names[o]
	}
	if n, ok := keyOpNames[o]; ok {
		return n
	}
	if n, ok := groupOpNames[o]; ok {
		return n
	}
	return fmt.Sprintf("op(%d)", o)
}

// Command is one entry of the replicated log. Only the fields its Op names are used.
type Command struct {
	Op          Op      `json:"op"`
	Lease       LeaseID `json:"lease,omitzero"`
	TTLMillis   int64   `json:"ttl,omitempty"`
	Name        string  `json:"name,omitempty"`
	Class       Class   `json:"class,omitempty"`
	Holder      Holder  `json:"holder,omitzero"`
	Wait        bool    `json:"wait,omitempty"`
	DelayMillis int64   `json:"delay,omitempty"`
	Token       uint64  `json:"token,omitempty"`
	Count       uint64  `json:"count,omitempty"`
	Reason      string  `json:"reason,omitempty"`
	// KV writes.
	Key           string `json:"key,omitempty"`
	Value         []byte `json:"value,omitempty"`
	Version       uint64 `json:"version,omitempty"`
	CheckVersion  bool   `json:"checkVersion,omitempty"`
	RequireHolder bool   `json:"requireHolder,omitempty"`
	// Membership.
	Node      string `json:"node,omitempty"`
	Addr      string `json:"addr,omitempty"`
	FastLane  string `json:"fastLane,omitempty"`
	ClusterID string `json:"clusterId,omitempty"`
	// Lock modes and lock sets (OpAcquire).
	Mode  Mode     `json:"mode,omitempty"`
	Limit uint32   `json:"limit,omitempty"`
	Names []string `json:"names,omitempty"`
	// WallMillis is the proposer's wall clock when it proposed the command (Unix
	// milliseconds; the replication layer sets it on the commands that can start or end
	// a hold). Display only: the ledger's times. Nothing in the state machine depends on
	// it.
	WallMillis int64 `json:"wall,omitempty"`
	// Groups (groups.go): the member, the partition, the member's weight, the group's
	// drain deadline. A group's partition count is Count, an epoch is Token.
	Member      string `json:"member,omitempty"`
	Partition   uint32 `json:"partition,omitempty"`
	Weight      uint32 `json:"weight,omitempty"`
	DrainMillis int64  `json:"drain,omitempty"`
}

// acquireArgs returns the arguments of an OpAcquire.
func (c *Command) acquireArgs() AcquireArgs {
	return AcquireArgs{Lease: c.Lease, Name: c.Name, Names: c.Names, Class: c.Class, Mode: c.Mode, Limit: c.Limit,
		Holder: c.Holder, Wait: c.Wait, DelayMillis: c.DelayMillis}
}

// EffectKind names an effect.
type EffectKind uint8

// Effects reported by Apply.
const (
	// EffectGranted: Lease was granted lock Name with Token (a waiter reached the head
	// of the queue, or a fresh acquire).
	EffectGranted EffectKind = 1
	// EffectLeaseEnded: Lease ended for Reason; its holds and waits are gone.
	EffectLeaseEnded EffectKind = 2
	// EffectDelayed: lock Name entered a lock-delay of DelayMillis; the leader must
	// propose OpEndDelay when it has passed.
	EffectDelayed EffectKind = 3
	// EffectRevokedHold: Lease lost lock Name (Token) to a force release.
	EffectRevokedHold EffectKind = 4
	// EffectWaitEnded: Lease stopped waiting for Name without a grant because its lease
	// ended.
	EffectWaitEnded EffectKind = 5
	// EffectLeaseGranted: Lease was created with TTLMillis; the leader starts its
	// countdown.
	EffectLeaseGranted EffectKind = 6
)

// Effect is something a command caused that someone outside the state machine must act
// on: wake a waiting request, schedule a lock-delay, tell a holder.
type Effect struct {
	Kind        EffectKind
	Lease       LeaseID
	Name        string
	Token       uint64
	Reason      EndReason
	DelayMillis int64
	TTLMillis   int64
	Note        string
	Partition   uint32 // of a group's partition effects
	// Value and Holder are the new leader's, for EffectElected.
	Value  []byte
	Holder Holder
}

// Result is the outcome of applying one command.
type Result struct {
	// Token is the granted token (OpAcquire, OpCancelWait when already granted), the
	// consumed fence token (OpForceRelease), the first reserved token (OpReserve), the
	// key's new version (OpPut), or 1 when OpDelete removed a live key.
	Token uint64
	// Queued is true when OpAcquire queued the lease instead of granting.
	Queued bool
	// Again is true when OpAcquire (OpCampaign) found the lease already holding or
	// leading (Token) or waiting (Queued) as it asked: an earlier acquire (campaign)
	// made that grant or place, not this one.
	Again bool
	// Released is the token of the hold that OpForceRelease took away (0 if none).
	Released uint64
	// HolderToken and Holder describe the current holder when OpAcquire failed with
	// ErrLockHeld or queued.
	HolderToken uint64
	Holder      Holder
	// Blocker is, for an OpAcquire of a lock set that failed with ErrLockHeld or
	// queued, the first of its locks that could not be granted (HolderToken and Holder
	// describe its holder). Empty for a single lock.
	Blocker string
	// Effects, in deterministic order.
	Effects []Effect
	// Key is where an idempotency key stands after OpBegin or OpComplete.
	Key *KeyView
	// Err is the command's error; the state is unchanged when it is not nil.
	Err error
}

// Limits bound the state machine's memory. Zero fields take the defaults.
type Limits struct {
	MaxLeases         int `json:"maxLeases,omitempty"`
	MaxLocksPerLease  int `json:"maxLocksPerLease,omitempty"`
	MaxWaitersPerLock int `json:"maxWaitersPerLock,omitempty"`
	// IdempotencyKeys is how many done idempotency keys are kept (their retention, see
	// idempotency.go) and how many may be in progress at once; IdempotencyBytes bounds
	// the total size of the kept results (at least MaxResultLen).
	IdempotencyKeys  int `json:"idempotencyKeys,omitempty"`
	IdempotencyBytes int `json:"idempotencyBytes,omitempty"`
	// LedgerPerLock and LedgerTotal bound the ledger (State.History): the tenures kept
	// per lock and in all (DefaultLedgerPerLock, DefaultLedgerTotal).
	LedgerPerLock int `json:"ledgerPerLock,omitempty"`
	LedgerTotal   int `json:"ledgerTotal,omitempty"`
	// MaxGroups bounds the number of groups, MaxGroupMembers the members of one group.
	MaxGroups       int `json:"maxGroups,omitempty"`
	MaxGroupMembers int `json:"maxGroupMembers,omitempty"`
	// ElectionHistory, ElectionHistoryTotal and ElectionHistoryBytes bound the election
	// history that Observe resumes from (electionhistory.go): the changes kept per
	// election, in all, and their size in all (names, values, holders and 168 bytes a
	// change; at least MaxValueLen). Defaults DefaultElectionHistory,
	// DefaultElectionHistoryTotal, DefaultElectionHistoryBytes.
	ElectionHistory      int `json:"electionHistory,omitempty"`
	ElectionHistoryTotal int `json:"electionHistoryTotal,omitempty"`
	ElectionHistoryBytes int `json:"electionHistoryBytes,omitempty"`
}

// DefaultLimits are the limits used for zero fields of Limits.
var DefaultLimits = Limits{MaxLeases: 1 << 20, MaxLocksPerLease: 10000, MaxWaitersPerLock: 10000,
	IdempotencyKeys: 100_000, IdempotencyBytes: 64 << 20, MaxGroups: 10_000, MaxGroupMembers: 1000}

func (l Limits) withDefaults() Limits {
	if l.MaxLeases <= 0 {
		l.MaxLeases = DefaultLimits.MaxLeases
	}
	if l.MaxLocksPerLease <= 0 {
		l.MaxLocksPerLease = DefaultLimits.MaxLocksPerLease
	}
	if l.MaxWaitersPerLock <= 0 {
		l.MaxWaitersPerLock = DefaultLimits.MaxWaitersPerLock
	}
	if l.IdempotencyKeys <= 0 {
		l.IdempotencyKeys = DefaultLimits.IdempotencyKeys
	}
	if l.IdempotencyBytes <= 0 {
		l.IdempotencyBytes = DefaultLimits.IdempotencyBytes
	}
	if l.MaxGroups <= 0 {
		l.MaxGroups = DefaultLimits.MaxGroups
	}
	if l.MaxGroupMembers <= 0 {
		l.MaxGroupMembers = DefaultLimits.MaxGroupMembers
	}
	l.IdempotencyBytes = max(l.IdempotencyBytes, MaxResultLen) // the newest result always fits
	if l.LedgerPerLock <= 0 {
		l.LedgerPerLock = DefaultLedgerPerLock
	}
	if l.LedgerTotal <= 0 {
		l.LedgerTotal = DefaultLedgerTotal
	}
	if l.ElectionHistory <= 0 {
		l.ElectionHistory = DefaultElectionHistory
	}
	if l.ElectionHistoryTotal <= 0 {
		l.ElectionHistoryTotal = DefaultElectionHistoryTotal
	}
	if l.ElectionHistoryBytes <= 0 {
		l.ElectionHistoryBytes = DefaultElectionHistoryBytes
	}
	l.ElectionHistoryBytes = max(l.ElectionHistoryBytes, MaxValueLen)
	return l
}
