package leader_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leasehold/leasehold/core"
	"github.com/leasehold/leasehold/leader"
)

func applyOK(t *testing.T, fl *fakeLog, c core.Command) core.Result {
	t.Helper()
	r, err := fl.Apply(context.Background(), c)
	if err == nil {
		err = r.Err
	}
	if err != nil {
		t.Fatalf("%v: %v", c.Op, err)
	}
	return r
}

// draining returns the first draining partition of group g.
func draining(fl *fakeLog, g string) (p core.PartitionView, ok bool) {
	fl.Read(func(s *core.State) {
		v, _ := s.Group(g)
		for _, q := range v.Partitions {
			if q.Draining {
				p, ok = q, true
				return
			}
		}
	})
	return p, ok
}

// TestDrainDeadline checks that a draining partition is taken from its owner when the
// group's drain deadline has passed, not sooner; that a demoted leader ends no drain;
// that a new leader restarts the deadline at its full length; and that a release stops
// the timer.
func TestDrainDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, fl := newLeader(t, leader.Config{})
		promote(t, l)
		a, b := grant(t, l, time.Hour), grant(t, l, time.Hour)
		applyOK(t, fl, core.Command{Op: core.OpGroupCreate, Name: "g", Count: 8, DrainMillis: 2000})
		applyOK(t, fl, core.Command{Op: core.OpGroupJoin, Name: "g", Member: "a", Lease: a})
		changed := l.GroupsChanged()
		start := time.Now()
		applyOK(t, fl, core.Command{Op: core.OpGroupJoin, Name: "g", Member: "b", Lease: b})
		select {
		case <-changed:
		default:
			t.Fatal("GroupsChanged not closed by a drain")
		}
		p, ok := draining(fl, "g")
		if !ok {
			t.Fatal("no partition drains after b joined")
		}
		sleepUntil(start, 1999*time.Millisecond)
		if n := fl.proposals(core.OpGroupDrainEnd); n != 0 {
			t.Fatalf("%d drains ended before the deadline", n)
		}
		l.Demote()
		sleepUntil(start, 10*time.Second)
		if n := fl.proposals(core.OpGroupDrainEnd); n != 0 {
			t.Fatalf("a demoted leader ended %d drains", n)
		}
		promote(t, l)
		start = time.Now()
		// One drain ends by its owner's release: its timer must not fire.
		applyOK(t, fl, core.Command{Op: core.OpGroupRelease, Name: "g", Partition: uint32(p.Partition), Token: p.Epoch, Lease: a})
		sleepUntil(start, 1999*time.Millisecond)
		if n := fl.proposals(core.OpGroupDrainEnd); n != 0 {
			t.Fatalf("%d drains ended before the restarted deadline", n)
		}
		sleepUntil(start, 2010*time.Millisecond)
		if _, ok := draining(fl, "g"); ok {
			t.Fatal("a partition still drains after the deadline")
		}
		fl.Read(func(s *core.State) {
			v, _ := s.Group("g")
			for _, q := range v.Partitions {
				if q.Partition == p.Partition && q.Owner != "b" {
					t.Errorf("released partition %d is %s's", q.Partition, q.Owner)
				}
			}
		})
		for _, c := range fl.proposedSince(0) {
			if c.Op == core.OpGroupDrainEnd && c.Partition == uint32(p.Partition) {
				t.Fatalf("the released partition's drain timer fired: %+v", c)
			}
		}
	})
}
