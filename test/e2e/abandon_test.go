package e2e

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/leasehold/leasehold/client"
)

// TestAbandonedWaitDoesNotKeepLock: a Lock call waiting in a correctness lock's queue
// gives up (its context ends) while the server is down, so it cannot take itself out of
// the queue. The queue entry is replicated state and survives the restart. When the
// holder then releases, the lock must not end up held, for as long as that client
// lives, by a lease whose owner was told that Lock failed and holds no handle to
// release it: a third client must get the lock.
func TestAbandonedWaitDoesNotKeepLock(t *testing.T) {
	s := StartServer(t)
	const name = "e2e/abandon/x"
	h := s.Client(t, client.WithTTL(30*time.Second))
	w := s.Client(t, client.WithTTL(30*time.Second))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	hl, err := h.Lock(ctx, name, client.Correctness)
	if err != nil {
		t.Fatalf("holder lock: %v", err)
	}
	res := make(chan error, 1)
	go func() {
		// Long enough that the kill below comes first even on a loaded machine (the
		// waiter must give up while no server runs), short enough to end well inside
		// the 10 s the test waits for it: 1.5 s was not, at a load of 14-18.
		wctx, cancel := context.WithTimeout(ctx, 4*time.Second)
		defer cancel()
		wl, err := w.Lock(wctx, name, client.Correctness)
		if err == nil {
			_ = wl.Unlock(ctx)
			err = errors.New("granted while held")
		}
		res <- err
	}()
	if !eventually(5*time.Second, func() bool {
		info, err := h.Describe(ctx, name)
		return err == nil && info.GetWaiters() == 1
	}) {
		t.Fatal("the waiter did not queue within 5s")
	}
	select {
	case err := <-res:
		t.Fatalf("the waiter's Lock returned before the server was killed: %v", err)
	default:
	}
	s.Kill9()
	// The waiter's Lock ends while no server runs.
	select {
	case err := <-res:
		t.Logf("waiter's Lock: %v", err)
		if !errors.Is(err, client.ErrUnavailable) {
			t.Fatalf("waiter's Lock = %v, want ErrUnavailable", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter's Lock did not return within 10s")
	}
	s.Restart()
	if err := hl.Unlock(ctx); err != nil {
		t.Fatalf("holder unlock: %v", err)
	}

	y := s.Client(t)
	start := time.Now()
	yl, err := y.Lock(ctx, name, client.Correctness, client.WaitFor(3*time.Second))
	if err != nil {
		info, _ := y.Describe(ctx, name)
		t.Fatalf("after the holder released, a third client could not get the lock in %v: %v\n"+
			"lock: held=%v token=%d holder=%v ttl_remaining=%dms — the waiter gave up, but its lease got the lock and its client keeps that lease alive",
			time.Since(start).Round(time.Millisecond), err, info.GetHeld(), info.GetToken(), info.GetHolder(), info.GetTtlRemainingMs())
	}
	if err := yl.Unlock(ctx); err != nil {
		t.Errorf("unlock: %v", err)
	}
}
