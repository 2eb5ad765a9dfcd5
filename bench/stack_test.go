package bench

import (
	"context"
	"testing"
	"time"

	"github.com/leasehold/leasehold/replication"
	"github.com/leasehold/leasehold/service"
)

// startStack runs a single-node server in this process on a temporary data dir and
// returns its API address. Everything stops at the end of the benchmark.
func startStack(tb testing.TB) string {
	tb.Helper()
	n, err := service.Start(service.Config{
		Addr:         "127.0.0.1:0",
		FastLaneAddr: "127.0.0.1:0",
		Raft:         replication.Config{DataDir: tb.TempDir(), RaftAddr: "127.0.0.1:0", Bootstrap: true},
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
	return n.Addr()
}
