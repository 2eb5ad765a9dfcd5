package core

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// Sequence hands out fencing tokens. Next must return a value larger than every value it
// returned before. The replicated State is the sequence for correctness locks; the
// leader backs its efficiency table with blocks reserved through OpReserve.
type Sequence interface {
	Next() uint64
}

// Hold is a lease's grant of a lock.
type Hold struct {
	Lease       LeaseID `json:"lease"`
	Token       uint64  `json:"token"`
	Holder      Holder  `json:"holder,omitzero"`
	DelayMillis int64   `json:"delay,omitempty"`
}

// Waiter is a lease queued for a lock.
type Waiter struct {
	Lease       LeaseID `json:"lease"`
	Holder      Holder  `json:"holder,omitzero"`
	DelayMillis int64   `json:"delay,omitempty"`
}

// Lock describes one entry of the lock table, as Get, List and DelayedLocks report it and
// as snapshots record it. It is a copy: changing it does not change the table, and the
// table changing does not change it. A lock exists while it is held, waited for or in
// its lock-delay; otherwise it is removed.
type Lock struct {
	Name    string   `json:"name"`
	Class   Class    `json:"class"`
	Hold    *Hold    `json:"hold,omitempty"`
	Waiters []Waiter `json:"waiters,omitempty"`
	// Delayed is true while the lock is in its lock-delay after an expiry: it is not held
	// and nobody may be granted it until OpEndDelay. DelayMillis is the delay's length,
	// so that a new leader can restart it in full.
	Delayed     bool  `json:"delayed,omitempty"`
	DelayMillis int64 `json:"delayMillis,omitempty"`
}

// AcquireArgs are the arguments of Locks.Acquire.
type AcquireArgs struct {
	Lease       LeaseID
	Name        string
	Class       Class
	Holder      Holder
	Wait        bool
	DelayMillis int64
}

// lock is the table's record of one lock, laid out for the common case of very many
// plainly held locks (64 bytes): the hold is inline, its terms are shared with the
// lease's other holds, and the rarer parts (waiters, a running lock-delay) sit behind
// one pointer that is nil for most locks. Records are changed in place; a copy of one
// (SnapshotView) must copy its queue.
type lock struct {
	name  string
	lease LeaseID    // the holder's lease, when held
	token uint64     // the hold's token, when held
	terms *holdTerms // the hold's holder description and lock-delay; nil when not held
	queue *lockQueue // nil when nobody waits and the lock is not in a lock-delay
	pos   int32      // when held: the index of this record in its lease's leaseLocks.held
	class Class
}

// holdTerms are what a lease asked for with a hold. A holdTerms is never changed once
// made, so the holds of one lease share one while the lease asks for the same.
type holdTerms struct {
	holder Holder
	delay  int64
}

// lockQueue is the part of a lock that most locks do not have.
type lockQueue struct {
	waiters []Waiter
	delay   int64 // > 0 while the lock is in its lock-delay (and then it is not held)
}

// leaseLocks indexes the holds and waits of one lease. It exists while the lease holds
// or waits for at least one lock.
type leaseLocks struct {
	held  []*lock            // in no particular order; held[l.pos] == l
	waits map[*lock]struct{} // nil while the lease waits for nothing
	terms *holdTerms         // the terms of the lease's latest grant, for reuse
}

func (l *lock) held() bool                   { return l.terms != nil }
func (l *lock) heldBy(lease LeaseID) bool    { return l.terms != nil && l.lease == lease }
func (l *lock) delayed() bool                { return l.queue != nil && l.queue.delay > 0 }
func (ll *leaseLocks) count() int            { return len(ll.held) + len(ll.waits) }
func (ll *leaseLocks) waitsFor(l *lock) bool { _, ok := ll.waits[l]; return ok }

func (l *lock) numWaiters() int {
	if l.queue == nil {
		return 0
	}
	return len(l.queue.waiters)
}

// waiterIndex returns the position of lease in l's queue, or -1.
func (l *lock) waiterIndex(lease LeaseID) int {
	if l.queue == nil {
		return -1
	}
	return slices.IndexFunc(l.queue.waiters, func(w Waiter) bool { return w.Lease == lease })
}

// tidyQueue drops the queue when it holds nothing.
func (l *lock) tidyQueue() {
	if q := l.queue; q != nil && len(q.waiters) == 0 && q.delay == 0 {
		l.queue = nil
	}
}

// view returns the public description of l.
func (l *lock) view() *Lock {
	v := &Lock{Name: l.name, Class: l.class}
	if l.held() {
		v.Hold = &Hold{Lease: l.lease, Token: l.token, Holder: l.terms.holder, DelayMillis: l.terms.delay}
	}
	if q := l.queue; q != nil {
		v.Waiters = slices.Clone(q.waiters)
		v.Delayed, v.DelayMillis = q.delay > 0, q.delay
	}
	return v
}

// LostLock tells a live lease that it lost a lock it held: an operator force-released it.
// The table keeps a lease's lost locks until the lease ends (DropLease), at most
// MaxLostPerLease of them (the oldest go first), so that every keepalive can repeat
// them: a holder that missed one answer, or that now talks to another leader, still
// hears. A holder matches them to its grants by Name and Token, so a repeat is harmless.
type LostLock struct {
	Name   string `json:"name"`
	Token  uint64 `json:"token"`
	Reason string `json:"reason,omitempty"`
}

// MaxLostPerLease bounds how many lost locks the table keeps per lease.
const MaxLostPerLease = 16

// Locks is a table of exclusive locks with FIFO queues. It knows which leases exist only
// through the calls its owner makes; it does not check lease liveness itself.
type Locks struct {
	locks   map[string]*lock
	leases  map[LeaseID]*leaseLocks
	limits  Limits
	waiting int // waiters over all locks
	// lost holds the locks each lease lost to ForceRelease, oldest first. A slice here
	// is replaced when it changes, never changed in place, so Lost's callers and
	// snapshot views may keep it.
	lost map[LeaseID][]LostLock
	// spare holds a few lease indexes that became idle, for the next lease that takes
	// a lock: a lease that takes and releases one lock at a time would otherwise
	// allocate its index (and its held slice) anew for every grant. Memory only: it
	// changes nothing anyone can observe.
	spare []*leaseLocks
}

// maxSpareLeases bounds Locks.spare.
const maxSpareLeases = 64

// NewLocks returns an empty table with the given limits (zero fields take defaults;
// MaxLocksPerLease is at most math.MaxInt32).
func NewLocks(limits Limits) *Locks {
	limits = limits.withDefaults()
	limits.MaxLocksPerLease = min(limits.MaxLocksPerLease, math.MaxInt32) // lock.pos is an int32
	return &Locks{
		locks:  make(map[string]*lock),
		leases: make(map[LeaseID]*leaseLocks),
		limits: limits,
		lost:   make(map[LeaseID][]LostLock),
	}
}

// Waiting returns the number of queued waiters over all locks: the most tokens the table
// can consume (granting them) without a new Acquire.
func (t *Locks) Waiting() int { return t.waiting }

// Len returns the number of locks in the table.
func (t *Locks) Len() int { return len(t.locks) }

// Has reports whether the table has a lock called name (held, waited for or delayed).
func (t *Locks) Has(name string) bool { return t.locks[name] != nil }

// Get returns a copy of the lock called name, or nil.
func (t *Locks) Get(name string) *Lock {
	if l := t.locks[name]; l != nil {
		return l.view()
	}
	return nil
}

// LeaseLocks returns how many locks the lease holds or waits for.
func (t *Locks) LeaseLocks(lease LeaseID) int {
	if ll := t.leases[lease]; ll != nil {
		return ll.count()
	}
	return 0
}

// Lost returns the locks lease lost to ForceRelease while it lived, oldest first (at most
// MaxLostPerLease), or nil. The slice is never changed in place: the caller may keep
// it, and must not modify it.
func (t *Locks) Lost(lease LeaseID) []LostLock { return t.lost[lease] }

// HeldBy returns the names of the locks lease holds, sorted.
func (t *Locks) HeldBy(lease LeaseID) []string {
	ll := t.leases[lease]
	if ll == nil || len(ll.held) == 0 {
		return nil
	}
	names := make([]string, len(ll.held))
	for i, l := range ll.held {
		names[i] = l.name
	}
	slices.Sort(names)
	return names
}

// DelayedLocks returns copies of the locks in their lock-delay, in name order.
func (t *Locks) DelayedLocks() []*Lock {
	var delayed []*lock
	for _, l := range t.locks {
		if l.delayed() {
			delayed = append(delayed, l)
		}
	}
	slices.SortFunc(delayed, compareLockNames)
	var out []*Lock
	for _, l := range delayed {
		out = append(out, l.view())
	}
	return out
}

// List returns copies of up to limit locks whose names start with prefix, in name
// order, and whether more matched.
func (t *Locks) List(prefix string, limit int) ([]*Lock, bool) {
	limit = max(0, min(limit, len(t.locks)+1))
	names := make([]string, 0, min(len(t.locks), limit+1))
	for name := range t.locks {
		if strings.HasPrefix(name, prefix) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	truncated := len(names) > limit
	if truncated {
		names = names[:limit]
	}
	out := make([]*Lock, len(names))
	for i, n := range names {
		out[i] = t.locks[n].view()
	}
	return out, truncated
}

// Acquire grants lock a.Name to a.Lease, queues it (a.Wait), or fails with ErrLockHeld.
// It is idempotent per lease: when the lease already holds the lock it returns the
// existing token, and when it already waits it reports Queued again without a second
// place in the queue. The result's Effects are empty: a grant is reported through
// Result.Token.
//
// A lock of the other class fails with ErrClassConflict. In leasehold that check never
// fires: each table holds one class (State admits only correctness locks, the leader's
// efficiency table only efficiency ones), and names are kept apart across the two
// tables by the leader, which asks before either acquire (leader/class.go). It stays as
// a defence for a table used any other way.
func (t *Locks) Acquire(a AcquireArgs, seq Sequence) Result {
	l := t.locks[a.Name]
	ll := t.leases[a.Lease]
	if l != nil {
		if l.class != a.Class {
			return Result{Err: fmt.Errorf("%w: %q is held as %s, asked as %s", ErrClassConflict, a.Name, l.class, a.Class)}
		}
		if l.heldBy(a.Lease) {
			return Result{Token: l.token}
		}
		if ll != nil && ll.waitsFor(l) {
			return queuedResult(l)
		}
	}
	if ll != nil && ll.count() >= t.limits.MaxLocksPerLease {
		return Result{Err: fmt.Errorf("%w: the limit is %d", ErrTooManyLocks, t.limits.MaxLocksPerLease)}
	}
	if l == nil {
		l = &lock{name: a.Name, class: a.Class}
		t.locks[a.Name] = l
		t.grant(l, a.Lease, seq.Next(), a.Holder, a.DelayMillis)
		return Result{Token: l.token}
	}
	if !a.Wait {
		r := queuedResult(l)
		r.Queued = false
		r.Err = fmt.Errorf("%w: %q", ErrLockHeld, a.Name)
		return r
	}
	if n := l.numWaiters(); n >= t.limits.MaxWaitersPerLock {
		return Result{Err: fmt.Errorf("%w: %q has %d", ErrTooManyWaiters, a.Name, n)}
	}
	if l.queue == nil {
		l.queue = &lockQueue{}
	}
	l.queue.waiters = append(l.queue.waiters, Waiter{Lease: a.Lease, Holder: a.Holder, DelayMillis: a.DelayMillis})
	t.waiting++
	t.addWait(a.Lease, l)
	return queuedResult(l)
}

func queuedResult(l *lock) Result {
	r := Result{Queued: true}
	if l.held() {
		r.HolderToken, r.Holder = l.token, l.terms.holder
	}
	return r
}

// Release gives up lock name held by lease under token and grants the next waiter.
func (t *Locks) Release(lease LeaseID, name string, token uint64, seq Sequence) Result {
	l := t.locks[name]
	switch {
	case l == nil || !l.held():
		return Result{Err: fmt.Errorf("%w: %q is not held", ErrNotHolder, name)}
	case l.lease != lease:
		return Result{Err: fmt.Errorf("%w: %q is held by another lease", ErrNotHolder, name)}
	case l.token != token:
		return Result{Err: fmt.Errorf("%w: %q is held under token %d, not %d", ErrNotHolder, name, l.token, token)}
	}
	t.ungrant(l)
	var r Result
	t.grantNext(l, seq, &r)
	return r
}

// CancelWait takes lease out of name's queue. If the lease already holds the lock (the
// grant raced the cancellation) it returns that grant's token and leaves the hold alone.
func (t *Locks) CancelWait(lease LeaseID, name string) Result {
	l := t.locks[name]
	if l == nil {
		return Result{Err: fmt.Errorf("%w: %q", ErrNotWaiting, name)}
	}
	if l.heldBy(lease) {
		return Result{Token: l.token}
	}
	i := l.waiterIndex(lease)
	if i < 0 {
		return Result{Err: fmt.Errorf("%w: %q", ErrNotWaiting, name)}
	}
	l.queue.waiters = slices.Delete(l.queue.waiters, i, i+1)
	l.tidyQueue()
	t.waiting--
	t.removeWait(lease, l)
	t.dropIfUnused(l)
	return Result{}
}

// ForceRelease takes lock name away from its holder (if any) and records it among the
// holder's lost locks (see LostLock). The caller consumes the fence token; this only
// reports the released token and effects.
func (t *Locks) ForceRelease(name, reason string, seq Sequence, r *Result) {
	l := t.locks[name]
	if l == nil || !l.held() {
		return
	}
	lease, token := l.lease, l.token
	t.ungrant(l)
	t.addLost(lease, LostLock{Name: name, Token: token, Reason: reason})
	r.Released = token
	r.Effects = append(r.Effects, Effect{Kind: EffectRevokedHold, Lease: lease, Name: name, Token: token, Note: reason})
	t.grantNext(l, seq, r)
}

// addLost appends to lease's lost locks in a new slice, dropping the oldest beyond
// MaxLostPerLease.
func (t *Locks) addLost(lease LeaseID, ll LostLock) {
	old := t.lost[lease]
	keep := old[max(0, len(old)+1-MaxLostPerLease):]
	t.lost[lease] = append(append(make([]LostLock, 0, len(keep)+1), keep...), ll)
}

// EndDelay ends name's lock-delay and grants the next waiter. It is a no-op for a lock
// that is not delayed.
func (t *Locks) EndDelay(name string, seq Sequence, r *Result) {
	l := t.locks[name]
	if l == nil || !l.delayed() {
		return
	}
	l.queue.delay = 0
	l.tidyQueue()
	t.grantNext(l, seq, r)
}

// DropLease removes every hold and wait of lease, in name order, granting next waiters,
// and forgets the locks it lost. expired selects whether holders' lock-delays apply
// (they do not on a clean revoke).
func (t *Locks) DropLease(lease LeaseID, expired bool, seq Sequence, r *Result) {
	delete(t.lost, lease)
	ll := t.leases[lease]
	if ll == nil {
		return
	}
	mine := make([]*lock, 0, ll.count())
	mine = append(mine, ll.held...)
	for l := range ll.waits {
		mine = append(mine, l)
	}
	slices.SortFunc(mine, compareLockNames)
	// The lease's index goes as a whole; no grant below can be to this lease, because
	// it never waits for a lock it holds.
	delete(t.leases, lease)
	for _, l := range mine {
		if l.heldBy(lease) {
			delay := l.terms.delay
			l.lease, l.token, l.terms, l.pos = LeaseID{}, 0, nil, 0
			if expired && delay > 0 {
				if l.queue == nil {
					l.queue = &lockQueue{}
				}
				l.queue.delay = delay
				r.Effects = append(r.Effects, Effect{Kind: EffectDelayed, Name: l.name, DelayMillis: delay})
			}
			t.grantNext(l, seq, r)
			continue
		}
		if i := l.waiterIndex(lease); i >= 0 {
			l.queue.waiters = slices.Delete(l.queue.waiters, i, i+1)
			l.tidyQueue()
			t.waiting--
			r.Effects = append(r.Effects, Effect{Kind: EffectWaitEnded, Lease: lease, Name: l.name})
			t.dropIfUnused(l)
		}
	}
}

// grantNext gives a free, undelayed lock to the head of its queue, or removes the lock
// when nobody waits.
func (t *Locks) grantNext(l *lock, seq Sequence, r *Result) {
	if l.held() || l.delayed() {
		return
	}
	if l.numWaiters() == 0 {
		delete(t.locks, l.name)
		return
	}
	w := l.queue.waiters[0]
	l.queue.waiters = slices.Delete(l.queue.waiters, 0, 1)
	l.tidyQueue()
	t.waiting--
	t.leases[w.Lease].unwait(l) // the grant below keeps the lease's index alive
	t.grant(l, w.Lease, seq.Next(), w.Holder, w.DelayMillis)
	r.Effects = append(r.Effects, Effect{Kind: EffectGranted, Lease: w.Lease, Name: l.name, Token: l.token})
}

func (t *Locks) dropIfUnused(l *lock) {
	if !l.held() && l.queue == nil {
		delete(t.locks, l.name)
	}
}

// lease returns the index of lease, creating it.
func (t *Locks) lease(lease LeaseID) *leaseLocks {
	ll := t.leases[lease]
	if ll == nil {
		if n := len(t.spare); n > 0 {
			ll, t.spare[n-1] = t.spare[n-1], nil
			t.spare = t.spare[:n-1]
		} else {
			ll = &leaseLocks{}
		}
		t.leases[lease] = ll
	}
	return ll
}

// grant makes lease the holder of the free lock l.
func (t *Locks) grant(l *lock, lease LeaseID, token uint64, holder Holder, delay int64) {
	ll := t.lease(lease)
	if ll.terms == nil || ll.terms.holder != holder || ll.terms.delay != delay {
		ll.terms = &holdTerms{holder: holder, delay: delay}
	}
	l.lease, l.token, l.terms = lease, token, ll.terms
	l.pos = int32(len(ll.held))
	ll.held = append(ll.held, l)
}

// ungrant frees the held lock l and takes it out of its holder's index.
func (t *Locks) ungrant(l *lock) {
	ll := t.leases[l.lease]
	last := len(ll.held) - 1
	moved := ll.held[last]
	ll.held[l.pos], moved.pos = moved, l.pos
	ll.held[last] = nil
	ll.held = ll.held[:last]
	if cap(ll.held) > 64 && len(ll.held) < cap(ll.held)/4 {
		ll.held = slices.Clone(ll.held) // give back what a big lease no longer needs
	}
	t.forgetIfIdle(l.lease, ll)
	l.lease, l.token, l.terms, l.pos = LeaseID{}, 0, nil, 0
}

func (t *Locks) addWait(lease LeaseID, l *lock) {
	ll := t.lease(lease)
	if ll.waits == nil {
		ll.waits = make(map[*lock]struct{})
	}
	ll.waits[l] = struct{}{}
}

func (t *Locks) removeWait(lease LeaseID, l *lock) {
	ll := t.leases[lease]
	ll.unwait(l)
	t.forgetIfIdle(lease, ll)
}

func (ll *leaseLocks) unwait(l *lock) {
	delete(ll.waits, l)
	if len(ll.waits) == 0 {
		ll.waits = nil
	}
}

func (t *Locks) forgetIfIdle(lease LeaseID, ll *leaseLocks) {
	if ll.count() == 0 {
		delete(t.leases, lease)
		if len(t.spare) < maxSpareLeases && cap(ll.held) <= 8 {
			// held is empty and waits nil or empty; terms is immutable and reused only
			// by a lease with equal terms (grant), so the index is as good as new.
			ll.held, ll.waits = ll.held[:0], nil
			t.spare = append(t.spare, ll)
		}
	}
}

// sortedNames returns every lock name in order.
func (t *Locks) sortedNames() []string {
	names := make([]string, 0, len(t.locks))
	for n := range t.locks {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// restore inserts a lock read from a snapshot (already checked) and indexes it.
func (t *Locks) restore(v *Lock) {
	l := &lock{name: v.Name, class: v.Class}
	t.locks[v.Name] = l
	if h := v.Hold; h != nil {
		t.grant(l, h.Lease, h.Token, h.Holder, h.DelayMillis)
	}
	if len(v.Waiters) > 0 || v.Delayed {
		l.queue = &lockQueue{waiters: v.Waiters, delay: v.DelayMillis}
	}
	for _, w := range v.Waiters {
		t.addWait(w.Lease, l)
	}
	t.waiting += len(v.Waiters)
}

// records returns a copy of every record in the table, in no particular order, sharing
// nothing the table changes in place.
func (t *Locks) records() []lock {
	out := make([]lock, 0, len(t.locks))
	queued := 0
	for _, l := range t.locks {
		out = append(out, *l)
		if l.queue != nil {
			queued++
		}
	}
	if queued == 0 {
		return out
	}
	// The queues are copied into two allocations rather than two per queue.
	queues := make([]lockQueue, 0, queued)
	waiters := make([]Waiter, 0, t.waiting)
	for i := range out {
		if q := out[i].queue; q != nil {
			w := len(waiters)
			waiters = append(waiters, q.waiters...)
			queues = append(queues, lockQueue{waiters: waiters[w:len(waiters):len(waiters)], delay: q.delay})
			out[i].queue = &queues[len(queues)-1]
		}
	}
	return out
}

func compareLockNames(a, b *lock) int { return strings.Compare(a.name, b.name) }
