package nemesis

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/client"
)

// ---- the leasehold binary, built once per test binary ----------------------------------

var (
	buildOnce sync.Once
	buildDir  string
	buildBin  string
	buildErr  error
	// buildFastFlag is whether the binary's server command takes --fast-lane-addr (three
	// nodes on one host must not share the default fast-lane port).
	buildFastFlag bool
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
		root, err := moduleRoot()
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
		cmd := exec.CommandContext(ctx, "go", "build", "-o", buildBin, "./cmd/leasehold")
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./cmd/leasehold: %w\n%s", err, out)
			return
		}
		help, _ := exec.Command(buildBin, "server", "-h").CombinedOutput()
		buildFastFlag = bytes.Contains(help, []byte("-fast-lane-addr"))
	})
	if buildErr != nil {
		t.Fatalf("building leasehold: %v", buildErr)
	}
	return buildBin
}

// moduleRoot walks up from the working directory to leasehold's go.mod.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.Contains(b, []byte("module github.com/leasehold/leasehold\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("cannot find the go.mod of github.com/leasehold/leasehold above the working directory")
		}
		dir = parent
	}
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// ---- the cluster -----------------------------------------------------------------------

// Cluster is three `leasehold server` processes: n1 bootstraps, n2 and n3 join through
// n1. With a network lab each node runs in its own network namespace (partitions
// possible); without, all listen on free loopback ports. Logs go to files that are
// printed (their tails) only when the test fails; the working directory is then kept.
type Cluster struct {
	t     testing.TB
	bin   string
	dir   string
	lab   *netLab // nil on loopback
	Nodes []*Node
	start time.Time

	mu     sync.Mutex
	probes map[int]*client.Client
	hc     *http.Client
}

// Node is one server of a Cluster.
type Node struct {
	c     *Cluster
	Index int
	ID    string
	API   string // host:port of the API (clients, forwarding)
	Raft  string
	Fast  string // fast-lane address ("" if the binary has no such flag)
	Dir   string // data dir
	Log   string // log file (every incarnation appends)

	mu   sync.Mutex
	proc *proc
}

type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error
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
	c := &Cluster{t: t, bin: bin, dir: dir, probes: map[int]*client.Client{}, start: time.Now()}
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
		if c.lab != nil {
			ip := c.lab.NodeIP(i)
			n.API, n.Raft, n.Fast = ip+":7740", ip+":7741", ip+":7742"
		} else {
			var ports [3]int
			for j := range ports {
				if ports[j], err = freePort(); err != nil {
					t.Fatal(err)
				}
			}
			n.API = fmt.Sprintf("127.0.0.1:%d", ports[0])
			n.Raft = fmt.Sprintf("127.0.0.1:%d", ports[1])
			n.Fast = fmt.Sprintf("127.0.0.1:%d", ports[2])
		}
		c.Nodes = append(c.Nodes, n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := c.Nodes[0].Start(); err != nil {
		t.Fatal(err)
	}
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
			c.t.Logf("---- tail of %s's log (%s) ----\n%s", n.ID, n.Log, tail(n.Log, 120))
		}
		c.t.Logf("cluster data and logs kept in %s", c.dir)
		return
	}
	_ = os.RemoveAll(c.dir)
}

func tail(path string, lines int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	ls := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(ls) > lines {
		ls = append([]string{fmt.Sprintf("... (%d earlier lines)", len(ls)-lines)}, ls[len(ls)-lines:]...)
	}
	return strings.Join(ls, "\n")
}

// ---- one node's process ----------------------------------------------------------------

// Start starts the node's process (same ports, same data dir, same flags every time).
func (n *Node) Start() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.proc != nil {
		select {
		case <-n.proc.done:
		default:
			return fmt.Errorf("%s: already running", n.ID)
		}
	}
	f, err := os.OpenFile(n.Log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	args := []string{n.c.bin, "server", "--node-id", n.ID, "--addr", n.API, "--advertise-addr", n.API,
		"--raft-addr", n.Raft, "--data-dir", n.Dir, "--min-ttl", "100ms"}
	if buildFastFlag {
		args = append(args, "--fast-lane-addr", n.Fast)
	}
	if n.Index > 0 {
		args = append(args, "--join", n.c.Nodes[0].API)
	}
	if n.c.lab != nil {
		// The lab's addresses are not loopback: the test serves them open on purpose.
		args = append(n.c.lab.Exec(n.Index), append(args, "--insecure-no-auth")...)
	}
	fmt.Fprintf(f, "==== %s (+%v): starting %s\n", time.Now().Format(time.RFC3339Nano), time.Since(n.c.start).Round(time.Millisecond), strings.Join(args, " "))
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = f, f
	// If the test binary dies without its cleanup, the node dies too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("%s: start: %w", n.ID, err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		fmt.Fprintf(f, "==== %s (+%v): process exited: %v\n", time.Now().Format(time.RFC3339Nano), time.Since(n.c.start).Round(time.Millisecond), p.err)
		f.Close()
		close(p.done)
	}()
	n.proc = p
	return nil
}

func (n *Node) current() *proc {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.proc
}

func (n *Node) signal(sig syscall.Signal) error {
	p := n.current()
	if p == nil {
		return fmt.Errorf("%s: not started", n.ID)
	}
	select {
	case <-p.done:
		return fmt.Errorf("%s: not running (exited: %w)", n.ID, p.err)
	default:
	}
	return p.cmd.Process.Signal(sig)
}

func (n *Node) wait(timeout time.Duration) error {
	p := n.current()
	if p == nil {
		return nil
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(timeout):
		return fmt.Errorf("%s: still running after %v", n.ID, timeout)
	}
}

// Kill9 kills the node with SIGKILL and waits until it is gone.
func (n *Node) Kill9() error {
	if err := n.signal(syscall.SIGKILL); err != nil {
		return err
	}
	return n.wait(30 * time.Second)
}

// errShutdownHang is returned by Term when SIGTERM did not stop the node in time.
var errShutdownHang = errors.New("graceful shutdown hung")

// Term stops the node gracefully with SIGTERM. If it has not exited after 20s it gets
// SIGQUIT (the Go runtime writes every goroutine's stack to the node's log and exits),
// then SIGKILL; the error then wraps errShutdownHang.
func (n *Node) Term() error {
	if err := n.signal(syscall.SIGTERM); err != nil {
		return err
	}
	if err := n.wait(20 * time.Second); err != nil {
		_ = n.signal(syscall.SIGQUIT)
		if n.wait(5*time.Second) != nil {
			_ = n.signal(syscall.SIGKILL)
			_ = n.wait(10 * time.Second)
		}
		return fmt.Errorf("%w: %s did not exit within 20s of SIGTERM (goroutine dump from SIGQUIT in %s)", errShutdownHang, n.ID, n.Log)
	}
	return nil
}

// Stop pauses the node with SIGSTOP; Cont resumes it.
func (n *Node) Stop() error { return n.signal(syscall.SIGSTOP) }

// Cont resumes a node paused by Stop.
func (n *Node) Cont() error { return n.signal(syscall.SIGCONT) }

// Running reports whether the node's process is alive.
func (n *Node) Running() bool {
	p := n.current()
	if p == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

func (n *Node) kill() {
	p := n.current()
	if p == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
	}
}

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

// healthz reports whether node i serves as leader (its leader runtime is active).
func (c *Cluster) healthz(i int) bool {
	resp, err := c.hc.Get("http://" + c.Nodes[i].API + "/healthz")
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
