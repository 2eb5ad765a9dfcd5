package client

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/internal/reason"
)

// LockOption configures one Lock call.
type LockOption func(*lockOptions)

type lockOptions struct {
	class   leaseholdv1.LockClass
	mode    leaseholdv1.LockMode
	limit   uint32
	ttl     time.Duration
	waitMs  int64 // -1 forever (bounded by ctx), 0 try once
	holder  *Holder
	delayMs int64
	bound   bool
}

// Correctness declares a correctness lock: it protects data. Grants are committed and
// fsynced before the reply, tokens are durable; check the token at the resource.
func Correctness(o *lockOptions) { o.class = leaseholdv1.LockClass_LOCK_CLASS_CORRECTNESS }

// Efficiency declares an efficiency lock: it avoids duplicate work. Grants live in the
// leader's memory (one round trip, no disk write) and are lost, with notice, when the
// leader restarts or changes.
func Efficiency(o *lockOptions) { o.class = leaseholdv1.LockClass_LOCK_CLASS_EFFICIENCY }

// Shared takes the lock shared: any number of Shared holders at once (the readers of a
// readers-writer lock), while nobody holds it exclusively (the default, the writer).
// Queues are FIFO: an exclusive Lock waiting behind readers holds back the Shared
// Locks that come after it, so a writer is never starved. Each reader gets a token of
// its own; see FENCING.md for what it means at a resource. A name held or waited for
// as a semaphore refuses Shared with ErrModeConflict.
func Shared(o *lockOptions) { o.mode, o.limit = leaseholdv1.LockMode_LOCK_MODE_SHARED, 0 }

// Semaphore takes one of n slots of a semaphore (n from 1 to 10,000): up to n holders
// at once, each with its own token, FIFO behind them. Every holder must ask for the
// same n: while the name is held or waited for, another n (or an exclusive or Shared
// Lock of it) fails with ErrModeConflict.
func Semaphore(n int) LockOption {
	return func(o *lockOptions) {
		o.mode, o.limit = leaseholdv1.LockMode_LOCK_MODE_SEMAPHORE, uint32(min(max(n, 0), 1<<31))
	}
}

// TryOnce makes Lock fail at once with ErrNotAcquired when the lock is held.
func TryOnce(o *lockOptions) { o.waitMs = 0 }

// WaitFor makes Lock wait up to d in the server's FIFO queue (default: until ctx ends).
func WaitFor(d time.Duration) LockOption {
	return func(o *lockOptions) { o.waitMs = max(1, d.Milliseconds()) }
}

// LockTTL sets the TTL of the lease this lock hangs on (default: the client's TTL).
// Locks with the same TTL share one lease.
func LockTTL(d time.Duration) LockOption { return func(o *lockOptions) { o.ttl = d } }

// WithNote adds free text to the holder description shown in listings.
func WithNote(note string) LockOption {
	return func(o *lockOptions) {
		h := Holder{}
		if o.holder != nil {
			h = *o.holder
		}
		h.Note = note
		o.holder = &h
	}
}

// ReleaseOnDisconnect hangs the lock on a lease bound to the client's fast-lane
// connection (G7): when the node holding that connection sees it end — this process
// died, the connection broke, or the path to the node was cut for a few seconds — it
// revokes the lease at once, and the lock is free for the next holder, long before
// the TTL would free it. The TTL still applies when no node sees the end (the
// connection's node itself failed). The client gives such a lock up the moment its own
// connection breaks, or stays unacknowledged for 2 s: its Context is cancelled with
// ErrDisconnected, though the server may still hold the lease until its TTL (or until
// a leader change elsewhere is over; the binding survives one). Locks with this
// option and the same TTL share one lease. The lease is bound to the fast-lane
// connection it is granted on; without one (WithoutFastLane, a node without a fast
// lane) it is granted over Connect and bound to a Bind stream instead, which the
// client binds again, within the TTL, when a node ends it (a leader change).
//
// The window: the server may revoke before the client has noticed — a cut path is
// found by the server after Config.BoundIdleTimeout (5 s) of silence, by the client
// after 2 s unacknowledged, so normally the client first; if the client's own checks
// are late (a pause), the next holder's writes carry a higher token, and fencing (G5)
// rejects the late holder's.
func ReleaseOnDisconnect(o *lockOptions) { o.bound = true }

// LockDelay asks that, if this holder's lease expires (not a clean Unlock), nobody may
// take the lock for d. A mitigation for resources that cannot check tokens.
func LockDelay(d time.Duration) LockOption {
	return func(o *lockOptions) { o.delayMs = d.Milliseconds() }
}

// Lock is a held lock. Its methods are safe for concurrent use.
type Lock struct {
	c     *Client
	s     *lease
	name  string
	names []string // a lock set's names, sorted; nil for one lock
	token uint64
	class leaseholdv1.LockClass
	epoch string

	ctx    context.Context
	cancel context.CancelCauseFunc
	once   sync.Once
	mu     sync.Mutex
	cause  error    // why the lock was lost; nil while held
	rel    *release // the background release after an Unlock of unknown outcome
}

// Lock acquires the lock name. A class option (Correctness or Efficiency) is required.
// By default it waits in the server's FIFO queue until the lock is granted or ctx ends;
// TryOnce and WaitFor change that.
//
// Lock is safe to retry: the server treats a repeated acquire by the same lease as the
// same request. Lock itself retries while no server is available, until ctx ends.
//
// Errors: ErrNoClass; *HeldError (matches ErrNotAcquired) when the lock stayed held;
// ErrClassConflict; ErrModeConflict (the name is in use as another mode, see Shared and
// Semaphore); ErrSetConflict (the holder has the name under a LockSet); ErrUnavailable wrapping the last failure when ctx ended while no
// server could be reached; the server's InvalidArgument for a bad name (as a
// *connect.Error); ctx's error.
func (c *Client) Lock(ctx context.Context, name string, opts ...LockOption) (*Lock, error) {
	return c.lock(ctx, &c.own, []string{name}, opts)
}

// LockSet acquires the locks names all at once, under one fencing token, or none of
// them: a lock set. The set waits in the FIFO queue of every name at once and holds
// none of them until it can have all, so two LockSets never deadlock, whatever the
// order of their names; that makes it the way to take several locks, rather than one
// Lock after another. Options are Lock's and apply to every name (Shared takes them
// all shared). The returned Lock stands for the whole set: Names lists the names,
// Token is the set's, Unlock releases every name, and its Context ends when any of
// them is lost (an operator's force release of one name takes the whole set).
//
// LockSet is safe to retry as Lock is. It fails with ErrSetConflict when the holder
// (this Client, or the Session) already holds or waits for one of the names under
// another Lock or LockSet; a set of one name is the same as Lock. Other errors are
// Lock's; *HeldError names the first name that was held.
func (c *Client) LockSet(ctx context.Context, names []string, opts ...LockOption) (*Lock, error) {
	return c.lock(ctx, &c.own, names, opts)
}

// lock is Lock (one name) and LockSet (several) for the holder whose leases are set.
func (c *Client) lock(ctx context.Context, set *leaseSet, names []string, opts []LockOption) (*Lock, error) {
	if len(names) == 0 {
		return nil, ErrNoNames
	}
	o := lockOptions{ttl: c.opts.ttl, waitMs: -1}
	for _, opt := range opts {
		opt(&o)
	}
	if o.class == leaseholdv1.LockClass_LOCK_CLASS_UNSPECIFIED {
		return nil, ErrNoClass
	}
	h := c.opts.holder
	if o.holder != nil {
		h.Note = o.holder.Note
	}
	req := &leaseholdv1.AcquireRequest{
		Class:       o.class,
		Mode:        o.mode,
		Limit:       o.limit,
		Holder:      &leaseholdv1.Holder{Host: h.Host, Pid: h.PID, Note: h.Note},
		WaitMs:      o.waitMs,
		LockDelayMs: o.delayMs,
	}
	if len(names) == 1 {
		req.Name = names[0]
	} else {
		req.Names = names
	}
	b := newBackoff()
	retried := false
	for gone := 0; ; gone++ {
		if gone > 1 && b.sleep(ctx) != nil {
			return nil, ctx.Err() // fresh leases keep vanishing: not at once, then
		}
		s, err := c.leaseFor(ctx, set, leaseKind{ttl: o.ttl, bound: o.bound})
		if err != nil {
			return nil, err
		}
		if err := s.settle(ctx, names); err != nil {
			return nil, err
		}
		if !s.alive() {
			continue // it ended while a release ran: a fresh lease
		}
		req.LeaseId = s.id
		l, err := c.acquire(ctx, s, req)
		if errIsLeaseGone(err) {
			s.end(leaseGoneCause(err))
			continue // a fresh lease, at once
		}
		if errors.Is(err, errLostOnArrival) && ctx.Err() == nil && !retried {
			// The lease lapsed while the Lock waited (the service was out of reach longer
			// than the lease's cautious deadline, a restart say); acquire gave the late
			// grant back. Wait again once, on a fresh lease. A second loss is returned:
			// keepalives are not getting through.
			retried = true
			continue
		}
		if err != nil && ctx.Err() != nil {
			// The lease may be queued, or even granted: take it out in the background.
			s.background(names, func(ctx context.Context) error { return c.abandon(ctx, s, req) })
		}
		return l, err
	}
}

// errLostOnArrival marks a grant that came after its lease had ended on the client
// (Client.lock tries once more on a fresh lease).
var errLostOnArrival = errors.New("the lease ended before the grant arrived")

// acquire takes the lock (or the lock set) of req on lease s, retrying on the next node
// (see call): an Acquire by the same lease is the same request, whatever the attempt.
func (c *Client) acquire(ctx context.Context, s *lease, req *leaseholdv1.AcquireRequest) (*Lock, error) {
	name, names := req.GetName(), req.GetNames()
	if len(names) > 0 {
		names = slices.Clone(names)
		slices.Sort(names)
		name = names[0] // the server releases and cancels a set by any of its names
	}
	p := policy{repeatable: true, wait: time.Duration(req.GetWaitMs()) * time.Millisecond}
	resp, err := call(ctx, c, p, func(ctx context.Context) (*leaseholdv1.AcquireResponse, error) {
		return rpc(ctx, c, c.locks.Acquire, req)
	})
	if err != nil {
		code, d := detail(err)
		switch {
		case code == connect.CodeDeadlineExceeded && d.GetReason() == reason.LockHeld:
			return nil, heldError(name, d)
		case d.GetReason() == reason.ClassConflict:
			return nil, fmt.Errorf("%w: %w", ErrClassConflict, err)
		case d.GetReason() == reason.ModeConflict:
			return nil, fmt.Errorf("%w: %w", ErrModeConflict, err)
		case d.GetReason() == reason.SetConflict:
			return nil, fmt.Errorf("%w: %w", ErrSetConflict, err)
		case ctx.Err() != nil && !errors.Is(err, ErrUnavailable):
			return nil, ctx.Err()
		}
		return nil, err
	}
	l := &Lock{c: c, s: s, name: name, token: resp.GetToken(), class: resp.GetClass(), epoch: resp.GetEpoch()}
	if len(names) > 1 {
		l.names = names
	}
	l.ctx, l.cancel = context.WithCancelCause(context.Background())
	if err := s.add(l); err != nil {
		// The lease ended while we acquired (its deadline passed during a pause, or a
		// keepalive found it gone): the grant is gone or about to be. A Lock whose
		// context is done on arrival is no lock: say why instead.
		l.lost(err)
		// The lease ended here at its cautious deadline, before the service's: the
		// service may still hold the grant. Give it back now (bounded by one attempt), so
		// that the next Lock of the name, on a fresh lease, does not find it held by this
		// very client; if that fails, the lease's end frees it.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.opts.attempt)
		_ = c.releaseGrant(rctx, s, name, l.token)
		cancel()
		return nil, fmt.Errorf("client: lock %q was lost as it was granted (token %d): %w: %w", name, l.token, errLostOnArrival, err)
	}
	return l, nil
}

// Name returns the lock's name; for a lock set, the first of its names in sorted order.
func (l *Lock) Name() string { return l.name }

// Names returns the names the Lock holds, sorted: the names of a lock set, or the one
// name of a Lock. The caller must not change the slice.
func (l *Lock) Names() []string {
	if l.names == nil {
		return []string{l.name}
	}
	return l.names
}

// holds reports whether the Lock holds the lock name.
func (l *Lock) holds(name string) bool {
	return name == l.name || slices.Contains(l.names, name)
}

// Token returns the fencing token of this grant (of a lock set, shared by its names).
// Pass it to the resource with every write; the resource rejects tokens lower than one
// it has already accepted.
func (l *Lock) Token() uint64 { return l.token }

// Context returns a context that is cancelled the moment the lock is known lost, or at
// the cautious local deadline when keepalives go unanswered — whichever comes first —
// and after Unlock. context.Cause(l.Context()) tells why (ErrLeaseExpired,
// ErrLeaseRevoked, ErrLeaseDeadline, ErrReleasedByOperator, ErrStateLost,
// ErrUnlocked, ErrUnlockUnconfirmed, ErrDisconnected). Its Err method checks the deadline against the
// clock on every call, so
// a process resumed after a long pause sees the loss at once, before any timer runs.
func (l *Lock) Context() context.Context { return lockContext{l} }

// Lost reports whether the lock is no longer held, and why.
func (l *Lock) Lost() (bool, error) {
	l.settle()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cause != nil, l.cause
}

// settle makes l lost at once if its lease has ended or its deadline has passed. The
// goroutine that ends a lease (a timer, a keepalive answer) cancels its locks one after
// another after marking it ended; a caller asking about this lock meanwhile must not be
// told it still holds it (G4b: after a pause, a holder resuming beside the lease's timer
// wrote once under a lock already lost).
func (l *Lock) settle() {
	if cause := l.s.endCause(); cause != nil {
		l.lost(cause)
	}
}

func (l *Lock) lost(cause error) {
	l.once.Do(func() {
		l.mu.Lock()
		l.cause = cause
		l.mu.Unlock()
		l.cancel(cause)
	})
}

// Unlock releases the lock. It works even when ctx is already cancelled: it then uses
// a fresh timeout bounded by the lease TTL (after that the lease would be gone anyway).
// Whatever it returns, the lock's Context is done when Unlock returns.
//
// It returns nil when the lock was released by this call; an error wrapping
// ErrLockLost (and the cause) when the lock had been lost before Unlock, or when
// Unlock found it lost (the server answered that the lease does not hold it); an error
// wrapping ErrUnavailable when no server confirmed the release before ctx ended. The
// outcome is then unknown, and the Client goes on releasing in the background until a
// server confirms it or the lease ends (by TTL at the latest); until then a new Lock of
// the name by the same holder waits, so it never gets the old grant back. Calling
// Unlock again waits for that background release and returns its outcome.
//
// A release is repeated on another node when no answer came; when the repeat finds the
// lock no longer held by this lease, the attempt whose answer was lost released it, and
// Unlock returns nil.
func (l *Lock) Unlock(ctx context.Context) error {
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), l.s.ttl)
		defer cancel()
	}
	if lost, cause := l.Lost(); lost {
		l.mu.Lock()
		r := l.rel
		l.mu.Unlock()
		switch {
		case r != nil:
			return r.wait(ctx)
		case errors.Is(cause, ErrUnlocked):
			return nil
		}
		return fmt.Errorf("%w before Unlock: %w", ErrLockLost, cause)
	}
	req := &leaseholdv1.ReleaseRequest{Name: l.name, LeaseId: l.s.id, Token: l.token}
	_, unsure, err := callUnsure(ctx, l.c, repeatable, func(ctx context.Context) (*leaseholdv1.ReleaseResponse, error) {
		return rpc(ctx, l.c, l.c.locks.Release, req)
	})
	if unsure && err != nil && detailReason(err) == reason.NotHolder {
		// An earlier attempt, whose answer was lost, released it.
		err = nil
	}
	// Every Lock of this grant (two Lock calls for one name by one holder share it) ends
	// with it: none may go on believing it holds what was released.
	others := l.s.removeGrant(l.name, l.token)
	end := func(rel *release, cause error) {
		for _, o := range append(others, l) {
			if rel != nil {
				o.mu.Lock()
				o.rel = rel
				o.mu.Unlock()
			}
			o.lost(cause)
		}
	}
	switch {
	case err == nil:
		end(nil, ErrUnlocked)
		return nil
	case errors.Is(err, ErrUnavailable) || ctx.Err() != nil:
		if !errors.Is(err, ErrUnavailable) {
			err = fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		r := l.s.background(l.Names(), func(ctx context.Context) error {
			return l.c.releaseGrant(ctx, l.s, l.name, l.token)
		})
		end(r, fmt.Errorf("%w: %w", ErrUnlockUnconfirmed, err))
		return fmt.Errorf("%w (releasing in the background until confirmed or the lease ends)", err)
	}
	if errIsLeaseGone(err) {
		// The whole lease is gone, not this grant alone: every other lock on it is lost
		// too, now, not at its next keepalive.
		l.s.end(leaseGoneCause(err))
	}
	err = fmt.Errorf("%w (found by Unlock): %w", ErrLockLost, err)
	end(nil, err)
	return err
}

// lockContext is a held lock's context. It is a context.WithCancelCause underneath (so
// context.Cause and derived contexts work) whose Err also checks the lease's cautious
// deadline against the clock.
type lockContext struct{ l *Lock }

func (c lockContext) Deadline() (time.Time, bool) { return time.Time{}, false }
func (c lockContext) Done() <-chan struct{}       { return c.l.ctx.Done() }
func (c lockContext) Value(key any) any {
	if _, ok := key.(leaseDeadlineKey); ok {
		return c.l
	}
	return c.l.ctx.Value(key)
}

// leaseDeadlineKey is the context key LeaseDeadline finds a held lock's Lock by.
type leaseDeadlineKey struct{}

// LeaseDeadline returns the cautious local deadline of the lease under the lock, key
// (Once) or leadership whose Context ctx is or derives from: the moment that context
// will be cancelled unless an acknowledged keepalive moves it later, as things stand
// now. It is for a watchdog that cannot watch the context itself — another process,
// such as the guard `leasehold lock` runs CMD under, which kills CMD at that deadline
// should the process holding the lock stall. ok is false when ctx is not a lock's, or
// the lock is lost.
func LeaseDeadline(ctx context.Context) (deadline time.Time, ok bool) {
	l, _ := ctx.Value(leaseDeadlineKey{}).(*Lock)
	if l == nil {
		return time.Time{}, false
	}
	if lost, _ := l.Lost(); lost {
		return time.Time{}, false
	}
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	return l.s.deadline, l.s.err == nil
}
func (c lockContext) Err() error {
	c.l.settle()
	return c.l.ctx.Err()
}

// abandon takes lease s out of the queue (every queue of a lock set) that the acquire
// req put it in, or releases the grant it got, after a Lock whose outcome was unknown
// gave up; it runs as a background release (see lease.background) until ctx ends with
// the lease. The same Acquire with wait 0 on the same lease returns the lease's grant
// (idempotent) or cancels its place in the queue.
func (c *Client) abandon(ctx context.Context, s *lease, req *leaseholdv1.AcquireRequest) error {
	try := proto.CloneOf(req)
	try.LeaseId, try.WaitMs = s.id, 0
	name := req.GetName()
	if len(req.GetNames()) > 0 {
		name = req.GetNames()[0]
	}
	resp, err := call(ctx, c, repeatable, func(ctx context.Context) (*leaseholdv1.AcquireResponse, error) {
		return rpc(ctx, c, c.locks.Acquire, try)
	})
	if err != nil {
		//nolint:nilerr // not granted (held by another: the wait is cancelled), or the lease ended: nothing to release
		return nil
	}
	if s.holding(name, resp.GetToken()) {
		// The grant is the one another Lock of the name by this holder was given (the
		// same request, as the service sees it): it holds it, and Unlocks it.
		return nil
	}
	return c.releaseGrant(ctx, s, name, resp.GetToken())
}
