package service_test

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
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

	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/core"
	"github.com/leasehold/leasehold/fastlane"
	"github.com/leasehold/leasehold/internal/auth"
	"github.com/leasehold/leasehold/internal/tlsconf"
	"github.com/leasehold/leasehold/internal/tlsconf/tlstest"
	"github.com/leasehold/leasehold/replication"
	"github.com/leasehold/leasehold/service"
)

// pki is the certificates of a secured test cluster: a CA for the nodes (API server
// certificates and peer certificates alike) and another for clients.
type pki struct {
	nodes, clients *tlstest.CA
	node           tlstest.Cert // every node's certificate (127.0.0.1)
	authFile       string
}

func newPKI(t *testing.T) *pki {
	p := &pki{nodes: tlstest.NewCA(t, "nodes"), clients: tlstest.NewCA(t, "clients")}
	p.node = p.nodes.Issue(t, "node")
	p.authFile = writeAuth(t, map[string]any{
		"tokens": []map[string]any{
			token("ops", "ops-secret", "", "admin"),
			token("ci", "ci-secret", "jobs/", "lock", "read"),
		},
		"subjects": []map[string]any{{"cn": "billing", "rules": []map[string]any{{"prefix": "billing/", "allow": []string{"lock", "kv-write", "read"}}}}},
	})
	return p
}

func token(name, secret, prefix string, allow ...string) map[string]any {
	sum := sha256.Sum256([]byte(secret))
	return map[string]any{"name": name, "sha256": hex.EncodeToString(sum[:]), "rules": []map[string]any{{"prefix": prefix, "allow": allow}}}
}

func writeAuth(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "auth.json")
	if err := os.WriteFile(f, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// start starts a node with the pki's TLS (API, client CA, peer) and auth file, joining
// join when it is not "".
func (p *pki) start(t *testing.T, id, join string, peer tlstest.Cert, peerCA *tlstest.CA) *service.Node {
	t.Helper()
	tc, err := tlsconf.Load(
		tlsconf.Files{Cert: p.node.CertFile, Key: p.node.KeyFile, CA: p.clients.CertFile},
		tlsconf.Files{Cert: peer.CertFile, Key: peer.KeyFile, CA: peerCA.CertFile})
	if err != nil {
		t.Fatal(err)
	}
	a, err := auth.Load(p.authFile)
	if err != nil {
		t.Fatal(err)
	}
	cfg := service.Config{
		Addr:         "127.0.0.1:0",
		FastLaneAddr: "127.0.0.1:0",
		Raft:         replication.Config{NodeID: id, DataDir: t.TempDir(), RaftAddr: "127.0.0.1:0", Bootstrap: join == ""},
		Logger:       slog.New(slog.NewTextHandler(io.Discard, nil)),
		TLS:          tc,
		Join:         join,
	}
	cfg.Server.Auth = a
	n, err := service.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close(context.Background()) })
	return n
}

// first starts the first node, n1, bootstrapping a cluster, and waits until it leads.
func (p *pki) first(t *testing.T, ctx context.Context) *service.Node {
	t.Helper()
	n1 := p.start(t, "n1", "", p.node, p.nodes)
	if err := n1.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	return n1
}

// dial returns a client of addr over TLS trusting the nodes' CA, with opts.
func (p *pki) dial(t *testing.T, ctx context.Context, addr string, tc *tls.Config, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.Dial(ctx, addr, append([]client.Option{client.WithTLS(tc)}, opts...)...)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// TestTLSCluster runs three nodes with every port secured — the API and fast lane over
// TLS with client certificates required, raft and forwarding over mutual TLS with peer
// certificates, and an auth file — and checks that a client with a token or a mapped
// certificate takes locks and writes through a follower (forwarded to the leader with
// the caller's identity, over TLS), that the write reached every node through raft, and
// that the rules hold through a follower too.
func TestTLSCluster(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	p := newPKI(t)
	n1 := p.first(t, ctx)
	n2 := p.start(t, "n2", n1.Addr(), p.node, p.nodes)
	n3 := p.start(t, "n3", n1.Addr(), p.node, p.nodes)

	ciCert := p.clients.Issue(t, "ci-runner")
	ops := p.dial(t, ctx, n1.Addr(), p.nodes.ClientConfig(ciCert), client.WithToken("ops-secret"))
	waitMembers(t, ctx, ops, 3)

	for _, follower := range []*service.Node{n2, n3} {
		ci := p.dial(t, ctx, follower.Addr(), p.nodes.ClientConfig(ciCert), client.WithToken("ci-secret"))
		l, err := ci.Lock(ctx, "jobs/nightly", client.Correctness)
		if err != nil {
			t.Fatalf("ci through %s: Lock: %v", follower.Addr(), err)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatalf("ci through %s: Unlock: %v", follower.Addr(), err)
		}
		_, err = ci.Put(ctx, "jobs/result", []byte("x"))
		if connect.CodeOf(err) != connect.CodePermissionDenied || !strings.Contains(err.Error(), "token ci may not kv-write on jobs/result") {
			t.Errorf("ci through %s: Put: %v, want PermissionDenied naming the rule", follower.Addr(), err)
		}
	}

	// A certificate subject, forwarded by the follower, over Connect and the fast lane.
	billing := p.dial(t, ctx, n2.Addr(), p.nodes.ClientConfig(p.clients.Issue(t, "billing")))
	if _, err := billing.Put(ctx, "billing/invoice", []byte("paid")); err != nil {
		t.Fatalf("billing through a follower: Put: %v", err)
	}
	if _, err := billing.Put(ctx, "jobs/x", []byte("no")); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Errorf("billing: Put jobs/x: %v, want PermissionDenied", err)
	}
	viaConnect := p.dial(t, ctx, n3.Addr(), p.nodes.ClientConfig(p.clients.Issue(t, "billing")), client.WithoutFastLane())
	if _, err := viaConnect.Put(ctx, "billing/receipt", []byte("sent")); err != nil {
		t.Fatalf("billing through a follower over Connect: Put: %v", err)
	}

	// Raft carried it to every node.
	for _, n := range []*service.Node{n1, n2, n3} {
		deadline := time.Now().Add(10 * time.Second)
		for {
			found := false
			n.Raft.Read(func(st *core.State) { found = st.Get("billing/invoice") != nil })
			if found {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("node %s never applied billing/invoice", n.Addr())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

func waitMembers(t *testing.T, ctx context.Context, c *client.Client, n int) {
	t.Helper()
	for {
		ms, err := c.Members(ctx)
		if err == nil && len(ms) == n {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("cluster of %d not formed: %v %v", n, ms, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestWrongCARefused checks that a certificate of another CA gets nowhere: a client that
// does not trust the node's CA, a client certificate of another CA (API and fast lane),
// and a node whose peer certificate is of another CA (raft: it is never added, and its
// raft connections are refused).
func TestWrongCARefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p := newPKI(t)
	n1 := p.first(t, ctx)
	other := tlstest.NewCA(t, "other")
	good := p.clients.Issue(t, "ci-runner")
	bad := other.Issue(t, "ci-runner")
	fastAddr := n1.FastLaneAddr()

	// The right certificates get through on each port: the API, the fast lane (its
	// handshake), raft (a peer certificate).
	if _, err := client.Dial(ctx, n1.Addr(), client.WithTLS(p.nodes.ClientConfig(good)), client.WithToken("ops-secret")); err != nil {
		t.Fatalf("API with the right certificates: %v", err)
	}
	if conn, err := tls.Dial("tcp", fastAddr, p.nodes.ClientConfig(good)); err != nil {
		t.Fatalf("fast lane with the right certificates: %v", err)
	} else if _, err := fastlane.ClientHello(conn, "", fastlane.Extensions{Token: "ops-secret"}); err != nil {
		t.Fatalf("fast lane with the right certificates: hello: %v", err)
	} else {
		_ = conn.Close()
	}
	if conn, err := tls.Dial("tcp", n1.Raft.RaftAddr(), p.nodes.ClientConfig(p.node)); err != nil {
		t.Fatalf("raft with a peer certificate: %v", err)
	} else {
		_ = conn.Close()
	}

	cases := []struct {
		name string
		tc   *tls.Config
	}{
		{"server certificate of a CA the client does not trust", other.ClientConfig(good)},
		{"client certificate of another CA", p.nodes.ClientConfig(bad)},
		{"no client certificate", p.nodes.ClientConfig()},
	}
	for _, c := range cases {
		dctx, dcancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := client.Dial(dctx, n1.Addr(), client.WithTLS(c.tc), client.WithToken("ops-secret"))
		dcancel()
		if err == nil {
			t.Errorf("API, %s: Dial succeeded", c.name)
		}
		conn, err := tls.Dial("tcp", fastAddr, c.tc)
		if err == nil {
			// TLS 1.3 clients learn of a refused certificate on their first read.
			_, err = fastlane.ClientHello(conn, "", fastlane.Extensions{Token: "ops-secret"})
			_ = conn.Close()
		}
		if err == nil {
			t.Errorf("fast lane, %s: handshake succeeded", c.name)
		}
	}
	// Plain TCP to a TLS port gets no service either.
	if _, err := client.Dial(ctx, n1.Addr(), client.WithToken("ops-secret")); err == nil {
		t.Error("API without TLS: Dial succeeded")
	}

	// Raft: a connection with a peer certificate of another CA is refused...
	raftConn, err := tls.Dial("tcp", n1.Raft.RaftAddr(), other.ClientConfig(other.Issue(t, "intruder")))
	if err == nil {
		_ = raftConn.SetDeadline(time.Now().Add(5 * time.Second))
		_, err = raftConn.Read(make([]byte, 1))
		_ = raftConn.Close()
	}
	if err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("raft: a peer certificate of another CA was not refused (%v)", err)
	}
	// ...and a node with one can neither join (its join presents it) nor be reached
	// when added by an operator.
	intruder := p.start(t, "n9", n1.Addr(), other.Issue(t, "n9"), other)
	ops := p.dial(t, ctx, n1.Addr(), p.nodes.ClientConfig(good), client.WithToken("ops-secret"))
	actx, acancel := context.WithTimeout(ctx, 3*time.Second)
	_, err = ops.AddMember(actx, "n9", intruder.Raft.RaftAddr(), intruder.Addr())
	acancel()
	if err == nil {
		t.Error("raft: a node with a peer certificate of another CA was added")
	}
	time.Sleep(time.Second)
	if st := intruder.Raft.Status(); st.CommitIndex != 0 || st.LeaderID != "" {
		t.Errorf("the intruder received raft entries: %+v", st)
	}
}

// TestPeerHeaderNotTrusted checks that a request claiming to be forwarded, with a
// subject or peer header, from a connection without a peer certificate is not believed.
func TestPeerHeaderNotTrusted(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p := newPKI(t)
	n1 := p.first(t, ctx)
	tr := &http.Transport{TLSClientConfig: p.nodes.ClientConfig(p.clients.Issue(t, "nobody"))}
	defer tr.CloseIdleConnections()
	for _, h := range [][2]string{{"Leasehold-Forwarded-Subject", "billing"}, {"Leasehold-Forwarded-Peer", "n2"}} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "https://"+n1.Addr()+"/leasehold.v1.KVService/Put", strings.NewReader(`{"key":"billing/x","value":"eA=="}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Leasehold-Forwarded-By", "n2")
		req.Header.Set(h[0], h[1])
		resp, err := (&http.Client{Transport: tr}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("forged %s: %s %s, want 401 Unauthenticated", h[0], resp.Status, body)
		}
	}
}

// TestReload checks that a node reloads its certificates and auth file (service.Node
// Reload, which `leasehold server` calls on SIGHUP): a new server certificate from a new
// CA is served to new connections, a token taken out of the auth file stops working on
// a fast-lane connection already open, and an invalid file changes nothing.
func TestReload(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p := newPKI(t)
	n1 := p.first(t, ctx)
	ciCert := p.clients.Issue(t, "ci-runner")
	ci := p.dial(t, ctx, n1.Addr(), p.nodes.ClientConfig(ciCert), client.WithToken("ci-secret"))
	if _, err := ci.Lock(ctx, "jobs/a", client.Efficiency); err != nil {
		t.Fatal(err)
	}

	// Take ci out of the auth file; an invalid file first, which changes nothing.
	authJSON, err := os.ReadFile(p.authFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p.authFile, []byte(`{"tokens":[{"name":"x"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := n1.Reload(); err == nil {
		t.Fatal("Reload accepted an invalid auth file")
	}
	if _, err := ci.Lock(ctx, "jobs/b", client.Efficiency); err != nil {
		t.Fatalf("after an invalid reload: %v", err)
	}
	var f map[string]any
	_ = json.Unmarshal(authJSON, &f)
	f["tokens"] = f["tokens"].([]any)[:1] // ops only
	b, _ := json.Marshal(f)
	if err := os.WriteFile(p.authFile, b, 0o600); err != nil {
		t.Fatal(err)
	}
	// Rotate the server certificate to one of a new CA.
	newCA := tlstest.NewCA(t, "nodes-2")
	rotated := newCA.Issue(t, "node")
	copyFile(t, rotated.CertFile, p.node.CertFile)
	copyFile(t, rotated.KeyFile, p.node.KeyFile)
	if err := n1.Reload(); err != nil {
		t.Fatal(err)
	}
	if _, err := ci.Lock(ctx, "jobs/c", client.Efficiency, client.TryOnce); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("a removed token on an open connection: %v, want Unauthenticated", err)
	}
	conn, err := tls.Dial("tcp", n1.Addr(), newCA.ClientConfig(ciCert))
	if err != nil {
		t.Fatalf("the rotated certificate is not served: %v", err)
	}
	_ = conn.Close()
	if conn, err := tls.Dial("tcp", n1.Addr(), p.nodes.ClientConfig(ciCert)); err == nil {
		_ = conn.Close()
		t.Error("the old certificate is still served after the reload")
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestExposure checks that a node refuses to serve an address other than loopback
// without authentication, unless told to.
func TestExposure(t *testing.T) {
	ip := nonLoopbackIP(t)
	cfg := func() service.Config {
		return service.Config{
			Addr:         net.JoinHostPort(ip, "0"),
			FastLaneAddr: "off",
			Raft:         replication.Config{DataDir: t.TempDir(), RaftAddr: "127.0.0.1:0", Bootstrap: true},
			Logger:       slog.New(slog.NewTextHandler(io.Discard, nil)),
		}
	}
	if n, err := service.Start(cfg()); err == nil {
		_ = n.Close(context.Background())
		t.Fatal("a node served a non-loopback address without auth")
	} else if !strings.Contains(err.Error(), "--insecure-no-auth") {
		t.Errorf("the refusal does not say how to proceed: %v", err)
	}
	c := cfg()
	c.InsecureNoAuth = true
	n, err := service.Start(c)
	if err != nil {
		t.Fatalf("with InsecureNoAuth: %v", err)
	}
	_ = n.Close(context.Background())
	c = cfg()
	a, err := auth.Load(writeAuth(t, map[string]any{"tokens": []map[string]any{token("ops", "s", "", "admin")}}))
	if err != nil {
		t.Fatal(err)
	}
	c.Server.Auth = a
	if n, err = service.Start(c); err != nil {
		t.Fatalf("with auth: %v", err)
	}
	_ = n.Close(context.Background())
}

// nonLoopbackIP returns an address of this machine that is not loopback, or skips.
func nonLoopbackIP(t *testing.T) string {
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && !ipn.IP.IsLoopback() && ipn.IP.To4() != nil {
			return ipn.IP.String()
		}
	}
	t.Skip("no non-loopback IPv4 address on this machine")
	return ""
}
