package core

import (
	"fmt"
	"slices"
)

// Lock sets: one Acquire naming several locks, granted all at once under one token.
//
// A lock set waits as one setWait, which has a place in the queue of every lock it
// names (a waiter whose set is that setWait). It is granted when it is at the head of
// every one of those queues and every one of those locks admits it (its holds leave
// room, no lock-delay), and then on all its locks at once; until then it holds none of
// them. Its locks are released together too: Release, CancelWait and ForceRelease of
// any one of its names act on the whole set.
//
// Why no set of waiting acquires can deadlock. A deadlock would be a cycle of waiting
// acquires, each waiting behind the next in some queue (a holder never waits: a lease
// is granted nothing until it is granted everything it asked for in one acquire, and
// an acquire that overlaps what its lease already holds or waits for fails with
// ErrSetConflict). Every acquire enters its queues in one step — one command of the
// log, applied by Acquire below, which appends the set's place to all its queues before
// anything else happens — and a place never moves forward past another except by the
// other leaving its queue. So in every queue, places stand in the order their acquires
// were applied: the same order, the order of the log, in all queues at once. Waiting
// behind means applied later, so a cycle would be an acquire applied later than
// itself. Hence the earliest acquire still waiting is at the head of all its queues,
// and it waits only for holders and lock-delays, which end (holders release or their
// leases expire; delays end by OpEndDelay); when the last of them ends, the command
// that ends it grants the acquire (grantNext runs on every lock a command frees or
// whose queue it moves). Then the next earliest is the earliest, and so on: every
// waiting acquire is eventually granted. Restoring a snapshot checks the same property
// (a single order of acquires consistent with every queue), so that a restored state
// has it too (restore.go).
//
// No grant skips a queue's head, so sets are FIFO on each name as single locks are,
// and a set never starves behind a stream of single acquires: they queue behind it.

// acquireSet is Acquire for a lock set.
func (t *Locks) acquireSet(a *AcquireArgs, seq Sequence) Result {
	locks := make([]*lock, len(a.Names))
	for i, name := range a.Names {
		if l := t.locks.get(name); l != nil {
			if err := l.conflict(a); err != nil {
				return Result{Err: err}
			}
			locks[i] = l
		}
	}
	ll := t.leases[a.Lease]
	if ll != nil {
		if r, again := t.setAgain(locks, ll, a); again {
			r.Again = r.Err == nil
			return r
		}
	}
	if n := t.LeaseLocks(a.Lease); n+len(locks) > t.limits.MaxLocksPerLease {
		return Result{Err: fmt.Errorf("%w: the limit is %d, the lease has %d and asks for %d more", ErrTooManyLocks, t.limits.MaxLocksPerLease, n, len(locks))}
	}
	var blocker *lock
	for _, l := range locks {
		if l != nil && (l.numWaiters() > 0 || !l.admits(a.Mode)) {
			blocker = l
			break
		}
	}
	if blocker == nil {
		tok := seq.Next()
		for i, l := range locks {
			if l == nil {
				locks[i] = t.newLock(a.Names[i], a)
			}
			t.grant(locks[i], a.Lease, tok, a.Holder, a.DelayMillis, a.Mode)
		}
		t.addSet(a.Lease, tok, locks)
		return Result{Token: tok}
	}
	if !a.Wait {
		r := queuedResult(blocker)
		r.Queued, r.Blocker = false, blocker.name
		r.Err = fmt.Errorf("%w: %q, one of the set", ErrLockHeld, blocker.name)
		return r
	}
	for _, l := range locks {
		if l != nil && l.numWaiters() >= t.limits.MaxWaitersPerLock {
			return Result{Err: fmt.Errorf("%w: %q has %d", ErrTooManyWaiters, l.name, l.numWaiters())}
		}
	}
	s := &setWait{lease: a.Lease, key: a.Names[0], locks: locks}
	for i, l := range locks {
		if l == nil {
			l = t.newLock(a.Names[i], a)
			locks[i] = l
		}
		t.enqueue(l, waiter{lease: a.Lease, holder: a.Holder, delay: a.DelayMillis, mode: a.Mode, set: s})
	}
	r := queuedResult(blocker)
	r.Blocker = blocker.name
	return r
}

// setWait is a lock set's wait: the waiters in the queues of its locks point to it. It
// is never changed once made, so a snapshot's copy of the records may share it.
type setWait struct {
	lease LeaseID
	key   string  // the first name
	locks []*lock // in name order
}

// setAgain answers a lock set's acquire by a lease that already holds or waits for one
// of its locks (and reports false when it does neither): the same grant or place when
// it asked for this very set in this mode before, ErrSetConflict otherwise.
func (t *Locks) setAgain(locks []*lock, ll *leaseLocks, a *AcquireArgs) (Result, bool) {
	conflict := func(l *lock, how string) (Result, bool) {
		return Result{Err: fmt.Errorf("%w: the lease %s %q under another acquire", ErrSetConflict, how, l.name)}, true
	}
	for i, l := range locks {
		if l == nil {
			continue
		}
		if tok, mode, ok := l.holdOf(a.Lease); ok {
			if i == 0 && mode == a.Mode && slices.Equal(ll.sets[tok], locks) {
				return Result{Token: tok}, true
			}
			return conflict(l, "holds")
		}
		if ll.waitsFor(l) {
			w := l.more.waiters[l.waiterIndex(a.Lease)]
			if i == 0 && w.mode == a.Mode && w.set != nil && slices.Equal(w.set.locks, locks) {
				blocker := t.blocker(w.set)
				r := queuedResult(blocker)
				r.Blocker = blocker.name
				return r, true
			}
			return conflict(l, "waits for")
		}
	}
	return Result{}, false
}

// blocker returns the first lock of the waiting set s that does not let it through.
func (t *Locks) blocker(s *setWait) *lock {
	for _, l := range s.locks {
		if w := &l.more.waiters[0]; w.set != s || !l.admits(w.mode) {
			return l
		}
	}
	return s.locks[0] // only between a grant and its cascade, which never asks
}

// addSet records that lease holds the locks of one set under tok.
func (t *Locks) addSet(lease LeaseID, tok uint64, locks []*lock) {
	ll := t.leases[lease]
	if ll.sets == nil {
		ll.sets = make(map[uint64][]*lock)
	}
	ll.sets[tok] = locks
}

// dropSet frees every hold of the set that lease (index ll) holds under tok, recording
// an event of kind (with note) for each.
func (t *Locks) dropSet(ll *leaseLocks, lease LeaseID, tok uint64, set []*lock, kind EventKind, note string) {
	delete(ll.sets, tok) // first: the index may be forgotten with the last hold
	if len(ll.sets) == 0 {
		ll.sets = nil
	}
	for _, l := range set {
		t.emitHold(kind, l, lease, note)
		t.dropHold(l, ll, lease)
	}
}

// grantEach runs grantNext on each of locks, in order.
func (t *Locks) grantEach(locks []*lock, seq Sequence, r *Result) {
	for _, l := range locks {
		t.grantNext(l, seq, r)
	}
}

// grantNext grants l to the head of its queue for as long as l admits the head, or
// removes l when nothing holds it, waits for it or delays it. A lock set at the head is
// granted only when it is at the head of all its queues and all its locks admit it;
// its grant moves those queues too, so they are granted from in turn, in name order,
// after l. Every command that frees a lock or moves a queue calls it on that lock:
// that is what keeps the table from ever having a waiter it could grant.
func (t *Locks) grantNext(l *lock, seq Sequence, r *Result) {
	if l.more == nil { // nobody waits: the common case
		if !l.held() {
			t.locks.del(l.name)
		}
		return
	}
	var moved []*lock // locks whose queues a set's grant moved, still to look at
	for {
		t.grantHeads(l, seq, r, &moved)
		if len(moved) == 0 {
			return
		}
		l, moved = moved[0], moved[1:]
	}
}

// grantHeads grants l's queue from its head for as long as it can, adding to moved
// the other locks of every lock set it grants.
func (t *Locks) grantHeads(l *lock, seq Sequence, r *Result, moved *[]*lock) {
	for {
		m := l.more
		if m == nil || len(m.waiters) == 0 {
			t.dropIfUnused(l)
			return
		}
		w := m.waiters[0]
		if !l.admits(w.mode) {
			return
		}
		if w.set == nil {
			tok := seq.Next()
			t.unqueue(l, 0)
			t.leases[w.lease].unwait(l) // the grant below keeps the lease's index alive
			t.grant(l, w.lease, tok, w.holder, w.delay, w.mode)
			r.Effects = append(r.Effects, Effect{Kind: EffectGranted, Lease: w.lease, Name: l.name, Token: tok})
			continue
		}
		s := w.set
		if !setReady(s) {
			return
		}
		tok := seq.Next()
		ll := t.leases[s.lease]
		for _, o := range s.locks {
			t.unqueue(o, 0)
			ll.unwait(o) // the grants keep the lease's index alive
			t.grant(o, s.lease, tok, w.holder, w.delay, w.mode)
			r.Effects = append(r.Effects, Effect{Kind: EffectGranted, Lease: s.lease, Name: o.name, Token: tok})
			if o != l {
				*moved = append(*moved, o)
			}
		}
		t.addSet(s.lease, tok, s.locks)
	}
}

// setReady reports whether the waiting lock set s is at the head of all its queues and
// all its locks admit it.
func setReady(s *setWait) bool {
	for _, l := range s.locks {
		if w := &l.more.waiters[0]; w.set != s || !l.admits(w.mode) {
			return false
		}
	}
	return true
}
