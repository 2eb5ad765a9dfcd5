package leader

import (
	"context"
	"errors"
	"time"

	"github.com/leasehold/leasehold/core"
)

// Grant is a lock grant.
type Grant struct {
	Token uint64
	Class core.Class
	// Epoch is set for efficiency grants: the in-memory state that holds them.
	Epoch string
}

// AcquireArgs are the arguments of Acquire.
type AcquireArgs struct {
	core.AcquireArgs
	// WaitFor is how long to wait in the queue; 0 tries once. Ignored when Forever.
	WaitFor time.Duration
	Forever bool
}

// Acquire takes a lock for a lease (in a.Mode; or a lock set, a.Names, all at once
// under one token), or queues and waits for it. See the API's LockService.Acquire for
// the contract. Errors: *LeaseGoneError (lease unknown), *LockHeldError (held — for a
// set, naming the first lock that was; after a wait it also matches ErrWaitTimeout),
// core.ErrClassConflict, core.ErrModeConflict, core.ErrSetConflict, core limits,
// ErrNotLeader, and for correctness locks the replication errors (outcome unknown) and
// ctx's error.
func (l *Leader) Acquire(ctx context.Context, a AcquireArgs) (Grant, error) {
	start := l.now()
	a.Wait = a.Forever || a.WaitFor > 0
	var g Grant
	var err error
	if a.Class == core.Efficiency {
		g, err = l.acquireEfficiency(ctx, a)
	} else {
		g, err = l.acquireCorrectness(ctx, a)
	}
	err = l.explained(a, err)
	l.waited(a.Class, start, err)
	return g, err
}

func (l *Leader) acquireCorrectness(ctx context.Context, a AcquireArgs) (Grant, error) {
	if err := ctx.Err(); err != nil {
		return Grant{}, err // nothing proposed
	}
	ch, err := l.beginCorrectness(a)
	if err != nil {
		return Grant{}, err
	}
	// Not Apply(ctx): when ctx ends first the command may still commit, and a place in
	// a queue or a grant made for a caller who has left would stay, held by a live lease
	// whose owner never heard of it. abandoned takes it back.
	res, err, left := l.applyUnlessLeft(ctx, acquireCommand(a), func(res core.Result, err error) {
		l.abandoned(a, ch, res, err)
	})
	if left {
		return Grant{}, err
	}
	if g, err, done := l.endCorrectness(a, ch, res, err); done {
		return g, err
	}
	return l.await(ctx, a, ch, res)
}

// AcquireThen is Acquire without waiting for a correctness lock's commit: it proposes
// the acquire and returns at once; then gets what Acquire would have returned. then runs
// once, on the goroutine that hands out commit results (Log.ApplyThen), so it must not
// block. An acquire that the commit queues waits for its grant on a goroutine of its
// own, ended by ctx as Acquire's wait is; ctx does not cancel the commit itself. An
// efficiency acquire runs as Acquire on a goroutine of its own.
func (l *Leader) AcquireThen(ctx context.Context, a AcquireArgs, then func(Grant, error)) {
	start := l.now()
	a.Wait = a.Forever || a.WaitFor > 0
	if a.Class == core.Efficiency {
		go func() {
			g, err := l.acquireEfficiency(ctx, a)
			err = l.explained(a, err)
			l.waited(a.Class, start, err)
			then(g, err)
		}()
		return
	}
	ch, err := l.beginCorrectness(a)
	if err != nil {
		err = l.explained(a, err)
		l.waited(a.Class, start, err)
		then(Grant{}, err)
		return
	}
	l.log.ApplyThen(acquireCommand(a), func(res core.Result, err error) {
		if ctx.Err() != nil {
			// The caller left while the command committed (its connection closed): it
			// will read no answer, so what the commit did for it is undone.
			l.abandoned(a, ch, res, err)
			err = l.explained(a, ctx.Err())
			l.waited(a.Class, start, err)
			then(Grant{}, err)
			return
		}
		if g, err, done := l.endCorrectness(a, ch, res, err); done {
			err = l.explained(a, err)
			l.waited(a.Class, start, err)
			then(g, err)
			return
		}
		go func() {
			g, err := l.await(ctx, a, ch, res)
			err = l.explained(a, err)
			l.waited(a.Class, start, err)
			then(g, err)
		}()
	})
}

// beginCorrectness checks that a correctness acquire may be proposed, claims the name
// for it (class.go) and registers for the grant of a queued one.
func (l *Leader) beginCorrectness(a AcquireArgs) (chan outcome, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.active {
		return nil, ErrNotLeader
	}
	names := a.LockNames()
	for i, name := range names {
		if err := l.names.claimLocked(name, core.Correctness); err != nil {
			for _, claimed := range names[:i] {
				l.names.settleLocked(claimed)
			}
			return nil, err
		}
	}
	ch, ok := l.waits.addUnlessUndoing(a.Lease, a.Key())
	if !ok {
		for _, name := range names {
			l.names.settleLocked(name)
		}
		return nil, ErrUndoing
	}
	return ch, nil
}

func acquireCommand(a AcquireArgs) core.Command {
	return core.Command{
		Op: core.OpAcquire, Lease: a.Lease, Name: a.Name, Names: a.Names, Class: core.Correctness,
		Mode: a.Mode, Limit: a.Limit, Holder: a.Holder, Wait: a.Wait, DelayMillis: a.DelayMillis,
	}
}

// endCorrectness takes the commit's outcome of a correctness acquire. It reports done
// with the grant or error unless the acquire was queued, which then awaits its grant on
// ch.
func (l *Leader) endCorrectness(a AcquireArgs, ch chan outcome, res core.Result, err error) (Grant, error, bool) {
	l.settleNames(a)
	if err == nil {
		err = l.acquireErr(a, res)
	}
	if err != nil || !res.Queued {
		if !l.waits.answer(a.Lease, a.Key(), ch, err == nil && res.Token != 0) && err == nil {
			// Another attempt's undo is taking back the grant this result reports.
			return Grant{}, ErrUndoing, true
		}
		return Grant{Token: res.Token, Class: core.Correctness}, err, true
	}
	return Grant{}, nil, false
}

// abandoned takes the commit's outcome of a correctness acquire whose caller has left
// (see takeBack).
func (l *Leader) abandoned(a AcquireArgs, ch chan outcome, res core.Result, err error) {
	l.settleNames(a)
	l.abandonedCommit(acquireTakeBack(a), ch, res, err)
}

// settleNames gives back the claims beginCorrectness made on a's names, its commit's
// outcome being in.
func (l *Leader) settleNames(a AcquireArgs) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, name := range a.LockNames() {
		l.names.settleLocked(name)
	}
}

// acquireTakeBack says how to take back what acquire a did.
func acquireTakeBack(a AcquireArgs) takeBack {
	name := a.Key()
	return takeBack{
		lease: a.Lease, key: name, what: "lock", name: name,
		leave: core.Command{Op: core.OpCancelWait, Lease: a.Lease, Name: name},
		end:   func(token uint64) core.Command { return releaseCommand(a.Lease, name, token) },
	}
}

// acquireErr is the error of an acquire's result. It takes Leader.mu only for a lease
// not found, which the efficiency table (knowing no leases) never reports.
func (l *Leader) acquireErr(a AcquireArgs, res core.Result) error {
	switch {
	case res.Err == nil:
		return nil
	case errors.Is(res.Err, core.ErrLockHeld):
		return &LockHeldError{Name: heldName(a, res), HolderToken: res.HolderToken, Holder: res.Holder}
	case errors.Is(res.Err, core.ErrLeaseNotFound):
		return l.gone(a.Lease)
	default:
		return res.Err
	}
}

// heldName is the lock an acquire found held: its one lock, or the first of a lock
// set's that was.
func heldName(a AcquireArgs, res core.Result) string {
	if res.Blocker != "" {
		return res.Blocker
	}
	return a.Key()
}
