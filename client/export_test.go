package client

import (
	"context"
	"net"
	"net/http"
	"sync"
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

// WithBreakableConnectForTest returns an option whose Connect transport records its
// connections, and a function that closes them all under the client, as a broken
// network would.
func WithBreakableConnectForTest() (Option, func()) {
	var mu sync.Mutex
	var conns []net.Conn
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err == nil {
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
		return c, err
	}
	breakAll := func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
		conns = nil
	}
	return WithHTTPClient(&http.Client{Transport: tr}), breakAll
}
