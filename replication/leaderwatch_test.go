package replication_test

import (
	"context"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/testnode"
	"github.com/leasehold/leasehold/replication"
)

// TestDeadLeaderReplacedAtOnce: when the leader's process is gone (its connections end,
// its raft port refuses), a follower stands for election at once instead of waiting out
// raft's heartbeat timeout. The timeouts here are 2 s, so a new leader within 1 s of the
// leader's end can only come from that.
func TestDeadLeaderReplacedAtOnce(t *testing.T) {
	const timeout = 2 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var peers []replication.Peer
	for _, id := range []string{"n1", "n2", "n3"} {
		peers = append(peers, replication.Peer{ID: id, RaftAddr: testnode.FreeAddr(t)})
	}
	var nodes []*replication.Node
	for _, p := range peers {
		n, err := replication.Open(replication.Config{NodeID: p.ID, DataDir: t.TempDir(), RaftAddr: p.RaftAddr,
			Bootstrap: true, Peers: peers, HeartbeatTimeout: timeout, ElectionTimeout: timeout, Logger: quiet()})
		if err != nil {
			t.Fatal(err)
		}
		defer n.Close()
		nodes = append(nodes, n)
	}
	// leader waits until every node of nodes names the same leader, one of them, and
	// returns it.
	leader := func(nodes []*replication.Node) *replication.Node {
		t.Helper()
		for {
			var l *replication.Node
			agreed := true
			for _, n := range nodes {
				st := n.Status()
				agreed = agreed && st.LeaderID != "" && st.LeaderID == nodes[0].Status().LeaderID
				if st.Role == "leader" {
					l = n
				}
			}
			if agreed && l != nil {
				return l
			}
			if ctx.Err() != nil {
				t.Fatalf("no leader agreed on by %d nodes", len(nodes))
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	old := leader(nodes)
	if err := old.Barrier(ctx); err != nil { // the followers hear from the leader
		t.Fatal(err)
	}
	var rest []*replication.Node
	for _, n := range nodes {
		if n != old {
			rest = append(rest, n)
		}
	}
	start := time.Now()
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	next := leader(rest)
	if took := time.Since(start); took >= timeout/2 {
		t.Fatalf("new leader %s after %v: raft's timeout (%v) elected it, not the dead leader's refusal", next.NodeID(), took, timeout)
	} else {
		t.Logf("new leader %s %v after the leader closed", next.NodeID(), took)
	}
}

// TestLeaderLeaseDefault: a leader steps down after 500 ms without a quorum by default,
// or after the heartbeat timeout when that is shorter, so a shorter heartbeat timeout
// alone is still a valid configuration.
func TestLeaderLeaseDefault(t *testing.T) {
	if got := (replication.Config{}).WithDefaults().LeaderLeaseTimeout; got != 500*time.Millisecond {
		t.Errorf("default leader lease timeout %v, want 500ms", got)
	}
	c := replication.Config{DataDir: t.TempDir(), HeartbeatTimeout: 200 * time.Millisecond}
	if got := c.WithDefaults().LeaderLeaseTimeout; got != 200*time.Millisecond {
		t.Errorf("leader lease timeout with a 200ms heartbeat timeout: %v, want 200ms", got)
	}
	if err := c.Validate(); err != nil {
		t.Errorf("a 200ms heartbeat timeout alone is refused: %v", err)
	}
}
