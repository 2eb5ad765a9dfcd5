package server

import (
	"sync"
	"testing"
	"time"
)

// TestWorkers: every function runs; idle workers take the next functions instead of new
// goroutines; close ends the idle workers.
func TestWorkers(t *testing.T) {
	w := new(workers)
	live := func() (live, idle int) {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.live, len(w.idle)
	}
	const n = 100
	ran := make(chan int, 2*n)
	for round := range 2 {
		// n functions that all run at once: each holds its worker until all have started.
		var started, done sync.WaitGroup
		started.Add(n)
		done.Add(n)
		for i := range n {
			w.Go(func() {
				defer done.Done()
				started.Done()
				started.Wait()
				ran <- i
			})
		}
		done.Wait()
		if l, _ := live(); l != n {
			t.Fatalf("round %d: %d workers for %d functions at once, want %d", round, l, n, n)
		}
		waitFor(t, func() bool { _, idle := live(); return idle == n }, "every worker idle")
	}
	if len(ran) != 2*n {
		t.Fatalf("%d functions ran, want %d", len(ran), 2*n)
	}
	w.close()
	waitFor(t, func() bool { l, _ := live(); return l == 0 }, "every worker gone after close")
}

func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}
