//go:build linux

package client

import (
	"crypto/tls"
	"net"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/loopback"
	"github.com/leasehold/leasehold/internal/tlsconf/tlstest"
)

// TestTCPAckedThroughTLS: the kernel's view of a connection (is sent data waiting for
// the peer's acknowledgement?) is read through TLS too, so that the fast lane's watch
// for a cut path (fastLanes.watch) and a bound lease's (disconnect.go) work on a
// TLS connection as on a plain one.
func TestTCPAckedThroughTLS(t *testing.T) {
	ca := tlstest.NewCA(t, "test-ca")
	cert := ca.Issue(t, "server")
	peer, server := loopback.Pair(t)
	srv := tls.Server(server, &tls.Config{Certificates: []tls.Certificate{cert.TLS}, MinVersion: tls.VersionTLS12})
	cfg := ca.ClientConfig()
	cfg.ServerName = "127.0.0.1"
	conn := tls.Client(peer, cfg)
	done := make(chan error, 1)
	go func() { done <- srv.Handshake() }()
	if err := conn.Handshake(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
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
