package core

// This file holds the test machinery shared by the property, fuzz and table tests: a
// reference model of the lock semantics, a command generator driven by any source of
// choices (a seeded PRNG or fuzz bytes), a driver that runs the bare Locks table the way
// the leader runs its efficiency table, and invariant checks.
//
// The model is deliberately built differently from the code: it keeps no per-lease
// index (it scans), and it predicts every field of every Result, including the exact
// tokens and the order of effects. The state and the model are compared after every
// step.

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"unicode/utf8"
)

// lid returns a recognisable lease id for tests.
func lid(n uint32) LeaseID {
	var id LeaseID
	id[0] = 0x1e
	id[12], id[13], id[14], id[15] = byte(n>>24), byte(n>>16), byte(n>>8), byte(n)
	return id
}

// maxReserveCount is the largest OpReserve count validate accepts (validate.go).
const maxReserveCount = 1 << 40

// counterSeq is the simplest Sequence: 1, 2, 3, ...
type counterSeq struct{ n uint64 }

func (c *counterSeq) Next() uint64 { c.n++; return c.n }

// ---- reference model ----

type mHold struct {
	lease  LeaseID
	token  uint64
	holder Holder
	delay  int64
}

type mWaiter struct {
	lease  LeaseID
	holder Holder
	delay  int64
}

type mLock struct {
	class   Class
	held    bool
	hold    mHold
	waiters []mWaiter
	delayed bool
	delayMs int64
}

type model struct {
	// replicated is true when the model stands for State.Apply (only correctness locks,
	// ErrInvalid for anything else); false for a bare Locks table behind tableDriver.
	replicated bool
	limits     Limits
	seq        uint64
	leases     map[LeaseID]int64
	ended      map[LeaseID]EndReason
	locks      map[string]*mLock
	lost       map[LeaseID][]LostLock // a live lease's force-released holds, oldest first
}

func newModel(replicated bool, limits Limits) *model {
	if !replicated {
		limits.MaxLeases = 1 << 62 // a bare table knows no lease limit
	}
	return &model{
		replicated: replicated,
		limits:     limits.withDefaults(),
		leases:     make(map[LeaseID]int64),
		ended:      make(map[LeaseID]EndReason),
		locks:      make(map[string]*mLock),
		lost:       make(map[LeaseID][]LostLock),
	}
}

func (m *model) next() uint64 { m.seq++; return m.seq }

func (m *model) live(id LeaseID) bool { _, ok := m.leases[id]; return ok }

// names returns the names of the locks lease holds or waits for, sorted (a scan: the
// model has no index).
func (m *model) namesOf(lease LeaseID) []string {
	var out []string
	for name, l := range m.locks {
		if l.held && l.hold.lease == lease || slices.ContainsFunc(l.waiters, func(w mWaiter) bool { return w.lease == lease }) {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

func (m *model) sortedNames() []string {
	out := make([]string, 0, len(m.locks))
	for n := range m.locks {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

func (m *model) grantNext(name string, l *mLock, r *Result) {
	if l.held || l.delayed {
		return
	}
	if len(l.waiters) == 0 {
		delete(m.locks, name)
		return
	}
	w := l.waiters[0]
	l.waiters = l.waiters[1:]
	l.held = true
	l.hold = mHold{lease: w.lease, token: m.next(), holder: w.holder, delay: w.delay}
	r.Effects = append(r.Effects, Effect{Kind: EffectGranted, Lease: w.lease, Name: name, Token: l.hold.token})
}

func (m *model) dropIfUnused(name string, l *mLock) {
	if !l.held && !l.delayed && len(l.waiters) == 0 {
		delete(m.locks, name)
	}
}

func (m *model) queued(l *mLock) Result {
	r := Result{Queued: true}
	if l.held {
		r.HolderToken, r.Holder = l.hold.token, l.hold.holder
	}
	return r
}

// apply predicts the outcome of c. Err is one of the package's sentinel errors (the real
// error must match it with errors.Is). ok is false for commands the model does not cover
// (KV and membership); the caller then only checks invariants.
func (m *model) apply(c Command) (r Result, ok bool) {
	invalid := Result{Err: ErrInvalid}
	fail := func(err error) (Result, bool) { return Result{Err: err}, true }
	validName := ValidateName("name", c.Name) == nil
	switch c.Op {
	case OpGrant:
		if c.TTLMillis <= 0 || c.Lease.IsZero() {
			return invalid, true
		}
		if m.live(c.Lease) {
			return fail(ErrLeaseExists)
		}
		if len(m.leases) >= m.limits.MaxLeases {
			return fail(ErrTooManyLeases)
		}
		m.leases[c.Lease] = c.TTLMillis
		return Result{Effects: []Effect{{Kind: EffectLeaseGranted, Lease: c.Lease, TTLMillis: c.TTLMillis}}}, true

	case OpRevoke, OpExpire:
		if c.Lease.IsZero() {
			return invalid, true
		}
		if !m.live(c.Lease) {
			return fail(ErrLeaseNotFound)
		}
		reason := EndRevoked
		if c.Op == OpExpire {
			reason = EndExpired
		}
		for _, name := range m.namesOf(c.Lease) {
			l := m.locks[name]
			if l.held && l.hold.lease == c.Lease {
				l.held = false
				if reason == EndExpired && l.hold.delay > 0 {
					l.delayed, l.delayMs = true, l.hold.delay
					r.Effects = append(r.Effects, Effect{Kind: EffectDelayed, Name: name, DelayMillis: l.hold.delay})
				}
				l.hold = mHold{}
				m.grantNext(name, l, &r)
				continue
			}
			i := slices.IndexFunc(l.waiters, func(w mWaiter) bool { return w.lease == c.Lease })
			l.waiters = slices.Delete(l.waiters, i, i+1)
			r.Effects = append(r.Effects, Effect{Kind: EffectWaitEnded, Lease: c.Lease, Name: name})
			m.dropIfUnused(name, l)
		}
		delete(m.leases, c.Lease)
		delete(m.lost, c.Lease)
		m.ended[c.Lease] = reason
		r.Effects = append(r.Effects, Effect{Kind: EffectLeaseEnded, Lease: c.Lease, Reason: reason})
		return r, true

	case OpAcquire:
		if !validName || c.Class != Correctness && c.Class != Efficiency || c.DelayMillis < 0 ||
			ValidateHolder("holder", c.Holder) != nil || c.Lease.IsZero() {
			return invalid, true
		}
		if m.replicated && c.Class != Correctness {
			return invalid, true
		}
		if !m.live(c.Lease) {
			return fail(ErrLeaseNotFound)
		}
		l := m.locks[c.Name]
		if l != nil {
			if l.class != c.Class {
				return fail(ErrClassConflict)
			}
			if l.held && l.hold.lease == c.Lease {
				return Result{Token: l.hold.token, Again: true}, true
			}
			if slices.ContainsFunc(l.waiters, func(w mWaiter) bool { return w.lease == c.Lease }) {
				r := m.queued(l)
				r.Again = true
				return r, true
			}
		}
		if len(m.namesOf(c.Lease)) >= m.limits.MaxLocksPerLease {
			return fail(ErrTooManyLocks)
		}
		if l == nil {
			l = &mLock{class: c.Class, held: true}
			l.hold = mHold{lease: c.Lease, token: m.next(), holder: c.Holder, delay: c.DelayMillis}
			m.locks[c.Name] = l
			return Result{Token: l.hold.token}, true
		}
		if !c.Wait {
			r := m.queued(l)
			r.Queued, r.Err = false, ErrLockHeld
			return r, true
		}
		if len(l.waiters) >= m.limits.MaxWaitersPerLock {
			return fail(ErrTooManyWaiters)
		}
		l.waiters = append(l.waiters, mWaiter{lease: c.Lease, holder: c.Holder, delay: c.DelayMillis})
		return m.queued(l), true

	case OpRelease:
		if !validName || c.Lease.IsZero() {
			return invalid, true
		}
		if !m.live(c.Lease) {
			return fail(ErrLeaseNotFound)
		}
		l := m.locks[c.Name]
		if l == nil || !l.held || l.hold.lease != c.Lease || l.hold.token != c.Token {
			return fail(ErrNotHolder)
		}
		l.held, l.hold = false, mHold{}
		m.grantNext(c.Name, l, &r)
		return r, true

	case OpCancelWait:
		if !validName || c.Lease.IsZero() {
			return invalid, true
		}
		if !m.live(c.Lease) {
			return fail(ErrLeaseNotFound)
		}
		l := m.locks[c.Name]
		if l == nil {
			return fail(ErrNotWaiting)
		}
		if l.held && l.hold.lease == c.Lease {
			return Result{Token: l.hold.token}, true
		}
		i := slices.IndexFunc(l.waiters, func(w mWaiter) bool { return w.lease == c.Lease })
		if i < 0 {
			return fail(ErrNotWaiting)
		}
		l.waiters = slices.Delete(l.waiters, i, i+1)
		m.dropIfUnused(c.Name, l)
		return Result{}, true

	case OpForceRelease:
		if !validName || len(c.Reason) > MaxReasonLen || !utf8.ValidString(c.Reason) {
			return invalid, true
		}
		r.Token = m.next()
		if l := m.locks[c.Name]; l != nil && l.held {
			lost := append(m.lost[l.hold.lease], LostLock{Name: c.Name, Token: l.hold.token, Reason: c.Reason})
			m.lost[l.hold.lease] = lost[max(0, len(lost)-MaxLostPerLease):]
			r.Released = l.hold.token
			r.Effects = append(r.Effects, Effect{Kind: EffectRevokedHold, Lease: l.hold.lease, Name: c.Name, Token: l.hold.token, Note: c.Reason})
			l.held, l.hold = false, mHold{}
			m.grantNext(c.Name, l, &r)
		}
		return r, true

	case OpEndDelay:
		if !validName || len(c.Reason) > MaxReasonLen {
			return invalid, true
		}
		if l := m.locks[c.Name]; l != nil && l.delayed {
			l.delayed, l.delayMs = false, 0
			m.grantNext(c.Name, l, &r)
		}
		return r, true

	case OpReserve:
		if c.Count == 0 || c.Count > maxReserveCount || m.seq > ^uint64(0)-c.Count {
			return invalid, true
		}
		r.Token = m.seq + 1
		m.seq += c.Count
		return r, true
	}
	return Result{}, false
}

// compareLocks checks that the lock table t holds exactly what the model predicts, lost
// locks included.
func (m *model) compareLocks(t *Locks) error {
	if len(t.lost) != len(m.lost) {
		return fmt.Errorf("table has lost locks for %d leases, model %d", len(t.lost), len(m.lost))
	}
	for id, want := range m.lost {
		if got := t.Lost(id); !slices.Equal(got, want) {
			return fmt.Errorf("lease %s lost %+v, model %+v", id, got, want)
		}
	}
	if t.locks.len() != len(m.locks) {
		return fmt.Errorf("table has %d locks %v, model %d %v", t.locks.len(), t.sortedNames(), len(m.locks), m.sortedNames())
	}
	for name, ml := range m.locks {
		l := t.Get(name)
		if l == nil {
			return fmt.Errorf("lock %q missing from the table", name)
		}
		if l.Class != ml.class || l.Delayed != ml.delayed || l.DelayMillis != ml.delayMs || (l.Hold != nil) != ml.held {
			return fmt.Errorf("lock %q: got class=%v delayed=%v/%d held=%v, model class=%v delayed=%v/%d held=%v",
				name, l.Class, l.Delayed, l.DelayMillis, l.Hold != nil, ml.class, ml.delayed, ml.delayMs, ml.held)
		}
		if ml.held {
			want := Hold{Lease: ml.hold.lease, Token: ml.hold.token, Holder: ml.hold.holder, DelayMillis: ml.hold.delay}
			if *l.Hold != want {
				return fmt.Errorf("lock %q: hold %+v, model %+v", name, *l.Hold, want)
			}
		}
		if len(l.Waiters) != len(ml.waiters) {
			return fmt.Errorf("lock %q: %d waiters %v, model %d", name, len(l.Waiters), l.Waiters, len(ml.waiters))
		}
		for i, w := range ml.waiters {
			if want := (Waiter{Lease: w.lease, Holder: w.holder, DelayMillis: w.delay}); l.Waiters[i] != want {
				return fmt.Errorf("lock %q: waiter %d is %+v, model %+v", name, i, l.Waiters[i], want)
			}
		}
	}
	return nil
}

// compareState checks State s against the model: locks, leases, the sequence and the
// ended-lease reasons.
func (m *model) compareState(s *State) error {
	if err := m.compareLocks(s.locks); err != nil {
		return err
	}
	if s.LastToken() != m.seq {
		return fmt.Errorf("LastToken %d, model %d", s.LastToken(), m.seq)
	}
	if s.NumLeases() != len(m.leases) {
		return fmt.Errorf("%d leases, model %d", s.NumLeases(), len(m.leases))
	}
	for id, ttl := range m.leases {
		if l := s.Lease(id); l == nil || l.TTLMillis != ttl || l.ID != id {
			return fmt.Errorf("lease %s: got %+v, model ttl %d", id, l, ttl)
		}
	}
	for id, why := range m.ended {
		if !m.live(id) && len(m.ended) <= tombstoneCap && s.EndedReason(id) != why {
			return fmt.Errorf("EndedReason(%s) = %v, model %v", id, s.EndedReason(id), why)
		}
	}
	return nil
}

// ---- invariants, independent of the model ----

// checkTable checks the structural invariants of a lock table: the index agrees with the
// locks, holders and waiters are live leases, nobody waits twice or waits for a lock it
// holds, G2 (one exclusive holder, or readers only, or at most a semaphore's limit),
// tokens are not above last and distinct except that the locks of one lock set share
// theirs, lock sets are consistent across their locks, no waiter could be granted (the
// head of every queue is blocked), a lock that is neither held, waited for nor delayed
// does not exist, and the limits hold.
func checkTable(t *Locks, live func(LeaseID) bool, last uint64) error {
	seen := make(map[LeaseID]map[string]struct{})
	note := func(id LeaseID, name string) {
		if seen[id] == nil {
			seen[id] = make(map[string]struct{})
		}
		seen[id][name] = struct{}{}
	}
	type grant struct {
		lease LeaseID
		names []string
	}
	tokens := make(map[uint64]*grant)
	waiting := 0
	for rec := range t.locks.all() {
		name := rec.name
		if t.locks.get(name) != rec {
			return fmt.Errorf("lock %q is not found by its name", name)
		}
		if m := rec.more; m != nil && len(m.waiters) == 0 && len(m.holds) == 0 && m.delay == 0 {
			return fmt.Errorf("lock %q keeps an empty extra part", name)
		}
		l := rec.view()
		waiting += len(l.Waiters)
		if err := ValidateName("name", name); err != nil {
			return fmt.Errorf("lock with invalid name %q", name)
		}
		if l.Class != Efficiency && l.Class != Correctness {
			return fmt.Errorf("lock %q has class %d", name, l.Class)
		}
		if !l.Held() && !l.Delayed && len(l.Waiters) == 0 {
			return fmt.Errorf("lock %q is neither held, waited for nor delayed", name)
		}
		if l.Hold != nil && l.Delayed {
			return fmt.Errorf("lock %q is held exclusively and delayed at once", name)
		}
		if l.Delayed != (l.DelayMillis > 0) {
			return fmt.Errorf("lock %q: delayed=%v with delay %d", name, l.Delayed, l.DelayMillis)
		}
		// G2, on every name.
		switch {
		case l.Hold != nil && len(l.Holds) > 0:
			return fmt.Errorf("lock %q is held exclusively and shared at once", name)
		case l.Limit > 0 && l.Hold != nil:
			return fmt.Errorf("semaphore %q is held exclusively", name)
		case l.Limit > 0 && len(l.Holds) > int(l.Limit):
			return fmt.Errorf("semaphore %q of %d has %d holders", name, l.Limit, len(l.Holds))
		}
		if len(l.Waiters) > t.limits.MaxWaitersPerLock {
			return fmt.Errorf("lock %q has %d waiters, limit %d", name, len(l.Waiters), t.limits.MaxWaitersPerLock)
		}
		holds := l.Holds
		if l.Hold != nil {
			holds = []Hold{*l.Hold}
		}
		holders := make(map[LeaseID]bool)
		for _, h := range holds {
			if !live(h.Lease) {
				return fmt.Errorf("lock %q is held by lease %s, which does not exist", name, h.Lease)
			}
			if h.Token == 0 || h.Token > last {
				return fmt.Errorf("lock %q is held under token %d, last issued %d", name, h.Token, last)
			}
			if holders[h.Lease] {
				return fmt.Errorf("lease %s holds %q twice", h.Lease, name)
			}
			if h.DelayMillis < 0 {
				return fmt.Errorf("lock %q: negative hold delay", name)
			}
			holders[h.Lease] = true
			g := tokens[h.Token]
			if g == nil {
				g = &grant{lease: h.Lease}
				tokens[h.Token] = g
			}
			if g.lease != h.Lease {
				return fmt.Errorf("locks %q and %v are held under the same token %d by two leases", name, g.names, h.Token)
			}
			g.names = append(g.names, name)
			note(h.Lease, name)
		}
		inQueue := make(map[LeaseID]bool)
		for _, w := range l.Waiters {
			if !live(w.Lease) {
				return fmt.Errorf("lock %q is waited for by lease %s, which does not exist", name, w.Lease)
			}
			if inQueue[w.Lease] {
				return fmt.Errorf("lease %s is queued twice for %q", w.Lease, name)
			}
			if holders[w.Lease] {
				return fmt.Errorf("lease %s holds %q and waits for it", w.Lease, name)
			}
			if w.DelayMillis < 0 {
				return fmt.Errorf("lock %q: negative waiter delay", name)
			}
			if (w.Mode == Semaphore) != (l.Limit > 0) {
				return fmt.Errorf("lock %q (limit %d) is waited for in mode %v", name, l.Limit, w.Mode)
			}
			inQueue[w.Lease] = true
			note(w.Lease, name)
		}
		for i, w := range rec.more.waitersOrNil() {
			if s := w.set; s != nil {
				if s.lease != w.lease || s.key != s.locks[0].name || !slices.Contains(s.locks, rec) || len(s.locks) < 2 {
					return fmt.Errorf("lock %q: waiter %d's set %q is not consistent", name, i, s.key)
				}
				for _, o := range s.locks {
					j := o.waiterIndex(w.lease)
					if t.locks.get(o.name) != o || j < 0 || o.more.waiters[j].set != s {
						return fmt.Errorf("lock %q: waiter %d's set %q does not wait for %q", name, i, s.key, o.name)
					}
				}
			}
		}
		if rec.numWaiters() > 0 {
			w := &rec.more.waiters[0]
			if w.set == nil && rec.admits(w.mode) || w.set != nil && setReady(w.set) {
				return fmt.Errorf("lock %q could be granted to its first waiter %s (%v, set %v) but is not", name, w.lease, w.mode, w.set != nil)
			}
		}
	}
	if waiting != t.Waiting() {
		return fmt.Errorf("Waiting() = %d, the queues hold %d", t.Waiting(), waiting)
	}
	for id, lost := range t.lost {
		if !live(id) || len(lost) == 0 || len(lost) > MaxLostPerLease {
			return fmt.Errorf("lease %s (live %v) keeps %d lost locks", id, live(id), len(lost))
		}
		for _, lk := range lost {
			if lk.Token == 0 || lk.Token > last || ValidateName("name", lk.Name) != nil {
				return fmt.Errorf("lease %s keeps a bad lost lock %+v (last token %d)", id, lk, last)
			}
		}
	}
	for tok, g := range tokens {
		set := t.leases[g.lease].sets[tok]
		if len(g.names) > 1 || set != nil {
			var names []string
			for _, l := range set {
				names = append(names, l.name)
			}
			slices.Sort(g.names)
			if !slices.Equal(names, g.names) {
				return fmt.Errorf("token %d is held on %v, the lease's set lists %v", tok, g.names, names)
			}
		}
	}
	if len(seen) != len(t.leases) {
		return fmt.Errorf("index has %d leases, the locks name %d", len(t.leases), len(seen))
	}
	for id, names := range seen {
		indexed, err := leaseIndex(t, id)
		if err != nil {
			return err
		}
		if !reflect.DeepEqual(names, indexed) {
			return fmt.Errorf("index of lease %s is %v, the locks say %v", id, indexed, names)
		}
		if len(names) > t.limits.MaxLocksPerLease {
			return fmt.Errorf("lease %s has %d locks, limit %d", id, len(names), t.limits.MaxLocksPerLease)
		}
	}
	return nil
}

func (m *lockExtra) waitersOrNil() []waiter {
	if m == nil {
		return nil
	}
	return m.waiters
}

// leaseIndex returns the names of the locks the table's index lists for lease, checking
// that each entry points at the record the table holds, with the right position.
func leaseIndex(t *Locks, id LeaseID) (map[string]struct{}, error) {
	ll := t.leases[id]
	if ll == nil {
		return nil, fmt.Errorf("lease %s holds or waits but has no index", id)
	}
	names := make(map[string]struct{})
	for i, l := range ll.held {
		if int(l.pos) != i || t.locks.get(l.name) != l || !l.heldBy(id) {
			return nil, fmt.Errorf("lease %s: held[%d] is %q at pos %d, which it does not hold", id, i, l.name, l.pos)
		}
		names[l.name] = struct{}{}
	}
	if ll.shared != nil && len(ll.shared) == 0 || ll.sets != nil && len(ll.sets) == 0 {
		return nil, fmt.Errorf("lease %s keeps an empty shared or set index", id)
	}
	for l := range ll.shared {
		if t.locks.get(l.name) != l || l.sharedIndex(id) < 0 {
			return nil, fmt.Errorf("lease %s: indexed as holding %q shared, which it does not", id, l.name)
		}
		names[l.name] = struct{}{}
	}
	if ll.waits != nil && len(ll.waits) == 0 {
		return nil, fmt.Errorf("lease %s keeps an empty wait set", id)
	}
	for l := range ll.waits {
		if t.locks.get(l.name) != l || l.waiterIndex(id) < 0 {
			return nil, fmt.Errorf("lease %s: indexed as waiting for %q, which it does not", id, l.name)
		}
		names[l.name] = struct{}{}
	}
	if len(names) != ll.count() {
		return nil, fmt.Errorf("lease %s: index lists a lock twice", id)
	}
	for tok, set := range ll.sets {
		for _, l := range set {
			if got, _, ok := l.holdOf(id); !ok || got != tok || t.locks.get(l.name) != l {
				return nil, fmt.Errorf("lease %s: set %d lists %q, which it does not hold under that token", id, tok, l.name)
			}
		}
	}
	return names, nil
}

// checkState checks checkTable on the correctness table plus the State's own invariants,
// its ledger's and its election history's among them.
func checkState(s *State) error {
	if err := checkTable(s.locks, s.live, s.seq); err != nil {
		return err
	}
	for l := range s.locks.locks.all() {
		if l.class != Correctness {
			return fmt.Errorf("lock %q of class %v in the replicated state", l.name, l.class)
		}
	}
	for id, ttl := range s.leases {
		if id.IsZero() || ttl <= 0 {
			return fmt.Errorf("bad lease entry %s: ttl %d", id, ttl)
		}
	}
	if len(s.tombstones) != len(s.tombs()) || len(s.tombs()) > tombstoneCap {
		return fmt.Errorf("tombstones: %d entries, %d in order, cap %d", len(s.tombstones), len(s.tombs()), tombstoneCap)
	}
	for _, id := range s.tombs() {
		if id.IsZero() {
			return fmt.Errorf("tombstone with the zero lease id")
		}
		if _, ok := s.tombstones[id]; !ok {
			return fmt.Errorf("tombstone order names %s, which is not remembered", id)
		}
	}
	if err := checkLog(&s.ledger.ended); err != nil {
		return fmt.Errorf("ledger: %w", err)
	}
	if err := checkHistory(&s.history); err != nil {
		return fmt.Errorf("election history: %w", err)
	}
	return nil
}

// ---- choices: a seeded PRNG or fuzz bytes ----

type chooser interface {
	// intn returns a value in [0, n).
	intn(n int) int
}

type randChooser struct{ r *rand.Rand }

func (c randChooser) intn(n int) int { return c.r.IntN(n) }

func newRandChooser(seed uint64) randChooser {
	return randChooser{rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

// byteChooser turns fuzz input into choices, one byte per choice; when the input runs
// out every choice is 0 and done is set.
type byteChooser struct {
	b    []byte
	done bool
}

func (c *byteChooser) intn(n int) int {
	if len(c.b) == 0 {
		c.done = true
		return 0
	}
	v := int(c.b[0])
	c.b = c.b[1:]
	return v % n
}

// ---- command generator ----

var genNames = []string{"a", "orders/42", "jobs/nightly:digest", "z@x+1"}

type genSlot struct {
	id LeaseID
}

// generator produces commands that exercise the interesting cases: mostly meaningful
// (releases with the holder's token, cancels by real waiters, end-delays of delayed
// locks), with a share of wrong, stale, unknown and invalid ones. It reads the model
// (never the code under test) to choose.
type generator struct {
	ch         chooser
	m          *model
	slots      []genSlot
	nextID     uint32
	replicated bool // may emit KV, membership and efficiency-class (invalid) commands
	class      Class
}

func newGenerator(ch chooser, m *model, leases int) *generator {
	g := &generator{ch: ch, m: m, slots: make([]genSlot, leases), replicated: m.replicated, class: Correctness}
	if !m.replicated {
		g.class = Efficiency
	}
	for i := range g.slots {
		g.nextID++
		g.slots[i].id = lid(g.nextID)
	}
	return g
}

// lease returns a slot's current lease (live or ended), now and then one never granted.
func (g *generator) lease() LeaseID {
	if g.ch.intn(25) == 0 {
		return lid(1_000_000 + uint32(g.ch.intn(100)))
	}
	return g.slots[g.ch.intn(len(g.slots))].id
}

func (g *generator) name() string {
	if g.replicated && g.ch.intn(60) == 0 {
		return []string{"", "/a", "a//b", "a b"}[g.ch.intn(4)]
	}
	return genNames[g.ch.intn(len(genNames))]
}

func (g *generator) holder(id LeaseID) Holder {
	if g.ch.intn(3) == 0 {
		return Holder{}
	}
	return Holder{Host: fmt.Sprintf("host-%x", id[15]), PID: uint32(id[15]) + 100, Note: "n"}
}

func (g *generator) live() []LeaseID {
	var out []LeaseID
	for _, s := range g.slots {
		if g.m.live(s.id) {
			out = append(out, s.id)
		}
	}
	return out
}

func (g *generator) next() Command {
	w := g.ch.intn(100)
	switch {
	case w < 10: // grant: a new lease in an ended slot, or a duplicate of a live one
		i := g.ch.intn(len(g.slots))
		var dead []int
		for j, s := range g.slots {
			if !g.m.live(s.id) {
				dead = append(dead, j)
			}
		}
		if len(dead) > 0 && g.ch.intn(5) != 0 {
			i = dead[g.ch.intn(len(dead))]
			g.nextID++
			g.slots[i].id = lid(g.nextID)
		}
		ttl := int64(1000 * (1 + g.ch.intn(10)))
		if g.replicated && g.ch.intn(40) == 0 {
			ttl = 0
		}
		return Command{Op: OpGrant, Lease: g.slots[i].id, TTLMillis: ttl}
	case w < 14:
		return Command{Op: OpRevoke, Lease: g.lease()}
	case w < 20:
		return Command{Op: OpExpire, Lease: g.lease()}
	case w < 55:
		id := g.lease()
		c := Command{Op: OpAcquire, Lease: id, Name: g.name(), Class: g.class, Holder: g.holder(id), Wait: g.ch.intn(10) < 6}
		if g.ch.intn(3) == 0 {
			c.DelayMillis = int64(100 * (1 + g.ch.intn(5)))
		}
		if g.ch.intn(30) == 0 {
			if g.class == Correctness {
				c.Class = Efficiency
			} else {
				c.Class = Correctness
			}
		}
		if g.replicated && g.ch.intn(80) == 0 {
			c.DelayMillis = -1
		}
		return c
	case w < 71:
		return g.release()
	case w < 78:
		name := g.name()
		if l := g.m.locks[name]; l != nil && len(l.waiters) > 0 && g.ch.intn(10) < 7 {
			return Command{Op: OpCancelWait, Lease: l.waiters[g.ch.intn(len(l.waiters))].lease, Name: name}
		}
		return Command{Op: OpCancelWait, Lease: g.lease(), Name: name}
	case w < 82:
		return Command{Op: OpForceRelease, Name: g.name(), Reason: fmt.Sprintf("operator %d", g.ch.intn(3))}
	case w < 88:
		var delayed []string
		for _, n := range g.m.sortedNames() {
			if g.m.locks[n].delayed {
				delayed = append(delayed, n)
			}
		}
		if len(delayed) > 0 && g.ch.intn(5) != 0 {
			return Command{Op: OpEndDelay, Name: delayed[g.ch.intn(len(delayed))]}
		}
		return Command{Op: OpEndDelay, Name: g.name()}
	case w < 91:
		n := uint64(1 + g.ch.intn(50))
		if g.replicated && g.ch.intn(30) == 0 {
			n = 0
		}
		return Command{Op: OpReserve, Count: n}
	}
	if !g.replicated {
		return g.release()
	}
	return g.other()
}

// release produces mostly correct releases and a share of wrong ones: wrong token, wrong
// lease, a waiter's lease, a stale token, a lock that is not held.
func (g *generator) release() Command {
	name := g.name()
	l := g.m.locks[name]
	if l == nil || !l.held {
		return Command{Op: OpRelease, Lease: g.lease(), Name: name, Token: uint64(g.ch.intn(int(g.m.seq) + 2))}
	}
	c := Command{Op: OpRelease, Lease: l.hold.lease, Name: name, Token: l.hold.token}
	switch g.ch.intn(10) {
	case 6:
		c.Token = []uint64{l.hold.token + 1, l.hold.token - 1, 0, g.m.seq + 1}[g.ch.intn(4)]
	case 7:
		c.Lease = g.lease()
	case 8:
		if len(l.waiters) > 0 {
			c.Lease = l.waiters[0].lease
		}
	case 9:
		if live := g.live(); len(live) > 0 {
			c.Lease = live[g.ch.intn(len(live))]
		}
	}
	return c
}

// other produces KV and membership commands: not modelled, but they go through the
// snapshot, determinism and failure-leaves-state-unchanged checks.
func (g *generator) other() Command {
	key := []string{"k/1", "k/2", "cfg"}[g.ch.intn(3)]
	switch g.ch.intn(7) {
	case 0, 1, 2:
		c := Command{Op: OpPut, Key: key, Value: []byte{byte(g.ch.intn(256))}}
		g.fence(&c)
		return c
	case 3:
		c := Command{Op: OpDelete, Key: key}
		g.fence(&c)
		return c
	case 4:
		c := Command{Op: OpSetMember, Node: fmt.Sprintf("n%d", g.ch.intn(3)), Addr: fmt.Sprintf("127.0.0.1:%d", 7740+g.ch.intn(3))}
		if g.ch.intn(2) == 0 {
			c.FastLane = fmt.Sprintf("127.0.0.1:%d", 17742+g.ch.intn(3))
		}
		return c
	case 5:
		// Two IDs: the first applied stays, the other fails and changes nothing.
		return Command{Op: OpSetClusterID, ClusterID: []string{testClusterID, otherClusterID}[g.ch.intn(2)]}
	default:
		return Command{Op: OpRemoveMember, Node: fmt.Sprintf("n%d", g.ch.intn(3))}
	}
}

func (g *generator) fence(c *Command) {
	switch g.ch.intn(4) {
	case 0: // a held lock's current token
		name := genNames[g.ch.intn(len(genNames))]
		c.Name = name
		if l := g.m.locks[name]; l != nil && l.held {
			c.Token = l.hold.token
		} else {
			c.Token = uint64(1 + g.ch.intn(int(g.m.seq)+1))
		}
		c.RequireHolder = g.ch.intn(2) == 0
	case 1: // any token, possibly stale
		c.Name = genNames[g.ch.intn(len(genNames))]
		c.Token = uint64(1 + g.ch.intn(int(g.m.seq)+1))
	case 2:
		c.CheckVersion = true
		c.Version = uint64(g.ch.intn(3))
	}
}

// ---- comparing outcomes ----

func effectsEqual(a, b []Effect) bool {
	if len(a) == 0 && len(b) == 0 {
		return true
	}
	return reflect.DeepEqual(a, b)
}

// matchPrediction compares a real Result with the model's prediction.
func matchPrediction(got, want Result) error {
	switch {
	case want.Err == nil && got.Err != nil:
		return fmt.Errorf("unexpected error %w", got.Err)
	case want.Err != nil && !errors.Is(got.Err, want.Err):
		return fmt.Errorf("error %w, want %w", got.Err, want.Err)
	}
	g, w := got, want
	g.Err, w.Err = nil, nil
	g.Effects, w.Effects = nil, nil
	if !reflect.DeepEqual(g, w) {
		return fmt.Errorf("result %+v, want %+v", g, w)
	}
	if !effectsEqual(got.Effects, want.Effects) {
		return fmt.Errorf("effects\n  %+v\nwant\n  %+v", got.Effects, want.Effects)
	}
	return nil
}

// sameResult compares the Results of two States fed the same command.
func sameResult(a, b Result) error {
	if (a.Err == nil) != (b.Err == nil) || a.Err != nil && a.Err.Error() != b.Err.Error() {
		return fmt.Errorf("errors differ: %w vs %w", a.Err, b.Err)
	}
	x, y := a, b
	x.Err, y.Err, x.Effects, y.Effects = nil, nil, nil, nil
	if !reflect.DeepEqual(x, y) || !effectsEqual(a.Effects, b.Effects) {
		return fmt.Errorf("results differ:\n  %+v\n  %+v", a, b)
	}
	return nil
}

// ---- step checks independent of the model ----

type preStep struct {
	last   uint64
	queues map[string][]LeaseID
	holder map[string]LeaseID
	held   map[string]bool
}

func capture(t *Locks, last uint64) preStep {
	p := preStep{last: last, queues: make(map[string][]LeaseID), holder: make(map[string]LeaseID), held: make(map[string]bool)}
	for rec := range t.locks.all() {
		name := rec.name
		l := t.Get(name)
		for _, w := range l.Waiters {
			p.queues[name] = append(p.queues[name], w.Lease)
		}
		if l.Hold != nil {
			p.holder[name], p.held[name] = l.Hold.Lease, true
		}
	}
	return p
}

// checkStep checks what must hold for any step, whatever the model says: tokens issued
// by the step are above every earlier token and rise in effect order; LastToken never
// falls; a grant goes to the earliest still-waiting lease, and only to a lock the step
// freed; an idempotent re-acquire issues nothing.
func checkStep(pre preStep, c Command, r Result, last uint64) error {
	if last < pre.last {
		return fmt.Errorf("LastToken fell from %d to %d", pre.last, last)
	}
	if r.Err != nil {
		if last != pre.last {
			return fmt.Errorf("failed command moved LastToken from %d to %d", pre.last, last)
		}
		return nil
	}
	high := pre.last
	issue := func(tok uint64, what string) error {
		if tok <= high || tok > last {
			return fmt.Errorf("%s token %d is not above %d (last issued before the step %d, now %d)", what, tok, high, pre.last, last)
		}
		high = tok
		return nil
	}
	switch c.Op {
	case OpAcquire:
		if !r.Queued {
			if r.Token > pre.last {
				if err := issue(r.Token, "acquire"); err != nil {
					return err
				}
			} else if !pre.held[c.Name] || pre.holder[c.Name] != c.Lease || last != pre.last {
				return fmt.Errorf("acquire returned old token %d without holding %q", r.Token, c.Name)
			}
		}
	case OpForceRelease:
		if err := issue(r.Token, "fence"); err != nil {
			return err
		}
	case OpReserve:
		if err := issue(r.Token, "reserve"); err != nil {
			return err
		}
		high = r.Token + c.Count - 1
		if last != high {
			return fmt.Errorf("reserve of %d from %d left LastToken at %d", c.Count, r.Token, last)
		}
	}
	granted := make(map[string]bool)
	for _, e := range r.Effects {
		if e.Kind != EffectGranted {
			continue
		}
		if err := issue(e.Token, "granted"); err != nil {
			return err
		}
		if granted[e.Name] {
			return fmt.Errorf("%q granted twice in one step", e.Name)
		}
		granted[e.Name] = true
		// FIFO: the earliest queued lease that this step did not take out of the queue.
		var head LeaseID
		for _, id := range pre.queues[e.Name] {
			if (c.Op == OpRevoke || c.Op == OpExpire) && id == c.Lease {
				continue
			}
			head = id
			break
		}
		if e.Lease != head {
			return fmt.Errorf("%q granted to %s, but the earliest waiter was %s (queue %v)", e.Name, e.Lease, head, pre.queues[e.Name])
		}
		// One holder: the step must have freed the lock.
		if pre.held[e.Name] {
			h := pre.holder[e.Name]
			freed := c.Op == OpRelease && c.Name == e.Name && c.Lease == h ||
				c.Op == OpForceRelease && c.Name == e.Name ||
				(c.Op == OpRevoke || c.Op == OpExpire) && c.Lease == h
			if !freed {
				return fmt.Errorf("%q granted to %s while %s held it (op %v)", e.Name, e.Lease, h, c.Op)
			}
		}
	}
	return nil
}

// ---- the State sequence runner ----

type seqOptions struct {
	steps    int
	leases   int
	limits   Limits
	forkOdds int  // 1 in forkOdds steps starts a restored clone (0: never)
	twin     bool // run a second State from the start and compare
}

// runStateSequence applies a generated command sequence to a State and checks, after
// every step: the model's prediction, the invariants, the step checks, that a failing
// command left the snapshot bytes unchanged, and (optionally) that restored clones and a
// twin produce the same results and bytes.
func runStateSequence(ch chooser, o seqOptions) error {
	s := NewState(o.limits)
	m := newModel(true, o.limits)
	g := newGenerator(ch, m, o.leases)
	var twin *State
	if o.twin {
		twin = NewState(o.limits)
	}
	type clone struct {
		s    *State
		from int
	}
	var clones []clone
	before, err := s.MarshalSnapshot()
	if err != nil {
		return err
	}
	for step := 0; step < o.steps; step++ {
		if bc, ok := ch.(*byteChooser); ok && bc.done {
			break
		}
		if o.forkOdds > 0 && ch.intn(o.forkOdds) == 0 {
			c, err := RestoreState(before, o.limits)
			if err != nil {
				return fmt.Errorf("step %d: restore of a real snapshot: %w", step, err)
			}
			again, err := c.MarshalSnapshot()
			if err != nil {
				return err
			}
			if !bytes.Equal(before, again) {
				return fmt.Errorf("step %d: snapshot -> restore -> snapshot changed the bytes:\n%s\n%s", step, before, again)
			}
			if err := checkState(c); err != nil {
				return fmt.Errorf("step %d: restored state: %w", step, err)
			}
			if len(clones) == 2 { // keep the cost linear: at most two live clones
				clones = clones[1:]
			}
			clones = append(clones, clone{c, step})
		}
		cmd := g.next()
		pre := capture(s.locks, s.LastToken())
		want, modelled := m.apply(cmd)
		r := s.Apply(cmd)
		fail := func(format string, args ...any) error {
			return fmt.Errorf("step %d: %+v: %s", step, cmd, fmt.Sprintf(format, args...))
		}
		if modelled {
			if err := matchPrediction(r, want); err != nil {
				return fail("%v", err)
			}
		}
		after, err := s.MarshalSnapshot()
		if err != nil {
			return fail("marshal: %v", err)
		}
		if r.Err != nil && !bytes.Equal(before, after) {
			return fail("failed with %v but changed the state:\n%s\n%s", r.Err, before, after)
		}
		if err := checkState(s); err != nil {
			return fail("invariant: %v", err)
		}
		if err := checkStep(pre, cmd, r, s.LastToken()); err != nil {
			return fail("%v", err)
		}
		if err := m.compareState(s); err != nil {
			return fail("model: %v", err)
		}
		if twin != nil {
			if err := sameResult(r, twin.Apply(cmd)); err != nil {
				return fail("twin: %v", err)
			}
			tb, err := twin.MarshalSnapshot()
			if err != nil || !bytes.Equal(tb, after) {
				return fail("twin snapshot differs (%v)", err)
			}
		}
		for _, c := range clones {
			if err := sameResult(r, c.s.Apply(cmd)); err != nil {
				return fail("clone restored at step %d: %v", c.from, err)
			}
			cb, err := c.s.MarshalSnapshot()
			if err != nil || !bytes.Equal(cb, after) {
				return fail("clone restored at step %d: snapshot differs (%v)\n%s\n%s", c.from, err, cb, after)
			}
		}
		before = after
	}
	return nil
}

// ---- the bare Locks table, driven the way the leader drives its efficiency table ----

// tableDriver runs a Locks table on its own with a counter Sequence. It keeps the set of
// live leases itself (the table does not), and mirrors State.Apply's lease handling.
type tableDriver struct {
	t    *Locks
	seq  counterSeq
	live map[LeaseID]bool
}

func newTableDriver(limits Limits) *tableDriver {
	return &tableDriver{t: NewLocks(limits), live: make(map[LeaseID]bool)}
}

func (d *tableDriver) apply(c Command) Result {
	notFound := Result{Err: fmt.Errorf("%w: %s", ErrLeaseNotFound, c.Lease)}
	switch c.Op {
	case OpGrant:
		if d.live[c.Lease] {
			return Result{Err: ErrLeaseExists}
		}
		d.live[c.Lease] = true
		return Result{Effects: []Effect{{Kind: EffectLeaseGranted, Lease: c.Lease, TTLMillis: c.TTLMillis}}}
	case OpRevoke, OpExpire:
		if !d.live[c.Lease] {
			return notFound
		}
		var r Result
		d.t.DropLease(c.Lease, c.Op == OpExpire, &d.seq, &r)
		delete(d.live, c.Lease)
		reason := EndRevoked
		if c.Op == OpExpire {
			reason = EndExpired
		}
		r.Effects = append(r.Effects, Effect{Kind: EffectLeaseEnded, Lease: c.Lease, Reason: reason})
		return r
	case OpAcquire:
		if !d.live[c.Lease] {
			return notFound
		}
		return d.t.Acquire(c.acquireArgs(), &d.seq)
	case OpRelease:
		if !d.live[c.Lease] {
			return notFound
		}
		return d.t.Release(c.Lease, c.Name, c.Token, &d.seq)
	case OpCancelWait:
		if !d.live[c.Lease] {
			return notFound
		}
		return d.t.CancelWait(c.Lease, c.Name, &d.seq)
	case OpForceRelease:
		r := Result{Token: d.seq.Next()}
		d.t.ForceRelease(c.Name, c.Reason, &d.seq, &r)
		return r
	case OpEndDelay:
		var r Result
		d.t.EndDelay(c.Name, &d.seq, &r)
		return r
	case OpReserve:
		r := Result{Token: d.seq.n + 1}
		d.seq.n += c.Count
		return r
	}
	return Result{Err: ErrInvalid}
}

// runTableSequence is runStateSequence for a bare Locks table: model, invariants and step
// checks after every step.
func runTableSequence(ch chooser, steps, leases int, limits Limits) error {
	d := newTableDriver(limits)
	m := newModel(false, limits)
	g := newGenerator(ch, m, leases)
	for step := 0; step < steps; step++ {
		if bc, ok := ch.(*byteChooser); ok && bc.done {
			break
		}
		cmd := g.next()
		pre := capture(d.t, d.seq.n)
		want, _ := m.apply(cmd)
		r := d.apply(cmd)
		fail := func(format string, args ...any) error {
			return fmt.Errorf("step %d: %+v: %s", step, cmd, fmt.Sprintf(format, args...))
		}
		if err := matchPrediction(r, want); err != nil {
			return fail("%v", err)
		}
		if err := checkTable(d.t, func(id LeaseID) bool { return d.live[id] }, d.seq.n); err != nil {
			return fail("invariant: %v", err)
		}
		if err := checkStep(pre, cmd, r, d.seq.n); err != nil {
			return fail("%v", err)
		}
		if err := m.compareLocks(d.t); err != nil {
			return fail("model: %v", err)
		}
		if d.seq.n != m.seq {
			return fail("sequence at %d, model %d", d.seq.n, m.seq)
		}
	}
	return nil
}
