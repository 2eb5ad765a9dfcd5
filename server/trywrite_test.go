//go:build unix

package server

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/loopback"
)

// TestLaneConnTryWrite: on a TCP connection whose peer reads nothing, TryWrite never
// waits — once the socket's buffers are full it takes a part or nothing — and the peer
// then reads exactly the bytes it reported taken, in order.
func TestLaneConnTryWrite(t *testing.T) {
	peer, server := loopback.Pair(t)
	c := newLaneConn(server, DefaultConfig())

	chunk := bytes.Repeat([]byte("0123456789abcdef"), 4096) // 64 KiB
	var sent []byte
	full := false
	start := time.Now()
	for i := 0; i < 1000 && !full; i++ {
		p := append([]byte{byte(i)}, chunk...)
		n, tried, err := c.TryWrite(p)
		if !tried || err != nil {
			t.Fatalf("TryWrite on TCP: tried %v, err %v", tried, err)
		}
		sent = append(sent, p[:n]...)
		full = n < len(p)
	}
	if !full {
		t.Fatal("64 MB taken by a socket whose peer reads nothing")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("TryWrite took %v to fill the buffers: it waited", d)
	}
	_ = server.(*net.TCPConn).CloseWrite()
	got, err := io.ReadAll(peer)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, sent) {
		t.Fatalf("peer read %d bytes, TryWrite reported %d taken (or in another order)", len(got), len(sent))
	}
}
