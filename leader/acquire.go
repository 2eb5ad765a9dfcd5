package leader

import (
	"context"
	"errors"
	"sync"
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
	// The commit is waited for with ApplyThen, not Apply: when ctx ends first, the
	// command may still commit, and its outcome must still be seen — a place in a queue
	// or a grant made for a caller who has left would otherwise stay, held by a live
	// lease whose owner never heard of it.
	c := &commitWait{done: make(chan struct{})}
	l.log.ApplyThen(acquireCommand(a), func(res core.Result, err error) {
		if c.arrived(res, err) {
			l.abandoned(a, ch, res, err) // the caller had left
		}
	})
	select {
	case <-c.done:
	case <-ctx.Done():
		if !c.leave() {
			return Grant{}, ctx.Err() // the callback undoes what the commit did
		}
		// The outcome came as the caller left: answer it as if it had come first. Were a
		// grant taken back now, a retry of the same acquire, answered with that grant
		// since the outcome came, would have lost it.
	}
	if g, err, done := l.endCorrectness(a, ch, c.res, c.err); done {
		return g, err
	}
	return l.await(ctx, a, ch, c.res)
}

// commitWait hands a commit's outcome to the goroutine waiting for it, unless that
// goroutine left first (its caller's context ended): then whoever comes second — the
// outcome or the leaving — knows it and must undo the outcome.
type commitWait struct {
	mu   sync.Mutex
	res  core.Result
	err  error
	got  bool
	left bool
	done chan struct{}
}

// arrived records the outcome and reports whether the waiter had left.
func (c *commitWait) arrived(res core.Result, err error) (left bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.res, c.err, c.got = res, err, true
	close(c.done)
	return c.left
}

// leave marks the waiter gone and reports whether the outcome had arrived.
func (c *commitWait) leave() (got bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.left = true
	return c.got
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
	l.mu.Lock()
	for _, name := range a.LockNames() {
		l.names.settleLocked(name)
	}
	l.mu.Unlock()
	if err == nil {
		err = l.acquireErr(a, res)
	}
	if err != nil || !res.Queued {
		l.waits.remove(a.Lease, a.Key(), ch)
		return Grant{Token: res.Token, Class: core.Correctness}, err, true
	}
	return Grant{}, nil, false
}

// abandoned takes the commit's outcome of a correctness acquire whose caller has left:
// a grant or a place in a queue that this very acquire made (not one it found made by
// an earlier attempt, res.Again) is undone, unless another attempt of the same acquire
// waits on this node and so owns it.
func (l *Leader) abandoned(a AcquireArgs, ch chan outcome, res core.Result, err error) {
	l.mu.Lock()
	for _, name := range a.LockNames() {
		l.names.settleLocked(name)
	}
	l.mu.Unlock()
	if err != nil || res.Err != nil || res.Again {
		l.waits.remove(a.Lease, a.Key(), ch)
		return
	}
	if res.Queued {
		l.undo(a, ch, 0)
	} else {
		l.undo(a, ch, res.Token)
	}
}

// undo takes back, for an acquire whose caller left, the grant of token (0: its place
// in the queue, and a grant that raced the cancellation), unless another wait of the
// same lease for the name is registered (claimUndo). Until the undo is committed, an
// acquire of the name by the lease fails with ErrUndoing (retried by the client after a
// pause), so that it cannot find, and be answered with, what is being taken back. An
// undo that fails (this node stopped leading) leaves the grant or place to the lease's
// end, as a new leader cannot tell it from any other.
func (l *Leader) undo(a AcquireArgs, ch chan outcome, token uint64) {
	name := a.Key()
	if !l.waits.claimUndo(a.Lease, name, ch) {
		return
	}
	l.obs.Undone()
	finish := func(err error) {
		l.waits.undone(a.Lease, name)
		if err != nil {
			l.lg.Warn("could not undo the acquire of a caller that left; its lease keeps it until it ends",
				"lock", name, "err", err)
		}
	}
	release := func(token uint64) {
		l.log.ApplyThen(releaseCommand(a.Lease, name, token), func(res core.Result, err error) {
			finish(errors.Join(err, ignoreNotHolder(res.Err)))
		})
	}
	// On a goroutine of its own: this may run on the goroutine that hands out commit
	// results, and proposing may wait for raft's queue.
	go func() {
		if token != 0 {
			release(token)
			return
		}
		l.log.ApplyThen(core.Command{Op: core.OpCancelWait, Lease: a.Lease, Name: name}, func(res core.Result, err error) {
			if err == nil && res.Err == nil && res.Token != 0 {
				release(res.Token) // the grant won the race with the cancellation
				return
			}
			finish(errors.Join(err, ignoreNotWaiting(res.Err)))
		})
	}()
}

func ignoreNotHolder(err error) error {
	if errors.Is(err, core.ErrNotHolder) || errors.Is(err, core.ErrLeaseNotFound) {
		return nil
	}
	return err
}

func ignoreNotWaiting(err error) error {
	if errors.Is(err, core.ErrNotWaiting) || errors.Is(err, core.ErrLeaseNotFound) {
		return nil
	}
	return err
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
