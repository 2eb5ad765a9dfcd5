//go:build linux

package client

import (
	"crypto/tls"
	"net"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/tlsconf/tlstest"
)

// TestTCPAckedThroughTLS: the kernel's view of a connection (is sent data waiting for
// the peer's acknowledgement?) is read through TLS too, so that the fast lane's watch
// for a cut path (fastLanes.watch) and a bound lease's (disconnect.go) work on a
// TLS connection as on a plain one.
func TestTCPAckedThroughTLS(t *testing.T) {
	ca := tlstest.NewCA(t, "test-ca")
	cert := ca.Issue(t, "server")
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert.TLS}, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			_ = c.(*tls.Conn).Handshake()
			accepted <- c
		}
	}()
	conn, err := tls.Dial("tcp", ln.Addr().String(), ca.ClientConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	defer func() { (<-accepted).Close() }()
	for name, c := range map[string]net.Conn{"tls": conn, "plain": conn.NetConn()} {
		// The handshake's last flight may wait for a delayed acknowledgement (up to
		// 40 ms on Linux) before the connection is idle.
		deadline := time.Now().Add(2 * time.Second)
		for {
			unacked, _, ok := tcpAcked(c)
			if !ok {
				t.Fatalf("%s: the kernel's TCP state could not be read", name)
			}
			if !unacked {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: data still unacknowledged after 2 s on a loopback connection", name)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}
