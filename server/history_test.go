package server_test

import (
	"context"
	"testing"
	"time"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/core"
	"github.com/leasehold/leasehold/internal/clustertest"
)

func (o on) history(name string) []*leaseholdv1.Tenure {
	o.t.Helper()
	ctx, cancel := o.ctx(5 * time.Second)
	defer cancel()
	resp, err := o.n.Server().History(ctx, &leaseholdv1.HistoryRequest{Name: name})
	if err != nil {
		o.t.Fatalf("history %s through %s: %v", name, o.n.ID, err)
	}
	return resp.GetTenures()
}

// TestLedgerSurvivesFailoverAndRestore: a lock's ledger has an entry for each way a hold
// ends — released, expired, revoked, force-released (with its reason) — and the same
// entries, in the same order, on a new leader after a failover and on a node restarted
// from its snapshot.
func TestLedgerSurvivesFailoverAndRestore(t *testing.T) {
	c := clustertest.MakeCluster(t, 3, clustertest.Options{})
	lead := at(t, c.Leader())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	srv := lead.n.Server()
	const name = "ledger/x"
	// Released.
	l1 := lead.grant(10 * time.Second)
	t1 := lead.acquire(l1, name, correctness)
	if _, err := srv.Release(ctx, &leaseholdv1.ReleaseRequest{LeaseId: l1, Name: name, Token: t1}); err != nil {
		t.Fatal(err)
	}
	// Force-released.
	t2 := lead.acquire(l1, name, correctness)
	if _, err := srv.ForceRelease(ctx, &leaseholdv1.ForceReleaseRequest{Name: name, Reason: "stuck"}); err != nil {
		t.Fatal(err)
	}
	// Revoked.
	l2 := lead.grant(10 * time.Second)
	t3 := lead.acquire(l2, name, correctness)
	if _, err := srv.Revoke(ctx, &leaseholdv1.RevokeRequest{LeaseId: l2}); err != nil {
		t.Fatal(err)
	}
	// Expired.
	l3 := lead.grant(300 * time.Millisecond)
	t4 := lead.acquire(l3, name, correctness)
	clustertest.WaitFor(t, func() bool {
		h := lead.history(name)
		return len(h) == 4 && h[3].GetEnd() == leaseholdv1.TenureEnd_TENURE_END_EXPIRED
	}, "the expiry in the ledger")
	// Held.
	l4 := lead.grant(30 * time.Second)
	t5 := lead.acquire(l4, name, correctness)

	want := []struct {
		token  uint64
		end    leaseholdv1.TenureEnd
		reason string
	}{
		{t1, leaseholdv1.TenureEnd_TENURE_END_RELEASED, ""},
		{t2, leaseholdv1.TenureEnd_TENURE_END_FORCE_RELEASED, "stuck"},
		{t3, leaseholdv1.TenureEnd_TENURE_END_REVOKED, ""},
		{t4, leaseholdv1.TenureEnd_TENURE_END_EXPIRED, ""},
		{t5, leaseholdv1.TenureEnd_TENURE_END_UNSPECIFIED, ""},
	}
	check := func(where on, what string) {
		t.Helper()
		got := where.history(name)
		if len(got) != len(want) {
			t.Fatalf("%s: %d tenures: %v", what, len(got), got)
		}
		for i, w := range want {
			g := got[i]
			if g.GetToken() != w.token || g.GetEnd() != w.end || g.GetReason() != w.reason || g.GetStartUnixMs() == 0 ||
				(w.end != leaseholdv1.TenureEnd_TENURE_END_UNSPECIFIED) != (g.GetEndUnixMs() >= g.GetStartUnixMs()) {
				t.Fatalf("%s: tenure %d = %v, want token %d ended %v %q with its times", what, i, g, w.token, w.end, w.reason)
			}
		}
	}
	check(lead, "on the leader")

	// Failover: the new leader has the same ledger.
	c.Partition(lead.n)
	next := at(t, c.Leader(c.Others(lead.n)...))
	check(next, "on the new leader")
	c.Heal()

	// Restore: a node restarted on a snapshot that holds the ledger.
	follower := c.Others(next.n)[0]
	clustertest.WaitFor(t, func() bool {
		var n int
		follower.Raft().Read(func(st *core.State) { n = len(st.History(name)) })
		return n == len(want)
	}, "the follower to catch up")
	if err := follower.Raft().Snapshot(); err != nil {
		t.Fatal(err)
	}
	c.Kill(follower)
	c.Restart(follower)
	lead = at(t, c.Leader())
	clustertest.WaitFor(t, func() bool { return follower.Running() }, "the restart")
	var restored []core.Tenure
	clustertest.WaitFor(t, func() bool {
		follower.Raft().Read(func(st *core.State) { restored = st.History(name) })
		return len(restored) == len(want)
	}, "the restarted node's ledger")
	for i, w := range want {
		if restored[i].Token != w.token {
			t.Fatalf("restarted node: tenure %d = %+v, want token %d", i, restored[i], w.token)
		}
	}
	check(lead, "on the leader after the restart")
}
