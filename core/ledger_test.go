package core

import (
	"bytes"
	"fmt"
	"runtime"
	"testing"
)

// TestLedgerEndReasons: each way a hold ends leaves a tenure with its holder, token,
// mode, the proposers' times and how it ended (a force release with its note), in log
// order; holds still open come last; a snapshot restores the same history.
func TestLedgerEndReasons(t *testing.T) {
	s := NewState(Limits{})
	at := int64(1_000)
	apply := func(c Command) Result {
		t.Helper()
		at += 10
		c.WallMillis = at
		r := s.Apply(c)
		if r.Err != nil {
			t.Fatalf("%+v: %v", c, r.Err)
		}
		return r
	}
	for _, id := range []LeaseID{leaseA, leaseB, leaseC} {
		apply(Command{Op: OpGrant, Lease: id, TTLMillis: 1000})
	}
	h := Holder{Host: "h", PID: 7}
	acquire := func(id LeaseID) uint64 {
		return apply(Command{Op: OpAcquire, Lease: id, Name: "x", Class: Correctness, Holder: h}).Token
	}
	t1 := acquire(leaseA)
	apply(Command{Op: OpRelease, Lease: leaseA, Name: "x", Token: t1}) // released
	t2 := acquire(leaseA)
	apply(Command{Op: OpForceRelease, Name: "x", Reason: "by admin ops: stuck"}) // force-released
	t3 := acquire(leaseB)
	apply(Command{Op: OpExpire, Lease: leaseB}) // expired
	t4 := acquire(leaseC)
	apply(Command{Op: OpRevoke, Lease: leaseC}) // revoked
	apply(Command{Op: OpGrant, Lease: leaseB, TTLMillis: 1000})
	t5 := acquire(leaseB) // still held
	want := []struct {
		token uint64
		end   EventKind
		note  string
	}{{t1, EventReleased, ""}, {t2, EventForceReleased, "by admin ops: stuck"}, {t3, EventExpired, ""}, {t4, EventRevoked, ""}, {t5, 0, ""}}
	check := func(what string, s *State) {
		t.Helper()
		got := s.History("x")
		if len(got) != len(want) {
			t.Fatalf("%s: history %+v", what, got)
		}
		for i, w := range want {
			g := got[i]
			if g.Token != w.token || g.End != w.end || g.Note != w.note || g.Holder != h || g.StartMillis == 0 ||
				(w.end != 0) != (g.EndMillis > g.StartMillis) {
				t.Fatalf("%s: tenure %d = %+v, want token %d ended %v %q with its times", what, i, g, w.token, w.end, w.note)
			}
		}
	}
	check("live", s)
	b := mustSnapshotErr(s)
	r, err := RestoreState(b, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	check("restored", r)
	if !bytes.Equal(mustSnapshotErr(r), b) {
		t.Fatal("snapshot → restore → snapshot changed the bytes")
	}
}

// TestLedgerLockSetStarts: the names of a lock set share one token, and the ledger one
// start for it: every name's open hold shows the start, before and after a restore
// (whose snapshot is byte-identical), and every name's tenure keeps it once the set is
// released, not only the first name to end.
func TestLedgerLockSetStarts(t *testing.T) {
	s := NewState(Limits{})
	if r := s.Apply(Command{Op: OpGrant, Lease: leaseA, TTLMillis: 1000}); r.Err != nil {
		t.Fatal(r.Err)
	}
	names := []string{"set/a", "set/b", "set/c"}
	r := s.Apply(Command{Op: OpAcquire, Lease: leaseA, Names: names, Class: Correctness, WallMillis: 5_000})
	if r.Err != nil || r.Queued {
		t.Fatalf("acquire of the set: %+v", r)
	}
	check := func(what string, s *State, end EventKind) {
		t.Helper()
		for _, n := range names {
			h := s.History(n)
			if len(h) != 1 || h[0].Token != r.Token || h[0].StartMillis != 5_000 || h[0].End != end {
				t.Fatalf("%s: history of %s = %+v, want token %d from 5000 ended %v", what, n, h, r.Token, end)
			}
		}
	}
	check("held", s, 0)
	b := mustSnapshotErr(s)
	restored, err := RestoreState(b, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	check("held, restored", restored, 0)
	if !bytes.Equal(mustSnapshotErr(restored), b) {
		t.Fatal("snapshot → restore → snapshot changed the bytes")
	}
	for _, st := range []*State{s, restored} {
		if r := st.Apply(Command{Op: OpRelease, Lease: leaseA, Name: "set/b", Token: r.Token, WallMillis: 6_000}); r.Err != nil {
			t.Fatal(r.Err)
		}
		check("released", st, EventReleased)
		if len(st.ledger.open) != 0 {
			t.Fatalf("open starts after the release: %v", st.ledger.open)
		}
	}
}

// TestLedgerBounds: the ledger keeps a lock's last LedgerPerLock tenures and
// LedgerTotal in all, dropping the oldest, alike before and after a restore.
func TestLedgerBounds(t *testing.T) {
	limits := Limits{LedgerPerLock: 3, LedgerTotal: 5}
	s := NewState(limits)
	s.Apply(Command{Op: OpGrant, Lease: leaseA, TTLMillis: 1000})
	cycle := func(s *State, name string) {
		r := s.Apply(Command{Op: OpAcquire, Lease: leaseA, Name: name, Class: Correctness, WallMillis: 5})
		s.Apply(Command{Op: OpRelease, Lease: leaseA, Name: name, Token: r.Token, WallMillis: 6})
	}
	for range 5 {
		cycle(s, "a")
	}
	if got := s.History("a"); len(got) != 3 {
		t.Fatalf("%d tenures of a, want the last 3", len(got))
	}
	for range 3 {
		cycle(s, "b")
	}
	// 6 kept would exceed 5: a's oldest goes.
	if a, b := len(s.History("a")), len(s.History("b")); a != 2 || b != 3 {
		t.Fatalf("a has %d, b %d; want 2 and 3", a, b)
	}
	r, err := RestoreState(mustSnapshotErr(s), limits)
	if err != nil {
		t.Fatal(err)
	}
	cycle(s, "c")
	cycle(r, "c")
	if !bytes.Equal(mustSnapshotErr(s), mustSnapshotErr(r)) {
		t.Fatal("a restored ledger drops other tenures than the original")
	}
	if a := len(s.History("a")); a != 1 {
		t.Fatalf("a has %d after c's tenure, want 1", a)
	}
}

// TestLedgerQuietAndBusy: a quiet lock's one tenure, far from the total bound, does not
// keep a busy lock's dropped tenures in memory: the ledger's order stays near the
// tenures it keeps, and both locks keep what they should, through a snapshot too.
func TestLedgerQuietAndBusy(t *testing.T) {
	limits := Limits{LedgerPerLock: 4, LedgerTotal: 1000}
	s := NewState(limits)
	s.Apply(Command{Op: OpGrant, Lease: leaseA, TTLMillis: 1000})
	cycle := func(name string, at int64) {
		r := s.Apply(Command{Op: OpAcquire, Lease: leaseA, Name: name, Class: Correctness, WallMillis: at})
		s.Apply(Command{Op: OpRelease, Lease: leaseA, Name: name, Token: r.Token, WallMillis: at + 1})
	}
	cycle("quiet", 10)
	for i := range 10_000 {
		cycle("busy", int64(100+2*i))
	}
	if n := len(s.ledger.ended.order) - s.ledger.ended.head; n > 1+4+squeezeAfter+1 {
		t.Fatalf("the order holds %d records for 5 tenures kept: the busy lock's dropped ones pile up behind the quiet one", n)
	}
	if q, b := len(s.History("quiet")), len(s.History("busy")); q != 1 || b != 4 {
		t.Fatalf("quiet has %d tenures, busy %d; want 1 and 4", q, b)
	}
	r, err := RestoreState(mustSnapshotErr(s), limits)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(mustSnapshotErr(s), mustSnapshotErr(r)) {
		t.Fatal("a restored ledger differs from the original")
	}
}

// TestLedgerEntryBytes measures what one ledger entry costs (docs/OPERATIONS.md): a full
// ledger of released tenures of 16-byte names with a holder description.
func TestLedgerEntryBytes(t *testing.T) {
	const n = 100_000
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	g := NewLedger(Limits{}.withDefaults())
	for i := range n {
		name := fmt.Sprintf("orders/%09d", i)
		g.Note(Event{Kind: EventAcquired, Name: name, Token: uint64(i + 1)}, 1)
		g.Note(Event{Kind: EventReleased, Name: name, Token: uint64(i + 1), Holder: Holder{Host: fmt.Sprintf("worker-%d.example", i%100), PID: 4242}}, 2)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	per := float64(after.HeapAlloc-before.HeapAlloc) / n
	t.Logf("%.0f bytes per ledger entry (%d entries, one lock each: %.1f MB)", per, n, per*n/1e6)
	runtime.KeepAlive(&g)
}
