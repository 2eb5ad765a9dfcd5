package core

import (
	"bytes"
	"errors"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// Table tests of lock modes (shared, semaphore) and lock sets, on the replicated State.
// The random tests are in modes_property_test.go.

var leaseE = lid(0xE)

func acqMode(lease LeaseID, name string, mode Mode, limit uint32, wait bool) Command {
	return Command{Op: OpAcquire, Lease: lease, Name: name, Class: Correctness, Mode: mode, Limit: limit, Wait: wait}
}

func acqSet(lease LeaseID, wait bool, names ...string) Command {
	return Command{Op: OpAcquire, Lease: lease, Names: names, Class: Correctness, Wait: wait}
}

func rel(lease LeaseID, name string, token uint64) Command {
	return Command{Op: OpRelease, Lease: lease, Name: name, Token: token}
}

// holders returns the leases holding name in any mode, oldest first.
func (h *harness) holders(name string) []LeaseID {
	var out []LeaseID
	if l := h.lock(name); l != nil {
		if l.Hold != nil {
			out = append(out, l.Hold.Lease)
		}
		for _, x := range l.Holds {
			out = append(out, x.Lease)
		}
	}
	return out
}

func (h *harness) wantHolders(name string, want ...LeaseID) {
	h.t.Helper()
	if got := h.holders(name); !slices.Equal(got, want) {
		h.t.Fatalf("%s held by %v, want %v", name, got, want)
	}
}

func (h *harness) wantWaiters(name string, want ...LeaseID) {
	h.t.Helper()
	if got := h.waiters(name); !slices.Equal(got, want) {
		h.t.Fatalf("%s waited for by %v, want %v", name, got, want)
	}
}

func TestSharedReadersHoldTogether(t *testing.T) {
	h := newHarness(t, Limits{}, leaseA, leaseB, leaseC)
	ra := h.ok(acqMode(leaseA, "x", Shared, 0, false))
	rb := h.ok(acqMode(leaseB, "x", Shared, 0, false))
	if ra.Token == 0 || rb.Token <= ra.Token {
		t.Fatalf("reader tokens %d, %d: each reader gets its own, rising", ra.Token, rb.Token)
	}
	h.wantHolders("x", leaseA, leaseB)
	if l := h.lock("x"); l.Mode() != Shared || l.Hold != nil || len(l.Holds) != 2 {
		t.Fatalf("lock %+v", l)
	}
	// A writer does not get in while readers hold it.
	r := h.fails(acqMode(leaseC, "x", Exclusive, 0, false), ErrLockHeld)
	if r.HolderToken != ra.Token {
		t.Fatalf("held error names token %d, want the oldest reader's %d", r.HolderToken, ra.Token)
	}
	// Repeating an acquire returns the same grant.
	if again := h.unchanged(acqMode(leaseA, "x", Shared, 0, false)); again.Token != ra.Token {
		t.Fatalf("repeated shared acquire got token %d, want %d", again.Token, ra.Token)
	}
	// Release by a reader leaves the other.
	h.ok(rel(leaseA, "x", ra.Token))
	h.wantHolders("x", leaseB)
	h.fails(rel(leaseA, "x", ra.Token), ErrNotHolder)
	h.fails(rel(leaseB, "x", ra.Token), ErrNotHolder)
	h.ok(rel(leaseB, "x", rb.Token))
	if h.lock("x") != nil {
		t.Fatal("a lock nobody holds stays in the table")
	}
}

// TestSharedWriterIsNotStarved: a writer queued behind readers blocks the readers that
// come after it, is granted when the readers before it are done, and the readers behind
// it are then granted together when it releases.
func TestSharedWriterIsNotStarved(t *testing.T) {
	h := newHarness(t, Limits{}, leaseA, leaseB, leaseC, leaseD, leaseE)
	ra := h.ok(acqMode(leaseA, "x", Shared, 0, false))
	if r := h.ok(acqMode(leaseB, "x", Exclusive, 0, true)); !r.Queued {
		t.Fatalf("writer not queued: %+v", r)
	}
	// A later reader waits behind the writer, even though only readers hold the lock.
	h.fails(acqMode(leaseC, "x", Shared, 0, false), ErrLockHeld)
	h.ok(acqMode(leaseC, "x", Shared, 0, true))
	h.ok(acqMode(leaseD, "x", Shared, 0, true))
	h.ok(acqMode(leaseE, "x", Exclusive, 0, true))
	h.wantWaiters("x", leaseB, leaseC, leaseD, leaseE)
	r := h.ok(rel(leaseA, "x", ra.Token))
	wantEffects(t, r.Effects, Effect{Kind: EffectGranted, Lease: leaseB, Name: "x", Token: ra.Token + 1})
	h.wantHolders("x", leaseB)
	// The writer's release lets both readers in, in order, and stops at the next writer.
	r = h.ok(rel(leaseB, "x", ra.Token+1))
	wantEffects(t, r.Effects,
		Effect{Kind: EffectGranted, Lease: leaseC, Name: "x", Token: ra.Token + 2},
		Effect{Kind: EffectGranted, Lease: leaseD, Name: "x", Token: ra.Token + 3})
	h.wantHolders("x", leaseC, leaseD)
	h.wantWaiters("x", leaseE)
}

// TestSharedCancelLetsReadersThrough: when the writer that blocked readers gives up its
// place, the readers behind it join the readers holding the lock at once.
func TestSharedCancelLetsReadersThrough(t *testing.T) {
	h := newHarness(t, Limits{}, leaseA, leaseB, leaseC)
	h.ok(acqMode(leaseA, "x", Shared, 0, false))
	h.ok(acqMode(leaseB, "x", Exclusive, 0, true))
	h.ok(acqMode(leaseC, "x", Shared, 0, true))
	last := h.s.LastToken()
	r := h.ok(Command{Op: OpCancelWait, Lease: leaseB, Name: "x"})
	wantEffects(t, r.Effects, Effect{Kind: EffectGranted, Lease: leaseC, Name: "x", Token: last + 1})
	h.wantHolders("x", leaseA, leaseC)
	// The same when the writer's lease ends.
	h.ok(acqMode(leaseB, "x", Exclusive, 0, true))
	h.ok(Command{Op: OpRevoke, Lease: leaseC})
	h.ok(Command{Op: OpGrant, Lease: leaseD, TTLMillis: 1000})
	h.ok(acqMode(leaseD, "x", Shared, 0, true))
	last = h.s.LastToken()
	r = h.ok(Command{Op: OpExpire, Lease: leaseB})
	wantEffects(t, r.Effects,
		Effect{Kind: EffectWaitEnded, Lease: leaseB, Name: "x"},
		Effect{Kind: EffectGranted, Lease: leaseD, Name: "x", Token: last + 1},
		Effect{Kind: EffectLeaseEnded, Lease: leaseB, Reason: EndExpired})
}

func TestSemaphore(t *testing.T) {
	h := newHarness(t, Limits{}, leaseA, leaseB, leaseC, leaseD)
	sem := func(lease LeaseID, wait bool) Command { return acqMode(lease, "pool", Semaphore, 2, wait) }
	ta := h.ok(sem(leaseA, false)).Token
	tb := h.ok(sem(leaseB, false)).Token
	h.wantHolders("pool", leaseA, leaseB)
	if l := h.lock("pool"); l.Mode() != Semaphore || l.Limit != 2 {
		t.Fatalf("lock %+v", l)
	}
	h.fails(sem(leaseC, false), ErrLockHeld)
	h.ok(sem(leaseC, true))
	h.ok(sem(leaseD, true))
	r := h.ok(rel(leaseA, "pool", ta))
	wantEffects(t, r.Effects, Effect{Kind: EffectGranted, Lease: leaseC, Name: "pool", Token: h.s.LastToken()})
	h.wantHolders("pool", leaseB, leaseC)
	h.wantWaiters("pool", leaseD)
	// Another limit, or another kind, is a mode conflict while the name is in use.
	h.fails(acqMode(leaseA, "pool", Semaphore, 3, true), ErrModeConflict)
	h.fails(acqMode(leaseA, "pool", Exclusive, 0, true), ErrModeConflict)
	h.fails(acqMode(leaseA, "pool", Shared, 0, true), ErrModeConflict)
	h.ok(acq(leaseA, "rw"))
	h.fails(acqMode(leaseB, "rw", Semaphore, 1, true), ErrModeConflict)
	// A semaphore's holders release in any order.
	h.ok(rel(leaseB, "pool", tb))
	h.wantHolders("pool", leaseC, leaseD)
}

// TestModeUpgradeRefused: a lease holding a readers-writer lock in one mode that asks
// for the other mode is refused; it never silently gets the mode it did not ask for.
func TestModeUpgradeRefused(t *testing.T) {
	h := newHarness(t, Limits{}, leaseA, leaseB)
	h.ok(acqMode(leaseA, "x", Shared, 0, false))
	h.fails(acqMode(leaseA, "x", Exclusive, 0, true), ErrModeConflict)
	h.ok(acq(leaseB, "y"))
	h.fails(acqMode(leaseB, "y", Shared, 0, true), ErrModeConflict)
	h.ok(acqMode(leaseA, "y", Shared, 0, true))
	h.fails(acqMode(leaseA, "y", Exclusive, 0, true), ErrModeConflict) // waits shared
}

func TestLockSetGrantedAtOnce(t *testing.T) {
	h := newHarness(t, Limits{}, leaseA, leaseB)
	r := h.ok(acqSet(leaseA, false, "a", "b", "c"))
	for _, n := range []string{"a", "b", "c"} {
		if lease, tok := h.holder(n); lease != leaseA || tok != r.Token {
			t.Fatalf("%s held by %s/%d, want A/%d", n, lease, tok, r.Token)
		}
	}
	if h.s.LastToken() != r.Token {
		t.Fatal("a lock set consumed more than one token")
	}
	// Repeating the same set returns the same grant; an overlapping one conflicts.
	if again := h.unchanged(acqSet(leaseA, false, "a", "b", "c")); again.Token != r.Token {
		t.Fatalf("repeated set acquire got %d, want %d", again.Token, r.Token)
	}
	h.fails(acqSet(leaseA, false, "a", "b"), ErrSetConflict)
	h.fails(acqSet(leaseA, false, "c", "d"), ErrSetConflict)
	h.fails(acq(leaseA, "b"), ErrSetConflict)
	// Try-once for a set with one name held changes nothing, and says which one.
	if f := h.fails(acqSet(leaseB, false, "b", "z"), ErrLockHeld); f.Blocker != "b" || f.HolderToken != r.Token {
		t.Fatalf("held result %+v, want blocker b under %d", f, r.Token)
	}
	// One release with any of the names releases the whole set.
	h.fails(rel(leaseA, "b", r.Token+1), ErrNotHolder)
	h.ok(rel(leaseA, "b", r.Token))
	if h.s.Locks().Len() != 0 {
		t.Fatalf("locks left after the set's release: %v", h.s.locks.sortedNames())
	}
}

// TestLockSetWaitsForAll: a set that cannot have every name waits in every queue,
// holds none of them meanwhile, keeps later single acquires of its free names behind
// it (FIFO on each name), and is granted all at once when the last name frees.
func TestLockSetWaitsForAll(t *testing.T) {
	h := newHarness(t, Limits{}, leaseA, leaseB, leaseC)
	tb := h.ok(acq(leaseB, "b")).Token
	r := h.ok(acqSet(leaseA, true, "a", "b", "c"))
	if !r.Queued || r.Blocker != "b" || r.HolderToken != tb {
		t.Fatalf("set acquire: %+v", r)
	}
	for _, n := range []string{"a", "c"} {
		h.wantHolders(n)
		h.wantWaiters(n, leaseA)
	}
	// C wants the free "a": it queues behind the set.
	h.fails(acq(leaseC, "a"), ErrLockHeld)
	h.ok(acqWait(leaseC, "a"))
	h.wantWaiters("a", leaseA, leaseC)
	r = h.ok(rel(leaseB, "b", tb))
	tok := h.s.LastToken()
	wantEffects(t, r.Effects,
		Effect{Kind: EffectGranted, Lease: leaseA, Name: "a", Token: tok},
		Effect{Kind: EffectGranted, Lease: leaseA, Name: "b", Token: tok},
		Effect{Kind: EffectGranted, Lease: leaseA, Name: "c", Token: tok})
	h.wantWaiters("a", leaseC)
	// The set's release grants C.
	r = h.ok(rel(leaseA, "c", tok))
	wantEffects(t, r.Effects, Effect{Kind: EffectGranted, Lease: leaseC, Name: "a", Token: tok + 1})
}

// TestLockSetsCrossing: two sets over the same names in opposite order (the classic
// deadlock of taking locks one by one) are granted one after the other.
func TestLockSetsCrossing(t *testing.T) {
	h := newHarness(t, Limits{}, leaseA, leaseB, leaseC)
	tc := h.ok(acq(leaseC, "y")).Token
	h.ok(acqSet(leaseA, true, "x", "y"))
	h.ok(acqSet(leaseB, true, "x", "y")) // the names are sorted: "y", "x" is the same set
	r := h.ok(rel(leaseC, "y", tc))
	wantEffects(t, r.Effects,
		Effect{Kind: EffectGranted, Lease: leaseA, Name: "x", Token: tc + 1},
		Effect{Kind: EffectGranted, Lease: leaseA, Name: "y", Token: tc + 1})
	r = h.ok(rel(leaseA, "x", tc+1))
	wantEffects(t, r.Effects,
		Effect{Kind: EffectGranted, Lease: leaseB, Name: "x", Token: tc + 2},
		Effect{Kind: EffectGranted, Lease: leaseB, Name: "y", Token: tc + 2})
}

// TestLockSetCancelAndDrop: cancelling a set's wait (by any of its names) or ending its
// lease takes it out of every queue, and what waited behind it goes ahead.
func TestLockSetCancelAndDrop(t *testing.T) {
	h := newHarness(t, Limits{}, leaseA, leaseB, leaseC)
	tb := h.ok(acq(leaseB, "b")).Token
	h.ok(acqSet(leaseA, true, "a", "b"))
	h.ok(acqWait(leaseC, "a"))
	// C waits behind the set for the free "a"; the set leaves and C gets it.
	r := h.ok(Command{Op: OpCancelWait, Lease: leaseA, Name: "b"})
	wantEffects(t, r.Effects, Effect{Kind: EffectGranted, Lease: leaseC, Name: "a", Token: tb + 1})
	h.wantWaiters("b")
	h.fails(Command{Op: OpCancelWait, Lease: leaseA, Name: "a"}, ErrNotWaiting)
	// Again, with the set's lease expiring.
	h.ok(acqSet(leaseA, true, "b", "c"))
	h.ok(acqWait(leaseC, "c"))
	r = h.ok(Command{Op: OpExpire, Lease: leaseA})
	wantEffects(t, r.Effects,
		Effect{Kind: EffectWaitEnded, Lease: leaseA, Name: "b"},
		Effect{Kind: EffectWaitEnded, Lease: leaseA, Name: "c"},
		Effect{Kind: EffectGranted, Lease: leaseC, Name: "c", Token: tb + 2},
		Effect{Kind: EffectLeaseEnded, Lease: leaseA, Reason: EndExpired})
	// A cancel that lost the race to the grant returns the set's token.
	h.ok(Command{Op: OpGrant, Lease: leaseD, TTLMillis: 1000})
	h.ok(acqSet(leaseD, true, "d", "e"))
	if r := h.ok(Command{Op: OpCancelWait, Lease: leaseD, Name: "e"}); r.Token != h.s.LastToken() {
		t.Fatalf("cancel of a granted set: %+v", r)
	}
}

// TestLockSetForceReleaseAndDelay: a force release of one name takes the whole set
// from its holder; an expiry puts every name with a delay into its lock-delay.
func TestLockSetForceReleaseAndDelay(t *testing.T) {
	h := newHarness(t, Limits{}, leaseA, leaseB)
	tok := h.ok(acqSet(leaseA, false, "a", "b")).Token
	h.ok(acqWait(leaseB, "b"))
	r := h.ok(Command{Op: OpForceRelease, Name: "a", Reason: "ops"})
	wantEffects(t, r.Effects,
		Effect{Kind: EffectRevokedHold, Lease: leaseA, Name: "a", Token: tok, Note: "ops"},
		Effect{Kind: EffectRevokedHold, Lease: leaseA, Name: "b", Token: tok, Note: "ops"},
		Effect{Kind: EffectGranted, Lease: leaseB, Name: "b", Token: tok + 2})
	if r.Released != tok || r.Token != tok+1 {
		t.Fatalf("force release %+v", r)
	}
	c := acqSet(leaseA, false, "c", "d")
	c.DelayMillis = 300
	h.ok(c)
	r = h.ok(Command{Op: OpExpire, Lease: leaseA})
	wantEffects(t, r.Effects,
		Effect{Kind: EffectDelayed, Name: "c", DelayMillis: 300},
		Effect{Kind: EffectDelayed, Name: "d", DelayMillis: 300},
		Effect{Kind: EffectLeaseEnded, Lease: leaseA, Reason: EndExpired})
}

// TestSharedDelay: a reader that expires with a lock-delay keeps new holders out for
// the delay (the other readers keep theirs); of two delays the longest stands.
func TestSharedDelay(t *testing.T) {
	h := newHarness(t, Limits{}, leaseA, leaseB, leaseC)
	a := acqMode(leaseA, "x", Shared, 0, false)
	a.DelayMillis = 500
	h.ok(a)
	b := acqMode(leaseB, "x", Shared, 0, false)
	b.DelayMillis = 100
	h.ok(b)
	r := h.ok(Command{Op: OpExpire, Lease: leaseA})
	wantEffects(t, r.Effects, Effect{Kind: EffectDelayed, Name: "x", DelayMillis: 500}, Effect{Kind: EffectLeaseEnded, Lease: leaseA, Reason: EndExpired})
	h.fails(acqMode(leaseC, "x", Shared, 0, false), ErrLockHeld)
	h.ok(acqMode(leaseC, "x", Shared, 0, true))
	r = h.ok(Command{Op: OpExpire, Lease: leaseB})
	wantEffects(t, r.Effects, Effect{Kind: EffectDelayed, Name: "x", DelayMillis: 500}, Effect{Kind: EffectLeaseEnded, Lease: leaseB, Reason: EndExpired})
	r = h.ok(Command{Op: OpEndDelay, Name: "x"})
	wantEffects(t, r.Effects, Effect{Kind: EffectGranted, Lease: leaseC, Name: "x", Token: h.s.LastToken()})
}

func TestModesAndSetsValidate(t *testing.T) {
	h := newHarness(t, Limits{}, leaseA)
	for name, c := range map[string]Command{
		"limit on exclusive":      acqMode(leaseA, "x", Exclusive, 2, false),
		"limit on shared":         acqMode(leaseA, "x", Shared, 1, false),
		"semaphore of 0":          acqMode(leaseA, "x", Semaphore, 0, false),
		"semaphore too big":       acqMode(leaseA, "x", Semaphore, MaxSemaphoreLimit+1, false),
		"unknown mode":            acqMode(leaseA, "x", 7, 0, false),
		"set of one":              acqSet(leaseA, false, "a"),
		"set unsorted":            acqSet(leaseA, false, "b", "a"),
		"set with a repeat":       acqSet(leaseA, false, "a", "a"),
		"set with a bad name":     acqSet(leaseA, false, "a", "b//c"),
		"set and name":            {Op: OpAcquire, Lease: leaseA, Name: "a", Names: []string{"b", "c"}, Class: Correctness},
		"set of too many":         acqSet(leaseA, false, manyNames(MaxSetNames+1)...),
		"efficiency set":          {Op: OpAcquire, Lease: leaseA, Names: []string{"b", "c"}, Class: Efficiency},
		"semaphore set, no limit": {Op: OpAcquire, Lease: leaseA, Names: []string{"b", "c"}, Class: Correctness, Mode: Semaphore},
		"shared set with limit":   {Op: OpAcquire, Lease: leaseA, Names: []string{"b", "c"}, Class: Correctness, Mode: Shared, Limit: 3},
		"set of an unknown mode":  {Op: OpAcquire, Lease: leaseA, Names: []string{"b", "c"}, Class: Correctness, Mode: 9},
	} {
		t.Run(name, func(t *testing.T) {
			h.t = t
			h.fails(c, ErrInvalid)
		})
	}
	h.t = t
	h.ok(acqSet(leaseA, false, manyNames(MaxSetNames)...))
}

func manyNames(n int) []string {
	var out []string
	for i := range n {
		out = append(out, "n/"+string(rune('a'+i/26))+string(rune('a'+i%26)))
	}
	return out
}

// TestLockSetLimits: a set counts each name against the lease's lock limit, and waits
// only where every queue has room.
func TestLockSetLimits(t *testing.T) {
	h := newHarness(t, Limits{MaxLocksPerLease: 3, MaxWaitersPerLock: 1}, leaseA, leaseB, leaseC)
	h.ok(acq(leaseA, "a"))
	h.fails(acqSet(leaseA, false, "b", "c", "d"), ErrTooManyLocks)
	h.ok(acqSet(leaseA, false, "b", "c"))
	h.ok(acqSet(leaseB, true, "a", "z"))
	h.fails(acqSet(leaseC, true, "a", "y"), ErrTooManyWaiters)
}

// TestModesSnapshotRoundTrip: shared holds, semaphores, held and waiting lock sets
// survive a snapshot, and the restored state goes on exactly as the original.
func TestModesSnapshotRoundTrip(t *testing.T) {
	h := newHarness(t, Limits{}, leaseA, leaseB, leaseC, leaseD)
	h.ok(acqMode(leaseA, "r", Shared, 0, false))
	h.ok(acqMode(leaseB, "r", Shared, 0, false))
	h.ok(acqMode(leaseC, "r", Exclusive, 0, true))
	h.ok(acqMode(leaseD, "r", Shared, 0, true))
	h.ok(acqMode(leaseA, "sem", Semaphore, 1, false))
	h.ok(acqMode(leaseB, "sem", Semaphore, 1, true))
	setTok := h.ok(acqSet(leaseD, false, "s1", "s2")).Token
	h.ok(acqSet(leaseC, true, "free", "s2"))
	h.ok(acqWait(leaseA, "free"))
	b := mustSnapshot(t, h.s)
	s2, err := RestoreState(b, Limits{})
	if err != nil {
		t.Fatalf("restore: %v\n%s", err, b)
	}
	if err := checkState(s2); err != nil {
		t.Fatal(err)
	}
	if again := mustSnapshot(t, s2); !bytes.Equal(again, b) {
		t.Fatalf("round trip changed the bytes:\n%s\n%s", b, again)
	}
	for _, c := range []Command{rel(leaseD, "s2", setTok), {Op: OpRevoke, Lease: leaseA}, {Op: OpExpire, Lease: leaseB}, {Op: OpCancelWait, Lease: leaseC, Name: "r"}} {
		r1, r2 := h.ok(c), s2.Apply(c)
		if err := sameResult(r1, r2); err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		if !bytes.Equal(mustSnapshot(t, h.s), mustSnapshot(t, s2)) {
			t.Fatalf("%+v: the restored state went another way", c)
		}
	}
}

// TestSnapshotBeforeModesRestores: a snapshot written before lock modes and sets
// existed (testdata, written by the code of commit b43d575) still restores, as the
// same exclusive locks, queues and lock-delays.
func TestSnapshotBeforeModesRestores(t *testing.T) {
	b, err := os.ReadFile("testdata/snapshot-v1-before-modes.bin")
	if err != nil {
		t.Fatal(err)
	}
	s, err := RestoreState(b, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if err := checkState(s); err != nil {
		t.Fatal(err)
	}
	want := map[string]*Lock{
		"a": {Name: "a", Class: Correctness, Hold: &Hold{Lease: lid(3), Token: 3}},
		"jobs/nightly": {Name: "jobs/nightly", Class: Correctness, Waiters: []Waiter{{Lease: lid(2)}},
			Delayed: true, DelayMillis: 2000},
		"orders/42": {Name: "orders/42", Class: Correctness,
			Hold:    &Hold{Lease: lid(1), Token: 1, Holder: Holder{Host: "web-1", PID: 42, Note: "billing"}, DelayMillis: 500},
			Waiters: []Waiter{{Lease: lid(2), Holder: Holder{Host: "web-2", PID: 7}}, {Lease: lid(3), DelayMillis: 100}}},
	}
	for name, w := range want {
		if got := s.Locks().Get(name); !reflect.DeepEqual(got, w) {
			t.Errorf("%s: got %+v, want %+v", name, got, w)
		}
	}
	if s.Locks().Len() != len(want) || s.LastToken() != 103 || s.NumLeases() != 3 {
		t.Errorf("%d locks, last token %d, %d leases", s.Locks().Len(), s.LastToken(), s.NumLeases())
	}
	// The old queue behaves as it did: A's release grants B.
	r := s.Apply(rel(lid(1), "orders/42", 1))
	wantEffects(t, r.Effects, Effect{Kind: EffectGranted, Lease: lid(2), Name: "orders/42", Token: 104})
}

// TestRestoreRejectsImpossibleModesAndSets: snapshots with mode or set states no
// command sequence produces are corrupt.
func TestRestoreRejectsImpossibleModesAndSets(t *testing.T) {
	leases := `"leases":[{"id":"@A","ttl":1000},{"id":"@B","ttl":1000},{"id":"@C","ttl":1000}]`
	for name, body := range map[string]string{
		"exclusive and shared":          `{"seq":3,` + leases + `,"locks":[{"name":"x","class":2,"hold":{"lease":"@A","token":1},"holds":[{"lease":"@B","token":2}]}],"tombstones":null}`,
		"over the limit":                `{"seq":3,` + leases + `,"locks":[{"name":"x","class":2,"limit":1,"holds":[{"lease":"@A","token":1},{"lease":"@B","token":2}]}],"tombstones":null}`,
		"limit too big":                 `{"seq":3,` + leases + `,"locks":[{"name":"x","class":2,"limit":10001,"holds":[{"lease":"@A","token":1}]}],"tombstones":null}`,
		"semaphore held exclusively":    `{"seq":3,` + leases + `,"locks":[{"name":"x","class":2,"limit":2,"hold":{"lease":"@A","token":1}}],"tombstones":null}`,
		"reader twice":                  `{"seq":3,` + leases + `,"locks":[{"name":"x","class":2,"holds":[{"lease":"@A","token":1},{"lease":"@A","token":2}]}],"tombstones":null}`,
		"semaphore waiter in rw":        `{"seq":3,` + leases + `,"locks":[{"name":"x","class":2,"hold":{"lease":"@A","token":1},"waiters":[{"lease":"@B","mode":2}]}],"tombstones":null}`,
		"writer waiting in a semaphore": `{"seq":3,` + leases + `,"locks":[{"name":"x","class":2,"limit":1,"holds":[{"lease":"@A","token":1}],"waiters":[{"lease":"@B"}]}],"tombstones":null}`,
		"reader could be granted":       `{"seq":3,` + leases + `,"locks":[{"name":"x","class":2,"holds":[{"lease":"@A","token":1}],"waiters":[{"lease":"@B","mode":1}]}],"tombstones":null}`,
		"semaphore could be granted":    `{"seq":3,` + leases + `,"locks":[{"name":"x","class":2,"limit":2,"holds":[{"lease":"@A","token":1}],"waiters":[{"lease":"@B","mode":2}]}],"tombstones":null}`,
		"set could be granted": `{"seq":3,` + leases + `,"locks":[{"name":"x","class":2,"waiters":[{"lease":"@B","set":"x"}]},` +
			`{"name":"y","class":2,"waiters":[{"lease":"@B","set":"x"}]}],"tombstones":null}`,
		"set of one place": `{"seq":3,` + leases + `,"locks":[{"name":"x","class":2,"hold":{"lease":"@A","token":1},"waiters":[{"lease":"@B","set":"x"}]}],"tombstones":null}`,
		"set named after another": `{"seq":3,` + leases + `,"locks":[{"name":"x","class":2,"hold":{"lease":"@A","token":1},"waiters":[{"lease":"@B","set":"y"}]},` +
			`{"name":"y","class":2,"hold":{"lease":"@A","token":2},"waiters":[{"lease":"@B","set":"y"}]}],"tombstones":null}`,
		"set on two terms": `{"seq":3,` + leases + `,"locks":[{"name":"x","class":2,"hold":{"lease":"@A","token":1},"waiters":[{"lease":"@B","set":"x"}]},` +
			`{"name":"y","class":2,"hold":{"lease":"@A","token":2},"waiters":[{"lease":"@B","set":"x","mode":1}]}],"tombstones":null}`,
		"sets crossed (a deadlock)": `{"seq":3,` + leases + `,"locks":[` +
			`{"name":"x","class":2,"hold":{"lease":"@A","token":1},"waiters":[{"lease":"@B","set":"x"},{"lease":"@C","set":"x"}]},` +
			`{"name":"y","class":2,"hold":{"lease":"@A","token":2},"waiters":[{"lease":"@C","set":"x"},{"lease":"@B","set":"x"}]}],"tombstones":null}`,
		"one token, two leases": `{"seq":3,` + leases + `,"locks":[{"name":"x","class":2,"hold":{"lease":"@A","token":1}},{"name":"y","class":2,"holds":[{"lease":"@B","token":1}]}],"tombstones":null}`,
		"set held in two modes": `{"seq":3,` + leases + `,"locks":[{"name":"x","class":2,"hold":{"lease":"@A","token":1}},{"name":"y","class":2,"holds":[{"lease":"@A","token":1}]}],"tombstones":null}`,
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := RestoreState(snapJSON(body), Limits{}); !errors.Is(err, ErrCorrupt) {
				t.Errorf("RestoreState = %v, want ErrCorrupt", err)
			}
		})
	}
	// The same shapes, consistent, restore.
	ok := `{"seq":3,` + leases + `,"locks":[` +
		`{"name":"x","class":2,"hold":{"lease":"@A","token":1},"waiters":[{"lease":"@B","set":"x"},{"lease":"@C","set":"x"}]},` +
		`{"name":"y","class":2,"hold":{"lease":"@A","token":1},"waiters":[{"lease":"@B","set":"x"},{"lease":"@C","set":"x"}]}],"tombstones":null}`
	s, err := RestoreState(snapJSON(ok), Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if err := checkState(s); err != nil {
		t.Fatal(err)
	}
	r := s.Apply(rel(leaseA, "y", 1))
	wantEffects(t, r.Effects,
		Effect{Kind: EffectGranted, Lease: leaseB, Name: "x", Token: 4},
		Effect{Kind: EffectGranted, Lease: leaseB, Name: "y", Token: 4})
}

func TestModesCodec(t *testing.T) {
	for _, c := range []Command{
		acqMode(leaseA, "x", Shared, 0, true),
		acqMode(leaseA, "x", Semaphore, MaxSemaphoreLimit, false),
		acqSet(leaseA, true, "a", "b/c", strings.Repeat("z", MaxNameLen)),
	} {
		b, err := EncodeCommand(c)
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodeCommand(b)
		if err != nil || !reflect.DeepEqual(got, c) {
			t.Fatalf("round trip of %+v: %+v, %v", c, got, err)
		}
	}
	// A set bit that names no field is corrupt: bits 19 to 23 and 27 up are nobody's.
	for _, bit := range []uint{19, 23, 27, 31, 40} {
		b := append([]byte{commandV2, byte(OpRevoke)}, uvarint(1<<bit)...)
		if _, err := DecodeCommand(b); !errors.Is(err, ErrCorrupt) {
			t.Errorf("bit %d: %v, want ErrCorrupt", bit, err)
		}
	}
	// A names count the input cannot hold is refused before anything is allocated.
	b := append([]byte{commandV2, byte(OpAcquire)}, uvarint(1<<fNames)...)
	b = append(b, uvarint(1<<40)...)
	if _, err := DecodeCommand(b); !errors.Is(err, ErrCorrupt) {
		t.Errorf("huge names count: %v", err)
	}
}

func uvarint(v uint64) []byte {
	var b []byte
	for v >= 0x80 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}
