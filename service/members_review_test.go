package service_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/internal/auth"
	"github.com/leasehold/leasehold/service"
)

// knownBug skips a test showing an unfixed bug unless LEASEHOLD_KNOWN_BUGS=1.
func knownBug(t *testing.T) {
	t.Helper()
	if os.Getenv("LEASEHOLD_KNOWN_BUGS") != "1" {
		t.Skip("known bug; set LEASEHOLD_KNOWN_BUGS=1 to run")
	}
}

// TestAddMemberWithAuthNoPeerTLS: with an auth file and no TLS at all (loopback), an
// admin adds a running, empty node with `members add` — the path docs/SECURITY.md gives
// for a cluster with auth and without peer TLS. The new node has the same auth file; the
// add must succeed and promote the node.
func TestAddMemberWithAuthNoPeerTLS(t *testing.T) {
	file := writeAuth(t, map[string]any{"tokens": []map[string]any{token("ops", "ops-secret", "", "admin")}})
	withAuth := func(cfg *service.Config) {
		a, err := auth.Load(file)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Server.Auth = a
	}
	n1 := start(t, "n1", "", withAuth)
	n2 := start(t, "n2", "", withAuth, func(cfg *service.Config) { cfg.Raft.Bootstrap = false })
	ctx := ctxT(t, time.Minute)
	c := dial(t, n1.Addr(), client.WithToken("ops-secret"))
	ms, err := c.AddMember(ctx, "n2", n2.Raft.RaftAddr(), n2.Addr())
	if err != nil {
		t.Fatalf("AddMember with an admin token (auth on, no TLS): %v", err)
	}
	if len(ms) != 2 || ms[1].GetSuffrage() != "voter" {
		t.Fatalf("members after the add: %v", ms)
	}
}

// cluster3 starts n1 and has n2 and n3 join it, and waits until all three are voters.
func cluster3(t *testing.T, edit ...func(*service.Config)) (n1, n2, n3 *service.Node, c *client.Client) {
	t.Helper()
	n1 = start(t, "n1", "", edit...)
	n2 = start(t, "n2", n1.Addr(), edit...)
	n3 = start(t, "n3", n1.Addr(), edit...)
	c = dial(t, n1.Addr())
	ctx := ctxT(t, 30*time.Second)
	for {
		ms, err := c.Members(ctx)
		voters := 0
		for _, m := range ms {
			if m.GetSuffrage() == "voter" {
				voters++
			}
		}
		if err == nil && voters == 3 {
			return n1, n2, n3, c
		}
		if ctx.Err() != nil {
			t.Fatalf("the cluster of three did not form: %v %v", ms, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestRemoveMemberKeepsQuorum: in a cluster of three with one node down, removing one
// of the two live nodes leaves a configuration of two voters of which one is down: no
// majority, ever, until the dead node comes back. The removal must be refused (the
// cluster keeps serving on its live majority), or leave a cluster that still serves.
func TestRemoveMemberKeepsQuorum(t *testing.T) {
	knownBug(t)
	n1, _, n3, c := cluster3(t)
	ctx := ctxT(t, time.Minute)
	if err := n3.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(ctx, "before", []byte("v")); err != nil {
		t.Fatalf("two of three no longer serve: %v", err)
	}
	rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	_, rerr := c.RemoveMember(rctx, "n2")
	cancel()
	t.Logf("RemoveMember(n2) with n3 down: %v", rerr)
	pctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if _, err := c.Put(pctx, "after", []byte("v")); err != nil {
		st := n1.Raft.Status()
		t.Fatalf("after RemoveMember(n2) (answer: %v) with n3 down the cluster no longer serves: Put: %v (n1 is %s, leader %q)", rerr, err, st.Role, st.LeaderID)
	}
}
