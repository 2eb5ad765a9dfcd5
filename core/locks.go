package core

import (
	"fmt"
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

// Lock is one entry of the lock table. A lock exists while it is held, waited for or in
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

// Locks is a table of exclusive locks with FIFO queues. It knows which leases exist only
// through the calls its owner makes; it does not check lease liveness itself.
type Locks struct {
	locks   map[string]*Lock
	byLease map[LeaseID]map[string]struct{} // holds and waits of each lease
	limits  Limits
	waiting int // waiters over all locks
}

// NewLocks returns an empty table with the given limits (zero fields take defaults).
func NewLocks(limits Limits) *Locks {
	return &Locks{
		locks:   make(map[string]*Lock),
		byLease: make(map[LeaseID]map[string]struct{}),
		limits:  limits.withDefaults(),
	}
}

// Waiting returns the number of queued waiters over all locks: the most tokens the table
// can consume (granting them) without a new Acquire.
func (t *Locks) Waiting() int { return t.waiting }

// Len returns the number of locks in the table.
func (t *Locks) Len() int { return len(t.locks) }

// Get returns the lock called name, or nil. The caller must not modify it.
func (t *Locks) Get(name string) *Lock { return t.locks[name] }

// LeaseLocks returns how many locks the lease holds or waits for.
func (t *Locks) LeaseLocks(lease LeaseID) int { return len(t.byLease[lease]) }

// HeldBy returns the names of the locks lease holds, sorted.
func (t *Locks) HeldBy(lease LeaseID) []string {
	var names []string
	for name := range t.byLease[lease] {
		if l := t.locks[name]; l.Hold != nil && l.Hold.Lease == lease {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

// DelayedLocks returns the locks in their lock-delay, in name order.
func (t *Locks) DelayedLocks() []*Lock {
	var out []*Lock
	for _, n := range t.sortedNames() {
		if l := t.locks[n]; l.Delayed {
			out = append(out, l)
		}
	}
	return out
}

// List returns up to limit locks whose names start with prefix, in name order, and
// whether more matched.
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
		out[i] = t.locks[n]
	}
	return out, truncated
}

// Acquire grants lock a.Name to a.Lease, queues it (a.Wait), or fails with ErrLockHeld.
// It is idempotent per lease: when the lease already holds the lock it returns the
// existing token, and when it already waits it reports Queued again without a second
// place in the queue. The result's Effects are empty: a grant is reported through
// Result.Token.
func (t *Locks) Acquire(a AcquireArgs, seq Sequence) Result {
	l := t.locks[a.Name]
	if l != nil {
		if l.Class != a.Class {
			return Result{Err: fmt.Errorf("%w: %q is held as %s, asked as %s", ErrClassConflict, a.Name, l.Class, a.Class)}
		}
		if l.Hold != nil && l.Hold.Lease == a.Lease {
			return Result{Token: l.Hold.Token}
		}
		if slices.ContainsFunc(l.Waiters, func(w Waiter) bool { return w.Lease == a.Lease }) {
			return t.queuedResult(l)
		}
	}
	if len(t.byLease[a.Lease]) >= t.limits.MaxLocksPerLease {
		return Result{Err: fmt.Errorf("%w: the limit is %d", ErrTooManyLocks, t.limits.MaxLocksPerLease)}
	}
	if l == nil {
		l = &Lock{Name: a.Name, Class: a.Class}
		t.locks[a.Name] = l
		l.Hold = &Hold{Lease: a.Lease, Token: seq.Next(), Holder: a.Holder, DelayMillis: a.DelayMillis}
		t.index(a.Lease, a.Name)
		return Result{Token: l.Hold.Token}
	}
	if !a.Wait {
		r := t.queuedResult(l)
		r.Queued = false
		r.Err = fmt.Errorf("%w: %q", ErrLockHeld, a.Name)
		return r
	}
	if len(l.Waiters) >= t.limits.MaxWaitersPerLock {
		return Result{Err: fmt.Errorf("%w: %q has %d", ErrTooManyWaiters, a.Name, len(l.Waiters))}
	}
	l.Waiters = append(l.Waiters, Waiter{Lease: a.Lease, Holder: a.Holder, DelayMillis: a.DelayMillis})
	t.waiting++
	t.index(a.Lease, a.Name)
	return t.queuedResult(l)
}

func (t *Locks) queuedResult(l *Lock) Result {
	r := Result{Queued: true}
	if l.Hold != nil {
		r.HolderToken, r.Holder = l.Hold.Token, l.Hold.Holder
	}
	return r
}

// Release gives up lock name held by lease under token and grants the next waiter.
func (t *Locks) Release(lease LeaseID, name string, token uint64, seq Sequence) Result {
	l := t.locks[name]
	switch {
	case l == nil || l.Hold == nil:
		return Result{Err: fmt.Errorf("%w: %q is not held", ErrNotHolder, name)}
	case l.Hold.Lease != lease:
		return Result{Err: fmt.Errorf("%w: %q is held by another lease", ErrNotHolder, name)}
	case l.Hold.Token != token:
		return Result{Err: fmt.Errorf("%w: %q is held under token %d, not %d", ErrNotHolder, name, l.Hold.Token, token)}
	}
	l.Hold = nil
	t.unindex(lease, name)
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
	if l.Hold != nil && l.Hold.Lease == lease {
		return Result{Token: l.Hold.Token}
	}
	i := slices.IndexFunc(l.Waiters, func(w Waiter) bool { return w.Lease == lease })
	if i < 0 {
		return Result{Err: fmt.Errorf("%w: %q", ErrNotWaiting, name)}
	}
	l.Waiters = slices.Delete(l.Waiters, i, i+1)
	t.waiting--
	t.unindex(lease, name)
	t.dropIfUnused(l)
	return Result{}
}

// ForceRelease takes lock name away from its holder (if any). The caller consumes the
// fence token; this only reports the released token and effects.
func (t *Locks) ForceRelease(name, reason string, seq Sequence, r *Result) {
	l := t.locks[name]
	if l == nil || l.Hold == nil {
		return
	}
	h := l.Hold
	l.Hold = nil
	t.unindex(h.Lease, name)
	r.Released = h.Token
	r.Effects = append(r.Effects, Effect{Kind: EffectRevokedHold, Lease: h.Lease, Name: name, Token: h.Token, Note: reason})
	t.grantNext(l, seq, r)
}

// EndDelay ends name's lock-delay and grants the next waiter. It is a no-op for a lock
// that is not delayed.
func (t *Locks) EndDelay(name string, seq Sequence, r *Result) {
	l := t.locks[name]
	if l == nil || !l.Delayed {
		return
	}
	l.Delayed, l.DelayMillis = false, 0
	t.grantNext(l, seq, r)
}

// DropLease removes every hold and wait of lease, in name order, granting next waiters.
// expired selects whether holders' lock-delays apply (they do not on a clean revoke).
func (t *Locks) DropLease(lease LeaseID, expired bool, seq Sequence, r *Result) {
	names := make([]string, 0, len(t.byLease[lease]))
	for name := range t.byLease[lease] {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		l := t.locks[name]
		if l.Hold != nil && l.Hold.Lease == lease {
			delay := l.Hold.DelayMillis
			l.Hold = nil
			if expired && delay > 0 {
				l.Delayed, l.DelayMillis = true, delay
				r.Effects = append(r.Effects, Effect{Kind: EffectDelayed, Name: name, DelayMillis: delay})
			}
			t.grantNext(l, seq, r)
			continue
		}
		i := slices.IndexFunc(l.Waiters, func(w Waiter) bool { return w.Lease == lease })
		if i >= 0 {
			l.Waiters = slices.Delete(l.Waiters, i, i+1)
			t.waiting--
			r.Effects = append(r.Effects, Effect{Kind: EffectWaitEnded, Lease: lease, Name: name})
			t.dropIfUnused(l)
		}
	}
	delete(t.byLease, lease)
}

// grantNext gives a free, undelayed lock to the head of its queue, or removes the lock
// when nobody waits.
func (t *Locks) grantNext(l *Lock, seq Sequence, r *Result) {
	if l.Hold != nil || l.Delayed {
		return
	}
	if len(l.Waiters) == 0 {
		delete(t.locks, l.Name)
		return
	}
	w := l.Waiters[0]
	l.Waiters = slices.Delete(l.Waiters, 0, 1)
	t.waiting--
	l.Hold = &Hold{Lease: w.Lease, Token: seq.Next(), Holder: w.Holder, DelayMillis: w.DelayMillis}
	r.Effects = append(r.Effects, Effect{Kind: EffectGranted, Lease: w.Lease, Name: l.Name, Token: l.Hold.Token})
}

func (t *Locks) dropIfUnused(l *Lock) {
	if l.Hold == nil && !l.Delayed && len(l.Waiters) == 0 {
		delete(t.locks, l.Name)
	}
}

func (t *Locks) index(lease LeaseID, name string) {
	m := t.byLease[lease]
	if m == nil {
		m = make(map[string]struct{})
		t.byLease[lease] = m
	}
	m[name] = struct{}{}
}

func (t *Locks) unindex(lease LeaseID, name string) {
	m := t.byLease[lease]
	delete(m, name)
	if len(m) == 0 {
		delete(t.byLease, lease)
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

// restore inserts a lock read from a snapshot and rebuilds the lease index.
func (t *Locks) restore(l *Lock) {
	t.locks[l.Name] = l
	if l.Hold != nil {
		t.index(l.Hold.Lease, l.Name)
	}
	for _, w := range l.Waiters {
		t.index(w.Lease, l.Name)
	}
	t.waiting += len(l.Waiters)
}
