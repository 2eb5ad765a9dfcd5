package bench

import (
	"context"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/leasehold/leasehold/core"
	"github.com/leasehold/leasehold/leader"
	"github.com/leasehold/leasehold/replication"
	"github.com/leasehold/leasehold/server"
)

// startStack runs a single-node server in this process on a temporary data dir and
// returns its API address. Everything stops at the end of the benchmark.
func startStack(tb testing.TB) string {
	tb.Helper()
	var l *leader.Leader
	changes := make(chan bool, 1)
	node, err := replication.Open(replication.Config{
		DataDir:      tb.TempDir(),
		RaftAddr:     "127.0.0.1:0",
		Bootstrap:    true,
		Observe:      func(e []core.Effect) { l.OnEffects(e) },
		LeaderChange: changes,
	})
	if err != nil {
		tb.Fatal(err)
	}
	l = leader.New(node, leader.Config{})
	ctx, cancel := context.WithCancel(context.Background())
	go l.Run(ctx, changes)
	srv, err := server.New(server.Config{}, l, node)
	if err != nil {
		tb.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	hs := &http.Server{Handler: srv.Handler(), Protocols: new(http.Protocols)}
	hs.Protocols.SetHTTP1(true)
	hs.Protocols.SetUnencryptedHTTP2(true)
	go func() { _ = hs.Serve(ln) }()
	tb.Cleanup(func() {
		_ = hs.Close()
		cancel()
		l.Demote()
		_ = node.Close()
	})
	deadline := time.Now().Add(10 * time.Second)
	for !l.Active() {
		if time.Now().After(deadline) {
			tb.Fatal("no leader after 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return ln.Addr().String()
}
