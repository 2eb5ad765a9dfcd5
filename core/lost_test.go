package core

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// TestLostLocks: a force release records the lock among its holder's lost locks, in the
// replicated state, until the lease ends; at most MaxLostPerLease are kept, the newest;
// a lease that lost nothing has none; a snapshot carries them, restores them, and a view
// taken before later force releases does not see those.
func TestLostLocks(t *testing.T) {
	s := NewState(Limits{})
	apply := func(c Command) Result {
		t.Helper()
		r := s.Apply(c)
		if r.Err != nil {
			t.Fatalf("%+v: %v", c, r.Err)
		}
		return r
	}
	apply(Command{Op: OpGrant, Lease: leaseA, TTLMillis: 1000})
	apply(Command{Op: OpGrant, Lease: leaseB, TTLMillis: 1000})
	var want []LostLock
	forced := func(i int) {
		t.Helper()
		name := fmt.Sprintf("lock/%d", i)
		tok := apply(Command{Op: OpAcquire, Lease: leaseA, Name: name, Class: Correctness}).Token
		apply(Command{Op: OpAcquire, Lease: leaseB, Name: name, Class: Correctness, Wait: true})
		r := apply(Command{Op: OpForceRelease, Name: name, Reason: fmt.Sprintf("operator %d", i)})
		if r.Released != tok {
			t.Fatalf("force release of %s released %d, want %d", name, r.Released, tok)
		}
		want = append(want, LostLock{Name: name, Token: tok, Reason: fmt.Sprintf("operator %d", i)})
	}
	forced(0)
	if got := s.Locks().Lost(leaseA); !slices.Equal(got, want) {
		t.Fatalf("Lost(A) = %+v, want %+v", got, want)
	}
	if got := s.Locks().Lost(leaseB); got != nil {
		t.Fatalf("Lost(B) = %+v; B was granted the lock, it lost nothing", got)
	}
	first := s.Locks().Lost(leaseA)
	view := s.SnapshotView()
	before, err := view.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i < MaxLostPerLease+5; i++ {
		forced(i)
	}
	want = want[len(want)-MaxLostPerLease:]
	if got := s.Locks().Lost(leaseA); !slices.Equal(got, want) {
		t.Fatalf("after %d force releases Lost(A) = %+v, want the newest %d: %+v", MaxLostPerLease+5, got, MaxLostPerLease, want)
	}
	if first[0].Name != "lock/0" || len(first) != 1 {
		t.Fatalf("a slice Lost returned changed: %+v", first)
	}
	if again, err := view.Bytes(); err != nil || !bytes.Equal(again, before) {
		t.Fatalf("a view taken before the force releases changed (%v)", err)
	}

	b := mustSnapshot(t, s)
	if !bytes.Contains(b, []byte(`"lost":[{"lease":"`+leaseA.String()+`","name":"lock/5","token":`)) {
		t.Fatalf("snapshot does not carry the lost locks:\n%s", b)
	}
	r, err := RestoreState(b, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Locks().Lost(leaseA); !slices.Equal(got, want) {
		t.Fatalf("restored Lost(A) = %+v, want %+v", got, want)
	}
	if again := mustSnapshot(t, r); !bytes.Equal(again, b) {
		t.Fatal("restored state encodes differently")
	}

	apply(Command{Op: OpExpire, Lease: leaseA})
	if got := s.Locks().Lost(leaseA); got != nil {
		t.Fatalf("Lost(A) after the lease ended = %+v", got)
	}
	if b := mustSnapshot(t, s); bytes.Contains(b, []byte(`"lost"`)) {
		t.Fatalf("snapshot keeps the lost locks of an ended lease:\n%s", b)
	}
	if r := s.Apply(Command{Op: OpForceRelease, Name: "x", Reason: "bad \xff"}); r.Err == nil {
		t.Fatal("a force release with a reason that is not UTF-8 was applied")
	}
}

// TestSnapshotVersion1Restores: a snapshot written before lost locks were replicated
// (version 1) still restores, to the same state, which is written as version 2 with the
// same body.
func TestSnapshotVersion1Restores(t *testing.T) {
	for i, s := range randomStates(t, 20) {
		clear(s.locks.lost) // a version-1 writer had neither lost locks nor a ledger
		s.ledger = NewLedger(s.limits)
		b := mustSnapshot(t, s)
		v1 := append([]byte{snapshotV1}, b[1:]...)
		r, err := RestoreState(v1, Limits{})
		if err != nil {
			t.Fatalf("state %d: version-1 snapshot: %v", i, err)
		}
		if got := mustSnapshot(t, r); !bytes.Equal(got, b) {
			t.Fatalf("state %d: version-1 snapshot restored to another state", i)
		}
		if strings.Contains(string(b), `"lost"`) {
			t.Fatalf("state %d: a state without lost locks writes a lost field", i)
		}
	}
}
