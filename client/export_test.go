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
