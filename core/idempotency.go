package core

import (
	"bytes"
	"fmt"
	"slices"
)

// Idempotency keys (G9): work that must be done at most once, named by a key.
//
// OpBegin(Key, Lease, Holder) claims Key for Lease: a key nobody has is given a new
// token from the sequence and is then in progress under Lease; a key in progress under
// another lease answers who has it; a done key answers its stored result. OpComplete(Key,
// Token, Value) marks the key done with the result Value, but only when it is in progress
// under Token: any other token is stale and is rejected, so a key is marked done at most
// once. OpAbandon(Key, Token) gives a key in progress back without a result. When a
// lease ends, every key in progress under it becomes free again: the next Begin gets a
// new, larger token, and the late Complete of the holder that died or paused is stale.
//
// Retention is counted, not timed: the state keeps the newest Limits.IdempotencyKeys done
// keys, and the newest whose results together fit in Limits.IdempotencyBytes; completing
// one more evicts the oldest. The state machine has no clock, and a wall time stamped
// in each command by its proposer would move with whichever node leads and with that
// node's clock, so a "24 hours" retention could end early after a leader change; a count
// is the same on every replica, bounds memory directly, and its end is observable (the
// key is gone from Get). The price is that how long a key is kept depends on how fast
// new keys are done; size the limit for the busiest hour.
const (
	// OpBegin claims Key for Lease, with Holder describing who works on it.
	OpBegin Op = 50
	// OpComplete marks Key done with the result Value; Token must be the Begin's token.
	OpComplete Op = 51
	// OpAbandon gives Key back, without a result, if it is in progress under Token.
	OpAbandon Op = 52
)

// MaxResultLen bounds the result stored with a done key, as MaxValueLen bounds a KV value.
const MaxResultLen = MaxValueLen

var keyOpNames = map[Op]string{OpBegin: "begin", OpComplete: "complete", OpAbandon: "abandon", OpDisconnect: "disconnect",
	OpCampaign: "campaign", OpProclaim: "proclaim", OpResign: "resign", OpWithdraw: "withdraw"}

// EffectKeyDone reports that key Name was marked done by the Begin whose token is Token.
// It is the hook for Watch's "idempotency key done" event; nobody needs to act on it yet.
const EffectKeyDone EffectKind = 50

// KeyStatus is where an idempotency key stands.
type KeyStatus uint8

// The statuses of a key. KeyNew is only ever an answer to Begin: the key is then in
// progress under the caller's lease.
const (
	KeyAbsent     KeyStatus = 0 // nobody has begun it, or its retention ended
	KeyNew        KeyStatus = 1 // Begin: the key is now the caller's, under Token
	KeyInProgress KeyStatus = 2 // another lease has it, under Token
	KeyDone       KeyStatus = 3 // done under Token, with Result
)

func (k KeyStatus) String() string {
	switch k {
	case KeyNew:
		return "new"
	case KeyInProgress:
		return "in progress"
	case KeyDone:
		return "done"
	}
	return "absent"
}

// KeyView is what a Begin or a Get answers about a key. It never shows the lease.
type KeyView struct {
	Key    string
	Status KeyStatus
	// Token is the token of the Begin that has, or had, the key (0 when absent).
	Token uint64
	// Holder describes who has it in progress, or who completed it.
	Holder Holder
	// Result is the stored result of a done key. It is shared with the state, which
	// never changes it in place: do not modify it.
	Result []byte
}

// keyRecord is one idempotency key as the state and its snapshot keep it.
type keyRecord struct {
	Key    string  `json:"key"`
	Token  uint64  `json:"token"`
	Lease  LeaseID `json:"lease,omitzero"` // in progress under it; zero when done
	Holder Holder  `json:"holder,omitzero"`
	Done   bool    `json:"done,omitempty"`
	Result []byte  `json:"result,omitempty"` // set once, never changed in place
}

// keyStore holds the idempotency keys of a State.
type keyStore struct {
	keys    map[string]*keyRecord
	byLease map[LeaseID]map[string]struct{} // the keys in progress under each lease
	// done lists the done keys oldest first, from done[head] on: Complete appends,
	// retention evicts from the front.
	done       []string
	head       int
	doneBytes  int // total length of the done keys' results
	inProgress int
}

func newKeyStore() keyStore {
	return keyStore{keys: make(map[string]*keyRecord), byLease: make(map[LeaseID]map[string]struct{})}
}

// Key returns what State knows about key.
func (s *State) Key(key string) KeyView {
	r := s.keys.keys[key]
	if r == nil {
		return KeyView{Key: key}
	}
	st := KeyInProgress
	if r.Done {
		st = KeyDone
	}
	return KeyView{Key: key, Status: st, Token: r.Token, Holder: r.Holder, Result: r.Result}
}

// NumKeys returns how many idempotency keys are in progress and how many done keys are
// kept.
func (s *State) NumKeys() (inProgress, done int) {
	return s.keys.inProgress, len(s.keys.done) - s.keys.head
}

// applyKey applies OpBegin, OpComplete and OpAbandon.
func (s *State) applyKey(c Command) Result {
	ks := &s.keys
	r := ks.keys[c.Key]
	switch c.Op {
	case OpBegin:
		if !s.live(c.Lease) {
			return Result{Err: s.leaseGone(c.Lease)}
		}
		if r != nil {
			v := s.Key(c.Key)
			if !r.Done && r.Lease == c.Lease {
				v.Status = KeyNew // a retried Begin gets its own token back
			}
			return Result{Token: r.Token, Key: &v}
		}
		if ks.inProgress >= s.limits.IdempotencyKeys {
			return Result{Err: fmt.Errorf("%w: %d keys are in progress, the limit is %d", ErrTooManyKeys, ks.inProgress, s.limits.IdempotencyKeys)}
		}
		r = &keyRecord{Key: c.Key, Token: s.Next(), Lease: c.Lease, Holder: c.Holder}
		ks.hold(r)
		v := s.Key(c.Key)
		v.Status = KeyNew
		return Result{Token: r.Token, Key: &v}
	case OpComplete:
		switch {
		case r != nil && r.Done && r.Token == c.Token:
			// A retried Complete: the key is done, by this very Begin. The first result
			// stays.
			v := s.Key(c.Key)
			return Result{Token: r.Token, Key: &v}
		case r == nil || r.Done || r.Token != c.Token:
			return Result{Err: staleKeyToken(c.Key, c.Token, r)}
		}
		ks.release(r)
		r.Lease, r.Done, r.Result = LeaseID{}, true, nil
		if len(c.Value) > 0 {
			r.Result = bytes.Clone(c.Value)
		}
		ks.done = append(ks.done, c.Key)
		ks.doneBytes += len(r.Result)
		ks.evict(s.limits)
		v := s.Key(c.Key)
		return Result{Token: r.Token, Key: &v, Effects: []Effect{{Kind: EffectKeyDone, Name: c.Key, Token: r.Token}}}
	case OpAbandon:
		if r != nil && !r.Done && r.Token == c.Token {
			ks.release(r)
			delete(ks.keys, c.Key)
		}
		return Result{}
	}
	return Result{Err: fmt.Errorf("%w: unknown op %d", ErrInvalid, c.Op)}
}

// staleKeyToken is the error of a Complete whose token is not that of the key's Begin.
func staleKeyToken(key string, token uint64, r *keyRecord) error {
	switch {
	case r == nil:
		return fmt.Errorf("%w: idempotency key %q is not in progress (never begun, given back, its lease ended, or its retention ended); token %d completes nothing",
			ErrStaleToken, key, token)
	case r.Done:
		return fmt.Errorf("%w: idempotency key %q was done under token %d; token %d completes nothing", ErrStaleToken, key, r.Token, token)
	}
	return fmt.Errorf("%w: idempotency key %q is in progress under token %d, not %d", ErrStaleToken, key, r.Token, token)
}

// hold adds the in-progress record r, indexed by its lease.
func (ks *keyStore) hold(r *keyRecord) {
	ks.keys[r.Key] = r
	mine := ks.byLease[r.Lease]
	if mine == nil {
		mine = make(map[string]struct{})
		ks.byLease[r.Lease] = mine
	}
	mine[r.Key] = struct{}{}
	ks.inProgress++
}

// release takes the in-progress record r out of its lease's index.
func (ks *keyStore) release(r *keyRecord) {
	mine := ks.byLease[r.Lease]
	delete(mine, r.Key)
	if len(mine) == 0 {
		delete(ks.byLease, r.Lease)
	}
	ks.inProgress--
}

// dropLease frees every key in progress under lease (the lease ended).
func (ks *keyStore) dropLease(lease LeaseID) {
	for key := range ks.byLease[lease] {
		delete(ks.keys, key)
		ks.inProgress--
	}
	delete(ks.byLease, lease)
}

// evict ends the retention of the oldest done keys while more are kept than limits
// allow.
func (ks *keyStore) evict(limits Limits) {
	for n := len(ks.done) - ks.head; n > 0 && (n > limits.IdempotencyKeys || ks.doneBytes > limits.IdempotencyBytes); n-- {
		key := ks.done[ks.head]
		ks.done[ks.head] = ""
		ks.head++
		ks.doneBytes -= len(ks.keys[key].Result)
		delete(ks.keys, key)
	}
	if ks.head > 1024 && ks.head > len(ks.done)/2 {
		ks.done = slices.Clone(ks.done[ks.head:])
		ks.head = 0
	}
}

// validateKeyOp checks OpBegin, OpComplete and OpAbandon.
func (c *Command) validateKeyOp() error {
	if err := ValidateName("key", c.Key); err != nil {
		return err
	}
	switch c.Op {
	case OpBegin:
		if c.Lease.IsZero() {
			return Invalid("lease_id", "must be set")
		}
		return ValidateHolder("holder", c.Holder)
	case OpComplete:
		if len(c.Value) > MaxResultLen {
			return Invalid("result", "is %d bytes, the limit is %d", len(c.Value), MaxResultLen)
		}
	}
	if c.Token == 0 {
		return Invalid("token", "must be the token Begin returned")
	}
	return nil
}

// records copies the keys for a snapshot: the inProgress keys in progress, in no
// order (SnapshotView.WriteTo sorts them), then the done keys oldest first (the order
// retention evicts them in).
func (ks *keyStore) records() (out []keyRecord, inProgress int) {
	out = make([]keyRecord, 0, len(ks.keys))
	for _, r := range ks.keys {
		if !r.Done {
			out = append(out, *r)
		}
	}
	inProgress = len(out)
	for _, key := range ks.done[ks.head:] {
		out = append(out, *ks.keys[key])
	}
	return out, inProgress
}

// restoreKey adds one record read from a snapshot, checking it against what the
// snapshot restored before it (leases, the sequence, the keys before it).
func (s *State) restoreKey(r *keyRecord) error {
	ks := &s.keys
	bad := func(why string) error { return fmt.Errorf("%w: idempotency key in snapshot: %s", ErrCorrupt, why) }
	switch {
	case r == nil:
		return bad("null")
	case ValidateName("key", r.Key) != nil || ValidateHolder("holder", r.Holder) != nil:
		return bad("invalid key or holder")
	case ks.keys[r.Key] != nil:
		return bad(r.Key + " twice")
	case r.Token == 0 || r.Token > s.seq:
		return bad(r.Key + " has an impossible token")
	case r.Done && (!r.Lease.IsZero() || len(r.Result) > MaxResultLen):
		return bad(r.Key + " is done with a lease or an oversized result")
	case !r.Done && (!s.live(r.Lease) || r.Result != nil):
		return bad(r.Key + " is in progress under an unknown lease, or with a result")
	case !r.Done && len(ks.done) > 0:
		return bad(r.Key + " is in progress after the done keys")
	}
	if !r.Done {
		ks.hold(r)
		return nil
	}
	ks.keys[r.Key] = r
	ks.done = append(ks.done, r.Key)
	ks.doneBytes += len(r.Result)
	ks.evict(s.limits) // the limits may be smaller than those the snapshot was made with
	return nil
}
