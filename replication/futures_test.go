package replication

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// pendingFuture is an apply future the test answers.
type pendingFuture struct {
	raft.ApplyFuture
	answer chan error
}

func (f pendingFuture) Error() error { return <-f.answer }

// TestFuturesHandOutOutcomes: every proposer gets its own future's outcome, whatever
// the order raft answers in; a proposer that is not answered yet does not hold up
// others once the waiter gets to them; with nothing pending the waiting goroutine waits
// for the next future until close, and after close it ends.
func TestFuturesHandOutOutcomes(t *testing.T) {
	var w futures
	const n = 5
	fs := make([]pendingFuture, n)
	dones := make([]<-chan error, n)
	for i := range fs {
		fs[i] = pendingFuture{answer: make(chan error, 1)}
		dones[i] = waitChan(&w, fs[i])
	}
	for _, i := range []int{4, 2, 0, 3, 1} { // raft answers out of queue order
		fs[i].answer <- fmt.Errorf("outcome %d", i)
	}
	for i, done := range dones {
		select {
		case err := <-done:
			if want := fmt.Sprintf("outcome %d", i); err == nil || err.Error() != want {
				t.Fatalf("proposer %d got %v, want %s", i, err, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("proposer %d got no outcome", i)
		}
	}
	// With nothing pending it waits for the next future, and serves it.
	waitIdle(t, &w, true)
	f := pendingFuture{answer: make(chan error, 1)}
	done := waitChan(&w, f)
	f.answer <- errors.New("again")
	if err := <-done; err == nil || err.Error() != "again" {
		t.Fatalf("after a pause: %v", err)
	}
	// After close it ends once nothing is pending; a future waited on later still gets
	// its outcome, from a goroutine that ends after it.
	waitIdle(t, &w, true)
	w.close()
	waitRunning(t, &w, false)
	f = pendingFuture{answer: make(chan error, 1)}
	done = waitChan(&w, f)
	f.answer <- errors.New("after close")
	if err := <-done; err == nil || err.Error() != "after close" {
		t.Fatalf("after close: %v", err)
	}
	waitRunning(t, &w, false)
}

// waitIdle waits until w's goroutine exists and is (or is not) waiting for a future.
func waitIdle(t *testing.T, w *futures, idle bool) {
	t.Helper()
	waitState(t, w, fmt.Sprintf("running, idle=%v", idle), func() bool { return w.running && w.idle == idle })
}

// waitRunning waits until w's goroutine exists, or does not.
func waitRunning(t *testing.T, w *futures, running bool) {
	t.Helper()
	waitState(t, w, fmt.Sprintf("running=%v", running), func() bool { return w.running == running })
}

// waitState waits up to 5 s until cond, called with w.mu held, is true.
func waitState(t *testing.T, w *futures, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		w.mu.Lock()
		ok := cond()
		w.mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the futures goroutine is not %s after 5 s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// waitChan waits on f through w and returns a channel with its error.
func waitChan(w *futures, f raft.ApplyFuture) <-chan error {
	done := make(chan error, 1)
	w.wait(f, func(_ raft.ApplyFuture, err error) { done <- err })
	return done
}
