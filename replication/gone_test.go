package replication

import (
	"net"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// TestGone: a leader counts as gone when its port refuses, or accepts and closes at once
// (a dying process) and then refuses; a port that accepts and keeps the connection open
// is a live node.
func TestGone(t *testing.T) {
	listen := func() net.Listener {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		return ln
	}
	live := listen()
	defer live.Close()
	go func() {
		var held []net.Conn // open until the listener closes
		defer func() {
			for _, c := range held {
				_ = c.Close()
			}
		}()
		for {
			c, err := live.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	if gone(raft.ServerAddress(live.Addr().String())) {
		t.Error("a live node (connection held open) counts as gone")
	}

	closed := listen()
	addr := raft.ServerAddress(closed.Addr().String())
	_ = closed.Close()
	if !gone(addr) {
		t.Error("a refused port does not count as gone")
	}

	dying := listen()
	go func() {
		if c, err := dying.Accept(); err == nil {
			_ = dying.Close() // the listener goes with the process
			_ = c.Close()
		}
	}()
	if !gone(raft.ServerAddress(dying.Addr().String())) {
		t.Error("a port that accepted, closed and then refused does not count as gone")
	}
}

// TestDialedConnRedialsAfterPeerClosed: a pooled connection whose other end closed
// between two requests (the other node restarted) is dialled again when the next request
// starts, so the request goes through instead of failing on the dead connection.
func TestDialedConnRedialsAfterPeerClosed(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan int, 4)
	go func() {
		for i := 1; ; i++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- i
			go func(first bool) {
				defer c.Close()
				var b [1]byte
				for {
					if _, err := c.Read(b[:]); err != nil {
						return
					}
					if _, err := c.Write(b[:]); err != nil || first {
						return // the first connection ends after one answer
					}
				}
			}(i == 1)
		}
	}()
	s := &stream{Listener: ln, dial: dialTCP}
	c, err := s.Dial(raft.ServerAddress(ln.Addr().String()), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ask := func(v byte) {
		t.Helper()
		if _, err := c.Write([]byte{v}); err != nil {
			t.Fatalf("write %d: %v", v, err)
		}
		var b [1]byte
		if _, err := c.Read(b[:]); err != nil || b[0] != v {
			t.Fatalf("answer to %d: %v %v", v, b[0], err)
		}
	}
	ask(1)
	if n := <-accepted; n != 1 {
		t.Fatalf("connection %d", n)
	}
	time.Sleep(50 * time.Millisecond) // the server's close reaches this side
	ask(2)
	if n := <-accepted; n != 2 {
		t.Fatalf("the second request went on connection %d, want a new one (2)", n)
	}
}
