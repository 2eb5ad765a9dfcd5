package replication_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/leasehold/leasehold/core"
	"github.com/leasehold/leasehold/internal/testnode"
	"github.com/leasehold/leasehold/replication"
)

// TestAddNonvoterKeepsQuorum: a member added as a non-voter that never answers (a typo)
// leaves a one-node cluster committing on its own; the same member added as a voter
// would take the cluster's majority away. The non-voter first, then the promotion, is
// why AddMember cannot brick a cluster.
func TestAddNonvoterKeepsQuorum(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	n := open(t, t.TempDir(), "")
	defer n.Close()
	if err := n.AddNonvoter(ctx, "typo", testnode.FreeAddr(t)); err != nil {
		t.Fatal(err)
	}
	servers, err := n.Configuration()
	if err != nil || len(servers) != 2 || servers[1].Voter {
		t.Fatalf("configuration %+v, %v", servers, err)
	}
	actx, acancel := context.WithTimeout(ctx, 5*time.Second)
	defer acancel()
	if _, err := n.Apply(actx, core.Command{Op: core.OpGrant, Lease: core.LeaseID{9}, TTLMillis: 1000}); err != nil {
		t.Fatalf("with a dead non-voter the cluster no longer commits: %v", err)
	}
	if err := n.VerifyLeader(actx); err != nil {
		t.Fatalf("with a dead non-voter the leader cannot confirm its leadership: %v", err)
	}
}

// TestRecoverCluster: a three-voter cluster loses two nodes for good; RecoverCluster
// rewrites the survivor's configuration to itself alone, and the survivor leads again with
// its state, a token sequence advanced by the gap, and no trace of the lost voters.
func TestRecoverCluster(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := func(id string) replication.Config {
		return replication.Config{NodeID: id, DataDir: t.TempDir(), RaftAddr: testnode.FreeAddr(t), Logger: quiet()}
	}
	c1, c2, c3 := cfg("n1"), cfg("n2"), cfg("n3")
	c1.Bootstrap = true
	n1, err := replication.Open(c1)
	if err != nil {
		t.Fatal(err)
	}
	for !n1.IsLeader() {
		if ctx.Err() != nil {
			t.Fatal("no leader")
		}
		time.Sleep(5 * time.Millisecond)
	}
	var lost []*replication.Node
	for _, c := range []replication.Config{c2, c3} {
		n, err := replication.Open(c)
		if err != nil {
			t.Fatal(err)
		}
		lost = append(lost, n)
		if err := n1.AddVoter(ctx, c.NodeID, c.RaftAddr); err != nil {
			t.Fatal(err)
		}
	}
	lease := core.LeaseID{7}
	apply(t, n1, core.Command{Op: core.OpGrant, Lease: lease, TTLMillis: 60_000})
	tok := apply(t, n1, core.Command{Op: core.OpAcquire, Lease: lease, Name: "x", Class: core.Correctness}).Token
	apply(t, n1, core.Command{Op: core.OpSetClusterID, ClusterID: "0123456789abcdef0123456789abcdef"})
	for _, n := range append(lost, n1) {
		if err := n.Close(); err != nil {
			t.Fatal(err)
		}
	}

	const gap = 1000
	running, err := replication.Open(c1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := replication.RecoverCluster(c1, nil, gap); !errors.Is(err, replication.ErrDataDirInUse) {
		t.Fatalf("recovering a running node: %v, want ErrDataDirInUse", err)
	}
	_ = running.Close()
	if _, err := replication.RecoverCluster(c1, []replication.Peer{{ID: "n2", RaftAddr: c2.RaftAddr}}, gap); err == nil {
		t.Fatal("a configuration without this node was accepted")
	}
	rec, err := replication.RecoverCluster(c1, nil, gap)
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Before) != 3 || len(rec.After) != 1 || rec.After[0].ID != "n1" || rec.LastToken < tok+gap || rec.LastIndex == 0 {
		t.Fatalf("recovery %+v", rec)
	}

	n1, err = replication.Open(c1)
	if err != nil {
		t.Fatal(err)
	}
	defer n1.Close()
	for !n1.IsLeader() {
		if ctx.Err() != nil {
			t.Fatalf("the recovered node does not lead: %+v", n1.Status())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := n1.Barrier(ctx); err != nil {
		t.Fatal(err)
	}
	var held uint64
	var id string
	n1.Read(func(s *core.State) { held, id = s.Locks().Get("x").Hold.Token, s.ClusterID() })
	if held != tok || id != "0123456789abcdef0123456789abcdef" {
		t.Fatalf("recovered lock x held under %d (want %d), cluster ID %q", held, tok, id)
	}
	if next := apply(t, n1, core.Command{Op: core.OpAcquire, Lease: lease, Name: "y", Class: core.Correctness}).Token; next <= tok+gap {
		t.Fatalf("first token after recovery %d is not above %d + gap %d", next, tok, gap)
	}
	servers, err := n1.Configuration()
	if err != nil || len(servers) != 1 || servers[0].ID != "n1" || !servers[0].Voter {
		t.Fatalf("configuration after recovery %+v, %v", servers, err)
	}
}

// TestClusterIDKnownAtStart: a node knows the cluster it belongs to as soon as it opens
// its data dir, before it has applied the log again (a follower applies only once a
// leader tells it the commit index): the ID is kept in the stable store when applied.
func TestClusterIDKnownAtStart(t *testing.T) {
	dir := t.TempDir()
	n := open(t, dir, "")
	const id = "0123456789abcdef0123456789abcdef"
	apply(t, n, core.Command{Op: core.OpSetClusterID, ClusterID: id})
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	// No snapshot holds the ID, and no election has happened yet right after Open.
	n, err := replication.Open(replication.Config{DataDir: dir, RaftAddr: "127.0.0.1:0", Logger: quiet(), HeartbeatTimeout: 2 * time.Second, ElectionTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	var got string
	var applied uint64
	n.Read(func(s *core.State) { got = s.ClusterID() })
	applied = n.Status().AppliedIndex
	if got != id {
		t.Fatalf("right after Open the cluster ID is %q (applied index %d), want %s", got, applied, id)
	}
}
