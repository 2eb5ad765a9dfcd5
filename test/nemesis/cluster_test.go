package nemesis

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/internal/proc"
)

// ---- the leasehold binary, built once per test binary ----------------------------------

var (
	buildOnce sync.Once
	buildDir  string
	buildBin  string
	buildErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// leaseholdBinary builds ./cmd/leasehold once (lazily, so skipped tests cost nothing).
func leaseholdBinary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		root, err := proc.ModuleRoot()
		if err != nil {
			buildErr = err
			return
		}
		if buildDir, err = os.MkdirTemp("", "leasehold-nemesis-bin-"); err != nil {
			buildErr = err
			return
		}
		buildBin = filepath.Join(buildDir, "leasehold")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		buildErr = proc.Build(ctx, root, buildBin, "./cmd/leasehold")
	})
	if buildErr != nil {
		t.Fatalf("building leasehold: %v", buildErr)
	}
	return buildBin
}

// ---- the cluster -----------------------------------------------------------------------

// Cluster is three `leasehold server` processes: n1 bootstraps, n2 and n3 join through
// n1. With a network lab each node runs in its own network namespace (partitions
// possible); without, all listen on free loopback ports. Logs go to files that are
// printed (their tails) only when the test fails; the working directory is then kept.
type Cluster struct {
	t     testing.TB
	dir   string
	lab   *netLab // nil on loopback
	Nodes []*Node

	mu     sync.Mutex
	probes map[int]*client.Client
	hc     *http.Client
}

// Node is one server of a Cluster: a `leasehold server` process (internal/proc).
type Node struct {
	c     *Cluster
	Index int
	ID    string
	API   string // host:port of the API (clients, forwarding)
	Raft  string
	Fast  string // fast-lane address ("" if the binary has no such flag)
	Dir   string // data dir
	Log   string // log file (every incarnation appends)
	srv   *proc.Server
}

// NewCluster starts a three-node cluster and waits until it is healthy. With useNetns the
// nodes run in a network lab (the caller checked netnsUnavailable).
func NewCluster(t testing.TB, useNetns bool) *Cluster {
	t.Helper()
	bin := leaseholdBinary(t)
	dir, err := os.MkdirTemp("", "leasehold-nemesis-")
	if err != nil {
		t.Fatal(err)
	}
	c := &Cluster{t: t, dir: dir, probes: map[int]*client.Client{}}
	c.hc = &http.Client{Timeout: 2 * time.Second}
	t.Cleanup(c.close)
	if useNetns {
		if c.lab, err = newNetLab(3); err != nil {
			t.Fatalf("network lab: %v", err)
		}
	}
	for i := range 3 {
		n := &Node{c: c, Index: i, ID: fmt.Sprintf("n%d", i+1), Dir: filepath.Join(dir, fmt.Sprintf("n%d", i+1))}
		n.Log = n.Dir + ".log"
		n.srv = &proc.Server{Bin: bin, ID: n.ID, Dir: n.Dir, Log: n.Log, Advertise: true, Args: []string{"--min-ttl", "100ms"}}
		if c.lab != nil {
			// In its own namespace every node has the default ports to itself.
			ip := c.lab.NodeIP(i)
			n.srv.API, n.srv.Raft, n.srv.Fast = ip+":7740", ip+":7741", ip+":7742"
			n.srv.Prefix = c.lab.Exec(i)
		}
		// Else the first Start picks free loopback ports.
		if i > 0 {
			n.srv.Join = c.Nodes[0].API
		}
		c.Nodes = append(c.Nodes, n)
		if i == 0 {
			if err := n.Start(); err != nil {
				t.Fatal(err)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := c.waitLeader(ctx, []int{0}); err != nil {
		t.Fatalf("n1 did not become leader: %v", err)
	}
	for _, n := range c.Nodes[1:] {
		if err := n.Start(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.WaitHealthy(ctx); err != nil {
		t.Fatalf("cluster did not become healthy: %v", err)
	}
	return c
}

// Addrs returns every node's API address, comma separated, for client.Dial.
func (c *Cluster) Addrs() string {
	var a []string
	for _, n := range c.Nodes {
		a = append(a, n.API)
	}
	return strings.Join(a, ",")
}

// Netns reports whether the nodes run in a network lab (partitions possible).
func (c *Cluster) Netns() bool { return c.lab != nil }

func (c *Cluster) close() {
	for _, n := range c.Nodes {
		n.kill()
	}
	c.mu.Lock()
	for _, p := range c.probes {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = p.Close(ctx)
		cancel()
	}
	c.mu.Unlock()
	if c.lab != nil {
		c.lab.Close()
	}
	if c.t.Failed() {
		for _, n := range c.Nodes {
			c.t.Logf("---- tail of %s's log (%s) ----\n%s", n.ID, n.Log, proc.Tail(n.Log, 120))
		}
		c.t.Logf("cluster data and logs kept in %s", c.dir)
		return
	}
	_ = os.RemoveAll(c.dir)
}

// ---- one node's process ----------------------------------------------------------------

// Start starts the node's process (same ports, same data dir, same flags every time) and
// waits until it answers HTTP (its listeners are open; it may not have joined yet).
func (n *Node) Start() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := n.srv.Start(ctx); err != nil {
		return err
	}
	n.API, n.Raft, n.Fast = n.srv.API, n.srv.Raft, n.srv.Fast
	return nil
}

// current returns the node's latest process (nil before the first Start).
func (n *Node) current() *proc.Process { return n.srv.Process() }

// Kill9 kills the node with SIGKILL and waits until it is gone.
func (n *Node) Kill9() error {
	if err := n.srv.Signal(syscall.SIGKILL); err != nil {
		return err
	}
	return n.current().Wait(30 * time.Second)
}

// errShutdownHang is returned by Term when SIGTERM did not stop the node in time.
var errShutdownHang = errors.New("graceful shutdown hung")

// Term stops the node gracefully with SIGTERM. If it has not exited after 20s it gets
// SIGQUIT (the Go runtime writes every goroutine's stack to the node's log and exits),
// then SIGKILL; the error then wraps errShutdownHang.
func (n *Node) Term() error {
	if err := n.srv.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	p := n.current()
	if err := p.Wait(20 * time.Second); err != nil {
		_ = p.Signal(syscall.SIGQUIT)
		if p.Wait(5*time.Second) != nil {
			_ = p.Kill()
		}
		return fmt.Errorf("%w: %s did not exit within 20s of SIGTERM (goroutine dump from SIGQUIT in %s)", errShutdownHang, n.ID, n.Log)
	}
	return nil
}

// Stop pauses the node with SIGSTOP; Cont resumes it.
func (n *Node) Stop() error { return n.srv.Signal(syscall.SIGSTOP) }

// Cont resumes a node paused by Stop.
func (n *Node) Cont() error { return n.srv.Signal(syscall.SIGCONT) }

// Running reports whether the node's process is alive.
func (n *Node) Running() bool { return n.srv.Running() }

func (n *Node) kill() { _ = n.srv.Kill() }

// ---- observing the cluster ------------------------------------------------------------

func (c *Cluster) probe(ctx context.Context, i int) (*client.Client, error) {
	c.mu.Lock()
	p := c.probes[i]
	c.mu.Unlock()
	if p != nil {
		return p, nil
	}
	p, err := client.Dial(ctx, c.Nodes[i].API)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old := c.probes[i]; old != nil {
		_ = p.Close(ctx)
		return old, nil
	}
	c.probes[i] = p
	return p, nil
}

// nodeView is what one node says about the cluster.
type nodeView struct {
	status  *leaseholdv1.StatusResponse
	members []*leaseholdv1.Member
	err     error
}

func (c *Cluster) view(ctx context.Context, i int) nodeView {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	p, err := c.probe(ctx, i)
	if err != nil {
		return nodeView{err: err}
	}
	st, err := p.Status(ctx)
	if err != nil {
		return nodeView{err: err}
	}
	ms, err := p.Members(ctx)
	if err != nil {
		return nodeView{err: err}
	}
	return nodeView{status: st, members: ms}
}

func (c *Cluster) views(ctx context.Context, nodes []int) []nodeView {
	out := make([]nodeView, len(c.Nodes))
	var wg sync.WaitGroup
	for _, i := range nodes {
		wg.Go(func() { out[i] = c.view(ctx, i) })
	}
	wg.Wait()
	return out
}

func (c *Cluster) index(id string) int {
	for i, n := range c.Nodes {
		if n.ID == id {
			return i
		}
	}
	return -1
}

// healthz reports whether node i is ready (/readyz): for the leader, that its leader
// runtime is active.
func (c *Cluster) healthz(i int) bool {
	resp, err := c.hc.Get("http://" + c.Nodes[i].API + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// waitLeader waits until one of nodes leads and serves, as all of nodes agree, and
// returns its index.
func (c *Cluster) waitLeader(ctx context.Context, nodes []int) (int, error) {
	var why string
	for {
		vs := c.views(ctx, nodes)
		why = ""
		leader := -1
		for _, i := range nodes {
			v := vs[i]
			if v.err != nil {
				why = fmt.Sprintf("%s: %v", c.Nodes[i].ID, v.err)
				break
			}
			l := c.index(v.status.GetLeader())
			if l < 0 || (leader >= 0 && l != leader) {
				why = fmt.Sprintf("%s sees leader %q", c.Nodes[i].ID, v.status.GetLeader())
				leader = -2
				break
			}
			leader = l
		}
		if why == "" && leader >= 0 {
			inSet := false
			for _, i := range nodes {
				inSet = inSet || i == leader
			}
			switch {
			case !inSet:
				why = fmt.Sprintf("leader %s is outside the set", c.Nodes[leader].ID)
			case vs[leader].status.GetRole() != "leader":
				why = fmt.Sprintf("%s is named leader but its role is %s", c.Nodes[leader].ID, vs[leader].status.GetRole())
			case !c.healthz(leader):
				why = fmt.Sprintf("%s leads but does not serve yet", c.Nodes[leader].ID)
			default:
				return leader, nil
			}
		}
		select {
		case <-ctx.Done():
			return -1, fmt.Errorf("%w: %s", ctx.Err(), why)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// WaitNewLeader waits until a node other than old leads, as every node but old agrees.
func (c *Cluster) WaitNewLeader(ctx context.Context, old int) (int, error) {
	var others []int
	for i := range c.Nodes {
		if i != old {
			others = append(others, i)
		}
	}
	return c.waitLeader(ctx, others)
}

// WaitHealthy waits until every node answers, every node lists three voters and the
// same leader, the leader serves, and every follower has applied what the leader had
// committed when the check began. It returns the leader's index.
func (c *Cluster) WaitHealthy(ctx context.Context) (int, error) {
	all := []int{0, 1, 2}
	var why string
	for {
		leader, err := c.waitLeader(ctx, all)
		if err != nil {
			return -1, fmt.Errorf("no agreed leader: %w (last: %s)", err, why)
		}
		vs := c.views(ctx, all)
		why = ""
		commit := vs[leader].status.GetCommitIndex()
		for i, v := range vs {
			if v.err != nil {
				why = fmt.Sprintf("%s: %v", c.Nodes[i].ID, v.err)
				break
			}
			voters, leaders := 0, 0
			for _, m := range v.members {
				if m.GetSuffrage() == "voter" {
					voters++
				}
				if m.GetLeader() {
					leaders++
				}
				if m.GetApiAddr() == "" {
					why = fmt.Sprintf("%s: member %s has no API address yet", c.Nodes[i].ID, m.GetNodeId())
				}
			}
			if voters != 3 || leaders != 1 {
				why = fmt.Sprintf("%s lists %d voters and %d leaders", c.Nodes[i].ID, voters, leaders)
			}
			if v.status.GetAppliedIndex() < commit && i != leader {
				why = fmt.Sprintf("%s applied %d < leader's commit %d", c.Nodes[i].ID, v.status.GetAppliedIndex(), commit)
			}
			if why != "" {
				break
			}
		}
		if why == "" {
			return leader, nil
		}
		select {
		case <-ctx.Done():
			return -1, fmt.Errorf("%w: %s", ctx.Err(), why)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Leader returns the current leader's index (waiting up to timeout for one).
func (c *Cluster) Leader(timeout time.Duration) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return c.waitLeader(ctx, []int{0, 1, 2})
}

// Isolate cuts node i off: full (nobody reaches it) or peers only (clients still do).
func (c *Cluster) Isolate(i int, full bool) error {
	if c.lab == nil {
		return errors.New("partitions need the network lab (network namespaces)")
	}
	if full {
		return c.lab.IsolateFull(i)
	}
	return c.lab.IsolatePeers(i, len(c.Nodes))
}

// Heal ends node i's isolation.
func (c *Cluster) Heal(i int) error {
	if c.lab == nil {
		return nil
	}
	return c.lab.Heal(i)
}
