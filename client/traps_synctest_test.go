package client

// Client traps found under faults (issue #14, item 5), each pinned under
// testing/synctest against a fake server that keeps the one piece of lock state that
// matters here: which lease holds each name, under which token.

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"connectrpc.com/connect"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/api/leasehold/v1/leaseholdv1connect"
	"github.com/leasehold/leasehold/internal/reason"
)

// trapServer is a fakeServer whose Acquire and Release keep grants as the real server
// does: an Acquire by the lease that holds the name returns its grant (idempotent), a
// free name gets the next token. release decides each Release's fate: whether it takes
// effect and the error answered (nil: acknowledged).
type trapServer struct {
	*fakeServer
	acquireDelay time.Duration
	// slowAcquires, if set, limits acquireDelay to the first slowAcquires acquires.
	slowAcquires int
	acquires     int

	gmu      sync.Mutex
	held     map[string]uint64 // name → token (the one lease of the fake)
	next     uint64
	releases int
	release  func(i int) (effect bool, err error)
}

func (f *trapServer) Acquire(ctx context.Context, req *leaseholdv1.AcquireRequest) (*leaseholdv1.AcquireResponse, error) {
	f.gmu.Lock()
	f.acquires++
	slow := f.acquireDelay > 0 && (f.slowAcquires == 0 || f.acquires <= f.slowAcquires)
	f.gmu.Unlock()
	if slow {
		select {
		case <-time.After(f.acquireDelay):
		case <-ctx.Done():
			return nil, connect.NewError(connect.CodeDeadlineExceeded, ctx.Err())
		}
	}
	f.gmu.Lock()
	defer f.gmu.Unlock()
	tok, ok := f.held[req.GetName()]
	if !ok {
		f.next++
		tok = f.next
		f.held[req.GetName()] = tok
	}
	return &leaseholdv1.AcquireResponse{Token: tok, Class: leaseholdv1.LockClass_LOCK_CLASS_CORRECTNESS}, nil
}

func (f *trapServer) Release(ctx context.Context, req *leaseholdv1.ReleaseRequest) (*leaseholdv1.ReleaseResponse, error) {
	time.Sleep(10 * time.Millisecond)
	f.gmu.Lock()
	i := f.releases
	f.releases++
	effect, err := f.release(i)
	if f.held[req.GetName()] != req.GetToken() {
		f.gmu.Unlock()
		return nil, reasonError(connect.CodeFailedPrecondition, reason.NotHolder)
	}
	if effect {
		delete(f.held, req.GetName())
	}
	f.gmu.Unlock()
	if effect && err != nil {
		// Released, and the answer is lost: the caller hears nothing until it gives up.
		select {
		case <-ctx.Done():
		case <-f.quit:
		}
		return nil, connect.NewError(connect.CodeDeadlineExceeded, ctx.Err())
	}
	return &leaseholdv1.ReleaseResponse{}, err
}

func (f *trapServer) holds(name string) (uint64, bool) {
	f.gmu.Lock()
	defer f.gmu.Unlock()
	tok, ok := f.held[name]
	return tok, ok
}

// reasonError is a Connect error with code and the server's ErrorDetail reason.
func reasonError(code connect.Code, r string) error {
	e := connect.NewError(code, errors.New("fake: "+r))
	if d, err := connect.NewErrorDetail(&leaseholdv1.ErrorDetail{Reason: r}); err == nil {
		e.AddDetail(d)
	}
	return e
}

// trapClient returns a Client whose server is f, closed when the test ends.
func trapClient(t *testing.T, f *trapServer) *Client {
	t.Helper()
	f.held = make(map[string]uint64)
	if f.release == nil {
		f.release = func(int) (bool, error) { return true, nil }
	}
	return fakeClient(t, f.fakeServer, f)
}

func acked(int) (time.Duration, error) { return 0, nil }

var unavailableErr = connect.NewError(connect.CodeUnavailable, errors.New("fake: no leader"))

// TestUnlockUnavailableReleasesInBackground: an Unlock that no server confirms
// returns ErrUnavailable, its lock's Context is done at once (ErrUnlockUnconfirmed),
// the Client goes on releasing until the server confirms it, and meanwhile a new Lock
// of the name never gets the old grant back: it waits, and then gets a new token. It
// holds whether the unconfirmed attempts took effect (the answer was lost) or not.
func TestUnlockUnavailableReleasesInBackground(t *testing.T) {
	for _, tc := range []struct {
		name   string
		effect bool
	}{{"release never arrived", false}, {"released, answer lost", true}} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var down sync.Mutex
				failing := true
				f := &trapServer{fakeServer: &fakeServer{ttl: time.Minute, answer: acked}}
				f.release = func(int) (bool, error) {
					down.Lock()
					defer down.Unlock()
					if failing {
						return tc.effect, unavailableErr
					}
					return true, nil
				}
				c := trapClient(t, f)
				ctx := context.Background()
				l, err := c.Lock(ctx, "trap/a", Correctness)
				if err != nil {
					t.Fatal(err)
				}
				uctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				err = l.Unlock(uctx)
				cancel()
				if !errors.Is(err, ErrUnavailable) {
					t.Fatalf("Unlock with no server confirming = %v, want ErrUnavailable", err)
				}
				if l.Context().Err() == nil || !errors.Is(context.Cause(l.Context()), ErrUnlockUnconfirmed) {
					t.Fatalf("lock context after an unconfirmed Unlock: err %v cause %v, want done with ErrUnlockUnconfirmed", l.Context().Err(), context.Cause(l.Context()))
				}
				lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				l2, err := c.Lock(lctx, "trap/a", Correctness)
				cancel()
				if tc.effect {
					// The background release finds it released: a new grant at once.
					if err != nil || l2.Token() == l.Token() {
						t.Fatalf("Lock after a release that took effect = %v, %v, want a new grant", l2, err)
					}
					if err := l.Unlock(ctx); err != nil {
						t.Fatalf("second Unlock after the background release = %v, want nil", err)
					}
					down.Lock()
					failing = false
					down.Unlock()
					if err := l2.Unlock(ctx); err != nil {
						t.Fatal(err)
					}
					return
				}
				if err == nil {
					t.Fatalf("Lock while the release is unconfirmed returned a lock with token %d (the old one was %d), want a wait", l2.Token(), l.Token())
				}
				if !errors.Is(err, ErrUnavailable) {
					t.Fatalf("Lock while the release is unconfirmed = %v, want ErrUnavailable", err)
				}
				f.gmu.Lock()
				tries := f.releases
				f.gmu.Unlock()
				if tries < 10 {
					t.Fatalf("%d release attempts in 7 s, want the background release to go on", tries)
				}
				down.Lock()
				failing = false
				down.Unlock()
				time.Sleep(time.Second)
				if tok, ok := f.holds("trap/a"); ok {
					t.Fatalf("the server still holds the lock (token %d) after the release came through", tok)
				}
				if err := l.Unlock(ctx); err != nil {
					t.Fatalf("second Unlock after the background release = %v, want nil", err)
				}
				l2, err = c.Lock(ctx, "trap/a", Correctness)
				if err != nil {
					t.Fatal(err)
				}
				if l2.Token() == l.Token() {
					t.Fatalf("new Lock got the old grant back (token %d)", l.Token())
				}
				if err := l2.Unlock(ctx); err != nil {
					t.Fatal(err)
				}
			})
		})
	}
}

// TestLockNeverReturnsLostLock: a grant whose answer arrives after the lease's
// cautious deadline (a pause, a slow leader) is not returned as a Lock whose Context is
// already done: Lock fails with the cause.
func TestLockNeverReturnsLostLock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &trapServer{
			fakeServer:   &fakeServer{ttl: fakeTTL, answer: func(int) (time.Duration, error) { return -1, nil }},
			acquireDelay: fakeTTL,
		}
		c := trapClient(t, f)
		l, err := c.Lock(context.Background(), "trap/late", Correctness)
		if err == nil {
			t.Fatalf("Lock returned a lock (context err %v, cause %v), want an error", l.Context().Err(), context.Cause(l.Context()))
		}
		if !errors.Is(err, ErrLeaseDeadline) {
			t.Fatalf("Lock = %v, want the cause, ErrLeaseDeadline", err)
		}
	})
}

// TestLockLateGrantGivenBack: a grant that arrives after its lease's cautious deadline
// is given back to the service before Lock tries again on a fresh lease, so the second
// try gets a new grant — not the same token back, and not "held" by this very client.
func TestLockLateGrantGivenBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &trapServer{
			fakeServer:   &fakeServer{ttl: fakeTTL, answer: func(int) (time.Duration, error) { return -1, nil }},
			acquireDelay: fakeTTL,
			slowAcquires: 1,
		}
		c := trapClient(t, f)
		l, err := c.Lock(context.Background(), "trap/late-once", Correctness)
		if err != nil {
			t.Fatalf("Lock after one late grant: %v, want a lock on a fresh lease", err)
		}
		if l.Token() == 1 {
			t.Fatalf("Lock got token 1, the late grant, back: it was not given back first")
		}
		if f.releases == 0 {
			t.Fatalf("the late grant was never released")
		}
	})
}

// TestUnlockLostMessage: "before Unlock" is said only of a loss before Unlock; a loss
// that Unlock finds (the server answers not holder) says so.
func TestUnlockLostMessage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &trapServer{fakeServer: &fakeServer{ttl: time.Minute, answer: acked}}
		c := trapClient(t, f)
		ctx := context.Background()
		l, err := c.Lock(ctx, "trap/found", Correctness)
		if err != nil {
			t.Fatal(err)
		}
		f.gmu.Lock()
		f.held["trap/found"] = 999 // taken away on the server, unknown to the client
		f.gmu.Unlock()
		err = l.Unlock(ctx)
		if !errors.Is(err, ErrLockLost) || strings.Contains(err.Error(), "before Unlock") || !strings.Contains(err.Error(), "found by Unlock") {
			t.Fatalf("Unlock of a lock found lost = %v, want ErrLockLost found by Unlock", err)
		}

		l, err = c.Lock(ctx, "trap/before", Correctness)
		if err != nil {
			t.Fatal(err)
		}
		l.s.end(ErrLeaseExpired)
		err = l.Unlock(ctx)
		if !errors.Is(err, ErrLockLost) || !errors.Is(err, ErrLeaseExpired) || !strings.Contains(err.Error(), "before Unlock") {
			t.Fatalf("Unlock of a lock lost before = %v, want ErrLockLost before Unlock, ErrLeaseExpired", err)
		}
	})
}

// keyTrap is a fake IdempotencyService that keeps claims as the real one does (a key
// claimed under a token until Abandon or Complete) and answers the first Begin late.
type keyTrap struct {
	leaseholdv1connect.IdempotencyServiceClient // methods not implemented below panic
	beginDelay                                  time.Duration

	mu        sync.Mutex
	begins    int
	next      uint64
	claimed   map[string]uint64
	abandoned []uint64
	completed []uint64
}

func (f *keyTrap) Begin(ctx context.Context, req *leaseholdv1.BeginRequest) (*leaseholdv1.BeginResponse, error) {
	f.mu.Lock()
	f.begins++
	slow := f.begins == 1
	f.mu.Unlock()
	if slow {
		select {
		case <-time.After(f.beginDelay):
		case <-ctx.Done():
			return nil, connect.NewError(connect.CodeDeadlineExceeded, ctx.Err())
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	tok, ok := f.claimed[req.GetKey()]
	if !ok {
		f.next++
		tok = f.next
		f.claimed[req.GetKey()] = tok
	}
	return &leaseholdv1.BeginResponse{Status: leaseholdv1.KeyStatus_KEY_STATUS_NEW, Token: tok}, nil
}

func (f *keyTrap) Abandon(_ context.Context, req *leaseholdv1.AbandonRequest) (*leaseholdv1.AbandonResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.claimed[req.GetKey()] == req.GetToken() {
		delete(f.claimed, req.GetKey())
	}
	f.abandoned = append(f.abandoned, req.GetToken())
	return &leaseholdv1.AbandonResponse{}, nil
}

func (f *keyTrap) Complete(_ context.Context, req *leaseholdv1.CompleteRequest) (*leaseholdv1.CompleteResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.completed = append(f.completed, req.GetToken())
	return &leaseholdv1.CompleteResponse{}, nil
}

// TestOnceLateClaimNotRun: a Begin answered after the lease's cautious deadline (the
// client paused, the leader slow) gives a claim the server may be expiring already;
// another holder may claim the key the moment it does. Once must not run fn under it:
// it gives the claim back and claims the key again on a fresh lease.
func TestOnceLateClaimNotRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &trapServer{fakeServer: &fakeServer{ttl: fakeTTL, answer: func(int) (time.Duration, error) { return -1, nil }}}
		c := trapClient(t, f)
		keys := &keyTrap{beginDelay: fakeTTL, claimed: make(map[string]uint64)}
		c.keys = keys
		var ran []uint64
		_, err := c.Once(context.Background(), "trap/late-claim", func(ctx context.Context, token uint64) ([]byte, error) {
			ran = append(ran, token)
			if ctx.Err() != nil {
				t.Errorf("fn ran with its context done: %v", context.Cause(ctx))
			}
			return []byte("done"), nil
		})
		if err != nil {
			t.Fatalf("Once after one late claim: %v, want fn run on a fresh claim", err)
		}
		if len(ran) != 1 || ran[0] == 1 {
			t.Fatalf("fn ran under tokens %v; want once, not under the late claim's token 1", ran)
		}
		if len(keys.abandoned) == 0 || keys.abandoned[0] != 1 {
			t.Errorf("abandoned %v, want the late claim (token 1) given back", keys.abandoned)
		}
	})
}

// TestUnlockLeaseGoneEndsTheLease: an Unlock answered NotFound (the lease expired or
// was revoked on the server) tells of the whole lease: every other lock on it is lost
// at once, not a keepalive later.
func TestUnlockLeaseGoneEndsTheLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &trapServer{fakeServer: &fakeServer{ttl: time.Minute, answer: acked}}
		f.release = func(int) (bool, error) {
			return false, reasonError(connect.CodeNotFound, reason.LeaseRevoked)
		}
		c := trapClient(t, f)
		ctx := context.Background()
		a, err := c.Lock(ctx, "trap/gone/a", Correctness)
		if err != nil {
			t.Fatal(err)
		}
		b, err := c.Lock(ctx, "trap/gone/b", Correctness)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Unlock(ctx); !errors.Is(err, ErrLockLost) {
			t.Fatalf("Unlock on a revoked lease = %v, want ErrLockLost", err)
		}
		synctest.Wait()
		if lost, cause := b.Lost(); !lost || !errors.Is(cause, ErrLeaseRevoked) {
			t.Fatalf("the other lock on the revoked lease: lost %v (%v), want lost at once with ErrLeaseRevoked", lost, cause)
		}
	})
}

// TestLeaseDeadline: LeaseDeadline finds the lease's cautious deadline through a held
// lock's context and contexts derived from it, follows acknowledged keepalives, and
// answers false for a context that is not a lock's and for a lock that was released.
func TestLeaseDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &trapServer{fakeServer: &fakeServer{ttl: fakeTTL, answer: acked}}
		c := trapClient(t, f)
		start := time.Now()
		l, err := c.Lock(context.Background(), "trap/deadline", Correctness)
		if err != nil {
			t.Fatal(err)
		}
		derived, cancel := context.WithCancel(l.Context())
		defer cancel()
		for _, ctx := range []context.Context{l.Context(), derived} {
			if d, ok := LeaseDeadline(ctx); !ok || !d.Equal(start.Add(fakeTTL-fakeMargin)) {
				t.Fatalf("LeaseDeadline = %v, %v; want the grant's send time + TTL − margin", d.Sub(start), ok)
			}
		}
		time.Sleep(fakeTTL / 2) // a keepalive or more, acknowledged
		if d, ok := LeaseDeadline(derived); !ok || !d.After(start.Add(fakeTTL-fakeMargin)) {
			t.Fatalf("LeaseDeadline after keepalives = %v, %v; want it moved on", d.Sub(start), ok)
		}
		if _, ok := LeaseDeadline(context.Background()); ok {
			t.Fatal("LeaseDeadline of a context that is no lock's answered ok")
		}
		if err := l.Unlock(context.Background()); err != nil {
			t.Fatal(err)
		}
		if _, ok := LeaseDeadline(derived); ok {
			t.Fatal("LeaseDeadline of a released lock answered ok")
		}
	})
}

// TestLockLostWhileLeaseEnds: the goroutine that ends a lease (its deadline timer, a
// keepalive answered NotFound) marks it ended, then cancels its locks one after
// another. A holder asking meanwhile — a process resumed after a pause, its timer
// firing beside it — must hear the lock is lost, not that it still holds it: that is
// one more write under a lost lock (test/e2e TestPauseScenario caught it once in CI).
func TestLockLostWhileLeaseEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &trapServer{fakeServer: &fakeServer{ttl: time.Minute, answer: acked}}
		c := trapClient(t, f)
		l, err := c.Lock(context.Background(), "trap/ending", Correctness)
		if err != nil {
			t.Fatal(err)
		}
		// The moment inside lease.end: ended, its locks not cancelled yet.
		l.s.mu.Lock()
		l.s.err = ErrLeaseExpired
		l.s.mu.Unlock()
		if l.Context().Err() == nil {
			t.Fatal("the lock's context Err is nil on a lease that has ended")
		}
		lost, cause := l.Lost()
		// The rest of lease.end, so that its goroutines stop.
		l.s.mu.Lock()
		l.s.err = nil
		l.s.mu.Unlock()
		l.s.end(ErrLeaseExpired)
		if !lost || !errors.Is(cause, ErrLeaseExpired) {
			t.Fatalf("Lost on a lease that has ended = %v, %v; want true, ErrLeaseExpired", lost, cause)
		}
	})
}
