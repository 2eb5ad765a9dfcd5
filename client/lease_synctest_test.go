package client

// The lease's timing (G4b) under testing/synctest: time is the bubble's fake clock, the
// server is a fake LeaseService and LockService in the same bubble, and no byte goes
// over a network. Every instant below is exact, not a tolerance around a sleep.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"connectrpc.com/connect"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/api/leasehold/v1/leaseholdv1connect"
)

// fakeServer answers a Client's lease and lock calls inside the bubble. answer decides
// the fate of the i-th keepalive (from 0): how long the server takes to answer
// (negative: it never does, the call ends with its context) and the error it then
// returns (nil: acknowledged).
type fakeServer struct {
	leaseholdv1connect.LeaseServiceClient // methods not implemented below panic
	leaseholdv1connect.LockServiceClient

	ttl    time.Duration
	answer func(i int) (time.Duration, error)
	quit   chan struct{} // closed when the test ends: calls still waiting return

	mu        sync.Mutex
	granted   time.Time   // when the Grant was sent
	sent      []time.Time // when each keepalive was sent
	deadlines []time.Time // each keepalive's context deadline (zero: none)
	acked     []time.Time // the send times of the acknowledged keepalives
}

func (f *fakeServer) Grant(_ context.Context, req *leaseholdv1.GrantRequest) (*leaseholdv1.GrantResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.granted = time.Now()
	return &leaseholdv1.GrantResponse{LeaseId: "fake-lease", TtlMs: req.GetTtlMs()}, nil
}

func (f *fakeServer) KeepAlive(ctx context.Context, _ *leaseholdv1.KeepAliveRequest) (*leaseholdv1.KeepAliveResponse, error) {
	sent := time.Now()
	dl, _ := ctx.Deadline()
	f.mu.Lock()
	i := len(f.sent)
	f.sent = append(f.sent, sent)
	f.deadlines = append(f.deadlines, dl)
	f.mu.Unlock()
	delay, err := f.answer(i)
	var answered <-chan time.Time // never, unless delay >= 0
	if delay >= 0 {
		answered = time.After(delay)
	}
	select {
	case <-answered:
	case <-ctx.Done():
		return nil, connect.NewError(connect.CodeDeadlineExceeded, ctx.Err())
	case <-f.quit:
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("fake: test over"))
	}
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	f.acked = append(f.acked, sent)
	f.mu.Unlock()
	return &leaseholdv1.KeepAliveResponse{TtlMs: f.ttl.Milliseconds()}, nil
}

func (f *fakeServer) Revoke(context.Context, *leaseholdv1.RevokeRequest) (*leaseholdv1.RevokeResponse, error) {
	return &leaseholdv1.RevokeResponse{}, nil
}

func (f *fakeServer) Acquire(context.Context, *leaseholdv1.AcquireRequest) (*leaseholdv1.AcquireResponse, error) {
	return &leaseholdv1.AcquireResponse{Token: 7, Class: leaseholdv1.LockClass_LOCK_CLASS_CORRECTNESS}, nil
}

// lockOn returns a correctness lock taken through a Client whose server is f, with TTL
// f.ttl and the default safety margin (see fakeClient).
func lockOn(t *testing.T, f *fakeServer) (*Client, *Lock) {
	t.Helper()
	c := fakeClient(t, f, f)
	l, err := c.Lock(context.Background(), "synctest/lock", Correctness)
	if err != nil {
		t.Fatal(err)
	}
	return c, l
}

// fakeClient returns a Client whose lease calls go to f and lock calls to locks. The
// Client is closed when the test ends, and calls still waiting for the fake end, so
// that no goroutine outlives the bubble.
func fakeClient(t *testing.T, f *fakeServer, locks leaseholdv1connect.LockServiceClient) *Client {
	f.quit = make(chan struct{})
	c := &Client{
		opts:     options{ttl: f.ttl},
		nodes:    newFailover(nil, []string{"fake"}),
		leases:   f,
		locks:    locks,
		sessions: make(map[*Session]struct{}),
	}
	c.fast = &fastLanes{c: c, disabled: true}
	t.Cleanup(func() {
		close(f.quit)
		_ = c.Close(context.Background())
	})
	return c
}

// lostAt waits until l's context is cancelled and returns when, and why.
func lostAt(l *Lock) (time.Time, error) {
	<-l.Context().Done()
	return time.Now(), context.Cause(l.Context())
}

const (
	fakeTTL    = 3 * time.Second
	fakeMargin = fakeTTL / 5 // Client.margin's default
)

// TestLeaseDeadlineUnderSynctest: a held lock's context is cancelled, with
// ErrLeaseDeadline, exactly at the send time of the last acknowledged keepalive plus
// TTL minus the margin — not at its answer's arrival, however late — and, when no
// keepalive is ever acknowledged, at the Grant's send time plus TTL minus the margin.
// Unanswered keepalives move nothing.
func TestLeaseDeadlineUnderSynctest(t *testing.T) {
	for _, tc := range []struct {
		name   string
		acks   int           // keepalives acknowledged before the server goes silent
		answer time.Duration // how long each of those takes to be answered
	}{
		{"no keepalive acknowledged", 0, 0},
		{"answers at once", 4, 0},
		{"answers late", 4, 300 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := &fakeServer{ttl: fakeTTL, answer: func(i int) (time.Duration, error) {
					if i < tc.acks {
						return tc.answer, nil
					}
					return -1, nil
				}}
				_, l := lockOn(t, f)
				at, cause := lostAt(l)
				f.mu.Lock()
				defer f.mu.Unlock()
				base := f.granted
				if len(f.acked) > 0 {
					base = f.acked[len(f.acked)-1]
				}
				if len(f.acked) != tc.acks {
					t.Fatalf("%d keepalives acknowledged, want %d", len(f.acked), tc.acks)
				}
				if want := base.Add(fakeTTL - fakeMargin); !at.Equal(want) {
					t.Fatalf("lock lost %v after the base (last acknowledged send or the grant), want %v", at.Sub(base), fakeTTL-fakeMargin)
				}
				if !errors.Is(cause, ErrLeaseDeadline) {
					t.Fatalf("cause %v, want ErrLeaseDeadline", cause)
				}
			})
		})
	}
}

// TestKeepAliveCadenceUnderSynctest: keepalives go out about every TTL/3, jittered by
// ±10% and stretched by less than one alignment quantum (aligned), never sooner, and
// not all at the same interval; a lock answered every time is never lost.
func TestKeepAliveCadenceUnderSynctest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeServer{ttl: fakeTTL, answer: func(int) (time.Duration, error) { return 0, nil }}
		c, l := lockOn(t, f)
		time.Sleep(3 * time.Minute)
		if err := l.Context().Err(); err != nil {
			t.Fatalf("a lease whose every keepalive was answered was lost: %v", context.Cause(l.Context()))
		}
		if err := c.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		interval := fakeTTL / 3
		q := interval / 32
		lo, hi := interval-interval/10, interval+interval/10+q
		prev := f.granted
		seen := map[time.Duration]bool{}
		for i, s := range f.sent {
			d := s.Sub(prev)
			if d < lo || d >= hi {
				t.Fatalf("keepalive %d went out %v after the one before, want within [%v, %v)", i, d, lo, hi)
			}
			seen[d] = true
			prev = s
		}
		if n := len(f.sent); n < 160 || n > 200 {
			t.Fatalf("%d keepalives in 3 minutes at TTL %v, want about 180", n, fakeTTL)
		}
		// Alignment to quanta of TTL/96 leaves a handful of distinct intervals in the ±10%.
		if len(seen) < 4 {
			t.Fatalf("only %d distinct intervals among %d keepalives: no jitter", len(seen), len(f.sent))
		}
	})
}

// TestKeepAliveRetriesStayInsideTheDeadline: when keepalives fail, the client retries
// sooner than the cadence, several times before the deadline, each attempt bounded by
// the deadline (its context ends there at the latest) and none sent at or after it;
// the lock is then lost at the deadline with ErrLeaseDeadline. A keepalive that comes
// through between failures moves the deadline.
func TestKeepAliveRetriesStayInsideTheDeadline(t *testing.T) {
	unavailable := connect.NewError(connect.CodeUnavailable, errors.New("fake: no leader"))
	synctest.Test(t, func(t *testing.T) {
		f := &fakeServer{ttl: fakeTTL, answer: func(i int) (time.Duration, error) {
			if i == 0 || i == 6 { // the first, and one in the middle of the failures
				return 0, nil
			}
			return 10 * time.Millisecond, unavailable
		}}
		_, l := lockOn(t, f)
		at, cause := lostAt(l)
		f.mu.Lock()
		defer f.mu.Unlock()
		if len(f.acked) != 2 {
			t.Fatalf("%d keepalives acknowledged, want 2 (the 1st and the 7th)", len(f.acked))
		}
		deadline := f.acked[0].Add(fakeTTL - fakeMargin)
		retries := 0
		for i, s := range f.sent {
			if i > 0 && f.sent[i-1].Equal(f.acked[1]) {
				deadline = f.acked[1].Add(fakeTTL - fakeMargin)
			}
			if !s.Before(deadline) {
				t.Fatalf("keepalive %d sent %v after the deadline it could no longer extend", i, s.Sub(deadline))
			}
			if f.deadlines[i].IsZero() || f.deadlines[i].After(deadline) {
				t.Fatalf("keepalive %d may run until %v, past the deadline %v", i, f.deadlines[i], deadline)
			}
			if i > 0 && s.Sub(f.sent[i-1]) < fakeTTL/3-fakeTTL/30 {
				retries++
			}
		}
		if retries < 8 {
			t.Fatalf("%d quick retries in two failure runs, want several in each: sends at %v", retries, f.sent)
		}
		if !at.Equal(deadline) || !errors.Is(cause, ErrLeaseDeadline) {
			t.Fatalf("lock lost at deadline%+v with %v, want at the deadline with ErrLeaseDeadline", at.Sub(deadline), cause)
		}
	})
}

// TestLeaseGoneUnderSynctest: a keepalive answered NotFound ends the lock the moment
// the answer arrives, with the cause the server gave: revoked, or expired.
func TestLeaseGoneUnderSynctest(t *testing.T) {
	for _, tc := range []struct {
		reason string
		want   error
	}{{"lease_revoked", ErrLeaseRevoked}, {"lease_expired", ErrLeaseExpired}} {
		t.Run(tc.reason, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				gone := connect.NewError(connect.CodeNotFound, fmt.Errorf("fake: %s", tc.reason))
				if d, err := connect.NewErrorDetail(&leaseholdv1.ErrorDetail{Reason: tc.reason}); err == nil {
					gone.AddDetail(d)
				}
				const delay = 40 * time.Millisecond
				f := &fakeServer{ttl: fakeTTL, answer: func(i int) (time.Duration, error) {
					if i < 2 {
						return 0, nil
					}
					return delay, gone
				}}
				_, l := lockOn(t, f)
				at, cause := lostAt(l)
				f.mu.Lock()
				defer f.mu.Unlock()
				if want := f.sent[2].Add(delay); !at.Equal(want) {
					t.Fatalf("lock lost %v after the answer, want at once", at.Sub(want))
				}
				if !errors.Is(cause, tc.want) {
					t.Fatalf("cause %v, want %v", cause, tc.want)
				}
			})
		})
	}
}
