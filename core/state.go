package core

import (
	"fmt"
	"slices"
)

// tombstoneCap bounds how many ended leases State remembers, so that a late keepalive
// can be told why its lease is gone.
const tombstoneCap = 4096

// Lease is a lease as the replicated state knows it: an id and a TTL. Its countdown is
// the leader's business.
type Lease struct {
	ID        LeaseID `json:"id"`
	TTLMillis int64   `json:"ttl"`
}

// State is the replicated state: leases, correctness locks (with the locks each lease
// lost to a force release), the token sequence, the fenced KV store and the members.
// Apply is its only mutator. It is not safe for concurrent use.
type State struct {
	seq uint64 // last token issued or reserved
	// leases holds each live lease's TTL in milliseconds, by value: a map without
	// pointers, which the garbage collector does not scan however many leases it holds.
	leases     map[LeaseID]int64
	locks      *Locks
	limits     Limits
	tombstones map[LeaseID]EndReason
	elections  *Elections
	tombOrder  []LeaseID // oldest first, from tombHead on
	tombHead   int       // tombOrder[:tombHead] are forgotten (compacted away once tombstoneCap of them)
	kv         kvStore
	members    map[string]memberAddrs // by node id
	clusterID  string                 // "" until OpSetClusterID
	keys       keyStore               // idempotency keys (idempotency.go)
	groups     groupStore             // groups and partitions (groups.go)
	ledger     Ledger                 // recent tenures (ledger.go)
	history    history                // recent election changes (electionhistory.go)
	// logIndex is the "logIndex" of the backup this state was read from (SnapshotLogIndex).
	logIndex uint64
	// now is the command being applied's WallMillis (the ledger's times); rec is
	// Record's fn.
	now int64
	rec func(Event)
	// ended is OnHoldEnd's fn.
	ended func(EndedHold)
}

// EndedHold is the end of one grant's hold, as OnHoldEnd reports it: its class and the
// ledger's times of its grant and its end (Unix milliseconds, the proposing leaders'
// wall clocks; EndMillis 0 when the ending command carried no time).
type EndedHold struct {
	Class                  Class
	StartMillis, EndMillis int64
}

// NewState returns an empty state with the given limits. Every replica must use the same
// limits, or their states diverge.
func NewState(limits Limits) *State {
	limits = limits.withDefaults()
	s := &State{
		leases:     make(map[LeaseID]int64),
		locks:      NewLocks(limits),
		limits:     limits,
		tombstones: make(map[LeaseID]EndReason),
		kv:         kvStore{entries: make(map[string]*Entry)},
		members:    make(map[string]memberAddrs),
		keys:       newKeyStore(),
		groups:     newGroupStore(),
		elections:  newElections(),
		ledger:     NewLedger(limits),
		history:    newHistory(limits),
	}
	s.locks.Record(s.record)
	return s
}

// record takes every event of the lock table: into the ledger, then to Record's fn.
func (s *State) record(e Event) {
	if start := s.ledger.Note(e, s.now); start > 0 && s.ended != nil {
		s.ended(EndedHold{Class: e.Class, StartMillis: start, EndMillis: s.now})
	}
	if s.rec != nil {
		s.rec(e)
	}
}

// Next implements Sequence: it issues the next token.
func (s *State) Next() uint64 {
	s.seq++
	return s.seq
}

// LastToken returns the last token issued or reserved.
func (s *State) LastToken() uint64 { return s.seq }

// SkipKVVersions makes the next KV version gap above the last one given: a restore
// from a backup (replication.RestoreDataDir) does it, as it does for tokens, so that a
// version the old cluster gave out after the backup is never given to another value —
// a CAS made with such a version (IfVersion) then fails instead of applying over a value
// its caller never read. It is not a command: only a state not yet serving may skip.
func (s *State) SkipKVVersions(gap uint64) error {
	if s.kv.rev > ^uint64(0)-gap {
		return Invalid("gap", "the KV versions would overflow")
	}
	s.kv.rev += gap
	return nil
}

// Lease returns the lease with id, or nil. The Lease is a copy: changing it changes
// nothing.
func (s *State) Lease(id LeaseID) *Lease {
	ttl, ok := s.leases[id]
	if !ok {
		return nil
	}
	return &Lease{ID: id, TTLMillis: ttl}
}

// live reports whether lease id exists.
func (s *State) live(id LeaseID) bool {
	_, ok := s.leases[id]
	return ok
}

// EndedReason tells why lease id ended, if State still remembers it.
func (s *State) EndedReason(id LeaseID) EndReason { return s.tombstones[id] }

// Leases calls fn for every lease in id order, each a copy.
func (s *State) Leases(fn func(*Lease)) {
	ids := make([]LeaseID, 0, len(s.leases))
	for id := range s.leases {
		ids = append(ids, id)
	}
	slices.SortFunc(ids, compareIDs)
	for _, id := range ids {
		fn(&Lease{ID: id, TTLMillis: s.leases[id]})
	}
}

// NumLeases returns the number of live leases.
func (s *State) NumLeases() int { return len(s.leases) }

// Record makes Apply call fn with every lock event of the commands it applies, in
// order, as it applies them (see Locks.Record). nil stops recording.
func (s *State) Record(fn func(Event)) { s.rec = fn }

// OnHoldEnd makes Apply call fn, as it applies a command, once for every grant whose
// hold the command ends and whose start the ledger knows (a lock set's grant once, with
// its last name): a leader's hold-time metric, which then keeps nothing per hold. nil
// stops it. It changes nothing in the state.
func (s *State) OnHoldEnd(fn func(EndedHold)) { s.ended = fn }

// Locks returns the correctness lock table for reading. Callers must not mutate it.
func (s *State) Locks() *Locks { return s.locks }

// Elections returns the election table (read-only use).
func (s *State) Elections() *Elections { return s.elections }

// Apply applies one command and returns its outcome. A command that fails leaves the
// state unchanged. Apply never panics on any input: commands come from the log and are
// validated again here.
func (s *State) Apply(c Command) Result {
	if err := c.validate(); err != nil {
		return Result{Err: err}
	}
	s.now = c.WallMillis
	switch c.Op {
	case OpGrant:
		if s.live(c.Lease) {
			return Result{Err: fmt.Errorf("%w: %s", ErrLeaseExists, c.Lease)}
		}
		if len(s.leases) >= s.limits.MaxLeases {
			return Result{Err: fmt.Errorf("%w: the limit is %d", ErrTooManyLeases, s.limits.MaxLeases)}
		}
		s.leases[c.Lease] = c.TTLMillis
		return Result{Effects: []Effect{{Kind: EffectLeaseGranted, Lease: c.Lease, TTLMillis: c.TTLMillis}}}
	case OpRevoke, OpExpire, OpDisconnect:
		if !s.live(c.Lease) {
			return Result{Err: s.leaseGone(c.Lease)}
		}
		reason := EndRevoked
		switch c.Op {
		case OpExpire:
			reason = EndExpired
		case OpDisconnect:
			reason = EndDisconnected
		}
		var r Result
		if reason == EndDisconnected {
			s.locks.DropDisconnected(c.Lease, s, &r) // a crashed holder's delay applies
		} else {
			s.locks.DropLease(c.Lease, reason == EndExpired, s, &r)
		}
		s.dropLeaseElections(c.Lease, leadershipEnd[reason], &r)
		delete(s.leases, c.Lease)
		s.keys.dropLease(c.Lease)
		s.dropGroupLease(c.Lease, &r)
		s.remember(c.Lease, reason)
		r.Effects = append(r.Effects, Effect{Kind: EffectLeaseEnded, Lease: c.Lease, Reason: reason})
		return r
	case OpAcquire:
		if c.Class != Correctness {
			return Result{Err: Invalid("class", "only correctness locks are replicated")}
		}
		if !s.live(c.Lease) {
			return Result{Err: s.leaseGone(c.Lease)}
		}
		return s.locks.Acquire(c.acquireArgs(), s)
	case OpRelease:
		if !s.live(c.Lease) {
			return Result{Err: s.leaseGone(c.Lease)}
		}
		return s.locks.Release(c.Lease, c.Name, c.Token, s)
	case OpCancelWait:
		if !s.live(c.Lease) {
			return Result{Err: s.leaseGone(c.Lease)}
		}
		return s.locks.CancelWait(c.Lease, c.Name, s)
	case OpForceRelease:
		r := Result{Token: s.Next()}
		s.locks.ForceRelease(c.Name, c.Reason, s, &r)
		return r
	case OpEndDelay:
		var r Result
		s.locks.EndDelay(c.Name, s, &r)
		return r
	case OpPut, OpDelete:
		return s.applyWrite(c)
	case OpBegin, OpComplete, OpAbandon:
		return s.applyKey(c)
	case OpGroupCreate, OpGroupJoin, OpGroupLeave, OpGroupRelease, OpGroupDrainEnd:
		return s.applyGroup(c)
	case OpCampaign, OpProclaim, OpResign, OpWithdraw:
		return s.applyElection(&c)
	case OpSetMember:
		s.members[c.Node] = memberAddrs{api: c.Addr, fastLane: c.FastLane}
		return Result{}
	case OpRemoveMember:
		delete(s.members, c.Node)
		return Result{}
	case OpSetClusterID:
		if s.clusterID != "" && s.clusterID != c.ClusterID {
			return Result{Err: fmt.Errorf("%w: it is %s", ErrClusterID, s.clusterID)}
		}
		s.clusterID = c.ClusterID
		return Result{}
	case OpReserve:
		if s.seq > ^uint64(0)-c.Count {
			return Result{Err: Invalid("count", "the token sequence would overflow")}
		}
		first := s.seq + 1
		s.seq += c.Count
		return Result{Token: first}
	}
	return Result{Err: fmt.Errorf("%w: unknown op %d", ErrInvalid, c.Op)}
}

func (s *State) leaseGone(id LeaseID) error {
	return fmt.Errorf("%w: %s (%s)", ErrLeaseNotFound, id, s.tombstones[id])
}

func (s *State) remember(id LeaseID, reason EndReason) {
	if _, ok := s.tombstones[id]; !ok {
		s.tombOrder = append(s.tombOrder, id)
	}
	s.tombstones[id] = reason
	if len(s.tombOrder)-s.tombHead > tombstoneCap {
		delete(s.tombstones, s.tombOrder[s.tombHead])
		s.tombHead++
		// Forgetting the oldest by moving the rest down cost a 64 KiB copy per lease
		// ended (a third of the apply's CPU with a million leases expiring); now the
		// copy is once per tombstoneCap ends.
		if s.tombHead >= tombstoneCap {
			s.tombOrder = s.tombOrder[:copy(s.tombOrder, s.tombOrder[s.tombHead:])]
			s.tombHead = 0
		}
	}
}

// tombs returns the remembered ended leases, oldest first.
func (s *State) tombs() []LeaseID { return s.tombOrder[s.tombHead:] }

func compareIDs(a, b LeaseID) int {
	for i := range a {
		if a[i] != b[i] {
			return int(a[i]) - int(b[i])
		}
	}
	return 0
}
