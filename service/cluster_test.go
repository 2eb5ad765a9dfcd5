package service_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/internal/testnode"
	"github.com/leasehold/leasehold/replication"
	"github.com/leasehold/leasehold/server"
	"github.com/leasehold/leasehold/service"
)

// logTo routes a node's log to t.Log (shown only when the test fails).
type logTo struct{ t *testing.T }

func (w logTo) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// start starts a node on free loopback ports; with join "" it bootstraps a cluster of
// its own (unless edit says otherwise) and waits until it serves, else it joins through
// join.
func start(t *testing.T, id, join string, edit ...func(*service.Config)) *service.Node {
	t.Helper()
	cfg := service.Config{
		Addr:         "127.0.0.1:0",
		FastLaneAddr: "127.0.0.1:0",
		Raft:         replication.Config{NodeID: id, DataDir: t.TempDir(), RaftAddr: testnode.FreeAddr(t), Bootstrap: join == ""},
		Join:         join,
		Logger:       slog.New(slog.NewTextHandler(logTo{t}, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	for _, e := range edit {
		e(&cfg)
	}
	n, err := service.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close(context.Background()) })
	if cfg.Raft.Bootstrap {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := n.WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

func dial(t *testing.T, addr string, opts ...client.Option) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = c.Close(ctx)
	})
	return c
}

func reasonOf(err error) string {
	ce := new(connect.Error)
	if !errors.As(err, &ce) {
		return ""
	}
	for _, d := range ce.Details() {
		if v, derr := d.Value(); derr == nil {
			if ed, ok := v.(*leaseholdv1.ErrorDetail); ok {
				return ed.GetReason()
			}
		}
	}
	return ""
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// TestAddMemberChecksTheNode: AddMember refuses, changing nothing, a node that does not
// answer at its API address (a typo), that answers with another node id or raft address,
// or that holds the data of another cluster; the cluster goes on serving. A node that
// answers as itself is added as a non-voter, catches up and is promoted, with its
// fast-lane address in the member table.
func TestAddMemberChecksTheNode(t *testing.T) {
	n1 := start(t, "n1", "")
	c := dial(t, n1.Addr())
	ctx := ctxT(t, time.Minute)
	if _, err := c.Lock(ctx, "before", client.Correctness); err != nil {
		t.Fatal(err)
	}
	fresh := start(t, "n2", "", func(cfg *service.Config) { cfg.Raft.Bootstrap = false })
	other := start(t, "x1", "")
	for name, tc := range map[string]struct{ id, raft, api, why string }{
		"no node at api_addr": {"n2", fresh.Raft.RaftAddr(), testnode.FreeAddr(t), "no leasehold node answers"},
		"another node id":     {"n3", fresh.Raft.RaftAddr(), fresh.Addr(), `is "n2", not node_id "n3"`},
		"another raft addr":   {"n2", testnode.FreeAddr(t), fresh.Addr(), "advertises raft address"},
		"another cluster":     {"x1", other.Raft.RaftAddr(), other.Addr(), "another cluster"},
	} {
		_, err := c.AddMember(ctx, tc.id, tc.raft, tc.api)
		if connect.CodeOf(err) != connect.CodeFailedPrecondition || reasonOf(err) != "member_check" || !strings.Contains(err.Error(), tc.why) {
			t.Errorf("%s: AddMember = %v, want FailedPrecondition member_check saying %q", name, err, tc.why)
		}
		ms, err := c.Members(ctx)
		if err != nil || len(ms) != 1 {
			t.Fatalf("%s: the configuration changed: %v %v", name, ms, err)
		}
	}
	if _, err := c.Lock(ctx, "after", client.Correctness); err != nil {
		t.Fatalf("the cluster stopped serving after refused adds: %v", err)
	}

	// The raft address by name: the node reports it resolved.
	_, raftPort, _ := net.SplitHostPort(fresh.Raft.RaftAddr())
	ms, err := c.AddMember(ctx, "n2", net.JoinHostPort("localhost", raftPort), fresh.Addr())
	if err != nil {
		t.Fatal(err)
	}
	var added *leaseholdv1.Member
	for _, m := range ms {
		if m.GetNodeId() == "n2" {
			added = m
		}
	}
	if added == nil || added.GetSuffrage() != "voter" || added.GetFastLaneAddr() != fresh.FastLaneAddr() || added.GetApiAddr() != fresh.Addr() {
		t.Fatalf("added member %v", added)
	}
	st, err := dial(t, fresh.Addr()).Status(ctx)
	if err != nil || st.GetClusterId() != c.ClusterID() || st.GetClusterId() == "" {
		t.Fatalf("the new member's cluster ID is %q (%v), the cluster's %q", st.GetClusterId(), err, c.ClusterID())
	}
}

// TestRemoveLastVoter: removing the only voter is FailedPrecondition and changes
// nothing: the node keeps its registered address, still leads and serves.
func TestRemoveLastVoter(t *testing.T) {
	n1 := start(t, "n1", "")
	c := dial(t, n1.Addr())
	ctx := ctxT(t, 30*time.Second)
	_, err := c.RemoveMember(ctx, "n1")
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || reasonOf(err) != "last_voter" {
		t.Fatalf("RemoveMember(the last voter) = %v, want FailedPrecondition last_voter", err)
	}
	ms, err := c.Members(ctx)
	if err != nil || len(ms) != 1 || ms[0].GetApiAddr() != n1.Addr() || !ms[0].GetLeader() {
		t.Fatalf("members after the refused remove: %v %v", ms, err)
	}
	if _, err := c.Lock(ctx, "x", client.Correctness); err != nil {
		t.Fatal(err)
	}
}

// TestJoinAndAdvertise: a node joining through a member becomes a voter, learns the
// cluster ID through the log, and the member table has every node's advertised fast
// lane. A node bound to 0.0.0.0 advertises its API host with the fast lane's port.
func TestJoinAndAdvertise(t *testing.T) {
	n1 := start(t, "n1", "")
	n2 := start(t, "n2", n1.Addr(), func(cfg *service.Config) {
		cfg.FastLaneAddr = "0.0.0.0:0"
		cfg.AdvertiseAddr = "" // the listener's, 127.0.0.1:port
	})
	c := dial(t, n1.Addr())
	ctx := ctxT(t, 30*time.Second)
	var ms []*leaseholdv1.Member
	for {
		var err error
		if ms, err = c.Members(ctx); err != nil {
			t.Fatal(err)
		}
		if len(ms) == 2 && ms[1].GetSuffrage() == "voter" && ms[1].GetFastLaneAddr() != "" {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("n2 did not join: %v", ms)
		}
		time.Sleep(20 * time.Millisecond)
	}
	_, port, _ := net.SplitHostPort(n2.FastLaneAddr())
	if want := net.JoinHostPort("127.0.0.1", port); ms[1].GetFastLaneAddr() != want || ms[0].GetFastLaneAddr() != n1.FastLaneAddr() {
		t.Fatalf("fast lanes in the member table %v, want n1 %s and n2 %s", ms, n1.FastLaneAddr(), want)
	}
	st, err := dial(t, n2.Addr()).Status(ctx)
	if err != nil || st.GetClusterId() != c.ClusterID() || st.GetFastLaneAddr() != ms[1].GetFastLaneAddr() {
		t.Fatalf("n2's status %v, %v", st, err)
	}
}

// TestJoinRefusesAnotherCluster: a node holding the data of one cluster is not taken by
// another (AddMember's check), and does not ask to join it (--join).
func TestJoinRefusesAnotherCluster(t *testing.T) {
	a := start(t, "a1", "")
	ca := dial(t, a.Addr())
	ctx := ctxT(t, 30*time.Second)
	var bDir string
	b := start(t, "b1", "", func(cfg *service.Config) { bDir = cfg.Raft.DataDir })
	_, err := ca.AddMember(ctx, "b1", b.Raft.RaftAddr(), b.Addr())
	if reasonOf(err) != "member_check" {
		t.Fatalf("adding a node of another cluster: %v", err)
	}
	if st, err := dial(t, b.Addr()).Status(ctx); err != nil || st.GetRole() != "leader" {
		t.Fatalf("the other cluster's node after the refused add: %v %v", st, err)
	}
	if err := b.Close(ctx); err != nil {
		t.Fatal(err)
	}
	// B's node restarted on its data with --join A: it does not ask, A does not change.
	start(t, "b1", a.Addr(), func(cfg *service.Config) { cfg.Raft.DataDir = bDir })
	time.Sleep(time.Second)
	if ms, err := ca.Members(ctx); err != nil || len(ms) != 1 {
		t.Fatalf("A's members after B's node tried to join: %v %v", ms, err)
	}
}

// TestConnectClusterCheck: every Connect response carries the node's cluster ID; a
// request that expects another cluster is refused before it is served; a client given
// another cluster's ID, or that learnt one, refuses the node.
func TestConnectClusterCheck(t *testing.T) {
	a := start(t, "a1", "")
	b := start(t, "b1", "")
	ca := dial(t, a.Addr())
	cb := dial(t, b.Addr())
	idA, idB := ca.ClusterID(), cb.ClusterID()
	if len(idA) != 32 || len(idB) != 32 || idA == idB {
		t.Fatalf("cluster IDs %q and %q", idA, idB)
	}
	ctx := ctxT(t, 30*time.Second)
	if st, err := ca.Status(ctx); err != nil || st.GetClusterId() != idA {
		t.Fatalf("Status %v %v", st, err)
	}

	// Raw Connect JSON: the header is on every response; a Put that expects cluster B
	// is refused by A and writes nothing.
	put := func(expect string) (*http.Response, string) {
		req, _ := http.NewRequest(http.MethodPost, "http://"+a.Addr()+"/leasehold.v1.KVService/Put", bytes.NewBufferString(`{"key":"k","value":"dg=="}`))
		req.Header.Set("Content-Type", "application/json")
		if expect != "" {
			req.Header.Set(server.ClusterIDHeader, expect)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp, string(body)
	}
	resp, body := put(idB)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "wrong_cluster") || resp.Header.Get(server.ClusterIDHeader) != idA {
		t.Fatalf("a Put for cluster B at A: %d %s %v", resp.StatusCode, body, resp.Header)
	}
	if v, err := ca.Get(ctx, "k"); err != nil || v.Found {
		t.Fatalf("the refused Put wrote: %v %v", v, err)
	}
	if resp, body := put(idA); resp.StatusCode != http.StatusOK {
		t.Fatalf("a Put for cluster A at A: %d %s", resp.StatusCode, body)
	}

	// A client that expects A refuses B: at Dial with WithClusterID ...
	if _, err := client.Dial(ctx, b.Addr(), client.WithClusterID(idA)); !errors.Is(err, client.ErrWrongCluster) {
		t.Fatalf("Dial(B, WithClusterID(A)) = %v, want ErrWrongCluster", err)
	}
	// ... and a client that learnt A from its node when the node at that address is
	// now of cluster B (a host that runs another cluster on the same port).
	p := newProxy(t, a.Addr())
	learnt := dial(t, p.addr, client.WithoutFastLane())
	if learnt.ClusterID() != idA {
		t.Fatalf("the client learnt %q, want A's %s", learnt.ClusterID(), idA)
	}
	if _, err := learnt.Put(ctx, "via-proxy", []byte("a")); err != nil {
		t.Fatal(err)
	}
	p.switchTo(b.Addr())
	// The first call after the switch may fail on the connection the proxy cut; none
	// may succeed, and once a connection to B exists each is refused as the wrong
	// cluster.
	refused := func(what string, call func() error) {
		t.Helper()
		for range 5 {
			err := call()
			switch {
			case err == nil:
				t.Fatalf("%s at B of a client of A succeeded", what)
			case errors.Is(err, client.ErrWrongCluster):
				return
			}
		}
		t.Fatalf("%s at B of a client of A was never refused as the wrong cluster", what)
	}
	refused("Put", func() error { _, err := learnt.Put(ctx, "via-proxy", []byte("b")); return err })
	refused("Lock", func() error {
		_, err := learnt.Lock(ctx, "via-proxy", client.Correctness, client.TryOnce)
		return err
	})
	if v, err := cb.Get(ctx, "via-proxy"); err != nil || v.Found {
		t.Fatalf("B has the value of a client of A: %v %v", v, err)
	}
	if st, err := cb.Status(ctx); err != nil || st.GetLeases() != 0 {
		t.Fatalf("B has a lease of a client of A: %v %v", st, err)
	}
	if v, err := ca.Get(ctx, "via-proxy"); err != nil || string(v.Data) != "a" {
		t.Fatalf("A's value %q %v", v.Data, err)
	}
}

// proxy forwards TCP connections to a target that the test can switch; switching
// closes the connections made so far.
type proxy struct {
	addr   string
	mu     sync.Mutex
	target string
	conns  []net.Conn
	count  int
}

// accepted returns how many connections the proxy forwarded.
func (p *proxy) accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.count
}

func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{addr: ln.Addr().String(), target: target}
	t.Cleanup(func() { _ = ln.Close(); p.switchTo("") })
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			out, err := net.Dial("tcp", p.target)
			if err != nil {
				p.mu.Unlock()
				_ = in.Close()
				continue
			}
			p.conns = append(p.conns, in, out)
			p.count++
			p.mu.Unlock()
			go func() { _, _ = io.Copy(out, in); _ = out.Close() }()
			go func() { _, _ = io.Copy(in, out); _ = in.Close() }()
		}
	}()
	return p
}

func (p *proxy) switchTo(target string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = target
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
}

// TestFastLaneOfAnotherCluster: a node that advertises another cluster's fast lane
// (the compose bug: a container's 127.0.0.1:7742 is the host's) is refused in the
// handshake: the client's locks and values go through Connect to its own cluster, and
// none lands in the other.
func TestFastLaneOfAnotherCluster(t *testing.T) {
	b := start(t, "b1", "")
	bLane := newProxy(t, b.FastLaneAddr()) // B's fast lane, counting the connections
	a := start(t, "a1", "", func(cfg *service.Config) { cfg.FastLaneAdvertise = bLane.addr })
	ctx := ctxT(t, 30*time.Second)
	ca := dial(t, a.Addr())
	if st, err := ca.Status(ctx); err != nil || st.GetFastLaneAddr() != bLane.addr {
		t.Fatalf("A advertises %q (%v), want B's fast lane %s", st.GetFastLaneAddr(), err, bLane.addr)
	}
	for i := range 20 {
		l, err := ca.Lock(ctx, "a/lock", client.Correctness)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ca.Put(ctx, "a/key", []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		e, err := ca.Lock(ctx, "a/eff", client.Efficiency)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	cb := dial(t, b.Addr())
	if st, err := cb.Status(ctx); err != nil || st.GetLeases() != 0 || st.GetLastToken() > 1 {
		t.Fatalf("cluster B saw the client of A: %v %v", st, err)
	}
	if v, err := cb.Get(ctx, "a/key"); err != nil || v.Found {
		t.Fatalf("A's value is in B: %v %v", v, err)
	}
	if v, err := ca.Get(ctx, "a/key"); err != nil || !v.Found {
		t.Fatalf("A's value is not in A: %v %v", v, err)
	}
	if n := bLane.accepted(); n == 0 {
		t.Fatal("the client never tried the fast lane A advertises")
	}
}
