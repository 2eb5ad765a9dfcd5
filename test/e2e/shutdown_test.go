package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/leasehold/leasehold/client"
)

// TestGracefulShutdown: SIGTERM makes the server exit 0 within 5s with a client
// connected that holds a lock (keepalives running), and a restart on the same data dir
// serves the same state: the lock still held under its token, the token sequence where
// it was.
func TestGracefulShutdown(t *testing.T) { testGracefulShutdown(t, false) }

// TestGracefulShutdownWithWaiter: the same with a second client queued behind the
// holder, its Acquire in flight while the server shuts down — over Connect (HTTP/2)
// and over the fast lane. A wait that can only end when someone releases must not hold
// the shutdown up; the queued acquire (replicated state) survives the restart and is
// granted when the holder releases.
func TestGracefulShutdownWithWaiter(t *testing.T) {
	t.Run("connect", func(t *testing.T) { testGracefulShutdown(t, true, client.WithoutFastLane()) })
	t.Run("fastlane", func(t *testing.T) { testGracefulShutdown(t, true) })
}

func testGracefulShutdown(t *testing.T, withWaiter bool, waiterOpts ...client.Option) {
	s := StartServer(t)
	const name = "e2e/shutdown/held"
	holder := s.Client(t, client.WithTTL(30*time.Second))
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	l, err := holder.Lock(ctx, name, client.Correctness)
	if err != nil {
		t.Fatalf("lock: %v", err)
	}
	type result struct {
		l   *client.Lock
		err error
		at  time.Time
	}
	waited := make(chan result, 1)
	if withWaiter {
		waiter := s.Client(t, append(waiterOpts, client.WithTTL(30*time.Second))...)
		go func() {
			wl, err := waiter.Lock(ctx, name, client.Correctness, client.WaitFor(time.Minute))
			waited <- result{wl, err, time.Now()}
		}()
		if !eventually(5*time.Second, func() bool {
			info, err := holder.Describe(ctx, name)
			return err == nil && info.GetWaiters() == 1
		}) {
			t.Fatal("the waiter did not queue within 5s")
		}
	}
	before, err := holder.Status(ctx)
	if err != nil {
		t.Fatalf("status: %v", err)
	}

	code, took := s.Stop(15 * time.Second)
	t.Logf("SIGTERM: exit %d after %v", code, took.Round(time.Millisecond))
	if code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0", code)
	}
	if took >= 5*time.Second {
		t.Errorf("took %v to exit after SIGTERM, want < 5s", took)
	}

	s.Restart()
	info, err := holder.Describe(ctx, name)
	if err != nil {
		t.Fatalf("describe after restart: %v", err)
	}
	if !info.GetHeld() || info.GetToken() != l.Token() {
		t.Errorf("after restart: held=%v token=%d, want held under %d", info.GetHeld(), info.GetToken(), l.Token())
	}
	after, err := holder.Status(ctx)
	if err != nil {
		t.Fatalf("status after restart: %v", err)
	}
	if after.GetLastToken() != before.GetLastToken() {
		t.Errorf("last token %d after restart, %d before", after.GetLastToken(), before.GetLastToken())
	}
	// The holder's session survived (TTL 30s): its lock is still live and it can release.
	if err := l.Context().Err(); err != nil {
		t.Errorf("holder's lock context ended: %v", context.Cause(l.Context()))
	}
	select {
	case r := <-waited:
		t.Fatalf("the waiter's Lock returned while the lock was held: %v", r.err)
	default:
	}
	released := time.Now()
	if err := l.Unlock(ctx); err != nil {
		t.Errorf("unlock after restart: %v", err)
	}
	last := l.Token()
	if withWaiter {
		// The waiter's Lock kept retrying through the shutdown: it gets the lock now.
		select {
		case r := <-waited:
			if r.err != nil {
				t.Fatalf("the waiter's Lock across the shutdown failed: %v", r.err)
			}
			t.Logf("waiter got token %d %v after the holder's unlock", r.l.Token(), r.at.Sub(released).Round(time.Millisecond))
			if r.l.Token() <= before.GetLastToken() {
				t.Errorf("G1: waiter's token %d is not above the last token %d before the restart", r.l.Token(), before.GetLastToken())
			}
			if err := r.l.Unlock(ctx); err != nil {
				t.Errorf("waiter's unlock: %v", err)
			}
			last = r.l.Token()
		case <-time.After(10 * time.Second):
			t.Fatal("the waiter's Lock did not return within 10s of the release")
		}
	}
	l2, err := s.Client(t).Lock(ctx, name, client.Correctness, client.TryOnce)
	if err != nil {
		t.Fatalf("lock after release: %v", err)
	}
	if l2.Token() <= last || l2.Token() <= before.GetLastToken() {
		t.Errorf("G1: token %d after restart; last grant %d, last token before the restart %d", l2.Token(), last, before.GetLastToken())
	}
}
