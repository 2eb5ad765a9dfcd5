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

// Lock modes and lock sets through the Leader, for both classes: the mode logic is the
// core's (core.Locks, for the replicated state and the efficiency table alike); these
// tests check the leader's side of it — waking the right waiter, leaving every queue
// of a set, class conflicts over all of a set's names, views of several holders, and
// the fast lane's AcquireNow never granting past a queue.

func modeArgs(lease core.LeaseID, name string, class core.Class, mode core.Mode, limit uint32, o acquireOpts) leader.AcquireArgs {
	a := args(lease, name, class, o)
	a.Mode, a.Limit = mode, limit
	return a
}

func setArgs(lease core.LeaseID, class core.Class, o acquireOpts, names ...string) leader.AcquireArgs {
	a := args(lease, "", class, o)
	a.Names = names
	return a
}

func mustAcquire(t *testing.T, l *leader.Leader, a leader.AcquireArgs) leader.Grant {
	t.Helper()
	g, err := l.Acquire(context.Background(), a)
	if err != nil || g.Token == 0 {
		t.Fatalf("Acquire(%s%v, %v): %+v, %v", a.Name, a.Names, a.Mode, g, err)
	}
	return g
}

// TestSharedWriterBlocksLaterReaders: readers share; a writer queues behind them; a
// reader arriving after the writer waits for it; the writer is woken when the readers
// are done, and the reader when the writer is.
func TestSharedWriterBlocksLaterReaders(t *testing.T) {
	for _, class := range classes {
		t.Run(class.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l, _ := newLeader(t, leader.Config{})
				promote(t, l)
				const name = "rw"
				r1, r2, w, r3 := grant(t, l, time.Minute), grant(t, l, time.Minute), grant(t, l, time.Minute), grant(t, l, time.Minute)
				g1 := mustAcquire(t, l, modeArgs(r1, name, class, core.Shared, 0, acquireOpts{}))
				g2 := mustAcquire(t, l, modeArgs(r2, name, class, core.Shared, 0, acquireOpts{}))
				writer := acquireAsync(t.Context(), l, modeArgs(w, name, class, core.Exclusive, 0, acquireOpts{forever: true}))
				reader := acquireAsync(t.Context(), l, modeArgs(r3, name, class, core.Shared, 0, acquireOpts{forever: true}))
				v, err := l.Describe(name)
				if err != nil || v.Mode != core.Shared || len(v.Holders) != 2 || v.Holders[0].Token != g1.Token || v.Holders[1].Token != g2.Token || v.Waiters != 2 || v.Token != g1.Token {
					t.Fatalf("Describe = %+v, %v; want two readers (%d, %d) and two waiters", v, err, g1.Token, g2.Token)
				}
				for _, tok := range []uint64{g1.Token, g2.Token} {
					if cur, _, err := l.CheckToken(t.Context(), name, tok); !cur || err != nil {
						t.Fatalf("CheckToken(%d) of a reader = %v, %v", tok, cur, err)
					}
				}
				if err := l.Release(context.Background(), r1, name, g1.Token); err != nil {
					t.Fatal(err)
				}
				noResult(t, writer, "writer while a reader holds")
				if err := l.Release(context.Background(), r2, name, g2.Token); err != nil {
					t.Fatal(err)
				}
				gw := result(t, writer, "writer")
				if gw.err != nil || gw.g.Token <= g2.Token {
					t.Fatalf("writer: %+v, %v", gw.g, gw.err)
				}
				noResult(t, reader, "reader behind the writer")
				if err := l.Release(context.Background(), w, name, gw.g.Token); err != nil {
					t.Fatal(err)
				}
				if gr := result(t, reader, "reader"); gr.err != nil || gr.g.Token <= gw.g.Token {
					t.Fatalf("reader: %+v, %v", gr.g, gr.err)
				}
			})
		})
	}
}

// TestSemaphoreThroughLeader: at most the limit hold; another limit or kind conflicts.
func TestSemaphoreThroughLeader(t *testing.T) {
	for _, class := range classes {
		t.Run(class.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l, _ := newLeader(t, leader.Config{})
				promote(t, l)
				const name = "pool"
				a, b, c := grant(t, l, time.Minute), grant(t, l, time.Minute), grant(t, l, time.Minute)
				ga := mustAcquire(t, l, modeArgs(a, name, class, core.Semaphore, 2, acquireOpts{}))
				mustAcquire(t, l, modeArgs(b, name, class, core.Semaphore, 2, acquireOpts{}))
				if _, err := l.Acquire(context.Background(), modeArgs(c, name, class, core.Semaphore, 2, acquireOpts{})); !errors.Is(err, core.ErrLockHeld) {
					t.Fatalf("third holder of a semaphore of 2: %v, want held", err)
				}
				for _, m := range []struct {
					mode  core.Mode
					limit uint32
				}{{core.Semaphore, 3}, {core.Exclusive, 0}, {core.Shared, 0}} {
					if _, err := l.Acquire(context.Background(), modeArgs(c, name, class, m.mode, m.limit, acquireOpts{})); !errors.Is(err, core.ErrModeConflict) {
						t.Fatalf("%v of %d on a semaphore of 2: %v, want ErrModeConflict", m.mode, m.limit, err)
					}
				}
				waiting := acquireAsync(t.Context(), l, modeArgs(c, name, class, core.Semaphore, 2, acquireOpts{waitFor: time.Minute}))
				if v, _ := l.Describe(name); v.Mode != core.Semaphore || v.Limit != 2 || len(v.Holders) != 2 || v.Waiters != 1 {
					t.Fatalf("Describe = %+v", v)
				}
				if err := l.Release(context.Background(), a, name, ga.Token); err != nil {
					t.Fatal(err)
				}
				if r := result(t, waiting, "third holder"); r.err != nil {
					t.Fatal(r.err)
				}
			})
		})
	}
}

// TestLockSetThroughLeader: a set is granted at once under one token, or waits for all
// of its names (woken once, by its first name), holding none; released by one Release;
// a set whose wait runs out leaves every queue, letting through what waited behind it.
func TestLockSetThroughLeader(t *testing.T) {
	for _, class := range classes {
		t.Run(class.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l, _ := newLeader(t, leader.Config{})
				promote(t, l)
				a, b, c := grant(t, l, time.Minute), grant(t, l, time.Minute), grant(t, l, time.Minute)
				gs := mustAcquire(t, l, setArgs(a, class, acquireOpts{}, "s/1", "s/2", "s/3"))
				for _, n := range []string{"s/1", "s/2", "s/3"} {
					if v, _ := l.Describe(n); v.Token != gs.Token {
						t.Fatalf("%s: %+v, want held under the set's token %d", n, v, gs.Token)
					}
				}
				set := acquireAsync(t.Context(), l, setArgs(b, class, acquireOpts{forever: true}, "s/3", "t/free"))
				single := acquireAsync(t.Context(), l, args(c, "t/free", class, acquireOpts{forever: true}))
				if v, _ := l.Describe("t/free"); v.Held || v.Waiters != 2 {
					t.Fatalf("t/free: %+v, want free with the set and one more waiting", v)
				}
				if err := l.Release(context.Background(), a, "s/2", gs.Token); err != nil {
					t.Fatal(err)
				}
				if v, _ := l.Describe("s/1"); v.Held {
					t.Fatalf("s/1 still held after the set's release: %+v", v)
				}
				got := result(t, set, "the waiting set")
				if got.err != nil || got.g.Token <= gs.Token {
					t.Fatalf("waiting set: %+v, %v", got.g, got.err)
				}
				noResult(t, single, "single acquire behind the set")
				if err := l.Release(context.Background(), b, "t/free", got.g.Token); err != nil {
					t.Fatal(err)
				}
				gc := result(t, single, "single acquire")
				if gc.err != nil {
					t.Fatal(gc.err)
				}

				// A set that times out leaves all its queues and lets the waiter behind it in.
				start := time.Now()
				timed := acquireAsync(t.Context(), l, setArgs(a, class, acquireOpts{waitFor: time.Second}, "t/free", "u/free"))
				behind := acquireAsync(t.Context(), l, args(b, "u/free", class, acquireOpts{forever: true}))
				noResult(t, behind, "behind a waiting set")
				sleepUntil(start, 1001*time.Millisecond)
				r := result(t, timed, "timed-out set")
				var lh *leader.LockHeldError
				if !errors.As(r.err, &lh) || !lh.Waited || lh.Name != "t/free" || lh.HolderToken != gc.g.Token {
					t.Fatalf("timed-out set: %v, want LockHeldError on t/free under %d", r.err, gc.g.Token)
				}
				if gb := result(t, behind, "the waiter behind the set"); gb.err != nil {
					t.Fatal(gb.err)
				}
				if n := queueLen(t, l, "t/free"); n != 0 {
					t.Fatalf("t/free: %d waiters left", n)
				}
			})
		})
	}
}

// TestLockSetClassConflict: a set is refused when any of its names is in use in the
// other class.
func TestLockSetClassConflict(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, _ := newLeader(t, leader.Config{})
		promote(t, l)
		a := grant(t, l, time.Minute)
		acquire(t, l, a, "eff/x", core.Efficiency, acquireOpts{})
		acquire(t, l, a, "corr/x", core.Correctness, acquireOpts{})
		if _, err := l.Acquire(context.Background(), setArgs(a, core.Correctness, acquireOpts{}, "a", "eff/x")); !errors.Is(err, core.ErrClassConflict) {
			t.Fatalf("correctness set over an efficiency lock: %v", err)
		}
		if _, err := l.Acquire(context.Background(), setArgs(a, core.Efficiency, acquireOpts{}, "a", "corr/x")); !errors.Is(err, core.ErrClassConflict) {
			t.Fatalf("efficiency set over a correctness lock: %v", err)
		}
		if _, ok := l.AcquireNow(setArgs(a, core.Efficiency, acquireOpts{forever: true}, "a", "corr/x")); ok {
			t.Fatal("AcquireNow granted an efficiency set over a correctness lock")
		}
	})
}

// TestAcquireNowKeepsFIFO: the fast lane's AcquireNow grants a reader alongside readers
// and a free set at once, but never a reader past a queued writer, nor a set whose name
// is held; refusing, it changes nothing.
func TestAcquireNowKeepsFIFO(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, _ := newLeader(t, leader.Config{ReserveBlock: 1000})
		promote(t, l)
		r1, w, r2 := grant(t, l, time.Minute), grant(t, l, time.Minute), grant(t, l, time.Minute)
		mustAcquire(t, l, modeArgs(r1, "rw", core.Efficiency, core.Shared, 0, acquireOpts{})) // reserves tokens
		if _, ok := l.AcquireNow(modeArgs(r2, "rw", core.Efficiency, core.Shared, 0, acquireOpts{forever: true})); !ok {
			t.Fatal("AcquireNow refused a reader beside a reader")
		}
		writer := acquireAsync(t.Context(), l, modeArgs(w, "rw", core.Efficiency, core.Exclusive, 0, acquireOpts{forever: true}))
		noResult(t, writer, "writer behind readers")
		late := grant(t, l, time.Minute)
		if g, ok := l.AcquireNow(modeArgs(late, "rw", core.Efficiency, core.Shared, 0, acquireOpts{forever: true})); ok {
			t.Fatalf("AcquireNow granted a reader past a queued writer: %+v", g)
		}
		if n := queueLen(t, l, "rw"); n != 1 {
			t.Fatalf("%d waiters after a refused AcquireNow, want the writer alone", n)
		}
		g, ok := l.AcquireNow(setArgs(late, core.Efficiency, acquireOpts{forever: true}, "f/1", "f/2"))
		if !ok {
			t.Fatal("AcquireNow refused a free set")
		}
		if _, ok := l.AcquireNow(setArgs(r1, core.Efficiency, acquireOpts{forever: true}, "f/2", "f/3")); ok {
			t.Fatal("AcquireNow granted a set with a held name")
		}
		if v, _ := l.Describe("f/3"); v.Held || v.Waiters != 0 {
			t.Fatalf("f/3 after a refused AcquireNow: %+v", v)
		}
		if err := l.Release(context.Background(), late, "f/1", g.Token); err != nil {
			t.Fatal(err)
		}
	})
}
