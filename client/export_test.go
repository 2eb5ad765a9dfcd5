package client

import (
	"net"
	"time"
)

// WithCutPathsForTest makes the fast lane's silence watch see the path to every node as
// cut (data sent, never acknowledged by the peer's TCP), as a partition would, which a
// test on loopback cannot make.
func WithCutPathsForTest() Option {
	return func(o *options) {
		o.tcpAcked = func(net.Conn) (bool, time.Duration, bool) { return true, time.Hour, true }
	}
}

// BreakFastLaneForTest closes c's fast-lane connection under it, as a broken network
// or a crash would: no goodbye, the server just sees the connection end.
func BreakFastLaneForTest(c *Client) {
	c.fast.mu.Lock()
	conn := c.fast.conn
	c.fast.mu.Unlock()
	if conn != nil {
		_ = conn.conn.Close()
	}
}
