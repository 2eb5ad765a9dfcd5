package service

import (
	"io"
	"log/slog"
	"net"
	"syscall"
	"testing"
)

// TestLimitedConnKeepsSocket: a connection accepted under the per-address bound still
// hands out its socket, and a raw write on it reaches the peer; the bound still counts
// it until it is closed.
func TestLimitedConnKeepsSocket(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	limit := newConnLimit(1, slog.New(slog.DiscardHandler))
	ln := limit.wrap(raw)
	defer ln.Close()
	peer, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	conn, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	sc, ok := conn.(syscall.Conn)
	if !ok {
		t.Fatalf("an accepted %T hides its socket", conn)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	var werr error
	if err := rc.Write(func(fd uintptr) bool {
		n, werr = syscall.Write(int(fd), []byte("hi"))
		return true
	}); err != nil || werr != nil || n != 2 {
		t.Fatalf("a write on the raw socket: n=%d, %v, %v", n, err, werr)
	}
	buf := make([]byte, 2)
	if _, err := io.ReadFull(peer, buf); err != nil || string(buf) != "hi" {
		t.Fatalf("the peer read %q, %v", buf, err)
	}
	if limit.take("127.0.0.1") {
		t.Fatal("the bound of 1 let a second connection from the same address in")
	}
	if err := conn.Close(); err != nil {
		t.Fatal(err)
	}
	if !limit.take("127.0.0.1") {
		t.Fatal("closing the connection did not give its place back")
	}
}
