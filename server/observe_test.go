package server_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/core"
	"github.com/leasehold/leasehold/internal/clustertest"
	"github.com/leasehold/leasehold/internal/reason"
	"github.com/leasehold/leasehold/server"
)

// observation is one Observe stream served by a node's handler, in the background.
type observation struct {
	mu   sync.Mutex
	msgs []*leaseholdv1.ObserveResponse
	err  error
	stop context.CancelFunc
	done chan struct{}
}

// observe starts Observe of name on o's node, resumed after *after when it is set.
func (o on) observe(name string, after *uint64) *observation {
	ctx, cancel := context.WithCancel(context.Background())
	ob := &observation{stop: cancel, done: make(chan struct{})}
	srv := o.n.Server()
	go func() {
		defer close(ob.done)
		err := srv.Observe(ctx, &leaseholdv1.ObserveRequest{Name: name, AfterRevision: after}, func(m *leaseholdv1.ObserveResponse) error {
			ob.mu.Lock()
			defer ob.mu.Unlock()
			ob.msgs = append(ob.msgs, m)
			return nil
		})
		ob.mu.Lock()
		ob.err = err
		ob.mu.Unlock()
	}()
	o.t.Cleanup(func() { cancel(); <-ob.done })
	return ob
}

// await waits until the stream has n messages and returns them.
func (ob *observation) await(t *testing.T, n int) []*leaseholdv1.ObserveResponse {
	t.Helper()
	var got []*leaseholdv1.ObserveResponse
	clustertest.WaitFor(t, func() bool {
		ob.mu.Lock()
		defer ob.mu.Unlock()
		got = append(got[:0], ob.msgs...)
		return len(got) >= n || ob.err != nil
	}, fmt.Sprintf("%d Observe messages", n))
	ob.mu.Lock()
	defer ob.mu.Unlock()
	if ob.err != nil {
		t.Fatalf("Observe ended: %v after %v", ob.err, got)
	}
	return got
}

// change is what a test expects of an Observe message.
type change struct {
	leads bool
	epoch uint64
	value string
	ended leaseholdv1.TenureEnd
}

func (c change) String() string {
	return fmt.Sprintf("{leads %v epoch %d value %q ended %v}", c.leads, c.epoch, c.value, c.ended)
}

func changesOf(msgs []*leaseholdv1.ObserveResponse) []change {
	out := make([]change, len(msgs))
	for i, m := range msgs {
		out[i] = change{m.GetHasLeader(), m.GetEpoch(), string(m.GetValue()), m.GetEnded()}
	}
	return out
}

// wantObserved checks the messages against want, and that their revisions rise.
func wantObserved(t *testing.T, what string, msgs []*leaseholdv1.ObserveResponse, want ...change) {
	t.Helper()
	if got := changesOf(msgs); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("%s:\n got %v\nwant %v", what, got, want)
	}
	for i := 1; i < len(msgs); i++ {
		if msgs[i].GetRevision() <= msgs[i-1].GetRevision() {
			t.Fatalf("%s: revision %d after %d", what, msgs[i].GetRevision(), msgs[i-1].GetRevision())
		}
	}
}

// TestObserveResumesAcrossNodes is G8 across a broken stream: an Observe that showed
// a leader and its proclaimed value stops; while it is away leaderships come and go
// (resigned, revoked) and the leader is killed; resumed on the new leader after the
// last revision it showed, it gets exactly the changes it missed, in order, with how
// each leadership ended, then the live ones; a node restarted from its data directory
// replays the same; a resume point below the retained history fails "compacted",
// naming the oldest point held, and resuming there goes on.
func TestObserveResumesAcrossNodes(t *testing.T) {
	c := clustertest.MakeCluster(t, 3, clustertest.Options{})
	lead := at(t, c.Leader())
	srv := lead.n.Server()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const name = "observe/svc"
	l1, l2, l3 := lead.grant(30*time.Second), lead.grant(30*time.Second), lead.grant(30*time.Second)
	campaign := func(srv *server.Server, lease, value string) uint64 {
		t.Helper()
		resp, err := srv.Campaign(ctx, &leaseholdv1.CampaignRequest{Name: name, LeaseId: lease, Value: []byte(value)})
		if err != nil {
			t.Fatalf("campaign %s: %v", value, err)
		}
		return resp.GetEpoch()
	}
	proclaim := func(srv *server.Server, lease string, epoch uint64, value string) {
		t.Helper()
		if _, err := srv.Proclaim(ctx, &leaseholdv1.ProclaimRequest{Name: name, LeaseId: lease, Epoch: epoch, Value: []byte(value)}); err != nil {
			t.Fatalf("proclaim %s: %v", value, err)
		}
	}
	resign := func(srv *server.Server, lease string, epoch uint64) {
		t.Helper()
		if _, err := srv.Resign(ctx, &leaseholdv1.ResignRequest{Name: name, LeaseId: lease, Epoch: epoch}); err != nil {
			t.Fatalf("resign %d: %v", epoch, err)
		}
	}

	first := lead.observe(name, nil)
	e1 := campaign(srv, l1, "a")
	proclaim(srv, l1, e1, "a2")
	proclaim(srv, l1, e1, "a2") // the same value: no change
	got := first.await(t, 3)
	wantObserved(t, "the first stream", got, change{}, change{true, e1, "a", 0}, change{true, e1, "a2", 0})
	first.stop()
	<-first.done
	last := got[len(got)-1].GetRevision()

	// Away: a resignation, a revoked leader, a leader with a new value.
	resign(srv, l1, e1)
	e2 := campaign(srv, l2, "b")
	if _, err := srv.Revoke(ctx, &leaseholdv1.RevokeRequest{LeaseId: l2}); err != nil {
		t.Fatal(err)
	}
	e3 := campaign(srv, l3, "c")
	proclaim(srv, l3, e3, "c2")
	missed := []change{
		{false, e1, "", leaseholdv1.TenureEnd_TENURE_END_RELEASED},
		{true, e2, "b", 0},
		{false, e2, "", leaseholdv1.TenureEnd_TENURE_END_REVOKED},
		{true, e3, "c", 0},
		{true, e3, "c2", 0},
	}
	old := lead.n
	if err := old.Raft().Snapshot(); err != nil { // its restart restores the history from it
		t.Fatal(err)
	}
	c.Kill(old)
	lead = at(t, c.Leader(c.Others(old)...))
	resumed := lead.observe(name, &last)
	wantObserved(t, "resumed on the new leader", resumed.await(t, len(missed)), missed...)
	resign(lead.n.Server(), l3, e3) // live
	live := append(missed, change{false, e3, "", leaseholdv1.TenureEnd_TENURE_END_RELEASED})
	wantObserved(t, "resumed, then live", resumed.await(t, len(live)), live...)

	c.Restart(old)
	restarted := at(t, old)
	rev := func(n *clustertest.Node) (r uint64) {
		n.Raft().Read(func(s *core.State) { r = s.ElectionRev() })
		return r
	}
	clustertest.WaitFor(t, func() bool { return rev(old) == rev(lead.n) }, "the restarted node to catch up")
	wantObserved(t, "resumed on the restarted node", restarted.observe(name, &last).await(t, len(live)), live...)

	// Past the retention (64 changes per election by default): compacted.
	l4 := lead.grant(30 * time.Second)
	e4 := campaign(lead.n.Server(), l4, "d")
	for i := range core.DefaultElectionHistory {
		proclaim(lead.n.Server(), l4, e4, fmt.Sprint(i))
	}
	err := lead.n.Server().Observe(ctx, &leaseholdv1.ObserveRequest{Name: name, AfterRevision: &last}, func(m *leaseholdv1.ObserveResponse) error {
		return fmt.Errorf("a message %v before compacted", m)
	})
	var hc *core.HistoryCompactedError
	if !errors.As(err, &hc) || hc.Oldest <= last {
		t.Fatalf("resume below the retention: %v, want compacted", err)
	}
	if code, d := server.Classify(err); code != connect.CodeFailedPrecondition || d.GetReason() != reason.Compacted || d.GetOldestRevision() != hc.Oldest {
		t.Fatalf("compacted classified as %v %+v", code, d)
	}
	oldest := hc.Oldest
	from := lead.observe(name, &oldest).await(t, core.DefaultElectionHistory)
	if v := string(from[len(from)-1].GetValue()); v != fmt.Sprint(core.DefaultElectionHistory-1) {
		t.Fatalf("resumed at the oldest point held: last value %q", v)
	}
}
