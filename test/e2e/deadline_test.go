package e2e

import (
	"context"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/leasehold/leasehold/client"
)

// TestClientUsableAfterLocalDeadline: a client holds a lock and keeps calling Lock on
// another name (same TTL, so the same lease) while the server is stopped. The lease's
// cautious local deadline passes (G4b) — the held lock's context must be cancelled —
// and after the server resumes the same client must still work: a Lock returns within
// a few seconds. Lock checks the session's deadline itself (so a process resumed after
// a pause sees it at once); doing so must not wedge the client.
//
// The race it looks for (a Lock call between the deadline and the deadline timer's own
// check) is not certain to happen in one try, so the scenario runs up to 3 times.
func TestClientUsableAfterLocalDeadline(t *testing.T) {
	s := StartServer(t)
	for attempt := 1; attempt <= 3 && !t.Failed(); attempt++ {
		clientSurvivesDeadline(t, s, attempt)
	}
}

func clientSurvivesDeadline(t *testing.T, s *Server, attempt int) {
	const ttl = time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// Not s.Client: a wedged client's Close would never return.
	c, err := client.Dial(ctx, s.Addr, client.WithTTL(ttl))
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	held := "e2e/deadline/held"
	l, err := c.Lock(ctx, held, client.Correctness)
	if err != nil {
		t.Fatalf("attempt %d: lock: %v", attempt, err)
	}
	time.Sleep(300 * time.Millisecond)

	s.Signal(syscall.SIGSTOP)
	var stop atomic.Bool
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				lctx, cancel := context.WithTimeout(ctx, 2*time.Millisecond)
				if ol, err := c.Lock(lctx, "e2e/deadline/other", client.Correctness, client.TryOnce); err == nil {
					_ = ol.Unlock(lctx)
				}
				cancel()
			}
		}()
	}
	select {
	case <-l.Context().Done():
	case <-time.After(3 * ttl):
		t.Errorf("attempt %d: G4b: the held lock's context was not cancelled within %v of stopping the server", attempt, 3*ttl)
	}
	time.Sleep(200 * time.Millisecond)
	stop.Store(true)
	s.Signal(syscall.SIGCONT)

	stopped := make(chan struct{})
	go func() { wg.Wait(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatalf("attempt %d: Lock calls with a 2ms context still blocked 5s after the deadline passed: the client is wedged; its goroutines:\n%s",
			attempt, stacksWith("(*session).end"))
	}
	type result struct {
		l   *client.Lock
		err error
	}
	res := make(chan result, 1)
	go func() {
		l2, err := c.Lock(ctx, "e2e/deadline/after", client.Correctness, client.WaitFor(3*time.Second))
		res <- result{l2, err}
	}()
	select {
	case r := <-res:
		if r.err != nil {
			t.Errorf("attempt %d: Lock after the server resumed: %v", attempt, r.err)
		} else {
			_ = r.l.Unlock(ctx)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("attempt %d: Lock after the server resumed did not return within 5s: the client is wedged; its goroutines:\n%s",
			attempt, stacksWith("(*session).end"))
	}
	cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
	defer ccancel()
	_ = c.Close(cctx)
}
