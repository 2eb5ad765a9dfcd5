package core

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"unique"
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
	// Mode is what the lease asked for: Exclusive or Shared on a readers-writer lock,
	// Semaphore on a semaphore.
	Mode Mode `json:"mode,omitempty"`
	// Set is set when the lease waits for a lock set: the set's first name. The set's
	// entries in the queues of its locks are those with this lease and this Set.
	Set string `json:"set,omitempty"`
}

// Lock describes one entry of the lock table, as Get, List and DelayedLocks report it and
// as snapshots record it. It is a copy: changing it does not change the table, and the
// table changing does not change it. A lock exists while it is held, waited for or in
// its lock-delay; otherwise it is removed.
type Lock struct {
	Name  string `json:"name"`
	Class Class  `json:"class"`
	// Limit is a semaphore's limit, 0 for a readers-writer lock.
	Limit uint32 `json:"limit,omitempty"`
	// Hold is the exclusive holder's grant, if a lease holds the lock exclusively.
	Hold *Hold `json:"hold,omitempty"`
	// Holds are the shared holders' grants, or a semaphore's, oldest first. A lock
	// never has both Hold and Holds.
	Holds   []Hold   `json:"holds,omitempty"`
	Waiters []Waiter `json:"waiters,omitempty"`
	// Delayed is true while the lock is in its lock-delay after an expiry: nobody may be
	// granted it until OpEndDelay (shared holders that still hold it keep it).
	// DelayMillis is the delay's length, so that a new leader can restart it in full.
	Delayed     bool  `json:"delayed,omitempty"`
	DelayMillis int64 `json:"delayMillis,omitempty"`
}

// Held reports whether any lease holds the lock.
func (l *Lock) Held() bool { return l.Hold != nil || len(l.Holds) > 0 }

// Mode returns the mode the lock is held in: Semaphore for a semaphore, Shared while
// readers hold it, Exclusive otherwise (held exclusively, or free).
func (l *Lock) Mode() Mode {
	switch {
	case l.Limit > 0:
		return Semaphore
	case len(l.Holds) > 0:
		return Shared
	}
	return Exclusive
}

// AcquireArgs are the arguments of Locks.Acquire. The table trusts them to be valid, as
// Command.validate checks an OpAcquire.
type AcquireArgs struct {
	Lease LeaseID
	// Name is the lock, or empty for a lock set.
	Name string
	// Names are a lock set's names (2 to MaxSetNames, in increasing order), nil for one
	// lock. The set is granted all at once, under one token.
	Names []string
	Class Class
	Mode  Mode
	// Limit is a semaphore's limit (Mode Semaphore only).
	Limit       uint32
	Holder      Holder
	Wait        bool
	DelayMillis int64
}

// Key returns the name that stands for the acquire: its lock, or a lock set's first
// name. Release and CancelWait of that name (or any other of the set's) act on the
// whole set.
func (a *AcquireArgs) Key() string {
	if len(a.Names) > 0 {
		return a.Names[0]
	}
	return a.Name
}

// LockNames returns the names the acquire asks for, in increasing order.
func (a *AcquireArgs) LockNames() []string {
	if len(a.Names) > 0 {
		return a.Names
	}
	return []string{a.Name}
}

// lock is the table's record of one lock, laid out for the common case of very many
// plainly held locks (64 bytes): an exclusive hold is inline, its terms are shared with
// every hold on equal terms, and the rarer parts (waiters, shared holds, a running
// lock-delay) sit behind one pointer that is nil for most locks. Records are changed in
// place; a copy of one (SnapshotView) must copy its extra part.
type lock struct {
	name  string
	lease LeaseID    // the exclusive holder's lease
	token uint64     // the exclusive hold's token
	terms terms      // the exclusive hold's holder description and lock-delay; unset when not held exclusively
	more  *lockExtra // nil when nobody waits or holds shared and the lock is not in a lock-delay
	pos   int32      // when held exclusively: the index of this record in its lease's leaseLocks.held
	class Class
	limit uint16 // a semaphore's limit (at most MaxSemaphoreLimit); 0 for a readers-writer lock
}

// holdTerms are what a lease asked for with a hold.
type holdTerms struct {
	holder Holder
	delay  int64
}

// terms refers to a hold's holdTerms, interned (package unique): every hold on equal
// terms shares one copy of them, the locks of one lease as well as the leases of one
// client (which all describe the same host and pid), and the copy goes when its last
// hold does. A million idle leases of a hundred clients keep a hundred descriptions
// instead of a million. The zero terms is unset: not held.
type terms struct{ h unique.Handle[holdTerms] }

func makeTerms(holder Holder, delay int64) terms {
	return terms{unique.Make(holdTerms{holder: holder, delay: delay})}
}

func (t terms) set() bool      { return t != terms{} }
func (t terms) holder() Holder { return t.h.Value().holder }
func (t terms) delay() int64   { return t.h.Value().delay }

// lockExtra is the part of a lock that most locks do not have.
type lockExtra struct {
	waiters []waiter
	holds   []sharedHold // shared or semaphore holds, oldest first
	delay   int64        // > 0 while the lock is in its lock-delay
}

// sharedHold is one hold of a lock held shared or of a semaphore.
type sharedHold struct {
	lease LeaseID
	token uint64
	terms terms
}

// waiter is one place in a lock's queue.
type waiter struct {
	lease  LeaseID
	holder Holder
	delay  int64
	mode   Mode
	set    *setWait // the lock set this place is one of; nil for a single lock
}

// leaseLocks indexes the holds and waits of one lease. It exists while the lease holds
// or waits for at least one lock.
type leaseLocks struct {
	held   []*lock            // exclusive holds, in no particular order; held[l.pos] == l
	shared map[*lock]struct{} // locks held shared or as a semaphore; nil while none
	waits  map[*lock]struct{} // nil while the lease waits for nothing
	sets   map[uint64][]*lock // the lock sets held, by token, each in name order; nil while none
	terms  terms              // the terms of the lease's latest grant, for reuse
}

func (l *lock) held() bool                   { return l.terms.set() }
func (l *lock) heldBy(lease LeaseID) bool    { return l.terms.set() && l.lease == lease }
func (l *lock) delayed() bool                { return l.more != nil && l.more.delay > 0 }
func (ll *leaseLocks) count() int            { return len(ll.held) + len(ll.shared) + len(ll.waits) }
func (ll *leaseLocks) waitsFor(l *lock) bool { _, ok := ll.waits[l]; return ok }

// inUse reports whether any lease holds l.
func (l *lock) inUse() bool { return l.terms.set() || l.more != nil && len(l.more.holds) > 0 }

func (l *lock) numWaiters() int {
	if l.more == nil {
		return 0
	}
	return len(l.more.waiters)
}

// waiterIndex returns the position of lease in l's queue, or -1.
func (l *lock) waiterIndex(lease LeaseID) int {
	if l.more == nil {
		return -1
	}
	return slices.IndexFunc(l.more.waiters, func(w waiter) bool { return w.lease == lease })
}

// sharedIndex returns the position of lease's shared hold of l, or -1.
func (l *lock) sharedIndex(lease LeaseID) int {
	if l.more == nil {
		return -1
	}
	return slices.IndexFunc(l.more.holds, func(h sharedHold) bool { return h.lease == lease })
}

// holdOf returns lease's token for l and the mode it holds l in, if it holds l.
func (l *lock) holdOf(lease LeaseID) (uint64, Mode, bool) {
	if l.heldBy(lease) {
		return l.token, Exclusive, true
	}
	if i := l.sharedIndex(lease); i >= 0 {
		return l.more.holds[i].token, l.sharedMode(), true
	}
	return 0, 0, false
}

// sharedMode is the mode of l's shared holds: Semaphore for a semaphore, else Shared.
func (l *lock) sharedMode() Mode {
	if l.limit > 0 {
		return Semaphore
	}
	return Shared
}

// admits reports whether l can be granted in mode now, queue aside: it is not in a
// lock-delay, and the holds it has leave room.
func (l *lock) admits(mode Mode) bool {
	if l.delayed() {
		return false
	}
	switch mode {
	case Exclusive:
		return !l.inUse()
	case Shared:
		return !l.terms.set()
	default:
		return l.more == nil || len(l.more.holds) < int(l.limit)
	}
}

// conflict checks that an acquire asks for l in l's class and kind.
func (l *lock) conflict(a *AcquireArgs) error {
	if l.class != a.Class {
		return fmt.Errorf("%w: %q is held as %s, asked as %s", ErrClassConflict, l.name, l.class, a.Class)
	}
	if uint32(l.limit) != a.Limit {
		return fmt.Errorf("%w: %q is in use as %s, asked as %s", ErrModeConflict, l.name, kindName(uint32(l.limit)), askedName(a.Mode, a.Limit))
	}
	return nil
}

// extra returns l's extra part, making it.
func (l *lock) extra() *lockExtra {
	if l.more == nil {
		l.more = &lockExtra{}
	}
	return l.more
}

// tidy drops l's extra part when it holds nothing.
func (l *lock) tidy() {
	if m := l.more; m != nil && len(m.waiters) == 0 && len(m.holds) == 0 && m.delay == 0 {
		l.more = nil
	}
}

// view returns the public description of l.
func (l *lock) view() *Lock {
	v := &Lock{}
	l.describe(v, new(Hold), nil, nil)
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

// describe fills v with the public description of l. hold, holds and waiters are
// where it puts the holds and waiters (appending to holds[:0] and waiters[:0]), so that
// a caller describing many locks in turn can reuse them; v refers to them.
func (l *lock) describe(v *Lock, hold *Hold, holds []Hold, waiters []Waiter) ([]Hold, []Waiter) {
	*v = Lock{Name: l.name, Class: l.class, Limit: uint32(l.limit)}
	if l.held() {
		*hold = Hold{Lease: l.lease, Token: l.token, Holder: l.terms.holder(), DelayMillis: l.terms.delay()}
		v.Hold = hold
	}
	m := l.more
	if m == nil {
		return holds, waiters
	}
	holds, waiters = holds[:0], waiters[:0]
	for _, h := range m.holds {
		holds = append(holds, Hold{Lease: h.lease, Token: h.token, Holder: h.terms.holder(), DelayMillis: h.terms.delay()})
	}
	for _, w := range m.waiters {
		pub := Waiter{Lease: w.lease, Holder: w.holder, DelayMillis: w.delay, Mode: w.mode}
		if w.set != nil {
			pub.Set = w.set.key
		}
		waiters = append(waiters, pub)
	}
	if len(holds) > 0 {
		v.Holds = holds
	}
	if len(waiters) > 0 {
		v.Waiters = waiters
	}
	v.Delayed, v.DelayMillis = m.delay > 0, m.delay
	return holds, waiters
}

// Locks is a table of locks — exclusive, shared (readers-writer) and semaphores, and
// lock sets over them — with FIFO queues. It knows which leases exist only through the
// calls its owner makes; it does not check lease liveness itself.
type Locks struct {
	locks   lockIndex // by name
	leases  map[LeaseID]*leaseLocks
	limits  Limits
	waiting int // places in queues over all locks (a lock set has one in each of its locks)
	// lost holds the locks each lease lost to ForceRelease, oldest first. A slice here
	// is replaced when it changes, never changed in place, so Lost's callers and
	// snapshot views may keep it.
	lost map[LeaseID][]LostLock
	// spare holds a few lease indexes that became idle, for the next lease that takes
	// a lock: a lease that takes and releases one lock at a time would otherwise
	// allocate its index (and its held slice) anew for every grant. Memory only: it
	// changes nothing anyone can observe.
	spare []*leaseLocks
	// rec, if set, is called with every event of a change (events.go).
	rec func(Event)
}

// maxSpareLeases bounds Locks.spare.
const maxSpareLeases = 64

// NewLocks returns an empty table with the given limits (zero fields take defaults;
// MaxLocksPerLease is at most math.MaxInt32).
func NewLocks(limits Limits) *Locks {
	limits = limits.withDefaults()
	limits.MaxLocksPerLease = min(limits.MaxLocksPerLease, math.MaxInt32) // lock.pos is an int32
	return &Locks{
		leases: make(map[LeaseID]*leaseLocks),
		limits: limits,
		lost:   make(map[LeaseID][]LostLock),
	}
}

// Waiting returns the number of places in queues over all locks (a lock set waiting
// has one in each of its locks): more than the tokens the table can consume (granting
// them, one token per waiting acquire) without a new Acquire.
func (t *Locks) Waiting() int { return t.waiting }

// Len returns the number of locks in the table.
func (t *Locks) Len() int { return t.locks.len() }

// Has reports whether the table has a lock called name (held, waited for or delayed).
func (t *Locks) Has(name string) bool { return t.locks.get(name) != nil }

// Get returns a copy of the lock called name, or nil.
func (t *Locks) Get(name string) *Lock {
	if l := t.locks.get(name); l != nil {
		return l.view()
	}
	return nil
}

// LeaseLocks returns how many locks the lease holds or waits for (a lock set counts
// each of its names).
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

// HeldBy returns the names of the locks lease holds, in any mode, sorted.
func (t *Locks) HeldBy(lease LeaseID) []string {
	ll := t.leases[lease]
	if ll == nil || len(ll.held)+len(ll.shared) == 0 {
		return nil
	}
	names := make([]string, 0, len(ll.held)+len(ll.shared))
	for _, l := range ll.held {
		names = append(names, l.name)
	}
	for l := range ll.shared {
		names = append(names, l.name)
	}
	slices.Sort(names)
	return names
}

// DelayedLocks returns copies of the locks in their lock-delay, in name order.
func (t *Locks) DelayedLocks() []*Lock {
	var delayed []*lock
	for l := range t.locks.all() {
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
	limit = max(0, min(limit, t.locks.len()+1))
	names := make([]string, 0, min(t.locks.len(), limit+1))
	for l := range t.locks.all() {
		if strings.HasPrefix(l.name, prefix) {
			names = append(names, l.name)
		}
	}
	slices.Sort(names)
	truncated := len(names) > limit
	if truncated {
		names = names[:limit]
	}
	out := make([]*Lock, len(names))
	for i, n := range names {
		out[i] = t.locks.get(n).view()
	}
	return out, truncated
}

// Acquire grants a lock (or a lock set, a.Names) to a.Lease in a.Mode, queues it
// (a.Wait), or fails with ErrLockHeld. It grants at once only when nobody waits for the
// lock and its holds leave room (FIFO: a newcomer never passes a waiter). It is
// idempotent per lease: when the lease already holds the lock (the set) as asked it
// returns the existing token, and when it already waits it reports Queued again
// without a second place in the queue; asking again for something else fails with
// ErrModeConflict or ErrSetConflict. The result's Effects are empty: a grant is
// reported through Result.Token.
//
// A lock of the other class fails with ErrClassConflict. In leasehold that check never
// fires: each table holds one class (State admits only correctness locks, the leader's
// efficiency table only efficiency ones), and names are kept apart across the two
// tables by the leader, which asks before either acquire (leader/class.go). It stays as
// a defence for a table used any other way.
func (t *Locks) Acquire(a AcquireArgs, seq Sequence) Result {
	if len(a.Names) > 0 {
		return t.acquireSet(&a, seq)
	}
	l := t.locks.get(a.Name)
	ll := t.leases[a.Lease]
	if l != nil {
		if err := l.conflict(&a); err != nil {
			return Result{Err: err}
		}
		if ll != nil {
			if r, again := t.again(l, ll, &a); again {
				r.Again = r.Err == nil
				return r
			}
		}
	}
	if ll != nil && ll.count() >= t.limits.MaxLocksPerLease {
		return Result{Err: fmt.Errorf("%w: the limit is %d", ErrTooManyLocks, t.limits.MaxLocksPerLease)}
	}
	if l == nil {
		l = t.newLock(a.Name, &a)
		tok := seq.Next()
		t.grant(l, a.Lease, tok, a.Holder, a.DelayMillis, a.Mode)
		return Result{Token: tok}
	}
	if l.numWaiters() == 0 && l.admits(a.Mode) {
		tok := seq.Next()
		t.grant(l, a.Lease, tok, a.Holder, a.DelayMillis, a.Mode)
		return Result{Token: tok}
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
	t.enqueue(l, waiter{lease: a.Lease, holder: a.Holder, delay: a.DelayMillis, mode: a.Mode})
	return queuedResult(l)
}

// again answers an acquire of l by a lease that already holds or waits for it (and
// reports false when it does neither): the same grant or place when it asks for the
// same, a conflict when it asks for another mode or held l as part of a lock set.
func (t *Locks) again(l *lock, ll *leaseLocks, a *AcquireArgs) (Result, bool) {
	if tok, mode, ok := l.holdOf(a.Lease); ok {
		switch {
		case ll.sets[tok] != nil:
			return Result{Err: fmt.Errorf("%w: %q is held as part of a lock set (token %d)", ErrSetConflict, l.name, tok)}, true
		case mode != a.Mode:
			return Result{Err: fmt.Errorf("%w: the lease holds %q %s, asked %s", ErrModeConflict, l.name, mode, a.Mode)}, true
		}
		return Result{Token: tok}, true
	}
	if !ll.waitsFor(l) {
		return Result{}, false
	}
	switch w := l.more.waiters[l.waiterIndex(a.Lease)]; {
	case w.set != nil:
		return Result{Err: fmt.Errorf("%w: the lease waits for %q as part of a lock set", ErrSetConflict, l.name)}, true
	case w.mode != a.Mode:
		return Result{Err: fmt.Errorf("%w: the lease waits for %q %s, asked %s", ErrModeConflict, l.name, w.mode, a.Mode)}, true
	}
	return queuedResult(l), true
}

// queuedResult describes l's holder for an acquire that waits or failed: the exclusive
// holder, or the oldest shared one.
func queuedResult(l *lock) Result {
	r := Result{Queued: true}
	switch {
	case l.held():
		r.HolderToken, r.Holder = l.token, l.terms.holder()
	case l.more != nil && len(l.more.holds) > 0:
		h := l.more.holds[0]
		r.HolderToken, r.Holder = h.token, h.terms.holder()
	}
	return r
}

// Release gives up lock name held by lease under token (in any mode) and grants the
// next waiters. When the hold is one of a lock set's, the whole set is released.
func (t *Locks) Release(lease LeaseID, name string, token uint64, seq Sequence) Result {
	l := t.locks.get(name)
	if l == nil {
		return Result{Err: fmt.Errorf("%w: %q is not held", ErrNotHolder, name)}
	}
	held, ok := l.token, l.heldBy(lease) // the common case, without holdOf's call
	if !ok {
		held, _, ok = l.holdOf(lease)
	}
	switch {
	case !ok && !l.inUse():
		return Result{Err: fmt.Errorf("%w: %q is not held", ErrNotHolder, name)}
	case !ok:
		return Result{Err: fmt.Errorf("%w: %q is held by another lease", ErrNotHolder, name)}
	case held != token:
		return Result{Err: fmt.Errorf("%w: %q is held under token %d, not %d", ErrNotHolder, name, held, token)}
	}
	var r Result
	ll := t.leases[lease]
	if set := ll.sets[token]; set != nil {
		t.dropSet(ll, lease, token, set, EventReleased, "")
		t.grantEach(set, seq, &r)
		return r
	}
	t.emitHold(EventReleased, l, lease, "")
	t.dropHold(l, ll, lease)
	t.grantNext(l, seq, &r)
	return r
}

// CancelWait takes lease out of name's queue (out of every queue of a lock set that
// name is one of), and grants what that lets through. If the lease already holds the
// lock (the grant raced the cancellation) it returns that grant's token and leaves the
// hold alone.
func (t *Locks) CancelWait(lease LeaseID, name string, seq Sequence) Result {
	l := t.locks.get(name)
	if l == nil {
		return Result{Err: fmt.Errorf("%w: %q", ErrNotWaiting, name)}
	}
	if tok, _, ok := l.holdOf(lease); ok {
		return Result{Token: tok}
	}
	i := l.waiterIndex(lease)
	if i < 0 {
		return Result{Err: fmt.Errorf("%w: %q", ErrNotWaiting, name)}
	}
	var r Result
	w := l.more.waiters[i]
	t.emitWaitEnded(l, w)
	if s := w.set; s != nil {
		for _, m := range s.locks {
			if m != l {
				t.emitWaitEnded(m, w)
			}
			t.unqueue(m, m.waiterIndex(lease))
			t.removeWait(lease, m)
		}
		t.grantEach(s.locks, seq, &r)
		return r
	}
	t.unqueue(l, i)
	t.removeWait(lease, l)
	t.grantNext(l, seq, &r)
	return r
}

// ForceRelease takes lock name away from every holder it has (from a holder of a lock
// set, the whole set), and records each lock taken among its holder's lost locks (see
// LostLock). The caller consumes the fence token; this only reports the released token
// (the highest, when there were several holders) and effects.
func (t *Locks) ForceRelease(name, reason string, seq Sequence, r *Result) {
	l := t.locks.get(name)
	if l == nil || !l.inUse() {
		return
	}
	type grant struct {
		lease LeaseID
		token uint64
	}
	var gone []grant
	if l.held() {
		gone = append(gone, grant{l.lease, l.token})
	} else {
		for _, h := range l.more.holds {
			gone = append(gone, grant{h.lease, h.token})
		}
	}
	freed := []*lock{l}
	for _, g := range gone {
		r.Released = max(r.Released, g.token)
		ll := t.leases[g.lease]
		set := ll.sets[g.token]
		if set == nil {
			t.emitHold(EventForceReleased, l, g.lease, reason)
			t.dropHold(l, ll, g.lease)
			t.addLost(g.lease, LostLock{Name: name, Token: g.token, Reason: reason})
			r.Effects = append(r.Effects, Effect{Kind: EffectRevokedHold, Lease: g.lease, Name: name, Token: g.token, Note: reason})
			continue
		}
		t.dropSet(ll, g.lease, g.token, set, EventForceReleased, reason)
		for _, m := range set {
			t.addLost(g.lease, LostLock{Name: m.name, Token: g.token, Reason: reason})
			r.Effects = append(r.Effects, Effect{Kind: EffectRevokedHold, Lease: g.lease, Name: m.name, Token: g.token, Note: reason})
			if !slices.Contains(freed, m) {
				freed = append(freed, m)
			}
		}
	}
	t.grantEach(freed, seq, r)
}

// addLost appends to lease's lost locks in a new slice, dropping the oldest beyond
// MaxLostPerLease.
func (t *Locks) addLost(lease LeaseID, ll LostLock) {
	old := t.lost[lease]
	keep := old[max(0, len(old)+1-MaxLostPerLease):]
	t.lost[lease] = append(append(make([]LostLock, 0, len(keep)+1), keep...), ll)
}

// EndDelay ends name's lock-delay and grants the next waiters. It is a no-op for a
// lock that is not delayed.
func (t *Locks) EndDelay(name string, seq Sequence, r *Result) {
	l := t.locks.get(name)
	if l == nil || !l.delayed() {
		return
	}
	l.more.delay = 0
	l.tidy()
	t.grantNext(l, seq, r)
}

// DropLease removes every hold and wait of lease, in name order, granting next waiters,
// and forgets the locks it lost. expired selects whether holders' lock-delays apply
// (they do on an expiry and a disconnect, not on a clean revoke).
func (t *Locks) DropLease(lease LeaseID, expired bool, seq Sequence, r *Result) {
	ended := EventRevoked
	if expired {
		ended = EventExpired
	}
	t.dropLease(lease, ended, expired, seq, r)
}

// DropDisconnected is DropLease for a lease whose bound connection ended (G7): its
// holders' lock-delays apply, and its holds end as EventDisconnected.
func (t *Locks) DropDisconnected(lease LeaseID, seq Sequence, r *Result) {
	t.dropLease(lease, EventDisconnected, true, seq, r)
}

// dropLease is DropLease, the holds ending as ended.
func (t *Locks) dropLease(lease LeaseID, ended EventKind, expired bool, seq Sequence, r *Result) {
	delete(t.lost, lease)
	ll := t.leases[lease]
	if ll == nil {
		return
	}
	mine := make([]*lock, 0, ll.count())
	mine = append(mine, ll.held...)
	for l := range ll.shared {
		mine = append(mine, l)
	}
	// The lease's places in queues go first, all of them, so that nothing granted below
	// (a lock set's grant moves the queues of all its locks) can be granted to it.
	var left map[*lock]waiter // the places, for their events (in name order, below)
	if t.rec != nil && len(ll.waits) > 0 {
		left = make(map[*lock]waiter, len(ll.waits))
	}
	for l := range ll.waits {
		i := l.waiterIndex(lease)
		if left != nil {
			left[l] = l.more.waiters[i]
		}
		t.unqueue(l, i)
		mine = append(mine, l)
	}
	slices.SortFunc(mine, compareLockNames)
	// The lease's index goes as a whole: it has no places left, so nothing is granted
	// to it below.
	delete(t.leases, lease)
	for _, l := range mine {
		var delay int64
		switch i := l.sharedIndex(lease); {
		case l.heldBy(lease):
			t.emitHold(ended, l, lease, "")
			delay = l.terms.delay()
			l.lease, l.token, l.terms, l.pos = LeaseID{}, 0, terms{}, 0
		case i >= 0:
			t.emitHold(ended, l, lease, "")
			delay = l.more.holds[i].terms.delay()
			l.more.holds = slices.Delete(l.more.holds, i, i+1)
		default:
			if left != nil {
				t.emitWaitEnded(l, left[l])
			}
			r.Effects = append(r.Effects, Effect{Kind: EffectWaitEnded, Lease: lease, Name: l.name})
			t.grantNext(l, seq, r)
			continue
		}
		if expired && delay > 0 {
			// Several holders of one lock may end with delays: the longest one stands.
			m := l.extra()
			m.delay = max(m.delay, delay)
			r.Effects = append(r.Effects, Effect{Kind: EffectDelayed, Name: l.name, DelayMillis: m.delay})
		}
		l.tidy()
		t.grantNext(l, seq, r)
	}
}

// newLock adds a record for name, of the class and kind a asks for.
func (t *Locks) newLock(name string, a *AcquireArgs) *lock {
	l := &lock{name: name, class: a.Class, limit: uint16(a.Limit)}
	t.locks.put(l)
	return l
}

// enqueue puts w at the back of l's queue.
func (t *Locks) enqueue(l *lock, w waiter) {
	m := l.extra()
	m.waiters = append(m.waiters, w)
	t.waiting++
	t.addWait(w.lease, l)
	if t.rec != nil {
		t.rec(Event{Kind: EventQueued, Name: l.name, Class: l.class, Limit: uint32(l.limit), Holder: w.holder, Mode: w.mode, Position: len(m.waiters)})
	}
}

// unqueue takes place i out of l's queue; the caller updates the lease's index.
func (t *Locks) unqueue(l *lock, i int) {
	l.more.waiters = slices.Delete(l.more.waiters, i, i+1)
	t.waiting--
	l.tidy()
}

func (t *Locks) dropIfUnused(l *lock) {
	if !l.inUse() && l.more == nil {
		t.locks.del(l.name)
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

// grant makes lease a holder of l in mode, which l admits.
func (t *Locks) grant(l *lock, lease LeaseID, token uint64, holder Holder, delay int64, mode Mode) {
	ll := t.lease(lease)
	if !ll.terms.set() || ll.terms.holder() != holder || ll.terms.delay() != delay {
		ll.terms = makeTerms(holder, delay)
	}
	if t.rec != nil {
		// With the interned holder, not the command's: the event may be kept (a watch
		// history of 100,000), and its strings then are the one shared copy.
		t.rec(Event{Kind: EventAcquired, Name: l.name, Class: l.class, Limit: uint32(l.limit), Token: token, Holder: ll.terms.holder(), Mode: mode})
	}
	if mode == Exclusive {
		l.lease, l.token, l.terms = lease, token, ll.terms
		l.pos = int32(len(ll.held))
		ll.held = append(ll.held, l)
		return
	}
	m := l.extra()
	m.holds = append(m.holds, sharedHold{lease: lease, token: token, terms: ll.terms})
	if ll.shared == nil {
		ll.shared = make(map[*lock]struct{})
	}
	ll.shared[l] = struct{}{}
}

// dropHold frees lease's hold of l (in any mode) and takes it out of the lease's index
// ll.
func (t *Locks) dropHold(l *lock, ll *leaseLocks, lease LeaseID) {
	if l.heldBy(lease) {
		last := len(ll.held) - 1
		moved := ll.held[last]
		ll.held[l.pos], moved.pos = moved, l.pos
		ll.held[last] = nil
		ll.held = ll.held[:last]
		if cap(ll.held) > 64 && len(ll.held) < cap(ll.held)/4 {
			ll.held = slices.Clone(ll.held) // give back what a big lease no longer needs
		}
		l.lease, l.token, l.terms, l.pos = LeaseID{}, 0, terms{}, 0
	} else {
		i := l.sharedIndex(lease)
		l.more.holds = slices.Delete(l.more.holds, i, i+1)
		l.tidy()
		delete(ll.shared, l)
		if len(ll.shared) == 0 {
			ll.shared = nil
		}
	}
	t.forgetIfIdle(lease, ll)
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
			// held is empty, shared, waits and sets nil or empty; terms is reused only
			// by a lease with equal terms (grant), so the index is as good as new.
			ll.held, ll.shared, ll.waits, ll.sets = ll.held[:0], nil, nil, nil
			t.spare = append(t.spare, ll)
		}
	}
}

// sortedNames returns every lock name in order.
func (t *Locks) sortedNames() []string {
	names := make([]string, 0, t.locks.len())
	for l := range t.locks.all() {
		names = append(names, l.name)
	}
	slices.Sort(names)
	return names
}

// records returns a copy of every record in the table, in no particular order, sharing
// nothing the table changes in place (a waiter's lock set is never changed once made).
func (t *Locks) records() []lock {
	out := make([]lock, 0, t.locks.len())
	extras, holds := 0, 0
	for l := range t.locks.all() {
		out = append(out, *l)
		if l.more != nil {
			extras++
			holds += len(l.more.holds)
		}
	}
	if extras == 0 {
		return out
	}
	// The extra parts are copied into three allocations rather than three per lock.
	more := make([]lockExtra, 0, extras)
	waiters := make([]waiter, 0, t.waiting)
	shared := make([]sharedHold, 0, holds)
	for i := range out {
		if m := out[i].more; m != nil {
			w, h := len(waiters), len(shared)
			waiters = append(waiters, m.waiters...)
			shared = append(shared, m.holds...)
			more = append(more, lockExtra{waiters: waiters[w:len(waiters):len(waiters)], holds: shared[h:len(shared):len(shared)], delay: m.delay})
			out[i].more = &more[len(more)-1]
		}
	}
	return out
}

func compareLockNames(a, b *lock) int { return strings.Compare(a.name, b.name) }
