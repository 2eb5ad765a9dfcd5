// Package testnode starts a leasehold node inside a test or benchmark: a real raft log
// on a temporary dir, the leader runtime, Connect and the fast lane on free loopback
// ports, logs discarded. Everything stops when the test ends.
package testnode

import (
	"context"
	"io"
	"log/slog"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold/replication"
	"github.com/leasehold/leasehold/service"
)

// Start starts a single-node leasehold in-process and waits until it serves as leader.
func Start(tb testing.TB) *service.Node { return StartWith(tb, nil) }

// StartWith is Start with the configuration changed by with (if not nil) first.
func StartWith(tb testing.TB, with func(*service.Config)) *service.Node {
	tb.Helper()
	cfg := service.Config{
		Addr:         "127.0.0.1:0",
		FastLaneAddr: "127.0.0.1:0",
		Raft:         replication.Config{DataDir: tb.TempDir(), RaftAddr: "127.0.0.1:0", Bootstrap: true},
		Logger:       slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	if with != nil {
		with(&cfg)
	}
	n, err := service.Start(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = n.Close(context.Background()) })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.WaitReady(ctx); err != nil {
		tb.Fatal(err)
	}
	return n
}

// Silent listens on a free loopback port, accepts every connection and never answers:
// a node that was cut off the network after its connections were made, as its clients
// and peers see it. It returns the address and a count of the connections accepted. It
// closes when the test ends.
func Silent(tb testing.TB) (addr string, accepted *atomic.Int32) {
	tb.Helper()
	accepted = new(atomic.Int32)
	addr = Serve(tb, func(conn net.Conn) {
		accepted.Add(1)
		_, _ = io.Copy(io.Discard, conn) // keep its buffers empty
	})
	return addr, accepted
}

// Serve listens on a free loopback port and runs serve on a goroutine of its own for
// every connection, until the test ends; then it closes the listener and every
// connection. It returns the address.
func Serve(tb testing.TB, serve func(net.Conn)) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				_ = c.Close()
			}
		}()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, conn)
			go serve(conn)
		}
	}()
	tb.Cleanup(func() { _ = ln.Close(); <-done })
	return ln.Addr().String()
}

// FreeAddr returns a loopback address that was free a moment ago: for a node that must
// be reopened on the address its raft configuration names, or for an address where
// nothing listens.
func FreeAddr(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
