package core

import (
	"bytes"
	"errors"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// Lease ids used by the table tests.
var (
	leaseA = lid(0xA)
	leaseB = lid(0xB)
	leaseC = lid(0xC)
	leaseD = lid(0xD)
	nobody = lid(0xDEAD)
)

// harness wraps a State for table tests: every call reports the line of the test.
type harness struct {
	t *testing.T
	s *State
}

func newHarness(t *testing.T, limits Limits, leases ...LeaseID) *harness {
	t.Helper()
	h := &harness{t: t, s: NewState(limits)}
	for _, id := range leases {
		h.ok(Command{Op: OpGrant, Lease: id, TTLMillis: 10_000})
	}
	return h
}

// ok applies c and fails the test if it fails.
func (h *harness) ok(c Command) Result {
	h.t.Helper()
	r := h.s.Apply(c)
	if r.Err != nil {
		h.t.Fatalf("%v %+v: %v", c.Op, c, r.Err)
	}
	if err := checkState(h.s); err != nil {
		h.t.Fatalf("after %v: invariant: %v", c.Op, err)
	}
	return r
}

// fails applies c, expects an error matching want, and checks that the state (its
// snapshot bytes and LastToken) did not change.
func (h *harness) fails(c Command, want error) Result {
	h.t.Helper()
	before := mustSnapshot(h.t, h.s)
	r := h.s.Apply(c)
	if !errors.Is(r.Err, want) {
		h.t.Fatalf("%v %+v: error %v, want %v", c.Op, c, r.Err, want)
	}
	if after := mustSnapshot(h.t, h.s); !bytes.Equal(before, after) {
		h.t.Fatalf("%v failed with %v but changed the state:\nbefore %s\nafter  %s", c.Op, r.Err, before, after)
	}
	if len(r.Effects) != 0 {
		h.t.Fatalf("%v failed with %v but reported effects %+v", c.Op, r.Err, r.Effects)
	}
	return r
}

// unchanged applies c, expects success, and checks that nothing changed.
func (h *harness) unchanged(c Command) Result {
	h.t.Helper()
	before := mustSnapshot(h.t, h.s)
	r := h.ok(c)
	if after := mustSnapshot(h.t, h.s); !bytes.Equal(before, after) {
		h.t.Fatalf("%v should not change the state:\nbefore %s\nafter  %s", c.Op, before, after)
	}
	return r
}

func (h *harness) acquire(lease LeaseID, name string, wait bool) Result {
	h.t.Helper()
	return h.ok(Command{Op: OpAcquire, Lease: lease, Name: name, Class: Correctness, Wait: wait})
}

func (h *harness) lock(name string) *Lock { return h.s.Locks().Get(name) }

// holder returns the lease and token holding name (zero if not held).
func (h *harness) holder(name string) (LeaseID, uint64) {
	if l := h.lock(name); l != nil && l.Hold != nil {
		return l.Hold.Lease, l.Hold.Token
	}
	return LeaseID{}, 0
}

func (h *harness) waiters(name string) []LeaseID {
	var out []LeaseID
	if l := h.lock(name); l != nil {
		for _, w := range l.Waiters {
			out = append(out, w.Lease)
		}
	}
	return out
}

func wantEffects(t *testing.T, got []Effect, want ...Effect) {
	t.Helper()
	if !effectsEqual(got, want) {
		t.Fatalf("effects:\n got  %+v\n want %+v", got, want)
	}
}

func acq(lease LeaseID, name string) Command {
	return Command{Op: OpAcquire, Lease: lease, Name: name, Class: Correctness}
}

func acqWait(lease LeaseID, name string) Command {
	c := acq(lease, name)
	c.Wait = true
	return c
}

// ---- grant ----

func TestGrant(t *testing.T) {
	t.Run("creates the lease and reports it", func(t *testing.T) {
		h := newHarness(t, Limits{})
		r := h.ok(Command{Op: OpGrant, Lease: leaseA, TTLMillis: 1500})
		wantEffects(t, r.Effects, Effect{Kind: EffectLeaseGranted, Lease: leaseA, TTLMillis: 1500})
		if l := h.s.Lease(leaseA); l == nil || l.ID != leaseA || l.TTLMillis != 1500 {
			t.Fatalf("Lease = %+v", l)
		}
		if h.s.NumLeases() != 1 || h.s.LastToken() != 0 {
			t.Fatalf("NumLeases %d LastToken %d", h.s.NumLeases(), h.s.LastToken())
		}
	})
	t.Run("duplicate id", func(t *testing.T) {
		h := newHarness(t, Limits{}, leaseA)
		h.acquire(leaseA, "x", false)
		h.fails(Command{Op: OpGrant, Lease: leaseA, TTLMillis: 99}, ErrLeaseExists)
		if h.s.Lease(leaseA).TTLMillis != 10_000 {
			t.Fatal("duplicate grant changed the TTL")
		}
	})
	t.Run("lease limit", func(t *testing.T) {
		h := newHarness(t, Limits{MaxLeases: 2}, leaseA, leaseB)
		h.fails(Command{Op: OpGrant, Lease: leaseC, TTLMillis: 1}, ErrTooManyLeases)
		h.ok(Command{Op: OpRevoke, Lease: leaseA})
		h.ok(Command{Op: OpGrant, Lease: leaseC, TTLMillis: 1})
		h.fails(Command{Op: OpGrant, Lease: leaseD, TTLMillis: 1}, ErrTooManyLeases)
	})
	for name, c := range map[string]Command{
		"zero lease":   {Op: OpGrant, TTLMillis: 1},
		"zero ttl":     {Op: OpGrant, Lease: leaseA},
		"negative ttl": {Op: OpGrant, Lease: leaseA, TTLMillis: -5},
	} {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, Limits{})
			h.fails(c, ErrInvalid)
		})
	}
}

// ---- revoke and expire ----

func TestRevokeExpireUnknownLease(t *testing.T) {
	for _, op := range []Op{OpRevoke, OpExpire} {
		t.Run(op.String(), func(t *testing.T) {
			h := newHarness(t, Limits{}, leaseA)
			h.acquire(leaseA, "x", false)
			h.fails(Command{Op: op, Lease: nobody}, ErrLeaseNotFound)
			h.fails(Command{Op: op}, ErrInvalid)
			// A repeated end is harmless: an error, nothing changes.
			h.ok(Command{Op: op, Lease: leaseA})
			r := h.fails(Command{Op: op, Lease: leaseA}, ErrLeaseNotFound)
			if want := "(" + h.s.EndedReason(leaseA).String() + ")"; !strings.Contains(r.Err.Error(), want) {
				t.Fatalf("error %q does not say why the lease ended (%s)", r.Err, want)
			}
		})
	}
}

func TestExpireReleasesEverythingAndGrantsFIFO(t *testing.T) {
	h := newHarness(t, Limits{}, leaseA, leaseB, leaseC, leaseD)
	// A holds three locks and waits for a fourth; B and C queue behind A in different
	// orders; D holds the lock A waits for.
	ta := h.acquire(leaseA, "m", false).Token
	h.acquire(leaseA, "k", false)
	h.acquire(leaseA, "z", false)
	h.acquire(leaseD, "w", false)
	h.acquire(leaseA, "w", true)
	h.acquire(leaseC, "m", true)
	h.acquire(leaseB, "m", true)
	h.acquire(leaseB, "k", true)
	h.acquire(leaseC, "k", true)
	h.acquire(leaseB, "w", true)
	last := h.s.LastToken()

	r := h.ok(Command{Op: OpExpire, Lease: leaseA})
	// Name order: k, m, w, z. k → B (queued first), m → C (queued first), w: A only
	// waited, z: nobody waits, so it is gone.
	wantEffects(t, r.Effects,
		Effect{Kind: EffectGranted, Lease: leaseB, Name: "k", Token: last + 1},
		Effect{Kind: EffectGranted, Lease: leaseC, Name: "m", Token: last + 2},
		Effect{Kind: EffectWaitEnded, Lease: leaseA, Name: "w"},
		Effect{Kind: EffectLeaseEnded, Lease: leaseA, Reason: EndExpired},
	)
	if h.s.Lease(leaseA) != nil || h.s.EndedReason(leaseA) != EndExpired {
		t.Fatalf("lease A: %+v, ended reason %v", h.s.Lease(leaseA), h.s.EndedReason(leaseA))
	}
	if h.lock("z") != nil {
		t.Fatal("z is still in the table with nobody holding or waiting")
	}
	if got, _ := h.holder("k"); got != leaseB {
		t.Fatalf("k is held by %v", got)
	}
	if got := h.waiters("k"); !reflect.DeepEqual(got, []LeaseID{leaseC}) {
		t.Fatalf("k waiters %v", got)
	}
	if got := h.waiters("m"); !reflect.DeepEqual(got, []LeaseID{leaseB}) {
		t.Fatalf("m waiters %v", got)
	}
	if got := h.waiters("w"); !reflect.DeepEqual(got, []LeaseID{leaseB}) {
		t.Fatalf("w waiters %v (A's place must be gone, B's kept)", got)
	}
	if h.s.Locks().LeaseLocks(leaseA) != 0 || len(h.s.Locks().HeldBy(leaseA)) != 0 {
		t.Fatal("the ended lease is still indexed")
	}
	// The old token of A is dead: A cannot release, and nobody else can with it.
	h.fails(Command{Op: OpRelease, Lease: leaseA, Name: "m", Token: ta}, ErrLeaseNotFound)
	h.fails(Command{Op: OpRelease, Lease: leaseC, Name: "m", Token: ta}, ErrNotHolder)
}

func TestRevokeReasonAndEndedReason(t *testing.T) {
	h := newHarness(t, Limits{}, leaseA, leaseB)
	h.acquire(leaseA, "x", false)
	h.acquire(leaseB, "x", true)
	r := h.ok(Command{Op: OpRevoke, Lease: leaseA})
	tok := h.s.LastToken()
	wantEffects(t, r.Effects,
		Effect{Kind: EffectGranted, Lease: leaseB, Name: "x", Token: tok},
		Effect{Kind: EffectLeaseEnded, Lease: leaseA, Reason: EndRevoked},
	)
	if got := h.s.EndedReason(leaseA); got != EndRevoked {
		t.Fatalf("EndedReason = %v", got)
	}
	if got := h.s.EndedReason(nobody); got != EndUnknown {
		t.Fatalf("EndedReason of a lease never granted = %v", got)
	}
	if got := h.s.EndedReason(leaseB); got != EndUnknown {
		t.Fatalf("EndedReason of a live lease = %v", got)
	}
	// Every lease operation on the ended lease is refused.
	for _, c := range []Command{
		acq(leaseA, "y"),
		{Op: OpRelease, Lease: leaseA, Name: "x", Token: 1},
		{Op: OpCancelWait, Lease: leaseA, Name: "x"},
	} {
		h.fails(c, ErrLeaseNotFound)
	}
}

func TestTombstonesAreBounded(t *testing.T) {
	h := newHarness(t, Limits{})
	for i := range uint32(tombstoneCap + 10) {
		h.s.Apply(Command{Op: OpGrant, Lease: lid(i + 1), TTLMillis: 1})
		op := OpRevoke
		if i%2 == 0 {
			op = OpExpire
		}
		if r := h.s.Apply(Command{Op: op, Lease: lid(i + 1)}); r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	if got := h.s.EndedReason(lid(1)); got != EndUnknown {
		t.Fatalf("the oldest tombstone should be forgotten, got %v", got)
	}
	if got := h.s.EndedReason(lid(tombstoneCap + 10)); got != EndRevoked {
		t.Fatalf("the newest tombstone: %v", got)
	}
	if got := h.s.EndedReason(lid(tombstoneCap + 9)); got != EndExpired {
		t.Fatalf("a recent tombstone: %v", got)
	}
	if err := checkState(h.s); err != nil {
		t.Fatal(err)
	}
}

// ---- acquire ----

func TestAcquireFreshGrant(t *testing.T) {
	h := newHarness(t, Limits{}, leaseA, leaseB)
	holder := Holder{Host: "web-1", PID: 42, Note: "rebuild"}
	r := h.ok(Command{Op: OpAcquire, Lease: leaseA, Name: "orders/42", Class: Correctness, Holder: holder, DelayMillis: 250})
	if r.Token != 1 || r.Queued || r.HolderToken != 0 || len(r.Effects) != 0 {
		t.Fatalf("first grant: %+v", r)
	}
	want := &Lock{Name: "orders/42", Class: Correctness, Hold: &Hold{Lease: leaseA, Token: 1, Holder: holder, DelayMillis: 250}}
	if got := h.lock("orders/42"); !reflect.DeepEqual(got, want) {
		t.Fatalf("lock = %+v, want %+v", got, want)
	}
	h.ok(Command{Op: OpReserve, Count: 10}) // tokens 2..11
	if r := h.acquire(leaseB, "orders/43", false); r.Token != 12 || h.s.LastToken() != 12 {
		t.Fatalf("grant after a reserve: token %d, LastToken %d; want 12", r.Token, h.s.LastToken())
	}
	if r := h.acquire(leaseA, "orders/44", true); r.Token != 13 || r.Queued {
		t.Fatalf("a waiting acquire of a free lock is granted at once: %+v", r)
	}
	if got := h.s.Locks().HeldBy(leaseA); !reflect.DeepEqual(got, []string{"orders/42", "orders/44"}) {
		t.Fatalf("HeldBy = %v", got)
	}
}

func TestAcquireIsIdempotent(t *testing.T) {
	h := newHarness(t, Limits{}, leaseA, leaseB, leaseC)
	first := h.acquire(leaseA, "x", false)
	h.acquire(leaseB, "x", true)
	for _, wait := range []bool{false, true} {
		c := acq(leaseA, "x")
		c.Wait = wait
		c.Holder = Holder{Host: "other"} // a retry with different details changes nothing
		r := h.unchanged(c)
		if r.Token != first.Token || r.Queued || r.Err != nil {
			t.Fatalf("re-acquire by the holder (wait=%v): %+v, want token %d", wait, r, first.Token)
		}
	}
	// A waiter's retry reports Queued again and never takes a second place.
	for _, wait := range []bool{true, false} {
		c := acqWait(leaseB, "x")
		c.Wait = wait
		r := h.unchanged(c)
		if !r.Queued || r.HolderToken != first.Token || r.Token != 0 {
			t.Fatalf("re-acquire by a waiter (wait=%v): %+v", wait, r)
		}
	}
	if got := h.waiters("x"); !reflect.DeepEqual(got, []LeaseID{leaseB}) {
		t.Fatalf("waiters %v", got)
	}
	// After release, B is the holder and its retry returns the new token.
	r := h.ok(Command{Op: OpRelease, Lease: leaseA, Name: "x", Token: first.Token})
	granted := r.Effects[0].Token
	if r := h.unchanged(acqWait(leaseB, "x")); r.Token != granted || r.Queued {
		t.Fatalf("retry after the grant: %+v, want token %d", r, granted)
	}
}

func TestAcquireHeld(t *testing.T) {
	h := newHarness(t, Limits{}, leaseA, leaseB, leaseC)
	holder := Holder{Host: "db-7", PID: 7}
	tok := h.ok(Command{Op: OpAcquire, Lease: leaseA, Name: "x", Class: Correctness, Holder: holder}).Token

	r := h.fails(acq(leaseB, "x"), ErrLockHeld)
	if r.HolderToken != tok || r.Holder != holder || r.Queued || r.Token != 0 {
		t.Fatalf("try-once on a held lock: %+v, want HolderToken %d and the holder", r, tok)
	}
	r = h.ok(acqWait(leaseB, "x"))
	if !r.Queued || r.HolderToken != tok || r.Holder != holder || r.Token != 0 {
		t.Fatalf("wait on a held lock: %+v", r)
	}
	h.ok(acqWait(leaseC, "x"))
	if got := h.waiters("x"); !reflect.DeepEqual(got, []LeaseID{leaseB, leaseC}) {
		t.Fatalf("queue %v, want B then C", got)
	}
	if h.s.LastToken() != tok {
		t.Fatal("queueing consumed a token")
	}
}

func TestAcquireRefused(t *testing.T) {
	long := strings.Repeat("a", MaxNameLen+1)
	for _, tc := range []struct {
		name string
		c    Command
		want error
	}{
		{"efficiency class", Command{Op: OpAcquire, Lease: leaseA, Name: "x", Class: Efficiency}, ErrInvalid},
		{"unspecified class", Command{Op: OpAcquire, Lease: leaseA, Name: "x"}, ErrInvalid},
		{"unknown class", Command{Op: OpAcquire, Lease: leaseA, Name: "x", Class: 3}, ErrInvalid},
		{"unknown lease", acq(nobody, "x"), ErrLeaseNotFound},
		{"zero lease", acq(LeaseID{}, "x"), ErrInvalid},
		{"empty name", acq(leaseA, ""), ErrInvalid},
		{"long name", acq(leaseA, long), ErrInvalid},
		{"negative delay", Command{Op: OpAcquire, Lease: leaseA, Name: "x", Class: Correctness, DelayMillis: -1}, ErrInvalid},
		{"bad holder", Command{Op: OpAcquire, Lease: leaseA, Name: "x", Class: Correctness, Holder: Holder{Note: "\xff"}}, ErrInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, Limits{}, leaseA, leaseB)
			h.acquire(leaseB, "y", false)
			h.fails(tc.c, tc.want)
		})
	}
}

func TestAcquireClassConflict(t *testing.T) {
	// State only holds correctness locks, so the conflict shows in a bare table (the
	// leader's efficiency table, or the two tables compared by the leader).
	tbl := NewLocks(Limits{})
	var seq counterSeq
	r := tbl.Acquire(AcquireArgs{Lease: leaseA, Name: "x", Class: Efficiency}, &seq)
	if r.Err != nil || r.Token != 1 {
		t.Fatalf("efficiency grant: %+v", r)
	}
	for _, a := range []AcquireArgs{
		{Lease: leaseB, Name: "x", Class: Correctness},
		{Lease: leaseB, Name: "x", Class: Correctness, Wait: true},
		{Lease: leaseA, Name: "x", Class: Correctness}, // even the holder
	} {
		if r := tbl.Acquire(a, &seq); !errors.Is(r.Err, ErrClassConflict) || r.Queued || r.Token != 0 {
			t.Fatalf("%+v: %+v, want ErrClassConflict", a, r)
		}
	}
	if l := tbl.Get("x"); len(l.Waiters) != 0 || l.Hold.Lease != leaseA || seq.n != 1 {
		t.Fatalf("conflict changed the table: %+v, seq %d", l, seq.n)
	}
	// A lock that is only waited for (delayed) conflicts too.
	var r2 Result
	tbl.Acquire(AcquireArgs{Lease: leaseB, Name: "x", Class: Efficiency, Wait: true}, &seq)
	tbl.Acquire(AcquireArgs{Lease: leaseA, Name: "d", Class: Efficiency, DelayMillis: 10}, &seq)
	tbl.DropLease(leaseA, true, &seq, &r2)
	if r := tbl.Acquire(AcquireArgs{Lease: leaseC, Name: "d", Class: Correctness, Wait: true}, &seq); !errors.Is(r.Err, ErrClassConflict) {
		t.Fatalf("delayed lock of the other class: %+v", r)
	}
	if err := checkTable(tbl, func(id LeaseID) bool { return id != leaseA }, seq.n); err != nil {
		t.Fatal(err)
	}
}

func TestAcquireLimits(t *testing.T) {
	t.Run("locks per lease", func(t *testing.T) {
		h := newHarness(t, Limits{MaxLocksPerLease: 2}, leaseA, leaseB)
		h.acquire(leaseB, "w", false)
		tok := h.acquire(leaseA, "x", false).Token
		h.acquire(leaseA, "w", true) // a wait counts too
		h.fails(acq(leaseA, "y"), ErrTooManyLocks)
		h.fails(acqWait(leaseA, "y"), ErrTooManyLocks)
		// Retries of what the lease already has still work at the limit.
		if r := h.unchanged(acq(leaseA, "x")); r.Token != tok {
			t.Fatalf("re-acquire at the limit: %+v", r)
		}
		if r := h.unchanged(acqWait(leaseA, "w")); !r.Queued {
			t.Fatalf("re-wait at the limit: %+v", r)
		}
		// Giving one up makes room.
		h.ok(Command{Op: OpCancelWait, Lease: leaseA, Name: "w"})
		h.acquire(leaseA, "y", false)
	})
	t.Run("waiters per lock", func(t *testing.T) {
		h := newHarness(t, Limits{MaxWaitersPerLock: 2}, leaseA, leaseB, leaseC, leaseD)
		h.acquire(leaseA, "x", false)
		h.acquire(leaseB, "x", true)
		h.acquire(leaseC, "x", true)
		h.fails(acqWait(leaseD, "x"), ErrTooManyWaiters)
		// try-once is not limited by the queue: it reports the holder.
		h.fails(acq(leaseD, "x"), ErrLockHeld)
		// The holder and existing waiters retry fine.
		h.unchanged(acqWait(leaseA, "x"))
		h.unchanged(acqWait(leaseC, "x"))
	})
}

// ---- release ----

func TestReleaseRefused(t *testing.T) {
	setup := func(t *testing.T) (*harness, uint64) {
		h := newHarness(t, Limits{}, leaseA, leaseB, leaseC)
		tok := h.acquire(leaseA, "x", false).Token
		h.acquire(leaseB, "x", true)
		h.acquire(leaseC, "other", false)
		return h, tok
	}
	_, tok := setup(t)
	for _, tc := range []struct {
		name string
		c    Command
		want error
	}{
		{"other lease", Command{Op: OpRelease, Lease: leaseC, Name: "x", Token: tok}, ErrNotHolder},
		{"the waiter", Command{Op: OpRelease, Lease: leaseB, Name: "x", Token: tok}, ErrNotHolder},
		{"token too high", Command{Op: OpRelease, Lease: leaseA, Name: "x", Token: tok + 1}, ErrNotHolder},
		{"token too low", Command{Op: OpRelease, Lease: leaseA, Name: "x", Token: tok - 1}, ErrNotHolder},
		{"zero token", Command{Op: OpRelease, Lease: leaseA, Name: "x"}, ErrNotHolder},
		{"not held", Command{Op: OpRelease, Lease: leaseA, Name: "nothing", Token: tok}, ErrNotHolder},
		{"another lock's token", Command{Op: OpRelease, Lease: leaseA, Name: "other", Token: tok + 1}, ErrNotHolder},
		{"unknown lease", Command{Op: OpRelease, Lease: nobody, Name: "x", Token: tok}, ErrLeaseNotFound},
		{"invalid name", Command{Op: OpRelease, Lease: leaseA, Name: "x/", Token: tok}, ErrInvalid},
		{"zero lease", Command{Op: OpRelease, Name: "x", Token: tok}, ErrInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, _ := setup(t)
			h.fails(tc.c, tc.want)
		})
	}
}

func TestReleaseGrantsHeadWaiter(t *testing.T) {
	h := newHarness(t, Limits{}, leaseA, leaseB, leaseC)
	tok := h.acquire(leaseA, "x", false).Token
	h.acquire(leaseB, "x", true)
	h.acquire(leaseC, "x", true)
	h.ok(Command{Op: OpReserve, Count: 5})
	last := h.s.LastToken()

	r := h.ok(Command{Op: OpRelease, Lease: leaseA, Name: "x", Token: tok})
	wantEffects(t, r.Effects, Effect{Kind: EffectGranted, Lease: leaseB, Name: "x", Token: last + 1})
	if r.Token != 0 || r.Queued {
		t.Fatalf("release result %+v", r)
	}
	if got, gt := h.holder("x"); got != leaseB || gt != last+1 || gt <= tok {
		t.Fatalf("holder %v/%d", got, gt)
	}
	if got := h.waiters("x"); !reflect.DeepEqual(got, []LeaseID{leaseC}) {
		t.Fatalf("waiters %v", got)
	}
	// The old token no longer releases it, even for the lease that now holds it.
	h.fails(Command{Op: OpRelease, Lease: leaseB, Name: "x", Token: tok}, ErrNotHolder)
	// The last release removes the lock.
	h.ok(Command{Op: OpRelease, Lease: leaseB, Name: "x", Token: last + 1})
	h.ok(Command{Op: OpRelease, Lease: leaseC, Name: "x", Token: last + 2})
	if h.lock("x") != nil || h.s.Locks().Len() != 0 {
		t.Fatal("a free lock with no waiters stays in the table")
	}
	if h.s.LastToken() != last+2 {
		t.Fatalf("LastToken %d", h.s.LastToken())
	}
}

func TestReleaseThenReacquireGetsNewToken(t *testing.T) {
	h := newHarness(t, Limits{}, leaseA)
	t1 := h.acquire(leaseA, "x", false).Token
	h.ok(Command{Op: OpRelease, Lease: leaseA, Name: "x", Token: t1})
	t2 := h.acquire(leaseA, "x", false).Token
	if t2 <= t1 {
		t.Fatalf("re-acquire after release got token %d, not above %d", t2, t1)
	}
	h.fails(Command{Op: OpRelease, Lease: leaseA, Name: "x", Token: t1}, ErrNotHolder)
}

// ---- cancel wait ----

func TestCancelWait(t *testing.T) {
	t.Run("removes from the queue, keeps the order", func(t *testing.T) {
		h := newHarness(t, Limits{}, leaseA, leaseB, leaseC, leaseD)
		tok := h.acquire(leaseA, "x", false).Token
		h.acquire(leaseB, "x", true)
		h.acquire(leaseC, "x", true)
		h.acquire(leaseD, "x", true)
		r := h.ok(Command{Op: OpCancelWait, Lease: leaseC, Name: "x"})
		if r.Token != 0 || len(r.Effects) != 0 {
			t.Fatalf("cancel result %+v", r)
		}
		if got := h.waiters("x"); !reflect.DeepEqual(got, []LeaseID{leaseB, leaseD}) {
			t.Fatalf("waiters %v", got)
		}
		if got, _ := h.holder("x"); got != leaseA {
			t.Fatal("cancel touched the holder")
		}
		h.fails(Command{Op: OpCancelWait, Lease: leaseC, Name: "x"}, ErrNotWaiting)
		// C re-queues at the back.
		h.acquire(leaseC, "x", true)
		r = h.ok(Command{Op: OpRelease, Lease: leaseA, Name: "x", Token: tok})
		if r.Effects[0].Lease != leaseB {
			t.Fatalf("granted to %v", r.Effects[0].Lease)
		}
		if got := h.waiters("x"); !reflect.DeepEqual(got, []LeaseID{leaseD, leaseC}) {
			t.Fatalf("waiters %v", got)
		}
	})
	t.Run("after the grant returns the token and keeps the hold", func(t *testing.T) {
		h := newHarness(t, Limits{}, leaseA, leaseB)
		tok := h.acquire(leaseA, "x", false).Token
		h.acquire(leaseB, "x", true)
		granted := h.ok(Command{Op: OpRelease, Lease: leaseA, Name: "x", Token: tok}).Effects[0].Token
		r := h.unchanged(Command{Op: OpCancelWait, Lease: leaseB, Name: "x"})
		if r.Token != granted {
			t.Fatalf("cancel after the grant returned %+v, want token %d", r, granted)
		}
		if got, gt := h.holder("x"); got != leaseB || gt != granted {
			t.Fatal("cancel after the grant dropped the hold")
		}
	})
	t.Run("last waiter of a delayed lock", func(t *testing.T) {
		h := newHarness(t, Limits{}, leaseA, leaseB)
		h.ok(Command{Op: OpAcquire, Lease: leaseA, Name: "x", Class: Correctness, DelayMillis: 100})
		h.acquire(leaseB, "x", true)
		h.ok(Command{Op: OpExpire, Lease: leaseA})
		h.ok(Command{Op: OpCancelWait, Lease: leaseB, Name: "x"})
		if l := h.lock("x"); l == nil || !l.Delayed || len(l.Waiters) != 0 {
			t.Fatalf("the delayed lock must stay, with no waiters: %+v", l)
		}
	})
	for _, tc := range []struct {
		name string
		c    Command
		want error
	}{
		{"no such lock", Command{Op: OpCancelWait, Lease: leaseB, Name: "nothing"}, ErrNotWaiting},
		{"not waiting", Command{Op: OpCancelWait, Lease: leaseC, Name: "x"}, ErrNotWaiting},
		{"unknown lease", Command{Op: OpCancelWait, Lease: nobody, Name: "x"}, ErrLeaseNotFound},
		{"invalid name", Command{Op: OpCancelWait, Lease: leaseB, Name: "/x"}, ErrInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, Limits{}, leaseA, leaseB, leaseC)
			h.acquire(leaseA, "x", false)
			h.acquire(leaseB, "x", true)
			h.fails(tc.c, tc.want)
		})
	}
}

// ---- force release ----

func TestForceRelease(t *testing.T) {
	t.Run("held lock with waiters", func(t *testing.T) {
		h := newHarness(t, Limits{}, leaseA, leaseB, leaseC)
		old := h.acquire(leaseA, "x", false).Token
		h.acquire(leaseB, "x", true)
		h.acquire(leaseC, "x", true)
		last := h.s.LastToken()
		r := h.ok(Command{Op: OpForceRelease, Name: "x", Reason: "stuck job"})
		if r.Token != last+1 || r.Released != old {
			t.Fatalf("force: %+v, want fence token %d and released %d", r, last+1, old)
		}
		wantEffects(t, r.Effects,
			Effect{Kind: EffectRevokedHold, Lease: leaseA, Name: "x", Token: old, Note: "stuck job"},
			Effect{Kind: EffectGranted, Lease: leaseB, Name: "x", Token: last + 2},
		)
		if got, gt := h.holder("x"); got != leaseB || gt <= r.Token {
			t.Fatalf("next holder %v with token %d, must be above the fence %d", got, gt, r.Token)
		}
		if got := h.waiters("x"); !reflect.DeepEqual(got, []LeaseID{leaseC}) {
			t.Fatalf("waiters %v", got)
		}
		// The old holder is fenced out: its release fails, its lease lives on.
		h.fails(Command{Op: OpRelease, Lease: leaseA, Name: "x", Token: old}, ErrNotHolder)
		if h.s.Lease(leaseA) == nil || h.s.Locks().LeaseLocks(leaseA) != 0 {
			t.Fatal("force release must keep the lease and drop its hold")
		}
	})
	t.Run("held lock, no waiters", func(t *testing.T) {
		h := newHarness(t, Limits{}, leaseA)
		old := h.acquire(leaseA, "x", false).Token
		r := h.ok(Command{Op: OpForceRelease, Name: "x"})
		if r.Token != old+1 || r.Released != old {
			t.Fatalf("force: %+v", r)
		}
		wantEffects(t, r.Effects, Effect{Kind: EffectRevokedHold, Lease: leaseA, Name: "x", Token: old})
		if h.lock("x") != nil {
			t.Fatal("lock still in the table")
		}
		if r := h.acquire(leaseA, "x", false); r.Token <= old+1 {
			t.Fatalf("next grant %d not above the fence %d", r.Token, old+1)
		}
	})
	t.Run("unheld name consumes a token", func(t *testing.T) {
		h := newHarness(t, Limits{}, leaseA)
		h.acquire(leaseA, "y", false)
		r := h.ok(Command{Op: OpForceRelease, Name: "x", Reason: "just in case"})
		if r.Token != 2 || r.Released != 0 || len(r.Effects) != 0 || h.s.LastToken() != 2 {
			t.Fatalf("force of a free name: %+v, LastToken %d", r, h.s.LastToken())
		}
		if h.lock("x") != nil {
			t.Fatal("force release created a lock")
		}
	})
	t.Run("delayed lock stays delayed", func(t *testing.T) {
		h := newHarness(t, Limits{}, leaseA, leaseB)
		h.ok(Command{Op: OpAcquire, Lease: leaseA, Name: "x", Class: Correctness, DelayMillis: 100})
		h.acquire(leaseB, "x", true)
		h.ok(Command{Op: OpExpire, Lease: leaseA})
		r := h.ok(Command{Op: OpForceRelease, Name: "x"})
		if r.Released != 0 || len(r.Effects) != 0 {
			t.Fatalf("force of a delayed lock: %+v", r)
		}
		if l := h.lock("x"); l == nil || !l.Delayed || l.Hold != nil {
			t.Fatalf("lock %+v", l)
		}
	})
	for name, c := range map[string]Command{
		"invalid name": {Op: OpForceRelease, Name: "a b"},
		"long reason":  {Op: OpForceRelease, Name: "x", Reason: strings.Repeat("r", MaxReasonLen+1)},
	} {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, Limits{}, leaseA)
			h.acquire(leaseA, "x", false)
			h.fails(c, ErrInvalid) // and no token consumed: fails checks the bytes
		})
	}
}

// ---- lock-delay ----

func TestLockDelay(t *testing.T) {
	setup := func(t *testing.T) *harness {
		h := newHarness(t, Limits{}, leaseA, leaseB, leaseC)
		h.ok(Command{Op: OpAcquire, Lease: leaseA, Name: "x", Class: Correctness, DelayMillis: 750})
		h.acquire(leaseB, "x", true)
		return h
	}
	t.Run("expiry delays, end-delay grants", func(t *testing.T) {
		h := setup(t)
		last := h.s.LastToken()
		r := h.ok(Command{Op: OpExpire, Lease: leaseA})
		wantEffects(t, r.Effects,
			Effect{Kind: EffectDelayed, Name: "x", DelayMillis: 750},
			Effect{Kind: EffectLeaseEnded, Lease: leaseA, Reason: EndExpired},
		)
		l := h.lock("x")
		if l == nil || !l.Delayed || l.DelayMillis != 750 || l.Hold != nil {
			t.Fatalf("lock %+v", l)
		}
		if got := h.waiters("x"); !reflect.DeepEqual(got, []LeaseID{leaseB}) {
			t.Fatalf("waiters %v", got)
		}
		if got := h.s.Locks().DelayedLocks(); len(got) != 1 || got[0].Name != "x" {
			t.Fatalf("DelayedLocks = %v", got)
		}
		// Nobody gets it during the delay.
		if r := h.fails(acq(leaseC, "x"), ErrLockHeld); r.HolderToken != 0 {
			t.Fatalf("try-once during the delay: %+v", r)
		}
		if r := h.ok(acqWait(leaseC, "x")); !r.Queued {
			t.Fatalf("wait during the delay: %+v", r)
		}
		h.fails(Command{Op: OpRelease, Lease: leaseB, Name: "x", Token: last}, ErrNotHolder)
		if h.s.LastToken() != last {
			t.Fatal("the delay issued a token")
		}
		r = h.ok(Command{Op: OpEndDelay, Name: "x"})
		wantEffects(t, r.Effects, Effect{Kind: EffectGranted, Lease: leaseB, Name: "x", Token: last + 1})
		if l := h.lock("x"); l.Delayed || l.DelayMillis != 0 {
			t.Fatalf("lock still delayed: %+v", l)
		}
		if got := h.waiters("x"); !reflect.DeepEqual(got, []LeaseID{leaseC}) {
			t.Fatalf("waiters %v", got)
		}
		if len(h.s.Locks().DelayedLocks()) != 0 {
			t.Fatal("DelayedLocks not empty")
		}
	})
	t.Run("end-delay with no waiters removes the lock", func(t *testing.T) {
		h := newHarness(t, Limits{}, leaseA)
		h.ok(Command{Op: OpAcquire, Lease: leaseA, Name: "x", Class: Correctness, DelayMillis: 5})
		h.ok(Command{Op: OpExpire, Lease: leaseA})
		if l := h.lock("x"); l == nil || !l.Delayed {
			t.Fatalf("an expired lock with a delay and no waiters must stay delayed: %+v", l)
		}
		r := h.ok(Command{Op: OpEndDelay, Name: "x"})
		if len(r.Effects) != 0 || h.lock("x") != nil {
			t.Fatalf("end-delay: %+v, lock %+v", r, h.lock("x"))
		}
	})
	t.Run("end-delay of a lock not delayed is a no-op", func(t *testing.T) {
		h := setup(t)
		h.unchanged(Command{Op: OpEndDelay, Name: "x"})
		h.unchanged(Command{Op: OpEndDelay, Name: "nothing"})
		h.fails(Command{Op: OpEndDelay, Name: ""}, ErrInvalid)
	})
	for _, op := range []Op{OpRevoke, OpRelease, OpForceRelease} {
		t.Run(op.String()+" does not delay", func(t *testing.T) {
			h := setup(t)
			c := Command{Op: op, Lease: leaseA, Name: "x", Token: 1}
			if op == OpForceRelease {
				c.Lease = LeaseID{}
			}
			r := h.ok(c)
			for _, e := range r.Effects {
				if e.Kind == EffectDelayed {
					t.Fatalf("%v reported %+v", op, e)
				}
			}
			if got, _ := h.holder("x"); got != leaseB {
				t.Fatalf("%v: the waiter was not granted at once (holder %v, lock %+v)", op, got, h.lock("x"))
			}
		})
	}
	t.Run("a waiter's delay applies once it holds", func(t *testing.T) {
		h := newHarness(t, Limits{}, leaseA, leaseB, leaseC)
		h.acquire(leaseA, "x", false)
		h.ok(Command{Op: OpAcquire, Lease: leaseB, Name: "x", Class: Correctness, Wait: true, DelayMillis: 300})
		h.acquire(leaseC, "x", true)
		h.ok(Command{Op: OpExpire, Lease: leaseA}) // A had no delay: B is granted at once
		if got, _ := h.holder("x"); got != leaseB {
			t.Fatalf("holder %v", got)
		}
		r := h.ok(Command{Op: OpExpire, Lease: leaseB})
		wantEffects(t, r.Effects,
			Effect{Kind: EffectDelayed, Name: "x", DelayMillis: 300},
			Effect{Kind: EffectLeaseEnded, Lease: leaseB, Reason: EndExpired},
		)
	})
	t.Run("waiter with a delay that expires while waiting", func(t *testing.T) {
		h := setup(t)
		h.ok(Command{Op: OpAcquire, Lease: leaseC, Name: "x", Class: Correctness, Wait: true, DelayMillis: 50})
		r := h.ok(Command{Op: OpExpire, Lease: leaseC})
		wantEffects(t, r.Effects,
			Effect{Kind: EffectWaitEnded, Lease: leaseC, Name: "x"},
			Effect{Kind: EffectLeaseEnded, Lease: leaseC, Reason: EndExpired},
		)
		if l := h.lock("x"); l.Delayed {
			t.Fatal("a waiter's expiry delayed the lock")
		}
	})
}

// ---- reserve ----

func TestReserve(t *testing.T) {
	h := newHarness(t, Limits{}, leaseA, leaseB)
	h.acquire(leaseA, "x", false) // token 1
	r := h.ok(Command{Op: OpReserve, Count: 100})
	if r.Token != 2 || h.s.LastToken() != 101 || len(r.Effects) != 0 {
		t.Fatalf("reserve: %+v, LastToken %d; want first token 2, last 101", r, h.s.LastToken())
	}
	if g := h.acquire(leaseB, "y", false); g.Token != 102 {
		t.Fatalf("grant after the block: %d, want 102", g.Token)
	}
	if r := h.ok(Command{Op: OpForceRelease, Name: "x"}); r.Token != 103 {
		t.Fatalf("fence after the block: %d", r.Token)
	}
	r = h.ok(Command{Op: OpReserve, Count: maxReserveCount})
	if r.Token != 104 || h.s.LastToken() != 103+maxReserveCount {
		t.Fatalf("largest reserve: %+v, LastToken %d", r, h.s.LastToken())
	}
	if g := h.acquire(leaseA, "z", false); g.Token != 104+maxReserveCount {
		t.Fatalf("grant after the largest block: %d", g.Token)
	}
	h.fails(Command{Op: OpReserve}, ErrInvalid)
	h.fails(Command{Op: OpReserve, Count: maxReserveCount + 1}, ErrInvalid)
}

func TestReserveOverflow(t *testing.T) {
	max := ^uint64(0)
	s := restoreWithSeq(t, max-10)
	h := &harness{t: t, s: s}
	h.fails(Command{Op: OpReserve, Count: 11}, ErrInvalid)
	if r := h.ok(Command{Op: OpReserve, Count: 5}); r.Token != max-9 || s.LastToken() != max-5 {
		t.Fatalf("reserve near the top: %+v, LastToken %d", r, s.LastToken())
	}
}

// restoreWithSeq returns an empty State whose sequence stands at seq.
func restoreWithSeq(t *testing.T, seq uint64) *State {
	t.Helper()
	b := []byte("\x01{\"seq\":" + strconv.FormatUint(seq, 10) + ",\"leases\":[],\"locks\":[],\"tombstones\":null}\n")
	s, err := RestoreState(b, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// ---- KV and membership (fenced writes are checked against the lock table) ----

const (
	testClusterID  = "0123456789abcdef0123456789abcdef"
	otherClusterID = "fedcba9876543210fedcba9876543210"
)

// TestClusterID: a cluster is named once; the same ID again changes nothing, another ID
// fails and changes nothing, and a malformed ID is invalid.
func TestClusterID(t *testing.T) {
	h := newHarness(t, Limits{})
	if h.s.ClusterID() != "" {
		t.Fatal("a new state has a cluster ID")
	}
	for _, bad := range []string{"", "0123", strings.ToUpper(testClusterID), "00000000000000000000000000000000", testClusterID[:31] + "g"} {
		h.fails(Command{Op: OpSetClusterID, ClusterID: bad}, ErrInvalid)
	}
	h.ok(Command{Op: OpSetClusterID, ClusterID: testClusterID})
	h.unchanged(Command{Op: OpSetClusterID, ClusterID: testClusterID})
	h.fails(Command{Op: OpSetClusterID, ClusterID: otherClusterID}, ErrClusterID)
	if h.s.ClusterID() != testClusterID {
		t.Fatalf("cluster ID %q", h.s.ClusterID())
	}
}

func TestFencedKV(t *testing.T) {
	h := newHarness(t, Limits{}, leaseA, leaseB)
	t1 := h.acquire(leaseA, "x", false).Token
	if r := h.ok(Command{Op: OpPut, Key: "k", Value: []byte("v1"), Name: "x", Token: t1, RequireHolder: true}); r.Token != 1 {
		t.Fatalf("first put version %d", r.Token)
	}
	h.ok(Command{Op: OpForceRelease, Name: "x"})
	t2 := h.acquire(leaseB, "x", false).Token
	h.ok(Command{Op: OpPut, Key: "k", Value: []byte("v2"), Name: "x", Token: t2})
	// The old holder is fenced out, with or without RequireHolder.
	r := h.fails(Command{Op: OpPut, Key: "k", Value: []byte("late"), Name: "x", Token: t1}, ErrStaleToken)
	var st *StaleTokenError
	if !errors.As(r.Err, &st) || st.Token != t1 || st.Highest != t2 || st.Key != "k" {
		t.Fatalf("stale error %#v", r.Err)
	}
	h.fails(Command{Op: OpDelete, Key: "k", Name: "x", Token: t1}, ErrStaleToken)
	// RequireHolder refuses a token that is not the holder's even when it is not stale.
	h.fails(Command{Op: OpPut, Key: "new", Value: []byte("v"), Name: "x", Token: t1, RequireHolder: true}, ErrNotHolder)
	// Compare-and-set.
	e := h.s.Get("k")
	h.fails(Command{Op: OpPut, Key: "k", Value: []byte("cas"), CheckVersion: true, Version: e.Version + 1}, ErrVersionMismatch)
	h.fails(Command{Op: OpPut, Key: "k", Value: []byte("cas"), CheckVersion: true}, ErrVersionMismatch)
	h.ok(Command{Op: OpPut, Key: "k", Value: []byte("cas"), CheckVersion: true, Version: e.Version})
	h.ok(Command{Op: OpPut, Key: "fresh", Value: []byte("cas"), CheckVersion: true})
	// A fenced delete keeps the fence so that a stale holder cannot recreate the key.
	if r := h.ok(Command{Op: OpDelete, Key: "k", Name: "x", Token: t2}); r.Token != 1 {
		t.Fatalf("delete of a live key: %+v", r)
	}
	if e := h.s.Get("k"); e == nil || !e.Deleted || e.FenceToken != t2 {
		t.Fatalf("deleted entry %+v", e)
	}
	h.fails(Command{Op: OpPut, Key: "k", Value: []byte("zombie"), Name: "x", Token: t1}, ErrStaleToken)
	if items, _ := h.s.ListKV("", 10); len(items) != 1 || items[0].Key != "fresh" {
		t.Fatalf("ListKV = %+v", items)
	}
	// Unfenced delete of a missing key is a no-op.
	h.unchanged(Command{Op: OpDelete, Key: "missing"})
	h.fails(Command{Op: OpPut, Key: "k", RequireHolder: true}, ErrInvalid)
	h.fails(Command{Op: OpPut, Key: "k", Value: make([]byte, MaxValueLen+1)}, ErrInvalid)

	h.ok(Command{Op: OpSetMember, Node: "n1", Addr: "127.0.0.1:7740"})
	h.fails(Command{Op: OpSetMember, Node: "n 1", Addr: "127.0.0.1:7740"}, ErrInvalid)
	h.fails(Command{Op: OpSetMember, Node: "n1", Addr: "127.0.0.1"}, ErrInvalid)
	if h.s.Member("n1") != "127.0.0.1:7740" {
		t.Fatal("member not recorded")
	}
	h.ok(Command{Op: OpRemoveMember, Node: "n1"})
	h.ok(Command{Op: OpSetMember, Node: "n2", Addr: "127.0.0.1:7740", FastLane: "127.0.0.1:7742"})
	h.fails(Command{Op: OpSetMember, Node: "n2", Addr: "127.0.0.1:7740", FastLane: "7742"}, ErrInvalid)
	if m := h.s.Members(); len(m) != 1 || m[0] != (Member{ID: "n2", APIAddr: "127.0.0.1:7740", FastLaneAddr: "127.0.0.1:7742"}) {
		t.Fatalf("members %+v", m)
	}
	h.fails(Command{Op: 0}, ErrInvalid)
	h.fails(Command{Op: 200}, ErrInvalid)
}

// ---- ids and validation ----

func TestParseLeaseID(t *testing.T) {
	good := "0123456789abcdef0123456789ABCDEF"
	id, err := ParseLeaseID(good)
	if err != nil {
		t.Fatal(err)
	}
	if id.String() != strings.ToLower(good) {
		t.Fatalf("String() = %s", id)
	}
	if again, err := ParseLeaseID(id.String()); err != nil || again != id {
		t.Fatalf("round trip: %v %v", again, err)
	}
	for _, bad := range []string{
		"", "0", good[:31], good + "0", strings.Repeat("0", 32), "0123456789abcdef0123456789abcdeg",
		" 123456789abcdef0123456789abcdef", "0x23456789abcdef0123456789abcdef", "é123456789abcdef0123456789abcde",
	} {
		if _, err := ParseLeaseID(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseLeaseID(%q) = %v, want ErrInvalid", bad, err)
		}
	}
	var u LeaseID
	if err := u.UnmarshalText([]byte("zz")); !errors.Is(err, ErrInvalid) || !u.IsZero() {
		t.Errorf("UnmarshalText of junk: %v, id %s", err, u)
	}
	if b, _ := id.MarshalText(); string(b) != id.String() {
		t.Errorf("MarshalText = %s", b)
	}
}

func TestValidateName(t *testing.T) {
	for _, ok := range []string{
		"a", "orders/42", "A-Z_a.z:0@9+x", "a/b/c", strings.Repeat("n", MaxNameLen), "..", "-", "x/y.z",
	} {
		if err := ValidateName("name", ok); err != nil {
			t.Errorf("ValidateName(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{
		"",
		strings.Repeat("n", MaxNameLen+1),
		"a b",
		"a=b",
		"/a",
		"a/",
		"/",
		"a//b",
		"a\x00b",
		"caf\u00e9",
		"a*",
		"*",
		"a\nb",
		"a\tb",
		"a\\b",
		"a?b",
		"\xff",
		"a,b",
		"a#b",
		"a%2Fb",
	} {
		err := ValidateName("lock", bad)
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("ValidateName(%q) = %v, want ErrInvalid", bad, err)
			continue
		}
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != "lock" || !strings.HasPrefix(err.Error(), "lock: ") {
			t.Errorf("ValidateName(%q) error %q does not name the field", bad, err)
		}
	}
}

func TestValidateHolder(t *testing.T) {
	for _, ok := range []Holder{
		{}, {Host: "h", PID: 1, Note: "n"}, {Host: strings.Repeat("h", MaxHostLen)}, {Note: strings.Repeat("é", MaxNoteLen/2)},
	} {
		if err := ValidateHolder("holder", ok); err != nil {
			t.Errorf("ValidateHolder(%+v) = %v", ok, err)
		}
	}
	for _, tc := range []struct {
		h     Holder
		field string
	}{
		{Holder{Host: strings.Repeat("h", MaxHostLen+1)}, "holder.host"},
		{Holder{Host: "\xc3"}, "holder.host"},
		{Holder{Note: strings.Repeat("n", MaxNoteLen+1)}, "holder.note"},
		{Holder{Note: "ok\xffno"}, "holder.note"},
	} {
		err := ValidateHolder("holder", tc.h)
		var fe *FieldError
		if !errors.Is(err, ErrInvalid) || !errors.As(err, &fe) || fe.Field != tc.field {
			t.Errorf("ValidateHolder(%+v) = %v, want a FieldError on %s", tc.h, err, tc.field)
		}
	}
}

func TestStringers(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{Efficiency.String(), "efficiency"}, {Correctness.String(), "correctness"}, {Class(9).String(), "unspecified"},
		{EndExpired.String(), "expired"}, {EndRevoked.String(), "revoked"}, {EndUnknown.String(), "unknown"},
		{OpGrant.String(), "grant"}, {OpRemoveMember.String(), "remove-member"}, {Op(0).String(), "op(0)"}, {Op(99).String(), "op(99)"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

func TestLocksList(t *testing.T) {
	h := newHarness(t, Limits{}, leaseA)
	for _, n := range []string{"b/2", "a/1", "b/1", "c"} {
		h.acquire(leaseA, n, false)
	}
	names := func(ls []*Lock) (out []string) {
		for _, l := range ls {
			out = append(out, l.Name)
		}
		return out
	}
	if got, more := h.s.Locks().List("b/", 10); !reflect.DeepEqual(names(got), []string{"b/1", "b/2"}) || more {
		t.Fatalf("List(b/) = %v %v", names(got), more)
	}
	if got, more := h.s.Locks().List("", 2); !reflect.DeepEqual(names(got), []string{"a/1", "b/1"}) || !more {
		t.Fatalf("List('', 2) = %v %v", names(got), more)
	}
	if got, more := h.s.Locks().List("", 0); len(got) != 0 || !more {
		t.Fatalf("List('', 0) = %v %v", names(got), more)
	}
	var ids []LeaseID
	h.s.Leases(func(l *Lease) { ids = append(ids, l.ID) })
	if len(ids) != 1 || ids[0] != leaseA {
		t.Fatalf("Leases = %v", ids)
	}
}

// TestDisconnectEndsLease: OpDisconnect (release on disconnect, G7) ends a lease as a
// revoke does — its locks go to the next waiter — but is remembered as
// EndDisconnected, and the holder's lock-delay applies, as after an expiry (a crashed
// holder), where a clean revoke skips it.
func TestDisconnectEndsLease(t *testing.T) {
	h := newHarness(t, Limits{}, leaseA, leaseB)
	h.acquire(leaseA, "x", false)
	h.acquire(leaseB, "x", true)
	r := h.ok(Command{Op: OpDisconnect, Lease: leaseA})
	wantEffects(t, r.Effects,
		Effect{Kind: EffectGranted, Lease: leaseB, Name: "x", Token: h.s.LastToken()},
		Effect{Kind: EffectLeaseEnded, Lease: leaseA, Reason: EndDisconnected},
	)
	if got := h.s.EndedReason(leaseA); got != EndDisconnected || got.String() != "disconnected" {
		t.Fatalf("EndedReason = %v", got)
	}
	h.fails(Command{Op: OpDisconnect, Lease: leaseA}, ErrLeaseNotFound)

	for _, tc := range []struct {
		op      Op
		delayed bool
	}{{OpDisconnect, true}, {OpExpire, true}, {OpRevoke, false}} {
		h := newHarness(t, Limits{}, leaseA)
		h.ok(Command{Op: OpAcquire, Lease: leaseA, Name: "d", Class: Correctness, DelayMillis: 100})
		h.ok(Command{Op: tc.op, Lease: leaseA})
		if l := h.lock("d"); (l != nil && l.Delayed) != tc.delayed {
			t.Errorf("%v: lock after the end %+v, want delayed %v", tc.op, l, tc.delayed)
		}
	}

	// The ledger says how the hold ended: disconnected, and a snapshot keeps it.
	h = newHarness(t, Limits{}, leaseA)
	h.acquire(leaseA, "l", false)
	h.ok(Command{Op: OpDisconnect, Lease: leaseA})
	b := mustSnapshot(t, h.s)
	if !bytes.Contains(b, []byte(`"how":9`)) {
		t.Fatalf("snapshot after a disconnect has no tenure ended as disconnected (9): %s", b)
	}
	if _, err := RestoreState(b, Limits{}); err != nil {
		t.Fatalf("restore of a disconnected tenure: %v", err)
	}
}

// A fenced write carrying a token the cluster never issued is refused: accepted, it
// would raise the key's fence above every real holder's token for good (a Delete keeps
// the fence, and nothing lowers it).
func TestFencedWriteRefusesATokenNeverIssued(t *testing.T) {
	h := newHarness(t, Limits{}, leaseA)
	g := h.ok(Command{Op: OpAcquire, Lease: leaseA, Name: "orders/42", Class: Correctness})
	for _, op := range []Op{OpPut, OpDelete} {
		r := h.s.Apply(Command{Op: op, Key: "k", Name: "orders/42", Token: 1 << 62, Value: []byte("x")})
		var fe *FieldError
		if !errors.As(r.Err, &fe) || fe.Field != "fence.token" {
			t.Fatalf("%v with token 2^62 (last token %d) = %v, want an invalid fence.token", op, h.s.LastToken(), r.Err)
		}
	}
	if r := h.s.Apply(Command{Op: OpPut, Key: "k", Name: "orders/42", Token: g.Token, Value: []byte("v")}); r.Err != nil {
		t.Fatalf("the holder's own write: %v", r.Err)
	}
}

// A snapshot's KV entries are only what writes make: restore refuses a live key at
// version 0 (IfVersion(0), "only if absent", would then overwrite it), a deleted key
// with a value, a version or no fence (commands never keep one), and two keys with
// one version; what commands made restores as it was.
func TestRestoreRefusesKVEntriesNoWriteMakes(t *testing.T) {
	pre := `{"seq":9,"leases":[],"locks":[],"tombstones":null,"kvRev":5,"kv":[`
	for name, kv := range map[string]string{
		"live at version 0":     `{"key":"k","value":"b2xk"}`,
		"deleted with a value":  `{"key":"k","value":"eA==","deleted":true,"fenceToken":3,"fenceLock":"l"}`,
		"deleted with version":  `{"key":"k","version":3,"deleted":true,"fenceToken":3,"fenceLock":"l"}`,
		"deleted without fence": `{"key":"k","deleted":true}`,
		"one version, two keys": `{"key":"a","version":3},{"key":"b","version":3}`,
	} {
		if _, err := RestoreState(snapJSONVersion(snapshotV2, pre+kv+`]}`), Limits{}); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: restore = %v, want ErrCorrupt", name, err)
		}
	}
	h := newHarness(t, Limits{}, leaseA)
	g := h.ok(Command{Op: OpAcquire, Lease: leaseA, Name: "l", Class: Correctness})
	h.ok(Command{Op: OpPut, Key: "a", Value: []byte("1")})
	h.ok(Command{Op: OpPut, Key: "b", Value: nil})
	h.ok(Command{Op: OpPut, Key: "c", Value: []byte("3"), Name: "l", Token: g.Token})
	h.ok(Command{Op: OpDelete, Key: "c", Name: "l", Token: g.Token})
	h.ok(Command{Op: OpDelete, Key: "d", Name: "l", Token: g.Token})
	h.ok(Command{Op: OpDelete, Key: "a"})
	snap, err := h.s.MarshalSnapshot()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := RestoreState(snap, Limits{}); err != nil {
		t.Fatalf("a snapshot of what commands made: %v", err)
	}
}
