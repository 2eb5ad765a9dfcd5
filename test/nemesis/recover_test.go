package nemesis

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/client"
)

// TestRecoverAfterQuorumLoss follows docs/OPERATIONS.md "Recovering a cluster that lost
// its quorum": a three-node cluster loses two nodes for good; the survivor, stopped, is
// recovered with `leasehold server --recover` to itself alone, started again as before,
// and serves with its data: the value written, the lock still held by its holder (whose
// lease rides through the outage), tokens above everything issued before, and a
// configuration of one voter.
func TestRecoverAfterQuorumLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real cluster; skipped with -short")
	}
	c := NewCluster(t, false)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	holder, err := client.Dial(ctx, c.Addrs(), client.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(context.Background())
	id := holder.ClusterID()
	lock, err := holder.Lock(ctx, "recover/lock", client.Correctness)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Put(ctx, "recover/key", []byte("kept")); err != nil {
		t.Fatal(err)
	}
	survivor := c.Nodes[0]
	for _, n := range c.Nodes {
		if err := n.Kill9(); err != nil {
			t.Fatal(err)
		}
	}
	// Only the survivor comes back: alone it is one voter of three, without a majority.
	if err := survivor.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	if c.healthz(0) {
		t.Fatal("one node of three serves as leader")
	}
	if err := survivor.Term(); err != nil {
		t.Fatal(err)
	}

	rctx, rcancel := context.WithTimeout(ctx, time.Minute)
	defer rcancel()
	out, err := exec.CommandContext(rctx, leaseholdBinary(t), "server", "--recover", "--node-id", survivor.ID,
		"--raft-addr", survivor.Raft, "--data-dir", survivor.Dir).CombinedOutput()
	t.Logf("leasehold server --recover:\n%s", out)
	if err != nil {
		t.Fatalf("--recover: %v", err)
	}
	if !strings.Contains(string(out), "it is now ["+survivor.ID+" "+survivor.Raft+"]") {
		t.Fatal("--recover does not report the new configuration")
	}
	if err := survivor.Start(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.waitLeader(ctx, []int{0}); err != nil {
		t.Fatalf("the recovered node does not lead: %v", err)
	}

	other, err := client.Dial(ctx, survivor.API, client.WithClusterID(id))
	if err != nil {
		t.Fatalf("the recovered node is not of cluster %s: %v", id, err)
	}
	defer other.Close(context.Background())
	if v, err := other.Get(ctx, "recover/key"); err != nil || string(v.Data) != "kept" {
		t.Fatalf("recover/key after the recovery: %q %v", v.Data, err)
	}
	if _, err := other.Lock(ctx, "recover/lock", client.Correctness, client.TryOnce); !errors.Is(err, client.ErrNotAcquired) {
		t.Fatalf("recover/lock is not held by its holder after the recovery: %v", err)
	}
	next, err := other.Lock(ctx, "recover/next", client.Correctness)
	if err != nil {
		t.Fatal(err)
	}
	if next.Token() <= lock.Token() {
		t.Fatalf("token after the recovery %d is not above %d", next.Token(), lock.Token())
	}
	ms, err := other.Members(ctx)
	if err != nil || len(ms) != 1 || ms[0].GetNodeId() != survivor.ID || ms[0].GetSuffrage() != "voter" {
		t.Fatalf("members after the recovery: %v %v", ms, err)
	}
	// The holder's lease rode through: its keepalives reach the survivor again, and its
	// lock is still its own.
	if err := lock.Context().Err(); err != nil {
		t.Fatalf("the holder lost its lock: %v", context.Cause(lock.Context()))
	}
	if err := lock.Unlock(ctx); err != nil {
		t.Fatalf("the holder cannot unlock after the recovery: %v", err)
	}
}
