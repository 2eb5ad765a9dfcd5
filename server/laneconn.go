package server

import (
	"errors"
	"net"
	"os"
	"sync/atomic"
	"time"
)

// laneConn is a fast-lane connection under the timeouts of G6. Once watched (after the
// handshake, which has its own timeout):
//   - a connection that has read nothing for IdleTimeout (up to an eighth more) while
//     no request is in flight on it is closed: its Read fails with the timeout;
//   - a write that blocks for WriteTimeout closes the connection: the client stopped
//     reading its answers.
//
// Deadlines are moved lazily, only when an eighth of the timeout has passed since they
// were last set, so a busy connection does not pay for one per read or write.
type laneConn struct {
	net.Conn
	idle, write time.Duration
	busy        func() bool // whether requests are in flight; nil until watched
	// boundIdle, once set (atomically: the binding request's goroutine sets it while
	// the reader reads), replaces idle and applies even with requests in flight: the
	// connection holds release-on-disconnect leases and its client probes it often.
	boundIdle atomic.Int64

	readBy, writeBy time.Time // the deadlines last set (the reader's, the writer's)
}

func newLaneConn(conn net.Conn, cfg Config) *laneConn {
	return &laneConn{Conn: conn, idle: cfg.IdleTimeout, write: cfg.WriteTimeout}
}

// watch starts the timeouts; busy reports whether requests are in flight.
func (c *laneConn) watch(busy func() bool) { c.busy = busy }

// bind makes the connection fail when it has read nothing for idle, requests in flight
// or not (release on disconnect, disconnect.go).
func (c *laneConn) bind(idle time.Duration) { c.boundIdle.Store(int64(idle)) }

func (c *laneConn) Read(p []byte) (int, error) {
	if c.busy == nil {
		return c.Conn.Read(p)
	}
	for {
		idle, bound := c.idle, time.Duration(c.boundIdle.Load())
		if bound > 0 {
			idle = bound
		}
		if now := time.Now(); c.readBy.Sub(now) < idle || c.readBy.Sub(now) > idle+idle/8 {
			c.readBy = now.Add(idle + idle/8)
			_ = c.SetReadDeadline(c.readBy)
		}
		n, err := c.Conn.Read(p)
		if n == 0 && errors.Is(err, os.ErrDeadlineExceeded) && bound == 0 && c.busy() {
			continue // silent, but waiting for answers: not idle
		}
		return n, err
	}
}

func (c *laneConn) Write(p []byte) (int, error) {
	if c.busy == nil {
		return c.Conn.Write(p)
	}
	if now := time.Now(); c.writeBy.Sub(now) < c.write {
		c.writeBy = now.Add(c.write + c.write/8)
		_ = c.SetWriteDeadline(c.writeBy)
	}
	n, err := c.Conn.Write(p)
	if err != nil {
		_ = c.Close() // the reader fails too, and the connection ends
	}
	return n, err
}
