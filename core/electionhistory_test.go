package core

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"testing"
)

// changesOf returns election name's changes after after, failing the test on an error.
func (h *harness) changesOf(name string, after uint64) []ElectionChange {
	h.t.Helper()
	got, err := h.s.ElectionChanges(name, after, nil)
	if err != nil {
		h.t.Fatalf("ElectionChanges(%q, %d): %v", name, after, err)
	}
	return got
}

// wantChanges checks the kind, epoch, value and end of each change, and that the
// revisions strictly increase.
func wantChanges(t *testing.T, got []ElectionChange, want ...ElectionChange) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d changes %+v, want %d %+v", len(got), got, len(want), want)
	}
	for i, g := range got {
		w := want[i]
		if g.Kind != w.Kind || g.Epoch != w.Epoch || !bytes.Equal(g.Value, w.Value) || g.Ended != w.Ended || g.Name != w.Name {
			t.Fatalf("change %d = %+v, want %+v", i, g, w)
		}
		if i > 0 && g.Rev <= got[i-1].Rev {
			t.Fatalf("revision %d after %d", g.Rev, got[i-1].Rev)
		}
	}
}

// TestElectionHistory: every change of an election is recorded in order with a rising
// revision — elected, proclaimed (a Proclaim of the value it has is no change), elected
// after a resignation, nobody after the leader's lease expired — with how each
// leadership ended and the proposer's wall time; a resume point returns what follows
// it, and one not reached yet returns nothing.
func TestElectionHistory(t *testing.T) {
	h := newHarness(t, Limits{}, leaseA, leaseB)
	if h.s.ElectionRev() != 0 || len(h.changesOf("svc", 0)) != 0 {
		t.Fatal("a new state has election history")
	}
	h.ok(Command{Op: OpAcquire, Lease: leaseA, Name: "lock", Class: Correctness}) // a token, so that revisions follow the sequence
	e1 := h.ok(Command{Op: OpCampaign, Lease: leaseA, Name: "svc", Value: []byte("a"), Wait: true, WallMillis: 1000}).Token
	r := h.ok(Command{Op: OpProclaim, Lease: leaseA, Name: "svc", Token: e1, Value: []byte("a2"), WallMillis: 2000})
	wantEffects(t, r.Effects, Effect{Kind: EffectProclaimed, Lease: leaseA, Name: "svc", Token: e1, Value: []byte("a2")})
	if r := h.ok(Command{Op: OpProclaim, Lease: leaseA, Name: "svc", Token: e1, Value: []byte("a2")}); len(r.Effects) != 0 {
		t.Fatalf("a Proclaim of the same value: effects %+v", r.Effects)
	}
	h.ok(Command{Op: OpCampaign, Lease: leaseB, Name: "svc", Value: []byte("b"), Wait: true})
	h.ok(Command{Op: OpResign, Lease: leaseA, Name: "svc", Token: e1})
	e2 := h.s.LastToken()
	h.ok(Command{Op: OpExpire, Lease: leaseB, WallMillis: 3000})

	all := h.changesOf("svc", 0)
	wantChanges(t, all,
		ElectionChange{Name: "svc", Kind: ChangeElected, Epoch: e1, Value: []byte("a")},
		ElectionChange{Name: "svc", Kind: ChangeProclaimed, Epoch: e1, Value: []byte("a2")},
		ElectionChange{Name: "svc", Kind: ChangeElected, Epoch: e2, Value: []byte("b"), Ended: EventReleased},
		ElectionChange{Name: "svc", Kind: ChangeLeaderless, Epoch: e2, Ended: EventExpired})
	if all[0].Rev < e1 || all[2].Rev < e2 {
		t.Fatalf("revisions %d, %d below the epochs %d, %d", all[0].Rev, all[2].Rev, e1, e2)
	}
	if all[0].WallMillis != 1000 || all[1].WallMillis != 2000 || all[3].WallMillis != 3000 {
		t.Fatalf("wall times %+v", all)
	}
	if h.s.ElectionRev() != all[3].Rev {
		t.Fatalf("ElectionRev %d, want the last change's %d", h.s.ElectionRev(), all[3].Rev)
	}
	wantChanges(t, h.changesOf("svc", all[1].Rev), all[2:]...)
	if got := h.changesOf("svc", all[3].Rev+100); len(got) != 0 {
		t.Fatalf("after a point not reached: %+v", got)
	}
	if got := h.changesOf("other", 0); len(got) != 0 {
		t.Fatalf("another election's changes: %+v", got)
	}
	h.ok(Command{Op: OpRevoke, Lease: leaseA})
	if got := h.changesOf("svc", all[3].Rev); len(got) != 0 {
		t.Fatalf("a lease that led no election any more made changes: %+v", got)
	}
}

// TestElectionHistoryBounds: the history keeps ElectionHistory changes per election
// and ElectionHistoryTotal in all, dropping the oldest; a resume point below what is
// held fails with a *HistoryCompactedError naming the oldest point held, and one at
// that point succeeds with every change after it.
func TestElectionHistoryBounds(t *testing.T) {
	h := newHarness(t, Limits{ElectionHistory: 3, ElectionHistoryTotal: 5}, leaseA, leaseB)
	ea := h.ok(Command{Op: OpCampaign, Lease: leaseA, Name: "a", Value: []byte("0")}).Token
	for i := 1; i <= 3; i++ {
		h.ok(Command{Op: OpProclaim, Lease: leaseA, Name: "a", Token: ea, Value: []byte{'0' + byte(i)}})
	}
	a := h.changesOf("a", h.s.history.oldest("a"))
	if len(a) != 3 || string(a[0].Value) != "1" {
		t.Fatalf("election a holds %+v, want its last 3 changes", a)
	}
	compacted := func(name string, after, oldest uint64) {
		t.Helper()
		_, err := h.s.ElectionChanges(name, after, nil)
		var ce *HistoryCompactedError
		if !errors.As(err, &ce) || !errors.Is(err, ErrHistoryCompacted) || ce.Oldest != oldest || ce.After != after || ce.Name != name {
			t.Fatalf("ElectionChanges(%q, %d) = %v, want compacted with the oldest %d", name, after, err, oldest)
		}
	}
	compacted("a", 0, a[0].Rev-1)
	compacted("a", a[0].Rev-2, a[0].Rev-1)
	wantChanges(t, h.changesOf("a", a[0].Rev-1), a...)

	eb := h.ok(Command{Op: OpCampaign, Lease: leaseB, Name: "b", Value: []byte("0")}).Token
	b1 := h.changesOf("b", 0)
	h.ok(Command{Op: OpProclaim, Lease: leaseB, Name: "b", Token: eb, Value: []byte("1")})
	// 5 held: a's 3, b's 2. One more drops the oldest of all (a's first).
	h.ok(Command{Op: OpProclaim, Lease: leaseB, Name: "b", Token: eb, Value: []byte("2")})
	if h.s.history.changes.live != 5 || h.s.history.floor != a[0].Rev {
		t.Fatalf("live %d floor %d, want 5 and %d", h.s.history.changes.live, h.s.history.floor, a[0].Rev)
	}
	wantChanges(t, h.changesOf("a", a[0].Rev), a[1:]...)
	compacted("a", a[0].Rev-1, a[0].Rev)
	// The totals' floor applies to every election: a resume point below it may have
	// lost any election's changes, even one with none held.
	compacted("c", 0, a[0].Rev)
	if got := h.changesOf("c", a[0].Rev); len(got) != 0 {
		t.Fatalf("an election never held: %+v", got)
	}
	// A full election may have dropped changes before its oldest, none after.
	compacted("b", 0, b1[0].Rev-1)
	if got := h.changesOf("b", b1[0].Rev-1); len(got) != 3 || got[0].Rev != b1[0].Rev {
		t.Fatalf("b from its oldest: %+v", got)
	}
}

// TestElectionHistoryQuietAndBusy: a busy election's dropped changes do not pile up
// behind a quiet election's old change (which the totals never reach).
func TestElectionHistoryQuietAndBusy(t *testing.T) {
	h := newHarness(t, Limits{ElectionHistory: 4}, leaseA, leaseB)
	h.ok(Command{Op: OpCampaign, Lease: leaseA, Name: "quiet"})
	e := h.ok(Command{Op: OpCampaign, Lease: leaseB, Name: "busy"}).Token
	for i := range 2000 {
		h.ok(Command{Op: OpProclaim, Lease: leaseB, Name: "busy", Token: e, Value: []byte(fmt.Sprint(i))})
		if err := checkHistory(&h.s.history); err != nil {
			t.Fatalf("after %d proclaims: %v", i+1, err)
		}
	}
	if n := len(h.s.history.changes.order) - h.s.history.changes.head; n > 100 || len(h.changesOf("quiet", 0)) != 1 {
		t.Fatalf("order holds %d changes for 5 live", n)
	}
}

// TestElectionHistoryBytes: ElectionHistoryBytes bounds the size of the changes held;
// the newest change is always kept.
func TestElectionHistoryBytes(t *testing.T) {
	h := newHarness(t, Limits{ElectionHistoryBytes: 1}, leaseA)
	big := bytes.Repeat([]byte("v"), MaxValueLen)
	e := h.ok(Command{Op: OpCampaign, Lease: leaseA, Name: "a", Value: big}).Token
	h.ok(Command{Op: OpProclaim, Lease: leaseA, Name: "a", Token: e, Value: []byte("small")})
	got := h.changesOf("a", h.s.history.floor)
	if len(got) != 1 || string(got[0].Value) != "small" || h.s.history.changes.size != got[0].logSize() {
		t.Fatalf("held %d changes (%d bytes), want the newest alone", len(got), h.s.history.changes.size)
	}
	big[0] = 'w'
	h.ok(Command{Op: OpProclaim, Lease: leaseA, Name: "a", Token: e, Value: big})
	if got := h.changesOf("a", h.s.history.floor); len(got) != 1 || !bytes.Equal(got[0].Value, big) {
		t.Fatal("the newest change, of the largest value, was not kept")
	}
}

// TestElectionHistorySnapshot: the history — its changes, revision and floor — goes
// through a snapshot byte for byte, and a restored state answers resume points as
// the original did and goes on with higher revisions.
func TestElectionHistorySnapshot(t *testing.T) {
	h := newHarness(t, Limits{ElectionHistory: 2, ElectionHistoryTotal: 3}, leaseA, leaseB)
	e := h.ok(Command{Op: OpCampaign, Lease: leaseA, Name: "a", Value: []byte("0"), Holder: Holder{Host: "h", PID: 7, Note: "n"}, WallMillis: 5}).Token
	for i := range 4 {
		h.ok(Command{Op: OpProclaim, Lease: leaseA, Name: "a", Token: e, Value: []byte{'1' + byte(i)}})
	}
	h.ok(Command{Op: OpCampaign, Lease: leaseB, Name: "b"})
	h.ok(Command{Op: OpCampaign, Lease: leaseB, Name: "c"})
	b := mustSnapshot(t, h.s)
	restored, err := RestoreState(b, Limits{ElectionHistory: 2, ElectionHistoryTotal: 3})
	if err != nil {
		t.Fatal(err)
	}
	if b2 := mustSnapshot(t, restored); !bytes.Equal(b, b2) {
		t.Fatalf("snapshot after restore differs:\n%s\n%s", b, b2)
	}
	for _, name := range []string{"a", "b", "c"} {
		for after := range h.s.ElectionRev() + 2 {
			w, werr := h.s.ElectionChanges(name, after, nil)
			g, gerr := restored.ElectionChanges(name, after, nil)
			if fmt.Sprint(werr) != fmt.Sprint(gerr) || fmt.Sprint(w) != fmt.Sprint(g) {
				t.Fatalf("%s after %d: restored %v %v, original %v %v", name, after, g, gerr, w, werr)
			}
		}
	}
	last := restored.ElectionRev()
	if r := restored.Apply(Command{Op: OpResign, Lease: leaseB, Name: "b", Token: h.s.Elections().Get("b").Leader.Epoch}); r.Err != nil {
		t.Fatal(r.Err)
	}
	if restored.ElectionRev() <= last {
		t.Fatalf("revision %d after restore, not above %d", restored.ElectionRev(), last)
	}

	for _, bad := range []string{
		`"electionRev":1,"electionFloor":2`,
		`"electionRev":1,"electionHistory":[{"rev":2,"name":"a","kind":1,"epoch":1}]`,
		`"electionRev":2,"electionHistory":[{"rev":2,"name":"a","kind":9,"epoch":1}]`,
		`"electionRev":2,"electionHistory":[{"rev":2,"name":"a","kind":1,"epoch":99}]`,
		`"electionRev":2,"electionHistory":[{"rev":2,"name":"a","kind":1,"epoch":1},{"rev":2,"name":"a","kind":2,"epoch":1}]`,
		`"electionRev":2,"electionFloor":2,"electionHistory":[{"rev":2,"name":"a","kind":1,"epoch":1}]`,
		`"electionRev":2,"electionHistory":[{"rev":2,"name":"a","kind":3,"epoch":1,"ended":5}]`,
	} {
		snap := append([]byte{snapshotV2}, `{"seq":1,"leases":[],"locks":[],"tombstones":null,`+bad+"}\n"...)
		if _, err := RestoreState(snap, Limits{}); !errors.Is(err, ErrCorrupt) {
			t.Errorf("snapshot with %s: %v, want ErrCorrupt", bad, err)
		}
	}
}

// TestElectionHistoryOldSnapshot: a snapshot written by main before the history (an
// election with a leader, a candidate and a proclaimed value) still decodes, with an
// empty history at revision 0, and the next change starts it.
func TestElectionHistoryOldSnapshot(t *testing.T) {
	b, err := os.ReadFile("testdata/snapshot-v2-elections-before-history.bin")
	if err != nil {
		t.Fatal(err)
	}
	s, err := RestoreState(b, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if ld := s.Elections().Get("svc").Leader; ld == nil || string(ld.Value) != "a2" {
		t.Fatalf("restored election %+v", s.Elections().Get("svc"))
	}
	if got, err := s.ElectionChanges("svc", 0, nil); err != nil || len(got) != 0 || s.ElectionRev() != 0 {
		t.Fatalf("history of an old snapshot: %+v %v rev %d", got, err, s.ElectionRev())
	}
	ld := s.Elections().Get("svc").Leader
	if r := s.Apply(Command{Op: OpResign, Lease: ld.Lease, Name: "svc", Token: ld.Epoch}); r.Err != nil {
		t.Fatal(r.Err)
	}
	got, err := s.ElectionChanges("svc", 0, nil)
	if err != nil || len(got) != 1 || got[0].Kind != ChangeElected || string(got[0].Value) != "b" || got[0].Ended != EventReleased {
		t.Fatalf("after the resign: %+v %v", got, err)
	}
}

// TestElectionHistoryProperty runs random election commands on a few names with small
// bounds. An observer of each election that reads after its last revision from time
// to time sees every change once, in order, or is told it is compacted; from a
// replay from the start of what is held (when not compacted) it rebuilds who leads
// each election now; and a snapshot restores the history byte for byte.
func TestElectionHistoryProperty(t *testing.T) {
	names := []string{"x", "y", "z"}
	leases := []LeaseID{leaseA, leaseB, leaseC, leaseD}
	for seed := range uint64(50) {
		rng := rand.New(rand.NewPCG(seed, 7))
		limits := Limits{ElectionHistory: 2 + rng.IntN(6), ElectionHistoryTotal: 4 + rng.IntN(12)}
		h := newHarness(t, limits, leases...)
		type obs struct {
			after uint64
			seen  []ElectionChange
			lost  bool
		}
		observers := map[string]*obs{}
		var recorded []ElectionChange // every change, from the notes, in order
		for _, n := range names {
			observers[n] = &obs{}
		}
		for step := range 400 {
			l := leases[rng.IntN(len(leases))]
			n := names[rng.IntN(len(names))]
			before := h.s.ElectionRev()
			var c Command
			switch k := rng.IntN(10); {
			case k < 3:
				c = Command{Op: OpCampaign, Lease: l, Name: n, Value: []byte{byte('a' + rng.IntN(3))}, Wait: rng.IntN(2) == 0}
			case k < 5:
				e := h.s.Elections().Get(n)
				if e == nil || e.Leader == nil {
					continue
				}
				c = Command{Op: OpProclaim, Lease: e.Leader.Lease, Name: n, Token: e.Leader.Epoch, Value: []byte{byte('a' + rng.IntN(3))}}
			case k < 7:
				e := h.s.Elections().Get(n)
				if e == nil || e.Leader == nil {
					continue
				}
				c = Command{Op: OpResign, Lease: e.Leader.Lease, Name: n, Token: e.Leader.Epoch}
			case k < 8:
				c = Command{Op: OpWithdraw, Lease: l, Name: n}
			default:
				if h.s.Lease(l) == nil {
					c = Command{Op: OpGrant, Lease: l, TTLMillis: 1000}
				} else {
					c = []Command{{Op: OpExpire, Lease: l}, {Op: OpRevoke, Lease: l}, {Op: OpDisconnect, Lease: l}}[rng.IntN(3)]
				}
			}
			if r := h.s.Apply(c); r.Err == nil {
				if err := checkState(h.s); err != nil {
					t.Fatalf("seed %d step %d: %v", seed, step, err)
				}
			}
			if err := checkHistory(&h.s.history); err != nil {
				t.Fatalf("seed %d step %d: %v", seed, step, err)
			}
			for _, c := range h.s.history.records() {
				if c.Rev > before {
					recorded = append(recorded, c)
				}
			}
			if rng.IntN(4) > 0 {
				continue
			}
			for _, n := range names { // the observers catch up
				o := observers[n]
				if o.lost {
					continue
				}
				got, err := h.s.ElectionChanges(n, o.after, nil)
				if errors.Is(err, ErrHistoryCompacted) {
					o.lost = true
					continue
				} else if err != nil {
					t.Fatal(err)
				}
				o.seen = append(o.seen, got...)
				if len(got) > 0 {
					o.after = got[len(got)-1].Rev
				}
			}
		}
		for _, n := range names {
			o := observers[n]
			var want []ElectionChange
			for _, c := range recorded {
				if c.Name == n && c.Rev <= o.after {
					want = append(want, c)
				}
			}
			if !o.lost && fmt.Sprint(o.seen) != fmt.Sprint(want) {
				t.Fatalf("seed %d: observer of %s saw %+v, want %+v", seed, n, o.seen, want)
			}
			// Rebuild who leads n from the oldest point held, when the replay starts at
			// a leadership's beginning or at nobody leading.
			held, err := h.s.ElectionChanges(n, h.s.history.oldest(n), nil)
			if err != nil {
				t.Fatal(err)
			}
			e := h.s.Elections().Get(n)
			if len(held) == 0 {
				continue
			}
			last := held[len(held)-1]
			switch {
			case e == nil || e.Leader == nil:
				if last.Kind != ChangeLeaderless {
					t.Fatalf("seed %d: nobody leads %s, the last change is %+v", seed, n, last)
				}
			case last.Kind == ChangeLeaderless || last.Epoch != e.Leader.Epoch || !bytes.Equal(last.Value, e.Leader.Value):
				t.Fatalf("seed %d: %s led by %+v, the last change is %+v", seed, n, e.Leader, last)
			}
		}
		b := mustSnapshot(t, h.s)
		restored, err := RestoreState(b, limits)
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		if b2 := mustSnapshot(t, restored); !bytes.Equal(b, b2) {
			t.Fatalf("seed %d: snapshot after restore differs", seed)
		}
	}
}

// checkHistory checks the history's invariants: its log's (checkLog), revisions rise
// in its order above the floor, and the revision is at least the last held.
func checkHistory(h *history) error {
	if err := checkLog(&h.changes); err != nil {
		return err
	}
	prev := h.floor
	for _, c := range h.records() {
		if c.Rev <= prev {
			return fmt.Errorf("revision %d after %d (floor %d)", c.Rev, prev, h.floor)
		}
		prev = c.Rev
	}
	if prev > h.rev {
		return fmt.Errorf("revision %d, the last held %d", h.rev, prev)
	}
	return nil
}

// TestElectionChangeBytes measures the memory of a held change (for OPERATIONS.md):
// 10,000 changes (the default total) of 1,000 elections, each with a 16-byte name, a
// 20-byte value and a holder description.
func TestElectionChangeBytes(t *testing.T) {
	const elections, per = 1000, 10
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	h := newHistory(Limits{}.withDefaults())
	rev := uint64(0)
	for i := range per {
		for e := range elections {
			rev++
			h.add(ElectionChange{Rev: rev, Name: fmt.Sprintf("svc/%012d", e), Kind: ChangeProclaimed, Epoch: uint64(e + 1),
				Value: fmt.Appendf(nil, "10.0.%d.%d:8080", i, e%250), Holder: Holder{Host: fmt.Sprintf("worker-%d.example", e%100), PID: 4242}})
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	n := elections * per
	got := float64(after.HeapAlloc-before.HeapAlloc) / float64(n)
	t.Logf("%.0f bytes per held election change (%d changes: %.1f MB); the byte bound counts %d for each", got, n, got*float64(n)/1e6, (&ElectionChange{Name: "svc/000000000000", Value: []byte("10.0.0.0:8080"), Holder: Holder{Host: "worker-0.example"}}).logSize())
	runtime.KeepAlive(&h)
}
