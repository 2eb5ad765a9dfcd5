// Package clustertest runs a leasehold cluster inside one test process, for the
// leader-change cases that need no real processes: every node is a full node as
// service.Start wires it (replication.Node, leader.Leader, server.Server, on loopback
// listeners with free ports), but raft's messages travel over raft's in-memory
// transport through a hub that can cut them: Partition, Disconnect, Depose and Heal
// need no root and no network namespaces. Each node has its own data directory, so
// Kill and Restart go through the real log on disk. Raft's timeouts are shrunk, and
// the nodes' logs go to t.Log, which shows them only when the test fails (or with -v).
//
// Tests call a node's handlers directly — Node.Server() is the *server.Server that
// Connect and the fast lane serve, and calling its methods in-process skips the network
// but nothing else — or dial the cluster with the Go client (Cluster.Addrs).
//
// It is modelled on hashicorp/raft's testing.go (MakeCluster, Partition, Disconnect)
// and nats-server's raftTransportHub (partition, heal); it is leasehold's own code
// because neither is importable (both live in test files of their projects).
package clustertest

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/leader"
	"github.com/leasehold/leasehold/replication"
	"github.com/leasehold/leasehold/server"
	"github.com/leasehold/leasehold/service"
)

// Options configures MakeCluster. The zero value is ready to use.
type Options struct {
	// HeartbeatTimeout and ElectionTimeout are raft's, on every node (default 400ms
	// each: short, yet long enough not to elect anew on a loaded machine running the
	// race detector). LeaderLeaseTimeout defaults to the HeartbeatTimeout, as in
	// production (replication.DefaultConfig): a leader that has not heard from a
	// quorum for that long steps down. Half of it, as before, made a leader whose
	// followers were not scheduled for 200 ms on a loaded machine step down in tests
	// that then had to follow the new one.
	HeartbeatTimeout, ElectionTimeout, LeaderLeaseTimeout time.Duration
	// Server bounds requests on every node (zero fields take server's defaults).
	Server server.Config
}

// Cluster is n nodes in this process, connected through an in-memory raft hub.
type Cluster struct {
	t     testing.TB
	opts  Options
	hub   *hub
	peers []replication.Peer
	// Nodes are the cluster's nodes, n1 first. A node keeps its place across Kill and
	// Restart.
	Nodes []*Node
}

// Node is one node of a Cluster. Between Kill and Restart it is not running, and the
// accessors of the running incarnation (Server, Leader, Raft, Addr) fail the test.
type Node struct {
	// ID is the node's raft id and its in-memory address: n1, n2, ...
	ID string
	c  *Cluster
	// Dir is the node's data directory; it outlives Kill, so Restart reopens it.
	Dir string
	log *slog.Logger

	mu  sync.Mutex
	svc *service.Node // nil while killed
}

// MakeCluster starts an n-node cluster (every node bootstraps with the same static
// configuration of all n) and waits until one node serves as leader. Everything stops
// when the test ends.
func MakeCluster(t testing.TB, n int, opts Options) *Cluster {
	t.Helper()
	if opts.HeartbeatTimeout == 0 {
		opts.HeartbeatTimeout = 400 * time.Millisecond
	}
	if opts.ElectionTimeout == 0 {
		opts.ElectionTimeout = 400 * time.Millisecond
	}
	if opts.LeaderLeaseTimeout == 0 {
		opts.LeaderLeaseTimeout = opts.HeartbeatTimeout
	}
	logs := &testLog{t: t}
	// Registered first so it runs last: nothing logs to t after the test has ended, even
	// a raft goroutine that outlives its node's Close by a moment.
	t.Cleanup(logs.stop)
	c := &Cluster{t: t, opts: opts, hub: newHub()}
	for i := range n {
		id := fmt.Sprintf("n%d", i+1)
		c.peers = append(c.peers, replication.Peer{ID: id, RaftAddr: id})
		c.Nodes = append(c.Nodes, &Node{ID: id, c: c, Dir: t.TempDir(), log: slog.New(slog.NewTextHandler(logs, nil)).With("node", id)})
	}
	t.Cleanup(func() {
		for _, nd := range c.Nodes {
			nd.stop()
		}
	})
	for _, nd := range c.Nodes {
		if err := nd.start(); err != nil {
			t.Fatal(err)
		}
	}
	c.Leader()
	return c
}

// start starts a new incarnation of the node on its data directory.
func (n *Node) start() error {
	svc, err := service.Start(service.Config{
		Addr:         "127.0.0.1:0",
		FastLaneAddr: "127.0.0.1:0",
		Raft: replication.Config{
			NodeID:             n.ID,
			DataDir:            n.Dir,
			Transport:          n.c.hub.attach(n.ID),
			Bootstrap:          true,
			Peers:              n.c.peers,
			HeartbeatTimeout:   n.c.opts.HeartbeatTimeout,
			ElectionTimeout:    n.c.opts.ElectionTimeout,
			LeaderLeaseTimeout: n.c.opts.LeaderLeaseTimeout,
		},
		Server: n.c.opts.Server,
		Logger: n.log,
	})
	if err != nil {
		n.c.hub.detach(n.ID)
		return fmt.Errorf("clustertest: start %s: %w", n.ID, err)
	}
	n.mu.Lock()
	n.svc = svc
	n.mu.Unlock()
	return nil
}

// stop closes the running incarnation, if any, at once.
func (n *Node) stop() {
	n.mu.Lock()
	svc := n.svc
	n.svc = nil
	n.mu.Unlock()
	if svc == nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // no grace: requests in flight are cut off
	if err := svc.Close(ctx); err != nil {
		n.log.Info("closed", "err", err)
	}
	n.c.hub.detach(n.ID)
}

// running returns the running incarnation, failing the test if the node is killed.
func (n *Node) running() *service.Node {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.svc == nil {
		n.c.t.Fatalf("clustertest: %s is not running", n.ID)
	}
	return n.svc
}

// Running reports whether the node runs (it was not killed, or was restarted since).
func (n *Node) Running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.svc != nil
}

// Server returns the running node's RPC handlers: (*server.Server).KeepAlive(ctx, req)
// and the rest serve the request on this node as they would after Connect or the fast
// lane routed it here, minus the transport, the routing and the error-to-code mapping.
// A handler called on a follower does not forward to the leader: it answers as a
// follower would (leader.ErrNotLeader for what only the leader serves). Errors come back
// as Go errors (leader.ErrNotLeader, *leader.LeaseGoneError, context errors, ...).
func (n *Node) Server() *server.Server { return n.running().Server }

// Leader returns the running node's leader runtime.
func (n *Node) Leader() *leader.Leader { return n.running().Leader }

// Raft returns the running node's replication node.
func (n *Node) Raft() *replication.Node { return n.running().Raft }

// Addr returns the running node's API address (Connect, on loopback). It changes on
// Restart.
func (n *Node) Addr() string { return n.running().Addr() }

// FastLaneAddr is the node's fast-lane address.
func (n *Node) FastLaneAddr() string { return n.running().FastLaneAddr() }

// serving reports whether the node runs and serves as leader.
func (n *Node) serving() bool {
	n.mu.Lock()
	svc := n.svc
	n.mu.Unlock()
	return svc != nil && svc.Leader.Active()
}

// Addrs returns every running node's API address, comma separated, for client.Dial.
func (c *Cluster) Addrs() string {
	var a []string
	for _, n := range c.Nodes {
		if n.Running() {
			a = append(a, n.Addr())
		}
	}
	return strings.Join(a, ",")
}

// leaderWait bounds Leader's wait.
const leaderWait = 30 * time.Second

// Leader waits until exactly one of among (default: every node) serves as leader, and
// returns it; the test fails if none does within 30 seconds. A node cut off by Depose
// goes on serving, so pass the others to wait for the leader they elect.
func (c *Cluster) Leader(among ...*Node) *Node {
	c.t.Helper()
	if len(among) == 0 {
		among = c.Nodes
	}
	deadline := time.Now().Add(leaderWait)
	for {
		var serving []*Node
		for _, n := range among {
			if n.serving() {
				serving = append(serving, n)
			}
		}
		if len(serving) == 1 {
			return serving[0]
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("clustertest: %d of %s serve as leader after %v, want one", len(serving), names(among), leaderWait)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Others returns every node but the given ones.
func (c *Cluster) Others(but ...*Node) []*Node {
	var out []*Node
	for _, n := range c.Nodes {
		if !slices.Contains(but, n) {
			out = append(out, n)
		}
	}
	return out
}

// Partition cuts every raft link between nodes and the rest of the cluster, both ways.
// Links within each side stay up. Clients (and the test) still reach every node.
func (c *Cluster) Partition(nodes ...*Node) {
	c.hub.mu.Lock()
	defer c.hub.mu.Unlock()
	for _, a := range nodes {
		for _, b := range c.Others(nodes...) {
			c.hub.cutLocked(a.ID, b.ID)
		}
	}
	c.log("partition", names(nodes), "from", names(c.Others(nodes...)))
}

// Disconnect cuts node off from every other node (raft only).
func (c *Cluster) Disconnect(node *Node) { c.Partition(node) }

// Depose cuts node off from every other node like Disconnect, but answers its raft
// heartbeats in its peers' place, as they answered before the cut. A leader so cut off
// goes on believing it leads — raft's own lease check and its heartbeat-based
// VerifyLeader keep passing — while the others elect a new leader; nothing it proposes
// commits. It is a leader deposed while it was paused (GC, SIGSTOP, a VM migration),
// at the moment it wakes to its followers' stale answers, held open until Heal.
func (c *Cluster) Depose(node *Node) {
	c.Partition(node)
	c.hub.mu.Lock()
	c.hub.deposed[node.ID] = true
	c.hub.mu.Unlock()
	c.log("depose", node.ID)
}

// Heal restores every raft link cut by Partition, Disconnect or Depose.
func (c *Cluster) Heal() {
	c.hub.heal()
	c.log("heal")
}

// Kill stops node at once — requests in flight are cut off, leadership is not handed
// over — keeping its data directory for Restart. In one process this is as close to
// kill -9 as it gets; the log is fsynced before each commit is acknowledged, so a real
// kill -9 loses nothing more (test/e2e checks that with real processes).
func (c *Cluster) Kill(node *Node) {
	c.t.Helper()
	if !node.Running() {
		c.t.Fatalf("clustertest: Kill: %s is not running", node.ID)
	}
	node.stop()
	c.log("killed", node.ID)
}

// Restart starts a killed node again on its data directory (same id, new API port). It
// does not wait for the node to catch up or for a leader.
func (c *Cluster) Restart(node *Node) {
	c.t.Helper()
	if node.Running() {
		c.t.Fatalf("clustertest: Restart: %s is running", node.ID)
	}
	if err := node.start(); err != nil {
		c.t.Fatal(err)
	}
	c.log("restarted", node.ID)
}

// WaitFor polls cond every few milliseconds until it holds; the test fails, naming
// what it waited for, if it does not within 10 seconds.
func WaitFor(t testing.TB, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("clustertest: timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (c *Cluster) log(msg string, args ...any) {
	c.t.Helper()
	c.t.Log(append([]any{"clustertest:", msg}, args...)...)
}

func names(nodes []*Node) string {
	var s []string
	for _, n := range nodes {
		s = append(s, n.ID)
	}
	return "[" + strings.Join(s, " ") + "]"
}

// testLog writes the nodes' log records to t.Log until the test ends.
type testLog struct {
	t       testing.TB
	mu      sync.Mutex
	stopped bool
}

func (l *testLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.stopped {
		l.t.Log(strings.TrimSuffix(string(p), "\n"))
	}
	return len(p), nil
}

func (l *testLog) stop() {
	l.mu.Lock()
	l.stopped = true
	l.mu.Unlock()
}
