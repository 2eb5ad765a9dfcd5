package core

import (
	"bytes"
	"errors"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
)

// knownRestoreGaps is true while RestoreState accepts some inconsistent states
// (TestRestoreStateRejectsInconsistentLocks and TestRestoreStateOutputRestores fail). While it is true, FuzzRestoreState
// does not fail when a restored state breaks the lock invariants; it still checks that
// nothing panics, that errors wrap ErrCorrupt, that the state round trips, and that a
// failing command leaves it unchanged. Set it to false when codec.go RestoreState and
// checkRestoredLock are fixed, so the fuzzer guards the fix.
const knownRestoreGaps = false

func FuzzDecodeCommand(f *testing.F) {
	for _, c := range sampleCommands() {
		b, err := EncodeCommand(c)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		f.Add(encodeV1(f, c))
	}
	for _, s := range []string{
		"", "\x01", "\x02{}", "\x01{}", "\x01null", "\x01{\"op\":4,\"name\":\"a//b\"}",
		"\x01{\"op\":1,\"lease\":\"FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF\",\"ttl\":1}",
		"\x01{\"op\":10,\"key\":\"k\",\"value\":\"\"}", "\x01{\"op\":10,\"key\":\"k\",\"value\":\"AAEC\"}",
		"\x01{\"op\":4,\"holder\":{\"note\":\"\\ud800\"}}", "\x01{\"OP\":9,\"Count\":18446744073709551615}",
		"\x01{\"op\":7,\"name\":\"x\",\"reason\":\"\xff\xfe\"}", "\x01{\"op\":2}{\"op\":3}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := DecodeCommand(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			if !reflect.DeepEqual(c, Command{}) {
				t.Fatalf("failed decode returned %+v", c)
			}
			return
		}
		e1, err := EncodeCommand(c)
		if err != nil {
			t.Fatalf("a decoded command does not encode: %v", err)
		}
		if len(e1) <= MaxCommandSize { // a version-1 input can encode to more than the limit
			c2, err := DecodeCommand(e1)
			if err != nil {
				t.Fatalf("re-encoded command does not decode: %v\n%q", err, e1)
			}
			if !reflect.DeepEqual(normalize(c), normalize(c2)) {
				t.Fatalf("round trip changed the command:\n %+v\n %+v", c, c2)
			}
			if e2, _ := EncodeCommand(c2); !bytes.Equal(e1, e2) {
				t.Fatalf("encoding is not stable:\n%q\n%q", e1, e2)
			}
		}
		// Whatever decodes is safe to apply: no panic, a failure changes nothing, and the
		// invariants hold afterwards.
		for _, s := range []*State{NewState(Limits{}), populatedState(t)} {
			before := mustSnapshot(t, s)
			r := s.Apply(c)
			if r.Err != nil && !bytes.Equal(before, mustSnapshot(t, s)) {
				t.Fatalf("%+v failed with %v and changed the state", c, r.Err)
			}
			if err := checkState(s); err != nil {
				t.Fatalf("%+v: invariant: %v", c, err)
			}
		}
	})
}

func normalize(c Command) Command {
	if len(c.Value) == 0 {
		c.Value = nil
	}
	if len(c.Names) == 0 {
		c.Names = nil
	}
	return c
}

// snapshotSeeds returns real snapshots: empty, populated, and states after random
// command sequences.
func snapshotSeeds(t testing.TB) [][]byte {
	out := [][]byte{mustSnapshot(t, NewState(Limits{})), mustSnapshot(t, populatedState(t))}
	for seed := range uint64(6) {
		ch := newRandChooser(seed)
		m := newModel(true, Limits{})
		g := newGenerator(ch, m, 4)
		s := NewState(Limits{})
		for range 40 + 30*int(seed) {
			c := g.next()
			m.apply(c)
			s.Apply(c)
		}
		out = append(out, mustSnapshot(t, s))
	}
	for seed := range uint64(3) { // shared locks, semaphores, held and waiting lock sets
		s := NewState(Limits{})
		g := &modeGen{ch: newRandChooser(seed), s: s, slots: []LeaseID{lid(1), lid(2), lid(3), lid(4)}, nextID: 4}
		for range 150 {
			s.Apply(g.next())
		}
		out = append(out, mustSnapshot(t, s))
	}
	for seed := range uint64(2) { // groups with members, owners and drains
		s, err := runGroupSequence(newRandChooser(seed), seed, 60)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, mustSnapshot(t, s))
	}
	return out
}

func FuzzRestoreState(f *testing.F) {
	for _, b := range snapshotSeeds(f) {
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add([]byte{snapshotV1})
	f.Add([]byte("\x01{}"))
	f.Add([]byte("\x01null"))
	bad := inconsistentSnapshots()
	for _, name := range slices.Sorted(maps.Keys(bad)) {
		f.Add(snapJSON(bad[name]))
	}
	f.Add(snapJSON(`{"seq":18446744073709551615,"leases":[{"id":"@A","ttl":1}],"locks":[{"name":"x","class":2,"delayed":true,"delayMillis":1,"waiters":[{"lease":"@A"}]}],"tombstones":[{"id":"@B","reason":9}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := RestoreState(b, Limits{})
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			if s != nil {
				t.Fatal("a failed restore returned a state")
			}
			return
		}
		consistent := checkState(s)
		if consistent != nil && !knownRestoreGaps {
			t.Fatalf("RestoreState accepted an inconsistent state: %v", consistent)
		}
		b1 := mustSnapshot(t, s)
		s2, err := RestoreState(b1, Limits{})
		if err != nil {
			if consistent == nil {
				t.Fatalf("the snapshot of a restored state does not restore: %v\n%s", err, b1)
			}
			// A known gap (e.g. a zero-id tombstone, TestRestoreStateOutputRestores): still
			// make sure the state machine copes with it.
			for _, c := range probeCommands(s) {
				before := mustSnapshot(t, s)
				if r := s.Apply(c); r.Err != nil && !bytes.Equal(before, mustSnapshot(t, s)) {
					t.Fatalf("%+v failed with %v and changed the state", c, r.Err)
				}
			}
			return
		}
		if b2 := mustSnapshot(t, s2); !bytes.Equal(b1, b2) {
			t.Fatalf("snapshot -> restore -> snapshot is not stable:\n%s\n%s", b1, b2)
		}
		// Drive both copies with commands aimed at what the snapshot contains.
		for _, c := range probeCommands(s) {
			before := mustSnapshot(t, s)
			r1, r2 := s.Apply(c), s2.Apply(c)
			if err := sameResult(r1, r2); err != nil {
				t.Fatalf("%+v: %v", c, err)
			}
			after := mustSnapshot(t, s)
			if r1.Err != nil && !bytes.Equal(before, after) {
				t.Fatalf("%+v failed with %v and changed the state", c, r1.Err)
			}
			if !bytes.Equal(after, mustSnapshot(t, s2)) {
				t.Fatalf("after %+v the copies differ", c)
			}
			if consistent == nil {
				if err := checkState(s); err != nil {
					t.Fatalf("after %+v: invariant: %v", c, err)
				}
			}
		}
	})
}

// probeCommands returns commands touching the leases and locks of s: acquires, releases
// with the holder's token, cancels, force releases, end-delays, expiries, a reserve.
func probeCommands(s *State) []Command {
	var leases []LeaseID
	s.Leases(func(l *Lease) { leases = append(leases, l.ID) })
	leases = leases[:min(len(leases), 4)]
	names := s.locks.sortedNames()
	names = names[:min(len(names), 4)]
	names = append(names, "fresh")
	var out []Command
	for _, n := range names {
		if l := s.locks.Get(n); l != nil && l.Hold != nil {
			out = append(out, Command{Op: OpRelease, Lease: l.Hold.Lease, Name: n, Token: l.Hold.Token})
		}
		for _, id := range leases {
			out = append(out,
				Command{Op: OpAcquire, Lease: id, Name: n, Class: Correctness, Wait: true, DelayMillis: 5},
				Command{Op: OpCancelWait, Lease: id, Name: n})
		}
		out = append(out, Command{Op: OpEndDelay, Name: n}, Command{Op: OpForceRelease, Name: n})
	}
	for _, id := range leases {
		out = append(out, Command{Op: OpExpire, Lease: id})
	}
	out = append(out, Command{Op: OpReserve, Count: 1}, Command{Op: OpPut, Key: "k", Value: []byte("v")})
	for _, n := range names {
		out = append(out, Command{Op: OpEndDelay, Name: n})
	}
	return out
}

// FuzzApplySequence turns its input into a command sequence (one byte per choice) and
// runs it through the model, invariant, token, FIFO, snapshot, restore and twin checks of
// the property tests, against both State and a bare Locks table.
func FuzzApplySequence(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add(bytes.Repeat([]byte{40, 0, 0, 1, 0}, 50))
	for seed := range uint64(8) {
		r := rand.New(rand.NewPCG(seed, 77))
		b := make([]byte, 200+int(seed)*200)
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) == 0 {
			return
		}
		limits := Limits{}
		if b[0]&1 == 1 {
			limits = smallLimits
		}
		leases := 2 + int(b[0]>>1)%6
		data := b[1:]
		o := seqOptions{steps: 2000, leases: leases, limits: limits, forkOdds: 40, twin: b[0]&2 == 0}
		if err := runStateSequence(&byteChooser{b: slices.Clone(data)}, o); err != nil {
			t.Fatal(err)
		}
		if err := runTableSequence(&byteChooser{b: slices.Clone(data)}, 2000, leases, limits); err != nil {
			t.Fatalf("locks table: %v", err)
		}
	})
}
