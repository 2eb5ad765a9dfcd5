package server

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasehold/leasehold/fastlane"
)

// ErrShuttingDown is the answer, Unavailable with reason "shutting_down", to a fast-lane
// request that arrives while the node drains its connections (DrainFastLane): the request
// was not started, and any other node can serve it.
var ErrShuttingDown = errors.New("server: this node is shutting down and did not start the request; send it to another node")

// drainQuiet is how long a draining connection must have had nothing in flight and
// nothing arrive before it is closed: long enough for the refusals and answers just
// written to reach the client, and for a request the client sent before it read them
// to arrive and be refused rather than cut off.
const drainQuiet = 50 * time.Millisecond

// lanes are a Server's open fast-lane connections, for DrainFastLane.
type lanes struct {
	mu    sync.Mutex
	conns map[*fastConn]struct{}
	// draining: DrainFastLane has begun; since then every request read is refused
	// and no connection is added.
	draining atomic.Bool
}

// add registers c, and reports false when the server drains (c must then end).
func (l *lanes) add(c *fastConn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.draining.Load() {
		return false
	}
	if l.conns == nil {
		l.conns = make(map[*fastConn]struct{})
	}
	l.conns[c] = struct{}{}
	return true
}

func (l *lanes) remove(c *fastConn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.conns, c)
}

// DrainFastLane ends the fast lane's connections without cutting off an answer: from
// now on a request read on any connection is refused with ErrShuttingDown (the client
// sends it to another node), requests in flight are answered as usual, and each
// connection is closed once nothing has been in flight on it, and nothing has arrived,
// for a moment (drainQuiet). It returns when every connection is closed, or, when ctx
// ends first, closes the rest at once (their requests in flight end with their outcome
// unknown to the client) and returns ctx's error.
//
// A connection whose client understands GOAWAY (fastlane.FlagGoAway, as the Go client
// does) is sent one first: the client then sends nothing more on it, and closes it once
// its requests are answered.
//
// The caller closes the fast-lane listener first (ServeFastLane's ln), so that no
// connection is added. What is not promised: a client without GOAWAY that writes a
// request in the instant its connection closes (after drainQuiet of silence) has it cut
// off, its outcome unknown to that client — it was never started; the Go client, which
// looks for the GOAWAY before it writes on a connection that was idle, would have to
// stall for drainQuiet between that look and its write. Connect's requests are drained
// by the HTTP server's Shutdown.
func (s *Server) DrainFastLane(ctx context.Context) error {
	s.lanes.mu.Lock()
	s.lanes.draining.Store(true)
	// A client that understands GOAWAY sends nothing more on its connection from the
	// moment the frame arrives, so the connection's close after drainQuiet cannot meet
	// a request on its way: the frame is in the client's socket before the quiet begins.
	for c := range s.lanes.conns {
		if c.goAway {
			c.w.Offer(goAway)
		}
	}
	s.lanes.mu.Unlock()
	since := time.Now()
	tick := time.NewTicker(drainQuiet / 5)
	defer tick.Stop()
	for {
		s.lanes.mu.Lock()
		for c := range s.lanes.conns {
			last := since
			if h := c.lastHeard(); h.After(last) {
				last = h
			}
			// Not while an answer is on its way: out of inflight, but still to be
			// handed to the Writer, or written by it.
			if !c.busy() && c.w.Idle() && time.Since(last) >= drainQuiet {
				_ = c.conn.Close() // its reader fails; serveFastConn removes it
				delete(s.lanes.conns, c)
			}
		}
		left := len(s.lanes.conns)
		s.lanes.mu.Unlock()
		if left == 0 {
			return nil
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			s.lanes.mu.Lock()
			for c := range s.lanes.conns {
				_ = c.conn.Close()
			}
			clear(s.lanes.conns)
			s.lanes.mu.Unlock()
			return ctx.Err()
		}
	}
}

// goAway is the GOAWAY frame DrainFastLane sends.
var goAway = fastlane.GoAwayFrame()

// heard records, while the server drains, that a frame arrived on c.
func (c *fastConn) heard() {
	if c.s.lanes.draining.Load() {
		c.lastFrame.Store(time.Now().UnixNano())
	}
}

// lastHeard is when a frame last arrived on c since the server began to drain (the zero
// time if none has).
func (c *fastConn) lastHeard() time.Time {
	if ns := c.lastFrame.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}
