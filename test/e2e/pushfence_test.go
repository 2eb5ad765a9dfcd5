package e2e

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/fence"
)

// staleWindow is what one try of TestPushedFencingWindow saw.
type staleWindow struct {
	expired  time.Time // the service's first "not current" answer for the old token
	rejected time.Time // the guard's first rejection of the old token (zero: none)
	floored  time.Time // Follow's floor in place (zero: none, or not following)
	late     int       // writes with the old token admitted after the floor was in place
}

// TestPushedFencingWindow measures the stale-write window with a paused holder, with and
// without server-pushed fencing (fence.Follow), and fails if, with it, a write by the old
// token is admitted after its floor was in place.
//
// Each try: a real process (pauseclient) takes a correctness lock with a 300 ms TTL and
// "writes" once (its token is admitted by an in-memory guard); it is stopped with
// SIGSTOP; its lease expires. From then on the test writes with the old token every
// millisecond — what the paused holder would do the moment it ran again — and polls
// CheckToken to see when the service expires the lease. Nobody else writes. The window
// is from the service's first "not current" answer to the guard's first rejection.
// Without Follow the old token is admitted for as long as nobody else writes (the test
// watches for 1 s); with Follow it is bounded by the delivery of the expiry event.
func TestPushedFencingWindow(t *testing.T) {
	s := StartServer(t)
	c := s.Client(t)
	const (
		ttl     = 300 * time.Millisecond
		pushed  = 10
		without = 3
		watch   = time.Second // how long an unpushed try watches for a rejection
	)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// With pushing: one guard follows the service for the whole run.
	guard := fence.NewMemory()
	var (
		mu      sync.Mutex
		floored = map[string]fence.Raised{}
		at      = map[string]time.Time{}
	)
	fctx, fcancel := context.WithCancel(ctx)
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- fence.Follow(fctx, c, "pw/", guard, fence.OnReady(func() { close(ready) }), fence.OnFloor(func(r fence.Raised) {
			mu.Lock()
			defer mu.Unlock()
			if r.Ended > floored[r.Resource].Ended {
				floored[r.Resource], at[r.Resource] = r, time.Now()
			}
		}))
	}()
	defer func() {
		fcancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Follow ended with %v", err)
		}
	}()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("Follow: %v", err)
	}
	flooredAt := func(name string, tok uint64) time.Time {
		mu.Lock()
		defer mu.Unlock()
		if floored[name].Ended >= tok {
			return at[name]
		}
		return time.Time{}
	}

	var withPush []time.Duration
	for i := range pushed {
		name := fmt.Sprintf("pw/%d", i)
		w := pauseAndProbe(ctx, t, s, c, guard, name, ttl, watch, func(tok uint64) time.Time { return flooredAt(name, tok) })
		if w.rejected.IsZero() {
			t.Fatalf("%s: with Follow, the old token was still admitted %v after the service expired it", name, watch)
		}
		if w.late > 0 {
			t.Errorf("%s: %d writes with the old token were admitted after its floor was in place", name, w.late)
		}
		withPush = append(withPush, w.rejected.Sub(w.expired))
		t.Logf("%s: rejected %v after expiry (floor in place at %v)", name,
			w.rejected.Sub(w.expired).Round(100*time.Microsecond), w.floored.Sub(w.expired).Round(100*time.Microsecond))
	}

	// Without pushing: a guard nobody tells.
	plain := fence.NewMemory()
	for i := range without {
		name := fmt.Sprintf("plain/%d", i)
		w := pauseAndProbe(ctx, t, s, c, plain, name, ttl, watch, func(uint64) time.Time { return time.Time{} })
		if !w.rejected.IsZero() {
			t.Errorf("%s: without Follow and with nobody else writing, the old token was rejected %v after expiry", name, w.rejected.Sub(w.expired))
		}
	}
	slices.Sort(withPush)
	t.Logf("stale-write window after expiry, %d tries: with pushed fencing p50 %v, max %v; without: still admitted %v after expiry in %d of %d tries (until the next holder writes)",
		len(withPush), withPush[len(withPush)/2].Round(100*time.Microsecond), withPush[len(withPush)-1].Round(100*time.Microsecond),
		watch, without, without)
}

// pauseAndProbe runs one try: a holder process takes name, its token is admitted, it is
// stopped; then the old token is written every millisecond until the guard rejects it or
// watch has passed since the service expired it.
func pauseAndProbe(ctx context.Context, t *testing.T, s *Server, c *client.Client, guard *fence.Memory, name string,
	ttl, watch time.Duration, flooredAt func(tok uint64) time.Time) staleWindow {
	t.Helper()
	a, tok, _ := startHolder(t, s, name, ttl)
	defer a.Kill()
	if err := guard.Admit(ctx, name, tok); err != nil {
		t.Fatalf("%s: the holder's own write: %v", name, err)
	}
	time.Sleep(2 * ttl / 3) // a keepalive or two in its steady state
	a.Signal(syscall.SIGSTOP)
	defer func() { _ = syscall.Kill(a.Pid(), syscall.SIGCONT) }()

	var w staleWindow
	expired := make(chan time.Time, 1)
	go func() { // when does the service say the token is no longer current?
		for ctx.Err() == nil {
			cur, err := c.CheckToken(ctx, name, tok)
			if err == nil && !cur {
				expired <- time.Now()
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	var deadline <-chan time.Time
	for {
		select {
		case w.expired = <-expired:
			deadline = time.After(watch)
		case <-deadline:
			return w
		case <-ctx.Done():
			t.Fatalf("%s: %v", name, ctx.Err())
		default:
		}
		t0 := time.Now()
		err := guard.Admit(ctx, name, tok)
		if f := flooredAt(tok); !f.IsZero() && w.floored.IsZero() {
			w.floored = f
		}
		switch {
		case err == nil:
			if !w.floored.IsZero() && t0.After(w.floored) {
				w.late++
			}
		case errors.Is(err, fence.ErrStale):
			w.rejected = time.Now()
			if w.expired.IsZero() { // the floor came before the CheckToken answer
				w.expired = <-expired
			}
			return w
		default:
			t.Fatalf("%s: admit: %v", name, err)
		}
		time.Sleep(time.Millisecond)
	}
}
