package server_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/api/leasehold/v1/leaseholdv1connect"
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

// TestEfficiencyLedgerAcrossLeaderChange: an efficiency lock's ledger is the leader's.
// The first leader of a new cluster shows its tenures with no marker (nothing came
// before it); after a failover the new leader knows nothing of the name until it is
// used again, and then shows one TENURE_END_LEADER_LOST entry (its epoch, when it began
// serving) before its own tenures, none of the old leader's. A follower forwards
// History to the leader (Connect; History is not on the fast lane) and answers the
// same; a name never used answers no tenures.
func TestEfficiencyLedgerAcrossLeaderChange(t *testing.T) {
	c := clustertest.MakeCluster(t, 3, clustertest.Options{})
	lead := at(t, c.Leader())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const name = "ledger/eff"
	l1 := lead.grant(30 * time.Second)
	t0 := lead.acquire(l1, name, efficiency)
	if _, err := lead.n.Server().Release(ctx, &leaseholdv1.ReleaseRequest{LeaseId: l1, Name: name, Token: t0}); err != nil {
		t.Fatal(err)
	}
	t1 := lead.acquire(l1, name, efficiency) // held when the leader changes
	type entry struct {
		token uint64
		end   leaseholdv1.TenureEnd
	}
	check := func(got []*leaseholdv1.Tenure, want []entry, epoch, what string) {
		t.Helper()
		if len(got) != len(want) {
			t.Fatalf("%s: %d tenures %v, want %d", what, len(got), got, len(want))
		}
		for i, w := range want {
			g := got[i]
			if g.GetToken() != w.token || g.GetEnd() != w.end || g.GetClass() != efficiency || g.GetEpoch() != epoch ||
				(w.end == leaseholdv1.TenureEnd_TENURE_END_LEADER_LOST) != (g.GetStartUnixMs() == 0) {
				t.Fatalf("%s: tenure %d = %v, want token %d ended %v, efficiency of epoch %s", what, i, g, w.token, w.end, epoch)
			}
		}
	}
	check(lead.history(name), []entry{{t0, leaseholdv1.TenureEnd_TENURE_END_RELEASED}, {t1, leaseholdv1.TenureEnd_TENURE_END_UNSPECIFIED}},
		lead.n.Leader().Epoch(), "on the first leader")

	c.Partition(lead.n)
	next := at(t, c.Leader(c.Others(lead.n)...))
	if h := next.history(name); len(h) != 0 {
		t.Fatalf("the new leader, before the name is used again: %v, want no tenures", h)
	}
	l2 := next.grant(30 * time.Second)
	t2 := next.acquire(l2, name, efficiency)
	if _, err := next.n.Server().Release(ctx, &leaseholdv1.ReleaseRequest{LeaseId: l2, Name: name, Token: t2}); err != nil {
		t.Fatal(err)
	}
	t3 := next.acquire(l2, name, efficiency)
	epoch := next.n.Leader().Epoch()
	want := []entry{{0, leaseholdv1.TenureEnd_TENURE_END_LEADER_LOST}, {t2, leaseholdv1.TenureEnd_TENURE_END_RELEASED}, {t3, leaseholdv1.TenureEnd_TENURE_END_UNSPECIFIED}}
	h := next.history(name)
	check(h, want, epoch, "on the new leader")
	if since := h[0].GetEndUnixMs(); since <= 0 || since > h[1].GetStartUnixMs() {
		t.Fatalf("the marker's time %d: want when the new leader began serving, before its first tenure %v", since, h[1])
	}
	c.Heal()

	// Through a follower: forwarded to the leader.
	follower := c.Others(next.n, lead.n)[0]
	if _, err := follower.Server().History(ctx, &leaseholdv1.HistoryRequest{Name: name}); err == nil {
		t.Fatal("a follower's own History handler answered: only the leader knows the efficiency ledger")
	}
	locks := leaseholdv1connect.NewLockServiceClient(http.DefaultClient, "http://"+follower.Addr())
	var resp *leaseholdv1.HistoryResponse
	var err error
	clustertest.WaitFor(t, func() bool {
		resp, err = locks.History(ctx, &leaseholdv1.HistoryRequest{Name: name})
		return err == nil
	}, "History through a follower that knows the leader")
	check(resp.GetTenures(), want, epoch, "through a follower")
	resp, err = locks.History(ctx, &leaseholdv1.HistoryRequest{Name: "ledger/never-used"})
	if err != nil || len(resp.GetTenures()) != 0 {
		t.Fatalf("History of a name never used: %v, %v; want no tenures", resp, err)
	}
}
