package server

import "sync"

// workers runs functions on reused goroutines. The fast lane starts a goroutine for
// every request that may wait (see fastConn.read); a fresh goroutine's stack is small,
// and the way through a handler, leader, replication and raft grows it several times
// over, copying it each time: at 64 workers doing correctness locks, stack growth was
// 10% of the server's CPU. A worker keeps its grown stack for the next function.
type workers struct {
	mu     sync.Mutex
	idle   []chan func()
	live   int // workers running or idle
	closed bool
}

// maxIdleWorkers bounds the goroutines kept waiting for work.
const maxIdleWorkers = 512

// Go runs f on an idle worker, or on a new one.
func (w *workers) Go(f func()) {
	w.mu.Lock()
	if n := len(w.idle); n > 0 {
		ch := w.idle[n-1]
		w.idle = w.idle[:n-1]
		w.mu.Unlock()
		ch <- f
		return
	}
	w.live++
	w.mu.Unlock()
	go w.run(f)
}

func (w *workers) run(f func()) {
	ch := make(chan func(), 1)
	for f != nil {
		f()
		w.mu.Lock()
		if w.closed || len(w.idle) >= maxIdleWorkers {
			w.live--
			w.mu.Unlock()
			return
		}
		w.idle = append(w.idle, ch)
		w.mu.Unlock()
		f = <-ch
	}
	w.mu.Lock()
	w.live--
	w.mu.Unlock()
}

// close ends the idle workers; busy ones end when their function returns.
func (w *workers) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
	for _, ch := range w.idle {
		close(ch)
	}
	w.idle = nil
}
