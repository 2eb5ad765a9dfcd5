package core

import (
	"fmt"
	"slices"
)

// restorer rebuilds the replicated state's lock table from a snapshot's lock records,
// one at a time (add), checking each; finish then checks and links what spans records:
// lock sets, held (the holds of one lease under one token) and waiting (the places of
// one lease under one Set name), the one order of acquires behind all queues that
// makes waiting sets deadlock-free (lockset.go), and that no waiter could be granted.
// Anything a sequence of commands cannot produce is rejected with ErrCorrupt.
type restorer struct {
	t    *Locks
	live func(LeaseID) bool
	last uint64 // the last token issued
	// tokens are the tokens of every hold restored. A token held more than once is a
	// lock set's (finish checks that it is one).
	tokens []uint64
	// sets are the waiting lock sets, by lease and first name.
	sets map[setKey]*setWait
}

type setKey struct {
	lease LeaseID
	key   string
}

func (t *Locks) restorer(live func(LeaseID) bool, last uint64) *restorer {
	return &restorer{t: t, live: live, last: last, sets: make(map[setKey]*setWait)}
}

func badLock(format string, args ...any) error {
	return fmt.Errorf("%w: lock in snapshot: %s", ErrCorrupt, fmt.Sprintf(format, args...))
}

// add checks one lock record from a snapshot and inserts it.
func (rs *restorer) add(v *Lock) error {
	if err := rs.check(v); err != nil {
		return err
	}
	t := rs.t
	l := &lock{name: v.Name, class: v.Class, limit: uint16(v.Limit)}
	t.locks.put(l)
	if h := v.Hold; h != nil {
		t.grant(l, h.Lease, h.Token, h.Holder, h.DelayMillis, Exclusive)
	}
	for _, h := range v.Holds {
		t.grant(l, h.Lease, h.Token, h.Holder, h.DelayMillis, l.sharedMode())
	}
	if len(v.Waiters) > 0 || v.Delayed {
		m := l.extra()
		m.delay = v.DelayMillis
		m.waiters = make([]waiter, 0, len(v.Waiters))
	}
	for _, w := range v.Waiters {
		pw := waiter{lease: w.Lease, holder: w.Holder, delay: w.DelayMillis, mode: w.Mode}
		if w.Set != "" {
			k := setKey{w.Lease, w.Set}
			s := rs.sets[k]
			if s == nil {
				s = &setWait{lease: w.Lease, key: w.Set}
				rs.sets[k] = s
			}
			s.locks = append(s.locks, l)
			pw.set = s
		}
		t.enqueue(l, pw)
	}
	if h := v.Hold; h != nil {
		rs.tokens = append(rs.tokens, h.Token)
	}
	for _, h := range v.Holds {
		rs.tokens = append(rs.tokens, h.Token)
	}
	return nil
}

// check checks what one lock record must be on its own.
func (rs *restorer) check(v *Lock) error {
	switch {
	case v == nil:
		return badLock("null")
	case ValidateName("name", v.Name) != nil:
		return badLock("invalid name")
	case rs.t.Has(v.Name):
		return badLock("duplicate %s", v.Name)
	case v.Class != Correctness:
		return badLock("%s is not a correctness lock", v.Name)
	case !v.Held() && !v.Delayed && len(v.Waiters) == 0:
		return badLock("%s is neither held, waited for nor delayed", v.Name)
	case v.Limit > MaxSemaphoreLimit:
		return badLock("%s has a limit above %d", v.Name, MaxSemaphoreLimit)
	case v.Hold != nil && (len(v.Holds) > 0 || v.Limit > 0):
		return badLock("%s is held exclusively and shared, or is a semaphore with an exclusive hold", v.Name)
	case v.Limit > 0 && len(v.Holds) > int(v.Limit):
		return badLock("%s has %d holders, more than its limit %d", v.Name, len(v.Holds), v.Limit)
	case v.Delayed != (v.DelayMillis > 0):
		return badLock("%s has an impossible delay", v.Name)
	case v.Hold != nil && v.Delayed:
		return badLock("%s has an impossible hold", v.Name)
	}
	seen := make(map[LeaseID]bool, len(v.Holds)+len(v.Waiters)+1)
	holds := v.Holds
	if v.Hold != nil {
		holds = []Hold{*v.Hold}
	}
	for _, h := range holds {
		switch {
		case !rs.live(h.Lease) || h.Token > rs.last:
			return badLock("%s held by an unknown lease or a future token", v.Name)
		case h.Token == 0 || h.DelayMillis < 0 || seen[h.Lease]:
			return badLock("%s has an impossible hold", v.Name)
		}
		seen[h.Lease] = true
	}
	for _, w := range v.Waiters {
		if !rs.live(w.Lease) {
			return badLock("%s waited for by an unknown lease", v.Name)
		}
		if seen[w.Lease] || w.DelayMillis < 0 {
			return badLock("%s has a lease twice or a negative delay in its queue", v.Name)
		}
		if (w.Mode == Semaphore) != (v.Limit > 0) || w.Mode > Semaphore {
			return badLock("%s is waited for in mode %v", v.Name, w.Mode)
		}
		if w.Set != "" && ValidateName("set", w.Set) != nil {
			return badLock("%s is waited for by a set with an invalid name", v.Name)
		}
		seen[w.Lease] = true
	}
	return nil
}

// finish checks and links what spans records, once every lock record is in.
func (rs *restorer) finish() error {
	t := rs.t
	if err := rs.linkSets(); err != nil {
		return err
	}
	for k, s := range rs.sets {
		slices.SortFunc(s.locks, compareLockNames)
		if len(s.locks) < 2 || len(s.locks) > MaxSetNames || s.locks[0].name != k.key {
			return fmt.Errorf("%w: lock set %q waited for with %d locks", ErrCorrupt, k.key, len(s.locks))
		}
		first := s.locks[0].more.waiters[s.locks[0].waiterIndex(k.lease)]
		for _, l := range s.locks[1:] {
			w := l.more.waiters[l.waiterIndex(k.lease)]
			if w.mode != first.mode || w.holder != first.holder || w.delay != first.delay {
				return fmt.Errorf("%w: lock set %q waited for on different terms", ErrCorrupt, k.key)
			}
		}
	}
	if err := rs.checkOneOrder(); err != nil {
		return err
	}
	for l := range t.locks.all() {
		if l.numWaiters() == 0 {
			continue
		}
		w := &l.more.waiters[0]
		if w.set == nil && l.admits(w.mode) || w.set != nil && setReady(w.set) {
			return badLock("%s could be granted to its first waiter", l.name)
		}
	}
	return nil
}

// linkSets finds the tokens held more than once and records each as a lock set: the
// holds of one token must be one lease's, in one kind (all exclusive, or all shared in
// locks of one limit).
func (rs *restorer) linkSets() error {
	slices.Sort(rs.tokens)
	var twice map[uint64][]*lock
	for i := 1; i < len(rs.tokens); i++ {
		if rs.tokens[i] == rs.tokens[i-1] {
			if twice == nil {
				twice = make(map[uint64][]*lock)
			}
			twice[rs.tokens[i]] = nil
		}
	}
	if twice == nil {
		return nil // the common case: every token once
	}
	type grant struct {
		lease  LeaseID
		shared bool
	}
	by := make(map[uint64]grant, len(twice))
	note := func(l *lock, tok uint64, lease LeaseID, shared bool) error {
		locks, ok := twice[tok]
		if !ok {
			return nil
		}
		if g, seen := by[tok]; seen && (g.lease != lease || g.shared != shared || locks[0].limit != l.limit) {
			return fmt.Errorf("%w: token %d held twice in snapshot", ErrCorrupt, tok)
		}
		by[tok] = grant{lease, shared}
		twice[tok] = append(locks, l)
		return nil
	}
	for l := range rs.t.locks.all() {
		if l.held() {
			if err := note(l, l.token, l.lease, false); err != nil {
				return err
			}
		}
		for _, h := range l.more.holdsOrNil() {
			if err := note(l, h.token, h.lease, true); err != nil {
				return err
			}
		}
	}
	for tok, locks := range twice {
		if len(locks) > MaxSetNames {
			return fmt.Errorf("%w: token %d held by a set of %d locks", ErrCorrupt, tok, len(locks))
		}
		slices.SortFunc(locks, compareLockNames)
		rs.t.addSet(by[tok].lease, tok, locks)
	}
	return nil
}

// checkOneOrder checks that one order of the waiting acquires agrees with every queue:
// the acquires, sorted by "waits behind", have no cycle. A cycle can only pass from one
// queue to another through an acquire that waits in both, a lock set, so it is enough
// to sort the waiting sets, each queue ordering the sets that wait in it.
func (rs *restorer) checkOneOrder() error {
	if len(rs.sets) == 0 {
		return nil
	}
	before := make(map[*setWait]int, len(rs.sets)) // how many sets stand right in front of the set's places
	next := make(map[*setWait][]*setWait)
	seen := make(map[*lock]bool) // each queue once
	for _, s := range rs.sets {
		before[s] += 0
		for _, l := range s.locks {
			if seen[l] {
				continue
			}
			seen[l] = true
			var prev *setWait
			for _, w := range l.more.waiters {
				if w.set == nil {
					continue
				}
				if prev != nil {
					next[prev] = append(next[prev], w.set)
					before[w.set]++
				}
				prev = w.set
			}
		}
	}
	var ready []*setWait
	for n, c := range before {
		if c == 0 {
			ready = append(ready, n)
		}
	}
	sorted := 0
	for len(ready) > 0 {
		n := ready[len(ready)-1]
		ready = ready[:len(ready)-1]
		sorted++
		for _, m := range next[n] {
			if before[m]--; before[m] == 0 {
				ready = append(ready, m)
			}
		}
	}
	if sorted != len(before) {
		return fmt.Errorf("%w: the queues of lock sets in the snapshot disagree on their order (a deadlock)", ErrCorrupt)
	}
	return nil
}

func (m *lockExtra) holdsOrNil() []sharedHold {
	if m == nil {
		return nil
	}
	return m.holds
}
