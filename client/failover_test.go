package client_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/api/leasehold/v1/leaseholdv1connect"
	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/fastlane"
	"github.com/leasehold/leasehold/internal/reason"
	"github.com/leasehold/leasehold/internal/testnode"
)

// fakeNode answers Status like a node without a fast lane, and every other call with
// the error answer returns, counting those calls.
type fakeNode struct {
	addr  string
	calls atomic.Int32
}

func startFakeNode(t *testing.T, answer func() error) *fakeNode {
	t.Helper()
	f := &fakeNode{}
	fail := connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			if strings.HasSuffix(req.Spec().Procedure, "/Status") {
				return next(ctx, req)
			}
			f.calls.Add(1)
			return nil, answer()
		}
	}))
	mux := http.NewServeMux()
	mux.Handle(leaseholdv1connect.NewLeaseServiceHandler(leaseholdv1connect.UnimplementedLeaseServiceHandler{}, fail))
	mux.Handle(leaseholdv1connect.NewLockServiceHandler(leaseholdv1connect.UnimplementedLockServiceHandler{}, fail))
	mux.Handle(leaseholdv1connect.NewKVServiceHandler(leaseholdv1connect.UnimplementedKVServiceHandler{}, fail))
	mux.Handle(leaseholdv1connect.NewClusterServiceHandler(fakeStatus{}, fail))
	f.addr = serveH2C(t, mux)
	return f
}

// serveH2C serves h over HTTP/1.1 and unencrypted HTTP/2 until the test ends, and
// returns its address.
func serveH2C(t *testing.T, h http.Handler) string {
	t.Helper()
	hs := httptest.NewUnstartedServer(h)
	hs.Config.Protocols = new(http.Protocols)
	hs.Config.Protocols.SetHTTP1(true)
	hs.Config.Protocols.SetUnencryptedHTTP2(true)
	hs.Start()
	t.Cleanup(hs.Close)
	return hs.Listener.Addr().String()
}

type fakeStatus struct {
	leaseholdv1connect.UnimplementedClusterServiceHandler
}

func (fakeStatus) Status(context.Context, *leaseholdv1.StatusRequest) (*leaseholdv1.StatusResponse, error) {
	return &leaseholdv1.StatusResponse{NodeId: "fake", Role: "follower"}, nil
}

// unavailable is the error a node gives with reason r and leader hint leader.
func unavailable(r, leader string) func() error {
	return func() error {
		ce := connect.NewError(connect.CodeUnavailable, errors.New(r))
		d, err := connect.NewErrorDetail(&leaseholdv1.ErrorDetail{Reason: r, LeaderApiAddr: leader})
		if err != nil {
			panic(err)
		}
		ce.AddDetail(d)
		return ce
	}
}

// dial dials addrs for the test, with a deadline for all its calls.
func dial(t *testing.T, addrs string, opts ...client.Option) (context.Context, *client.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	c, err := client.Dial(ctx, addrs, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return ctx, c
}

// exercise makes one call of each kind the client retries differently — a lock (lease
// grant, acquire, release), a fenced write, a read — and fails the test on any error.
func exercise(ctx context.Context, t *testing.T, c *client.Client, name string) {
	t.Helper()
	l, err := c.Lock(ctx, name, client.Correctness, client.TryOnce)
	if err != nil {
		t.Fatalf("Lock %s: %v", name, err)
	}
	if _, err := c.Put(ctx, name, []byte("v"), client.Fenced(l)); err != nil {
		t.Fatalf("Put %s: %v", name, err)
	}
	if v, err := c.Get(ctx, name); err != nil || !v.Found {
		t.Fatalf("Get %s: %+v, %v", name, v, err)
	}
	if _, err := c.Describe(ctx, name); err != nil {
		t.Fatalf("Describe %s: %v", name, err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatalf("Unlock %s: %v", name, err)
	}
}

// TestFailoverPassesSilentNode: a client whose first address accepts connections but
// never answers moves to the next address after one attempt timeout, and stays there:
// no call fails, and none goes back to the silent node while it is suspect.
func TestFailoverPassesSilentNode(t *testing.T) {
	node := testnode.Start(t)
	silent, accepted := testnode.Silent(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const attempt = 300 * time.Millisecond
	start := time.Now()
	c, err := client.Dial(ctx, silent+","+node.Addr(), client.WithAttemptTimeout(attempt))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	if took := time.Since(start); took < attempt || took > 5*attempt {
		t.Errorf("Dial took %v: want one attempt timeout (%v) on the silent node, then the answer", took, attempt)
	}
	for _, name := range []string{"silent/a", "silent/b", "silent/c"} {
		exercise(ctx, t, c, name)
	}
	if n := accepted.Load(); n != 1 {
		t.Errorf("the silent node got %d connections, want 1: the client came back to it", n)
	}
}

// TestFailoverFollowsLeaderHint: a node that answers "not the leader" and names the
// leader sends the client there — to an address it was not given — and the client stays.
func TestFailoverFollowsLeaderHint(t *testing.T) {
	node := testnode.Start(t)
	follower := startFakeNode(t, unavailable(reason.NotLeader, node.Addr()))
	ctx, c := dial(t, follower.addr)
	for _, name := range []string{"hint/a", "hint/b"} {
		exercise(ctx, t, c, name)
	}
	if n := follower.calls.Load(); n != 1 {
		t.Errorf("the node that is not the leader got %d calls, want 1", n)
	}
	st, err := c.Status(ctx)
	if err != nil || st.GetNodeId() == "fake" {
		t.Errorf("Status after the hint: %v from %q, want the leader's", err, st.GetNodeId())
	}
}

// TestFailoverLeaderUnknown: a node that does not know the leader (a restarted follower
// catching up) says so, and the client tries the next address at once: no call fails,
// Put and Delete included (nothing was done, so sending them again is safe).
func TestFailoverLeaderUnknown(t *testing.T) {
	testFailoverNotStarted(t, reason.LeaderUnknown, "unknown", "the node that knows no leader")
}

// TestFailoverShuttingDown: a node that drains its connections before it stops refuses
// new requests, unstarted, with "shutting_down"; the client sends them, Put included, to
// the next node at once, and stays off the draining node.
func TestFailoverShuttingDown(t *testing.T) {
	testFailoverNotStarted(t, reason.ShuttingDown, "draining", "the node that shuts down")
}

// TestFailoverBusy: a leader whose log could not take an entry in time answers "busy"
// (nothing written); the client sends the request again to the same node after a pause,
// a Put included, rather than leaving a leader that only needs a moment.
func TestFailoverBusy(t *testing.T) {
	node := testnode.Start(t)
	var n atomic.Int32
	busy := unavailable(reason.Busy, "")
	hint := unavailable(reason.NotLeader, node.Addr())
	leader := startFakeNode(t, func() error {
		if n.Add(1) <= 2 {
			return busy()
		}
		return hint()
	})
	ctx, c := dial(t, leader.addr+","+node.Addr())
	if _, err := c.Put(ctx, "busy/k", []byte("v")); err != nil {
		t.Fatalf("Put after two busy answers: %v", err)
	}
	if got := leader.calls.Load(); got != 3 {
		t.Errorf("the busy node got %d calls, want 3 (two busy answers, then the hint): the client left it at once", got)
	}
}

// testFailoverNotStarted: the first of two nodes answers every call Unavailable with
// why, a reason that says the request was not started; a Put (not repeated after an
// unknown outcome) and every other kind of call succeed on the second node, and the
// first node is asked once.
func testFailoverNotStarted(t *testing.T, why, prefix, first string) {
	t.Helper()
	node := testnode.Start(t)
	refusing := startFakeNode(t, unavailable(why, ""))
	ctx, c := dial(t, refusing.addr+","+node.Addr())
	if _, err := c.Put(ctx, prefix+"/first", []byte("v")); err != nil {
		t.Fatalf("the first call, a Put, on %s: %v", first, err)
	}
	exercise(ctx, t, c, prefix+"/a")
	if n := refusing.calls.Load(); n != 1 {
		t.Errorf("%s got %d calls, want 1", first, n)
	}
}

// TestFailoverOutcomeUnknown: after a failure that leaves the outcome unknown (the node
// could not reach the leader it forwarded to), a Put is not sent again — it fails with
// ErrUnavailable and the key is untouched elsewhere — while a read is retried on the
// next node and succeeds.
func TestFailoverOutcomeUnknown(t *testing.T) {
	node := testnode.Start(t)
	follower := startFakeNode(t, unavailable(reason.LeaderUnreachable, "192.0.2.1:7740"))
	ctx, c := dial(t, follower.addr+","+node.Addr())
	if _, err := c.Put(ctx, "unreachable/k", []byte("v")); !errors.Is(err, client.ErrUnavailable) || connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("Put whose outcome is unknown: %v, want ErrUnavailable (code Unavailable)", err)
	}
	if n := follower.calls.Load(); n != 1 {
		t.Fatalf("the Put went %d times to the first node, want 1", n)
	}
	if v, err := c.Get(ctx, "unreachable/k"); err != nil || v.Found {
		t.Fatalf("Get after the unknown Put: %+v, %v; want a successful read of nothing (the Put was not sent again)", v, err)
	}
}

// TestFastLaneNodeFallsSilent: a call with no deadline of its own (a Put) waits on the
// fast lane of a node whose path is then cut: its TCP acknowledges nothing more (made up
// here: loopback cannot drop packets) and its Status goes unanswered. The client notices
// within about the attempt timeout, not at the caller's deadline: the Put fails with
// ErrUnavailable (its outcome unknown), and the node is left.
func TestFastLaneNodeFallsSilent(t *testing.T) {
	var cut atomic.Bool
	addr := startLaneNode(t, &cut, -1)
	const attempt = 400 * time.Millisecond
	ctx, c := dial(t, addr, client.WithAttemptTimeout(attempt), client.WithCutPathsForTest())
	if _, err := c.CheckToken(ctx, "silent/warm", 1); err != nil {
		t.Fatalf("the call that opens the fast lane: %v", err)
	}
	cut.Store(true)
	start := time.Now()
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := c.Put(pctx, "silent/k", []byte("v"))
	took := time.Since(start)
	if !errors.Is(err, client.ErrUnavailable) || pctx.Err() != nil {
		t.Fatalf("Put on a node that fell silent: %v after %v; want ErrUnavailable before the deadline", err, took)
	}
	if took > 4*attempt {
		t.Fatalf("the silent node was noticed after %v, want about the attempt timeout (%v)", took, attempt)
	}
	t.Logf("a Put on a node cut off failed after %v (attempt timeout %v)", took.Round(time.Millisecond), attempt)
}

// TestFastLaneSlowNodeWaitedFor: a node that takes several attempt timeouts to answer,
// and does not answer a Status call in time either, but whose TCP acknowledges (it is
// reachable, only slow: a machine too loaded to answer soon), is waited for: the Put
// succeeds, it is not abandoned as silent.
func TestFastLaneSlowNodeWaitedFor(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("elsewhere the kernel does not tell what TCP acknowledged: the watch asks the node's Status")
	}
	const attempt = 200 * time.Millisecond
	var stalled atomic.Bool
	addr := startLaneNode(t, &stalled, 5*attempt)
	ctx, c := dial(t, addr, client.WithAttemptTimeout(attempt))
	if _, err := c.CheckToken(ctx, "slow/warm", 1); err != nil {
		t.Fatalf("the call that opens the fast lane: %v", err)
	}
	stalled.Store(true)
	start := time.Now()
	if _, err := c.Put(ctx, "slow/k", []byte("v")); err != nil {
		t.Fatalf("Put on a slow node: %v after %v", err, time.Since(start))
	}
	if took := time.Since(start); took < 5*attempt {
		t.Fatalf("the slow node answered after %v, before its delay", took)
	}
}

// startLaneNode starts a fake node: a fast lane that answers the first request of a
// connection at once and, when slow >= 0, every later one after slow (with an empty
// message, which decodes as any response); and a Connect node whose Status names that
// fast lane — and never answers once cut is set.
func startLaneNode(t *testing.T, cut *atomic.Bool, slow time.Duration) string {
	t.Helper()
	lane := startLane(t, slow)
	mux := http.NewServeMux()
	mux.Handle(leaseholdv1connect.NewClusterServiceHandler(silentAfterCut{cut: cut, lane: lane}))
	return serveH2C(t, mux)
}

// silentAfterCut answers Status (naming the fast lane lane) until cut, then never.
type silentAfterCut struct {
	leaseholdv1connect.UnimplementedClusterServiceHandler
	cut  *atomic.Bool
	lane string
}

func (s silentAfterCut) Status(ctx context.Context, _ *leaseholdv1.StatusRequest) (*leaseholdv1.StatusResponse, error) {
	if s.cut.Load() {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return &leaseholdv1.StatusResponse{NodeId: "fake", FastLaneAddr: s.lane}, nil
}

// startLane is the fast lane of startLaneNode.
func startLane(t *testing.T, slow time.Duration) string {
	t.Helper()
	return testnode.Serve(t, func(conn net.Conn) {
		if _, err := fastlane.ServerHello(conn, ""); err != nil {
			return
		}
		r, w := fastlane.NewReader(conn), fastlane.NewWriter(conn)
		for first := true; ; first = false {
			f, err := r.Read()
			if err != nil {
				return
			}
			if f.Kind != fastlane.KindRequest || !first && slow < 0 {
				continue
			}
			answer := func() {
				frame, err := fastlane.AppendFrame(nil, fastlane.KindResponse, f.Method, f.ID, nil)
				if err == nil {
					w.Send(frame, false)
				}
			}
			if first {
				answer()
			} else {
				time.AfterFunc(slow, answer)
			}
		}
	})
}
