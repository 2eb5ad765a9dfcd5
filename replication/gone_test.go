package replication

import (
	"net"
	"testing"

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
