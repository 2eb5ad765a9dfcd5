// Package testnode starts a leasehold node inside a test or benchmark: a real raft log
// on a temporary dir, the leader runtime, Connect and the fast lane on free loopback
// ports, logs discarded. Everything stops when the test ends.
package testnode

import (
	"context"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/leasehold/leasehold/replication"
	"github.com/leasehold/leasehold/service"
)

// Start starts a single-node leasehold in-process and waits until it serves as leader.
func Start(tb testing.TB) *service.Node {
	tb.Helper()
	n, err := service.Start(service.Config{
		Addr:         "127.0.0.1:0",
		FastLaneAddr: "127.0.0.1:0",
		Raft:         replication.Config{DataDir: tb.TempDir(), RaftAddr: "127.0.0.1:0", Bootstrap: true},
		Logger:       slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
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
