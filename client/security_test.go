package client

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/leasehold/leasehold/internal/auth"
	"github.com/leasehold/leasehold/internal/testnode"
	"github.com/leasehold/leasehold/internal/tlsconf"
	"github.com/leasehold/leasehold/internal/tlsconf/tlstest"
	"github.com/leasehold/leasehold/service"
)

// TestTLSAndTokenOnFastLane checks that WithTLS and WithToken reach the fast lane too:
// the locks of a client with both are served over a TLS fast-lane connection, and
// without the token every call is Unauthenticated, on either transport.
func TestTLSAndTokenOnFastLane(t *testing.T) {
	ca := tlstest.NewCA(t, "nodes")
	cert := ca.Issue(t, "node")
	tc, err := tlsconf.Load(tlsconf.Files{Cert: cert.CertFile, Key: cert.KeyFile}, tlsconf.Files{})
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte("s3cret"))
	file := filepath.Join(t.TempDir(), "auth.json")
	if err := os.WriteFile(file, []byte(`{"tokens":[{"name":"app","sha256":"`+hex.EncodeToString(sum[:])+`","rules":[{"prefix":"","allow":["lock","read"]}]}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := auth.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	n := testnode.StartWith(t, func(c *service.Config) { c.TLS, c.Server.Auth = tc, a })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	c, err := Dial(ctx, n.Addr(), WithTLS(&tls.Config{RootCAs: ca.Pool()}), WithToken("s3cret"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	l, err := c.Lock(ctx, "tls/a", Efficiency)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	c.fast.mu.Lock()
	conn := c.fast.conn
	c.fast.mu.Unlock()
	if conn == nil || conn.broken() {
		t.Fatal("the client did not use the fast lane")
	}
	if _, ok := conn.conn.(*tls.Conn); !ok {
		t.Fatalf("the fast-lane connection is a %T, not TLS", conn.conn)
	}

	for _, opts := range [][]Option{nil, {WithoutFastLane()}} {
		anon, err := Dial(ctx, n.Addr(), append(opts, WithTLS(&tls.Config{RootCAs: ca.Pool()}))...)
		if err == nil {
			_, err = anon.Lock(ctx, "tls/b", Efficiency, TryOnce)
			_ = anon.Close(ctx)
		}
		if connect.CodeOf(err) != connect.CodeUnauthenticated {
			t.Errorf("without a token (%d options): %v, want Unauthenticated", len(opts), err)
		}
	}
}
