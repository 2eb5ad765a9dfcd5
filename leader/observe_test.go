package leader_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leasehold/leasehold/core"
	"github.com/leasehold/leasehold/leader"
)

// recorder is an Observer that writes down what it is told, one line per call.
type recorder struct {
	mu    sync.Mutex
	lines []string
}

func (r *recorder) add(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lines = append(r.lines, fmt.Sprintf(format, args...))
}

func (r *recorder) Waited(c core.Class, o leader.WaitOutcome, d time.Duration) {
	r.add("wait %v %v %v", c, o, d)
}
func (r *recorder) Held(c core.Class, d time.Duration) { r.add("hold %v %v", c, d) }
func (r *recorder) Released(c core.Class)              { r.add("released %v", c) }
func (r *recorder) ForceReleased(c core.Class)         { r.add("forced %v", c) }
func (r *recorder) LeaseEnded(e core.EndReason)        { r.add("ended %v", e) }
func (r *recorder) ExpiredLate(d time.Duration)        { r.add("late %v", d) }
func (r *recorder) Promoted()                          { r.add("promoted") }
func (r *recorder) Undone()                            { r.add("undone") }

// take returns what was recorded since the last take, sorted (the order of calls within
// one step is not the point).
func (r *recorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.lines
	r.lines = nil
	slices.Sort(out)
	return out
}

func (r *recorder) want(t *testing.T, step string, want ...string) {
	t.Helper()
	slices.Sort(want)
	if got := r.take(); !slices.Equal(got, want) {
		t.Errorf("%s: observed\n\t%q\nwant\n\t%q", step, got, want)
	}
}

// TestObserverTimes checks what the leader measures, on synctest's clock: a wait from
// the acquire's arrival to its grant or its end, a hold from grant to release, force
// release or lease end, and an expiry's lateness from the lease's deadline (not from
// where the expiry loop parked it).
func TestObserverTimes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		l, _ := newLeader(t, leader.Config{Observer: rec})
		promote(t, l)
		rec.want(t, "Promote", "promoted")
		a, b := grant(t, l, time.Minute), grant(t, l, time.Minute)
		ctx := context.Background()

		for _, class := range []core.Class{core.Efficiency, core.Correctness} {
			// A free lock, held for 2s.
			g := acquire(t, l, a, "free", class, acquireOpts{})
			time.Sleep(2 * time.Second)
			if err := l.Release(ctx, a, "free", g.Token); err != nil {
				t.Fatal(err)
			}
			rec.want(t, class.String()+" free lock", "wait "+class.String()+" granted 0s", "hold "+class.String()+" 2s", "released "+class.String())

			// Held: refused at once, a wait that runs out after 500ms, and a wait
			// granted 3s later, when the holder releases.
			g = acquire(t, l, a, "held", class, acquireOpts{})
			if _, err := l.Acquire(ctx, args(b, "held", class, acquireOpts{})); err == nil {
				t.Fatal("a try-once acquire of a held lock was granted")
			}
			if _, err := l.Acquire(ctx, args(b, "held", class, acquireOpts{waitFor: 500 * time.Millisecond})); err == nil {
				t.Fatal("a wait for a held lock was granted")
			}
			waiting := acquireAsync(ctx, l, args(b, "held", class, acquireOpts{waitFor: time.Minute}))
			time.Sleep(3 * time.Second)
			if err := l.Release(ctx, a, "held", g.Token); err != nil {
				t.Fatal(err)
			}
			r := <-waiting
			if r.err != nil {
				t.Fatal(r.err)
			}
			c := class.String()
			rec.want(t, c+" held lock",
				"wait "+c+" granted 0s", "wait "+c+" refused 0s", "wait "+c+" timeout 500ms", "wait "+c+" granted 3s",
				"hold "+c+" 3.5s", "released "+c)

			// Force released 1s after its grant.
			time.Sleep(time.Second)
			if _, _, err := l.ForceRelease(ctx, "held", "test"); err != nil {
				t.Fatal(err)
			}
			rec.want(t, c+" force release", "hold "+c+" 1s", "forced "+c)
		}

		// A lock set is one grant (one token): one hold. Two readers of a shared lock are
		// two.
		for _, class := range []core.Class{core.Efficiency, core.Correctness} {
			c := class.String()
			set := args(a, "", class, acquireOpts{})
			set.Names = []string{"set/1", "set/2", "set/3"}
			gs, err := l.Acquire(ctx, set)
			if err != nil {
				t.Fatal(err)
			}
			r1 := args(a, "shared", class, acquireOpts{})
			r1.Mode = core.Shared
			r2 := r1
			r2.Lease = b
			g1, g2 := mustAcquire(t, l, r1), mustAcquire(t, l, r2)
			time.Sleep(time.Second)
			for _, rel := range []struct {
				lease core.LeaseID
				name  string
				token uint64
			}{{a, "set/2", gs.Token}, {a, "shared", g1.Token}, {b, "shared", g2.Token}} {
				if err := l.Release(ctx, rel.lease, rel.name, rel.token); err != nil {
					t.Fatal(err)
				}
			}
			rec.want(t, c+" lock set and shared lock",
				"wait "+c+" granted 0s", "wait "+c+" granted 0s", "wait "+c+" granted 0s",
				"hold "+c+" 1s", "hold "+c+" 1s", "hold "+c+" 1s",
				"released "+c, "released "+c, "released "+c)
		}

		// A lease with a lock of each class, expired at its deadline: 1s after its grant.
		start := time.Now()
		e := grant(t, l, time.Second)
		acquire(t, l, e, "x/eff", core.Efficiency, acquireOpts{})
		acquire(t, l, e, "x/corr", core.Correctness, acquireOpts{})
		rec.take()
		sleepUntil(start, 1500*time.Millisecond)
		rec.want(t, "expiry", "ended expired", "late 0s", "hold efficiency 1s", "hold correctness 1s")

		// Revoked.
		if err := l.Revoke(ctx, b); err != nil {
			t.Fatal(err)
		}
		rec.want(t, "revoke", "ended revoked")
	})
}

// TestObserverHoldEnds: the ends of correctness holds that replication reports are
// observed only while the node serves, timed by the ledger's times (never below 0, an
// unknown end taken as now).
func TestObserverHoldEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		l, _ := newLeader(t, leader.Config{Observer: rec})
		ends := []core.EndedHold{{Class: core.Correctness, StartMillis: 1_000, EndMillis: 3_500}}
		l.OnHoldEnds(ends)
		rec.want(t, "a follower")
		promote(t, l)
		rec.take()
		now := time.Now().UnixMilli()
		l.OnHoldEnds(append(ends,
			core.EndedHold{Class: core.Correctness, StartMillis: 9_000, EndMillis: 8_000}, // an earlier leader's clock ahead
			core.EndedHold{Class: core.Correctness, StartMillis: now - 1_500}))            // no end time: now
		rec.want(t, "the leader", "hold correctness 2.5s", "hold correctness 0s", "hold correctness 1.5s")
	})
}
