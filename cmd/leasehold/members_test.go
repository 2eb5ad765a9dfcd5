package main

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/internal/testnode"
	"github.com/leasehold/leasehold/replication"
	"github.com/leasehold/leasehold/service"
)

// TestCommandsWithoutLeaderGiveUp: a cluster of two voters loses one; the other
// has no leader to serve `members remove` (OPERATIONS.md: "nothing, members remove
// included, can be served"). The command must say so and exit — not retry forever.
func TestCommandsWithoutLeaderGiveUp(t *testing.T) {
	n1 := testnode.StartWith(t, func(cfg *service.Config) { cfg.Raft.NodeID = "n1" })
	n2, err := service.Start(service.Config{
		Addr:         "127.0.0.1:0",
		FastLaneAddr: "127.0.0.1:0",
		Raft:         replication.Config{NodeID: "n2", DataDir: t.TempDir(), RaftAddr: testnode.FreeAddr(t)},
		Join:         n1.Addr(),
		Logger:       slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.Dial(ctx, n1.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close(context.Background()) }()
	for {
		ms, err := c.Members(ctx)
		if err == nil && len(ms) == 2 && ms[1].GetSuffrage() == "voter" {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("n2 did not join: %v %v", ms, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := n2.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for n1.Raft.IsLeader() { // it steps down once it has heard from no quorum for a while
		if ctx.Err() != nil {
			t.Fatal("n1 still leads alone")
		}
		time.Sleep(20 * time.Millisecond)
	}
	type result struct {
		code           int
		stdout, stderr string
	}
	done := make(chan result, 1)
	go func() {
		code, stdout, stderr := cli(t, "members", "remove", "n2", "--addr", n1.Addr(), "--timeout", "5s")
		done <- result{code, stdout, stderr}
	}()
	select {
	case r := <-done:
		// The message goes to the process's stderr (clientcmds.go), not to r.stderr.
		if r.code != exitUnavailable {
			t.Fatalf("members remove without a quorum: exit %d, stdout %q, stderr %q; want %d", r.code, r.stdout, r.stderr, exitUnavailable)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("members remove against a node without a leader has not answered in 30 s")
	}
	// Every command that makes its calls and exits has --timeout (default 30 s).
	for _, args := range [][]string{
		{"kv", "get", "k"}, {"kv", "put", "k", "v"}, {"locks"}, {"history", "x"},
		{"unlock", "x", "--force", "--reason", "test"}, {"leader", "e"}, {"group", "status", "g"},
	} {
		start := time.Now()
		code, _, stderr := cli(t, append(args, "--addr", n1.Addr(), "--timeout", "1s")...)
		if took := time.Since(start); code != exitUnavailable || took > 10*time.Second {
			t.Errorf("%v --timeout 1s without a leader: exit %d after %v (%s); want %d within the timeout", args, code, took.Round(time.Millisecond), stderr, exitUnavailable)
		}
	}
	if code, _, stderr := cli(t, "locks", "--addr", n1.Addr(), "--timeout", "-1s"); code != exitUsage || !strings.Contains(stderr, "--timeout") {
		t.Errorf("locks --timeout -1s: exit %d (%s), want a usage error naming --timeout", code, stderr)
	}
}
