package service_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/internal/auth"
	"github.com/leasehold/leasehold/service"
)

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
// of the two live nodes would leave a configuration of two voters of which one is down:
// no majority, ever, until the dead node comes back (the change itself could not
// commit). The removal is refused (FailedPrecondition, quorum_at_risk) and changes
// nothing; the cluster keeps serving on its live majority, and removing the dead node
// instead works.
func TestRemoveMemberKeepsQuorum(t *testing.T) {
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
	pctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if _, err := c.Put(pctx, "after", []byte("v")); err != nil {
		st := n1.Raft.Status()
		t.Fatalf("after RemoveMember(n2) (answer: %v) with n3 down the cluster no longer serves: Put: %v (n1 is %s, leader %q)", rerr, err, st.Role, st.LeaderID)
	}
	if connect.CodeOf(rerr) != connect.CodeFailedPrecondition || reasonOf(rerr) != "quorum_at_risk" || !strings.Contains(rerr.Error(), "n3") {
		t.Fatalf("RemoveMember(n2) with n3 down = %v, want FailedPrecondition quorum_at_risk naming n3", rerr)
	}
	ms, err := c.Members(ctx)
	if err != nil || len(ms) != 3 || ms[1].GetApiAddr() == "" {
		t.Fatalf("members after the refused removal: %v %v", ms, err)
	}
	if ms, err = c.RemoveMember(ctx, "n3"); err != nil || len(ms) != 2 {
		t.Fatalf("RemoveMember(n3, the dead node) = %v %v", ms, err)
	}
	if _, err := c.Put(ctx, "after-n3", []byte("v")); err != nil {
		t.Fatalf("after removing the dead node: %v", err)
	}
}

// TestRemoveLeader: removing the leader of a healthy cluster of three answers, the
// leader steps down and the other two elect one of them and serve.
func TestRemoveLeader(t *testing.T) {
	_, n2, _, c := cluster3(t)
	ctx := ctxT(t, time.Minute)
	rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	ms, err := c.RemoveMember(rctx, "n1")
	cancel()
	if err != nil {
		t.Fatalf("RemoveMember(the leader) = %v %v", ms, err)
	}
	c2 := dial(t, n2.Addr())
	pctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if _, err := c2.Put(pctx, "after", []byte("v")); err != nil {
		t.Fatalf("after removing the leader: %v", err)
	}
	if ms, err := c2.Members(ctx); err != nil || len(ms) != 2 {
		t.Fatalf("members after removing the leader: %v %v", ms, err)
	}
}

// TestAddMemberAtAnotherMembersRaftAddr: n2, a member, dies without being removed, and a
// new node n3 is started on the same machine at n2's raft address (the address is free
// again). Adding n3 cannot work (raft refuses two members at one address); the answer
// must say so, naming raft_addr and the member that has it, as FailedPrecondition —
// not Internal.
func TestAddMemberAtAnotherMembersRaftAddr(t *testing.T) {
	_, n2, c, ctx := twoVoters(t)
	raft2 := n2.Raft.RaftAddr()
	if err := n2.Close(ctx); err != nil {
		t.Fatal(err)
	}
	n3 := start(t, "n3", "", func(cfg *service.Config) {
		cfg.Raft.Bootstrap = false
		cfg.Raft.RaftAddr = raft2
	})
	actx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	_, err := c.AddMember(actx, "n3", raft2, n3.Addr())
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "raft_addr") || !strings.Contains(err.Error(), "n2") {
		t.Fatalf("AddMember(n3 at n2's raft address) = %v (code %v), want FailedPrecondition naming raft_addr and n2", err, connect.CodeOf(err))
	}
}

// TestAddMemberRefusesEmptyNodeAsVoter: AddMember of a voter's node_id at a new raft
// address moves the voter (a node that changed hosts, keeping its data). A node under
// that id with no data at all — a replacement whose data dir was wiped, or a typo of the
// id — must not become that voter: it would count towards the quorum at once with none
// of the log, and an entry committed on the old voter and one other could then be lost
// with that other. It is refused (member_check) and the configuration stays as it was.
func TestAddMemberRefusesEmptyNodeAsVoter(t *testing.T) {
	_, n2, c, ctx := twoVoters(t)
	raft2 := n2.Raft.RaftAddr()
	// An empty node that calls itself n2, at another raft address.
	impostor := start(t, "n2", "", func(cfg *service.Config) { cfg.Raft.Bootstrap = false })
	actx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	_, err := c.AddMember(actx, "n2", impostor.Raft.RaftAddr(), impostor.Addr())
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "no data") {
		t.Fatalf("AddMember(n2, an empty node at a new address) = %v (code %v), want FailedPrecondition saying it has no data", err, connect.CodeOf(err))
	}
	ms, err := c.Members(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.GetNodeId() == "n2" && (m.GetRaftAddr() != raft2 || m.GetSuffrage() != "voter") {
			t.Fatalf("n2 after the refused AddMember: %v; want the voter at %s, unchanged", m, raft2)
		}
	}
}

// twoVoters starts n1 and n2, joined, and waits until n2 is a voter; it returns the
// nodes, a client of n1 and a context of a minute.
func twoVoters(t *testing.T) (n1, n2 *service.Node, c *client.Client, ctx context.Context) {
	t.Helper()
	n1 = start(t, "n1", "")
	n2 = start(t, "n2", n1.Addr())
	c = dial(t, n1.Addr())
	ctx = ctxT(t, time.Minute)
	waitMembers(t, ctx, c, 2)
	for {
		ms, err := c.Members(ctx)
		if err == nil && ms[1].GetSuffrage() == "voter" {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("n2 is not promoted")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return n1, n2, c, ctx
}
