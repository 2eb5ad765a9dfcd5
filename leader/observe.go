package leader

import (
	"context"
	"errors"
	"time"

	"github.com/leasehold/leasehold/core"
)

// What the leader measures, for metrics, on its own monotonic clock: an acquire from its
// arrival here to its grant or its end without one, a hold from its grant to its end, an
// expiry from the lease's deadline to the apply of its Expire. The core knows no clock;
// the leader times the outcomes and effects it acts on anyway, and tells an Observer.

// Observer receives what the leader measures (package metrics implements it). Its methods
// are called on the paths of requests, some with Leader.mu held: each must be cheap (no
// allocation, no lock), must not block and must not call the Leader.
type Observer interface {
	// Waited is called once for each acquire this leader served (Acquire, AcquireThen,
	// and AcquireNow when it grants): d runs from its arrival here to its grant, or to
	// its end without one, and outcome says which. A correctness acquire's d includes
	// its commit.
	Waited(class core.Class, outcome WaitOutcome, d time.Duration)
	// Held is called when a hold that this leader saw granted ends — released, force
	// released, or its lease ended — with how long it was held. For a correctness hold,
	// from when the leader learnt of its grant's apply (at the apply for a queued
	// acquire, when the commit's outcome reached its proposer for one granted at once)
	// to the same for its end. Not observed: holds granted before this node began
	// leading, and efficiency holds lost when it stops.
	Held(class core.Class, d time.Duration)
	// Released is called when a holder released a lock.
	Released(class core.Class)
	// ForceReleased is called when a force release took a lock from its holder.
	ForceReleased(class core.Class)
	// LeaseEnded is called when the end of a lease is applied while this node leads.
	LeaseEnded(reason core.EndReason)
	// ExpiredLate is called when an Expire this leader proposed is applied: d is how
	// long after the lease's deadline, on this leader's clock (at least the expiry
	// loop's wake-up and a commit; a retried proposal adds its retries).
	ExpiredLate(d time.Duration)
	// Promoted is called each time this node starts serving as leader.
	Promoted()
}

// WaitOutcome is how an acquire's wait ended (Observer.Waited).
type WaitOutcome uint8

// How an acquire's wait ends.
const (
	// WaitGranted: the lock was granted (at once, or after a wait in its queue).
	WaitGranted WaitOutcome = iota
	// WaitRefused: a try-once acquire found the lock held.
	WaitRefused
	// WaitTimedOut: the lock stayed held for the whole wait.
	WaitTimedOut
	// WaitCancelled: the caller gave up (its context ended).
	WaitCancelled
	// WaitFailed: anything else — its lease ended, leadership was lost, a limit, a class
	// conflict, an unknown commit outcome.
	WaitFailed
)

// WaitOutcomes lists every WaitOutcome, in order.
var WaitOutcomes = []WaitOutcome{WaitGranted, WaitRefused, WaitTimedOut, WaitCancelled, WaitFailed}

func (o WaitOutcome) String() string {
	switch o {
	case WaitGranted:
		return "granted"
	case WaitRefused:
		return "refused"
	case WaitTimedOut:
		return "timeout"
	case WaitCancelled:
		return "cancelled"
	default:
		return "failed"
	}
}

// waitOutcome is the outcome of an acquire that returned err.
func waitOutcome(err error) WaitOutcome {
	switch {
	case err == nil:
		return WaitGranted
	case errors.Is(err, ErrWaitTimeout):
		return WaitTimedOut
	case errors.Is(err, core.ErrLockHeld):
		return WaitRefused
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return WaitCancelled
	default:
		return WaitFailed
	}
}

// now is the time on this leader's monotonic clock, as an offset from Leader.base: one
// clock read (time.Now takes two, the wall clock's and the monotonic one).
func (l *Leader) now() time.Duration { return time.Since(l.base) }

// waited observes an acquire of class that arrived at start (Leader.now) and ended with
// err.
func (l *Leader) waited(class core.Class, start time.Duration, err error) {
	l.obs.Waited(class, waitOutcome(err), l.now()-start)
}

// nopObserver is the Observer of a Leader configured without one.
type nopObserver struct{}

func (nopObserver) Waited(core.Class, WaitOutcome, time.Duration) {}
func (nopObserver) Held(core.Class, time.Duration)                {}
func (nopObserver) Released(core.Class)                           {}
func (nopObserver) ForceReleased(core.Class)                      {}
func (nopObserver) LeaseEnded(core.EndReason)                     {}
func (nopObserver) ExpiredLate(time.Duration)                     {}
func (nopObserver) Promoted()                                     {}

// heldSince is when a hold, the grant of token, began (Leader.now) and its class. A
// token is one grant (a lock set's names share one), never reused.
type heldSince struct {
	token uint64
	at    time.Duration
	class core.Class
}

// holds are a lease's holds that this leader saw granted, on its countdown. Most leases
// hold one lock at a time: it is kept inline, and only the others go into a map. A
// leader keeps one entry per hold it saw granted (a million held locks, a million
// entries), so each is packed into a word (since) and the map's slots hold no pointer.
type holds struct {
	token uint64           // the inline hold's token; 0 when unused
	first since            // the inline hold's start and class
	more  map[uint64]since // by token; nil until a second hold
}

// since is a hold's start (Leader.now, below 2^61 ns: 73 years) shifted left by two,
// with its class in the low two bits.
type since int64

func packSince(at time.Duration, class core.Class) since {
	return since(int64(at)<<2 | int64(class&3))
}

func (s since) hold(token uint64) heldSince {
	return heldSince{token: token, at: time.Duration(int64(s) >> 2), class: core.Class(s & 3)}
}

// add records h unless its token is recorded already (an acquire repeated by its holder
// returns the first grant, which keeps its start).
func (hs *holds) add(h heldSince) {
	if hs.token == h.token {
		return
	}
	if _, ok := hs.more[h.token]; ok {
		return
	}
	if hs.token == 0 {
		hs.token, hs.first = h.token, packSince(h.at, h.class)
		return
	}
	if hs.more == nil {
		hs.more = make(map[uint64]since)
	}
	hs.more[h.token] = packSince(h.at, h.class)
}

// get returns the hold of token.
func (hs *holds) get(token uint64) (heldSince, bool) {
	if hs.token == token && token != 0 {
		return hs.first.hold(token), true
	}
	s, ok := hs.more[token]
	return s.hold(token), ok
}

// take removes and returns the hold of token.
func (hs *holds) take(token uint64) (heldSince, bool) {
	h, ok := hs.get(token)
	if !ok {
		return h, false
	}
	if hs.token == token {
		hs.token, hs.first = 0, 0
	} else {
		delete(hs.more, token)
	}
	return h, true
}

// each calls fn with every hold.
func (hs *holds) each(fn func(heldSince)) {
	if hs.token != 0 {
		fn(hs.first.hold(hs.token))
	}
	for token, s := range hs.more {
		fn(s.hold(token))
	}
}

// grantedLocked notes that lease was granted a hold under token at (Leader.now). A
// lease that does not count down here is not followed: on a follower, or when its end
// was applied first.
func (l *Leader) grantedLocked(lease core.LeaseID, token uint64, class core.Class, at time.Duration) {
	if c := l.leases[lease]; c != nil && token != 0 {
		c.holds.add(heldSince{token: token, at: at, class: class})
	}
}

// endedLocked observes the end of lease's hold under token, if it was followed.
func (l *Leader) endedLocked(lease core.LeaseID, token uint64) {
	if c := l.leases[lease]; c != nil {
		if h, ok := c.holds.take(token); ok {
			l.obs.Held(h.class, l.now()-h.at)
		}
	}
}

// leaseEndedLocked observes the end of a lease, applied now for reason; c is its
// countdown (nil if it had none): the holds it still had end, and an expiry this leader
// proposed is as late as the time since the lease's deadline.
func (l *Leader) leaseEndedLocked(c *countdown, reason core.EndReason) {
	l.obs.LeaseEnded(reason)
	if c == nil {
		return
	}
	now := l.now()
	c.holds.each(func(h heldSince) { l.obs.Held(h.class, now-h.at) })
	if reason == core.EndExpired && c.expiring {
		l.obs.ExpiredLate(l.now() - c.deadline)
	}
}
