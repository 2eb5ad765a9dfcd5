package clustertest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/internal/clustertest"
)

func grant(t *testing.T, n *clustertest.Node, ttl time.Duration) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := n.Server().Grant(ctx, &leaseholdv1.GrantRequest{TtlMs: ttl.Milliseconds()})
	if err != nil {
		t.Fatalf("grant through %s: %v", n.ID, err)
	}
	return resp.GetLeaseId()
}

// TestPartitionAndHeal: a leader cut off from the others steps down and they elect one
// of themselves; after Heal there is one leader, and every node agrees which.
func TestPartitionAndHeal(t *testing.T) {
	c := clustertest.MakeCluster(t, 3, clustertest.Options{})
	L := c.Leader()
	c.Partition(L)
	N := c.Leader(c.Others(L)...)
	if N == L {
		t.Fatalf("the partitioned %s is still the leader", L.ID)
	}
	clustertest.WaitFor(t, func() bool { return !L.Leader().Active() }, "the partitioned leader to step down")
	c.Heal()
	leader := c.Leader()
	for _, n := range c.Nodes {
		clustertest.WaitFor(t, func() bool { return n.Raft().Status().LeaderID == leader.ID }, n.ID+" to follow "+leader.ID+" after Heal")
	}
}

// TestDeposeKeepsTheOldLeaderServing: a deposed leader goes on serving as leader, and
// confirming its leadership with raft's heartbeats passes, while the others elect a new
// one; nothing it proposes commits; after Heal it steps down.
func TestDeposeKeepsTheOldLeaderServing(t *testing.T) {
	c := clustertest.MakeCluster(t, 3, clustertest.Options{})
	L := c.Leader()
	c.Depose(L)
	N := c.Leader(c.Others(L)...)
	if !L.Leader().Active() || L.Raft().Status().Role != "leader" {
		t.Fatalf("deposed %s stopped leading (role %s) once %s was elected", L.ID, L.Raft().Status().Role, N.ID)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := L.Server().Grant(ctx, &leaseholdv1.GrantRequest{TtlMs: 1000}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a grant through the deposed %s: %v, want it never to commit (DeadlineExceeded)", L.ID, err)
	}
	grant(t, N, time.Second)
	c.Heal()
	clustertest.WaitFor(t, func() bool { return !L.Leader().Active() }, "the deposed leader to step down after Heal")
}

// TestKillAndRestart: every node killed and restarted on its data directory comes back
// with the replicated state: the lock granted before is still held, under its token.
func TestKillAndRestart(t *testing.T) {
	c := clustertest.MakeCluster(t, 3, clustertest.Options{})
	L := c.Leader()
	lease := grant(t, L, time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	acq, err := L.Server().Acquire(ctx, &leaseholdv1.AcquireRequest{Name: "restart/x", Class: leaseholdv1.LockClass_LOCK_CLASS_CORRECTNESS, LeaseId: lease})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Nodes {
		c.Kill(n)
	}
	for _, n := range c.Nodes {
		c.Restart(n)
	}
	N := c.Leader()
	d, err := N.Server().Describe(ctx, &leaseholdv1.DescribeRequest{Name: "restart/x"})
	if err != nil {
		t.Fatal(err)
	}
	if !d.GetLock().GetHeld() || d.GetLock().GetToken() != acq.GetToken() {
		t.Fatalf("after restarting every node: %v, want held under token %d", d.GetLock(), acq.GetToken())
	}
}
