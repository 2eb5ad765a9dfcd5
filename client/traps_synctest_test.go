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
