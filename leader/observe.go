package leader

import (
	"context"
	"errors"
	"time"

	"github.com/leasehold/leasehold/core"
)

// What the leader measures, for metrics: an acquire from its arrival here to its grant
// or its end without one, and an expiry from the lease's deadline to the apply of its
// Expire, on its own monotonic clock; a hold from its grant to its end, by the ledger's
// times (wall clock, milliseconds), so that nothing is kept per hold beside the ledger's
// start of it. The core knows no clock; the leader times the outcomes and effects it
// acts on anyway, and tells an Observer.

// Observer receives what the leader measures (package metrics implements it). Its methods
// are called on the paths of requests, some with Leader.mu held: each must be cheap (no
// allocation, no lock), must not block and must not call the Leader.
type Observer interface {
	// Waited is called once for each acquire this leader served (Acquire, AcquireThen,
	// and AcquireNow when it grants): d runs from its arrival here to its grant, or to
	// its end without one, and outcome says which. A correctness acquire's d includes
	// its commit.
	Waited(class core.Class, outcome WaitOutcome, d time.Duration)
	// Held is called when a hold ends while this node leads — released, force released,
	// or its lease ended — with how long it was held (once per grant: a lock set's once),
	// in whole milliseconds, by the ledger's times: for a correctness hold, from its
	// grant's proposal to its end's (the proposing leaders' wall clocks, as
	// core.Tenure's StartMillis and EndMillis; a hold granted under an earlier leader
	// counts too, across the two clocks, and never below 0), for an efficiency hold from
	// its grant to its end on this leader's wall clock. Not observed: holds whose grant
	// the ledger did not time (commands of a version before the ledger's times), and
	// efficiency holds lost when this node stops leading.
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
	// Undone is called when this leader starts taking back what a correctness acquire
	// or a campaign did for a caller that had left before its answer (a place in a
	// queue, or a grant or leadership): see undo.go.
	Undone()
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
func (nopObserver) Undone()                                       {}

// OnHoldEnds observes the ends of correctness holds that an applied entry made
// (core.State.OnHoldEnd): replication calls it from its apply goroutine on every node,
// in log order, after OnEffects; only a serving leader observes them. It keeps nothing.
func (l *Leader) OnHoldEnds(ends []core.EndedHold) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.active {
		return
	}
	now := time.Now().UnixMilli()
	for _, e := range ends {
		end := e.EndMillis
		if end == 0 {
			end = now
		}
		l.obs.Held(e.Class, heldFor(e.StartMillis, end))
	}
}

// heldFor is the length of a hold from start to end (Unix milliseconds), 0 when the
// clocks they came from disagree.
func heldFor(start, end int64) time.Duration {
	return time.Duration(max(0, end-start)) * time.Millisecond
}

// leaseEndedLocked observes the end of a lease, applied now for reason; c is its
// countdown if counted (it had one): an expiry this leader proposed is as late as the
// time since the lease's deadline. (The ends of its holds come through the ledgers:
// OnHoldEnds, recordLocked.)
func (l *Leader) leaseEndedLocked(c countdown, counted bool, reason core.EndReason) {
	l.obs.LeaseEnded(reason)
	if !counted {
		return
	}
	if reason == core.EndExpired && c.expiring {
		l.obs.ExpiredLate(l.now() - c.deadline)
	}
}
