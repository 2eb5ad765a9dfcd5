package service_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/api/leasehold/v1/leaseholdv1connect"
	"github.com/leasehold/leasehold/internal/auth"
	"github.com/leasehold/leasehold/replication"
	"github.com/leasehold/leasehold/server"
	"github.com/leasehold/leasehold/service"
)

// TestStalledStreamRequestBody: G6's slow-client clause — a connection that stalls in a
// request body is closed after ReadTimeout (TestSlowClients checks it for a unary RPC).
// The request of a server-streaming RPC (Watch, Observe, Assignments, Bind, health's
// Watch) is one message too, but the guard gives streams no read deadline at all, so a
// client — unauthenticated: the body is read before any check — that sends the headers
// and part of the body holds its connection and a goroutine for ever.
func TestStalledStreamRequestBody(t *testing.T) {
	const rt = 300 * time.Millisecond
	n := startNode(t, "n1", server.Config{ReadHeaderTimeout: rt, ReadTimeout: rt, WriteTimeout: rt, IdleTimeout: 500 * time.Millisecond}, "")
	for _, procedure := range []string{
		"/leasehold.v1.LockService/Watch",
		"/leasehold.v1.ElectionService/Observe",
		"/leasehold.v1.LeaseService/Bind",
	} {
		c := dialFrom(t, "127.0.0.4", n.Addr())
		_, _ = c.Write([]byte("POST " + procedure + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/connect+proto\r\nContent-Length: 100\r\n\r\n\x00\x00\x00"))
		if took, err := closedWithin(c, rt+3*time.Second); err != nil {
			t.Errorf("%s, body stalled: %v (after %v); want the connection closed after ReadTimeout (%v)", procedure, err, took, rt)
		}
		_ = c.Close()
	}
}

// TestStreamsOutliveReadTimeout: the read deadline a server stream's request now has is
// lifted once the request has arrived, so a Watch stays open past ReadTimeout and
// delivers what happens later, over HTTP/1.1 and HTTP/2, with Connect, gRPC and gRPC-Web.
func TestStreamsOutliveReadTimeout(t *testing.T) {
	const rt = 300 * time.Millisecond
	n := startNode(t, "n1", server.Config{ReadTimeout: rt}, "")
	url := "http://" + n.Addr()
	h1 := &http.Client{Transport: &http.Transport{}}
	h2t := &http.Transport{Protocols: new(http.Protocols)}
	h2t.Protocols.SetUnencryptedHTTP2(true)
	h2 := &http.Client{Transport: h2t}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	type watch = *connect.ServerStreamForClient[leaseholdv1.WatchResponse]
	var streams []watch
	var names []string
	for _, c := range []struct {
		name string
		hc   *http.Client
		opt  []connect.ClientOption
	}{
		{"connect/h1", h1, nil}, {"connect/h2", h2, nil},
		{"grpc/h2", h2, []connect.ClientOption{connect.WithGRPC()}},
		{"grpcweb/h1", h1, []connect.ClientOption{connect.WithGRPCWeb()}},
	} {
		st, err := leaseholdv1connect.NewLockServiceClient(c.hc, url, c.opt...).Watch(ctx, &leaseholdv1.WatchRequest{Prefix: "rt/"})
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		if !st.Receive() {
			t.Fatalf("%s: watch: %v", c.name, st.Err())
		}
		streams, names = append(streams, st), append(names, c.name)
	}
	time.Sleep(3 * rt)
	g, err := leaseholdv1connect.NewLeaseServiceClient(http.DefaultClient, url).Grant(ctx, &leaseholdv1.GrantRequest{TtlMs: 10_000})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leaseholdv1connect.NewLockServiceClient(http.DefaultClient, url).Acquire(ctx, &leaseholdv1.AcquireRequest{
		Name: "rt/a", LeaseId: g.GetLeaseId(), Class: leaseholdv1.LockClass_LOCK_CLASS_CORRECTNESS}); err != nil {
		t.Fatal(err)
	}
	for i, st := range streams {
		got := false
		for !got && st.Receive() {
			for _, e := range st.Msg().GetEvents() {
				got = got || e.GetName() == "rt/a"
			}
		}
		if !got {
			t.Errorf("%s: the Watch ended before the event of rt/a: %v", names[i], st.Err())
		}
	}
}

// TestLoopbackRefusesForeignHost: out of the box a node listens on loopback without
// auth (SECURITY.md: "lets anyone on the machine do anything"), which is also every web
// page the machine's browser opens, through DNS rebinding: a page of
// http://rebind.attacker.example:7740 whose name the attacker then points at 127.0.0.1
// is same-origin with the node, so its scripts may POST application/json to every RPC
// and read the answers — force release locks, write keys, fetch /admin/snapshot with
// every lease ID. The only thing that tells such a request apart is its Host header,
// which the node does not look at. A node serving loopback without auth must refuse a
// Host that names neither a loopback name nor an IP address.
func TestLoopbackRefusesForeignHost(t *testing.T) {
	n := startNode(t, "n1", server.Config{}, "")
	_, port, _ := net.SplitHostPort(n.Addr())
	do := func(host, method, path, body string) int {
		req, err := http.NewRequest(method, "http://"+n.Addr()+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	put := `{"key":"k","value":"b3duZWQ="}`
	for _, host := range []string{"127.0.0.1:" + port, "localhost:" + port, "[::1]:" + port} {
		if code := do(host, http.MethodPost, "/leasehold.v1.KVService/Put", put); code != http.StatusOK {
			t.Fatalf("Put with Host %s: %d, want 200", host, code)
		}
	}
	for _, c := range []struct{ method, path, body string }{
		{http.MethodPost, "/leasehold.v1.KVService/Put", put},
		{http.MethodPost, "/leasehold.v1.LockService/ForceRelease", `{"name":"k"}`},
		{http.MethodGet, "/admin/snapshot", ""},
	} {
		if code := do("rebind.attacker.example:"+port, c.method, c.path, c.body); code < 400 {
			t.Errorf("%s %s with Host rebind.attacker.example: %d, want it refused", c.method, c.path, code)
		}
	}
	// A refused request whose body stalls holds no connection.
	c := dialFrom(t, "127.0.0.5", n.Addr())
	_, _ = c.Write([]byte("POST /leasehold.v1.KVService/Put HTTP/1.1\r\nHost: rebind.attacker.example\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"))
	if _, err := closedWithin(c, 3*time.Second); err != nil {
		t.Errorf("a refused request with a stalled body: %v", err)
	}
}

// TestPprofRefusalWithStalledBody: /debug/pprof/ is served outside the server's guard
// (service.withPprof), so it has no read deadline: an unauthenticated request to it,
// refused 401 at once, whose body stalls keeps its connection for ever while net/http
// waits for the rest of the body it means to discard.
func TestPprofRefusalWithStalledBody(t *testing.T) {
	a := authWithToken(t)
	n, err := service.Start(service.Config{
		Addr: "127.0.0.1:0", FastLaneAddr: "127.0.0.1:0", Pprof: true,
		Server: server.Config{Auth: a, ReadHeaderTimeout: 300 * time.Millisecond, ReadTimeout: 300 * time.Millisecond},
		Raft:   replication.Config{DataDir: t.TempDir(), RaftAddr: "127.0.0.1:0", Bootstrap: true},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close(context.Background()) })
	c := dialFrom(t, "127.0.0.6", n.Addr())
	_, _ = c.Write([]byte("POST /debug/pprof/cmdline HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{"))
	if _, err := closedWithin(c, 3*time.Second); err != nil {
		t.Errorf("an unauthenticated pprof request with a stalled body: %v", err)
	}
}

// authWithToken loads an auth file of one admin token, "root".
func authWithToken(t *testing.T) *auth.Authenticator {
	t.Helper()
	sum := sha256.Sum256([]byte("root"))
	file := filepath.Join(t.TempDir(), "auth.json")
	if err := os.WriteFile(file, []byte(`{"tokens":[{"name":"root","sha256":"`+hex.EncodeToString(sum[:])+`","rules":[{"prefix":"","allow":["admin"]}]}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := auth.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	return a
}
