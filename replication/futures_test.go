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
// others once the waiter gets to them; and the waiting goroutine ends when nothing is
// pending.
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
	deadline := time.Now().Add(5 * time.Second)
	for {
		w.mu.Lock()
		running := w.running
		w.mu.Unlock()
		if !running {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the waiting goroutine is still running with nothing pending")
		}
		time.Sleep(time.Millisecond)
	}
	// And it starts again for the next proposal.
	f := pendingFuture{answer: make(chan error, 1)}
	done := waitChan(&w, f)
	f.answer <- errors.New("again")
	if err := <-done; err == nil || err.Error() != "again" {
		t.Fatalf("after a pause: %v", err)
	}
}

// waitChan waits on f through w and returns a channel with its error.
func waitChan(w *futures, f raft.ApplyFuture) <-chan error {
	done := make(chan error, 1)
	w.wait(f, func(_ raft.ApplyFuture, err error) { done <- err })
	return done
}
