package leader_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leasehold/leasehold/core"
	"github.com/leasehold/leasehold/leader"
)

// TestEfficiencyLedger: the leader's efficiency ledger records every way an efficiency
// hold ends — released, expired, revoked, force-released (with who and why: the reason
// as the server records it), disconnected — with its holder, token and times, without a
// write to the log; a new cluster's first leader marks nothing lost, a later epoch
// starts empty and says that what came before it was lost (Lost, Since).
func TestEfficiencyLedger(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, fl := newLeader(t, leader.Config{})
		promote(t, l)
		const name = "eff/ledger"
		eff := core.Efficiency
		if h, err := l.EfficiencyHistory(name); err != nil || h.Served || h.Lost || len(h.Tenures) != 0 {
			t.Fatalf("a name never used: %+v, %v; want nothing served, nothing lost", h, err)
		}
		a := grant(t, l, time.Hour)
		first := acquire(t, l, a, "eff/warm-up", eff, acquireOpts{}) // reserves the epoch's tokens
		if err := l.Release(context.Background(), a, "eff/warm-up", first.Token); err != nil {
			t.Fatal(err)
		}
		n := fl.proposals(0)
		start := time.Now()

		// Released.
		t1 := acquire(t, l, a, name, eff, acquireOpts{}).Token
		if err := l.Release(context.Background(), a, name, t1); err != nil {
			t.Fatal(err)
		}
		// Force-released.
		t2 := acquire(t, l, a, name, eff, acquireOpts{}).Token
		const why = "by admin ops: stuck"
		if _, _, err := l.ForceRelease(context.Background(), name, why); err != nil {
			t.Fatal(err)
		}
		if cmds := fl.proposedSince(n); len(cmds) != 0 {
			t.Fatalf("efficiency grants, releases and a force release proposed %+v", cmds)
		}
		// Revoked.
		b := grant(t, l, time.Hour)
		t3 := acquire(t, l, b, name, eff, acquireOpts{}).Token
		if err := l.Revoke(context.Background(), b); err != nil {
			t.Fatal(err)
		}
		// Disconnected.
		c := grant(t, l, time.Hour)
		t4 := acquire(t, l, c, name, eff, acquireOpts{}).Token
		if err := l.Disconnect(context.Background(), c); err != nil {
			t.Fatal(err)
		}
		// Expired: a lease of one second, not kept alive. A lock-delay of 0 lets the
		// next holder in at once.
		d := grant(t, l, time.Second)
		t5 := acquire(t, l, d, name, eff, acquireOpts{}).Token
		time.Sleep(2 * time.Second)
		synctest.Wait()
		// Held.
		e := grant(t, l, time.Hour)
		t6 := acquire(t, l, e, name, eff, acquireOpts{}).Token

		h, err := l.EfficiencyHistory(name)
		if err != nil || !h.Served || h.Lost || h.Epoch != l.Epoch() || h.Since.After(start) {
			t.Fatalf("history %+v, %v; want served in this epoch, nothing lost on the first leader", h, err)
		}
		want := []struct {
			token uint64
			end   core.EventKind
			note  string
		}{{t1, core.EventReleased, ""}, {t2, core.EventForceReleased, why}, {t3, core.EventRevoked, ""},
			{t4, core.EventDisconnected, ""}, {t5, core.EventExpired, ""}, {t6, 0, ""}}
		if len(h.Tenures) != len(want) {
			t.Fatalf("%d tenures, want %d: %+v", len(h.Tenures), len(want), h.Tenures)
		}
		for i, w := range want {
			g := h.Tenures[i]
			if g.Name != name || g.Token != w.token || g.End != w.end || g.Note != w.note || g.Holder.PID != 42 || g.Mode != core.Exclusive ||
				g.StartMillis < start.UnixMilli() || (w.end != 0) != (g.EndMillis >= g.StartMillis) {
				t.Fatalf("tenure %d = %+v, want token %d ended %v %q with its holder and times", i, g, w.token, w.end, w.note)
			}
		}
		if h.Tenures[4].EndMillis-h.Tenures[4].StartMillis < 1000 {
			t.Fatalf("the expired tenure %+v lasted less than its TTL", h.Tenures[4])
		}

		// A new epoch knows nothing of the old one's tenures, and says they were lost.
		l.Demote()
		time.Sleep(time.Second)
		promote(t, l)
		h, err = l.EfficiencyHistory(name)
		if err != nil || h.Served || !h.Lost || len(h.Tenures) != 0 || h.Epoch != l.Epoch() || !h.Since.Equal(time.Now()) {
			t.Fatalf("after a new Promote: %+v, %v; want nothing served, the earlier epoch lost since now", h, err)
		}
		f := grant(t, l, time.Hour)
		t7 := acquire(t, l, f, name, eff, acquireOpts{}).Token
		if h, _ = l.EfficiencyHistory(name); !h.Served || !h.Lost || len(h.Tenures) != 1 || h.Tenures[0].Token != t7 || h.Tenures[0].End != 0 {
			t.Fatalf("the new epoch's hold: %+v", h)
		}
		// A name held as correctness is not served as efficiency.
		acquire(t, l, f, "corr/ledger", core.Correctness, acquireOpts{})
		if h, _ = l.EfficiencyHistory("corr/ledger"); h.Served || len(h.Tenures) != 0 {
			t.Fatalf("a correctness lock's efficiency history: %+v", h)
		}
		l.Demote()
		if _, err := l.EfficiencyHistory(name); !errors.Is(err, leader.ErrNotLeader) {
			t.Fatalf("EfficiencyHistory when not leading: %v, want ErrNotLeader", err)
		}
	})
}
