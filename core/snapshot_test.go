package core

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"unsafe"
)

// oneShotSnapshot encodes s the way MarshalSnapshot did before snapshots were streamed:
// one json.Encoder call over the whole state (in version 2, with the lost locks). The streamed bytes must equal it, so that
// every snapshot ever written keeps restoring and equal states keep equal bytes.
func oneShotSnapshot(t testing.TB, s *State) []byte {
	t.Helper()
	type oneShot struct {
		Seq        uint64       `json:"seq"`
		Leases     []*Lease     `json:"leases"`
		Locks      []*Lock      `json:"locks"`
		Tombstones []tombstone  `json:"tombstones"`
		KVRev      uint64       `json:"kvRev,omitempty"`
		KV         []*Entry     `json:"kv,omitempty"`
		Members    []Member     `json:"members,omitempty"`
		ClusterID  string       `json:"clusterId,omitempty"`
		Keys       []keyRecord  `json:"idempotency,omitempty"`
		Lost       []lostRecord `json:"lost,omitempty"`
		Ledger     []Tenure     `json:"ledger,omitempty"`
	}
	snap := oneShot{Seq: s.seq, Leases: []*Lease{}, Locks: []*Lock{}, KVRev: s.kv.rev, Members: s.Members(), ClusterID: s.clusterID}
	snap.Keys, _ = s.keys.records()
	snap.Ledger = s.ledger.records(s.locks)
	slices.SortStableFunc(snap.Keys, func(a, b keyRecord) int { // in progress by key, then done as they were
		if a.Done || b.Done {
			return boolCompare(a.Done, b.Done)
		}
		return strings.Compare(a.Key, b.Key)
	})
	s.Leases(func(l *Lease) {
		snap.Leases = append(snap.Leases, l)
		for _, lk := range s.locks.Lost(l.ID) {
			snap.Lost = append(snap.Lost, lostRecord{Lease: l.ID, LostLock: lk})
		}
	})
	for _, n := range s.locks.sortedNames() {
		snap.Locks = append(snap.Locks, s.locks.Get(n))
	}
	for _, id := range s.tombs() {
		snap.Tombstones = append(snap.Tombstones, tombstone{ID: id, Reason: s.tombstones[id]})
	}
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range s.kv.entries {
			if !yield(k) {
				return
			}
		}
	}) {
		snap.KV = append(snap.KV, s.kv.entries[k])
	}
	var buf bytes.Buffer
	buf.WriteByte(snapshotV2)
	if err := json.NewEncoder(&buf).Encode(&snap); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// randomStates returns states reached by random command sequences (the property tests'
// generator), plus the empty and the populated state.
func randomStates(t testing.TB, n int) []*State {
	out := []*State{NewState(Limits{}), populatedState(t)}
	for seed := range uint64(n) {
		s := NewState(Limits{})
		g := newGenerator(newRandChooser(7000+seed), newModel(true, Limits{}), propertyLeases)
		for range 300 {
			c := g.next()
			g.m.apply(c)
			s.Apply(c)
		}
		out = append(out, s)
	}
	return out
}

func TestSnapshotStreamEqualsOneShotEncoding(t *testing.T) {
	for i, s := range randomStates(t, 40) {
		want := oneShotSnapshot(t, s)
		var buf bytes.Buffer
		n, err := s.SnapshotView().WriteTo(&buf)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf.Bytes(), want) || n != int64(len(want)) {
			t.Fatalf("state %d: WriteTo wrote %d bytes\n%s\nwant %d\n%s", i, n, buf.Bytes(), len(want), want)
		}
		if got := mustSnapshot(t, s); !bytes.Equal(got, want) {
			t.Fatalf("state %d: MarshalSnapshot differs from WriteTo", i)
		}
	}
}

// TestSnapshotViewIsPointInTime: a view taken before changes writes the state as it was
// then, however the state changes before WriteTo runs (the FSM keeps applying while raft
// persists).
func TestSnapshotViewIsPointInTime(t *testing.T) {
	for i, s := range randomStates(t, 20) {
		want := mustSnapshot(t, s)
		v := s.SnapshotView()
		g := newGenerator(newRandChooser(9000+uint64(i)), newModel(true, Limits{}), propertyLeases)
		for range 200 {
			s.Apply(g.next())
		}
		for _, c := range probeCommands(s) {
			s.Apply(c)
		}
		for range 2 { // WriteTo may be called again
			var buf bytes.Buffer
			if _, err := v.WriteTo(&buf); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(buf.Bytes(), want) {
				t.Fatalf("state %d: the view changed with the state:\n%s\nwant\n%s", i, buf.Bytes(), want)
			}
		}
	}
}

// TestSnapshotViewConcurrentWithApply runs WriteTo on another goroutine while the state
// keeps applying, as raft does; with -race it finds any record the two share and change.
func TestSnapshotViewConcurrentWithApply(t *testing.T) {
	s := populatedState(t)
	g := newGenerator(newRandChooser(42), newModel(true, Limits{}), propertyLeases)
	for round := range 20 {
		want := mustSnapshot(t, s)
		v := s.SnapshotView()
		var wg sync.WaitGroup
		var got bytes.Buffer
		var err error
		wg.Go(func() { _, err = v.WriteTo(&got) })
		for range 50 {
			s.Apply(g.next())
		}
		for _, c := range probeCommands(s) {
			s.Apply(c)
		}
		wg.Wait()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Bytes(), want) {
			t.Fatalf("round %d: concurrent WriteTo wrote a different state", round)
		}
	}
}

func TestReadSnapshotStreams(t *testing.T) {
	for i, s := range randomStates(t, 10) {
		b := mustSnapshot(t, s)
		r, err := ReadSnapshot(iotest.HalfReader(iotest.OneByteReader(bytes.NewReader(b))), Limits{})
		if err != nil {
			t.Fatalf("state %d: %v", i, err)
		}
		if got := mustSnapshot(t, r); !bytes.Equal(got, b) {
			t.Fatalf("state %d: restored state encodes differently", i)
		}
		if err := checkState(r); err != nil {
			t.Fatalf("state %d: %v", i, err)
		}
	}
}

// TestReadSnapshotReaderError: a failing reader is reported as such, not as corruption.
func TestReadSnapshotReaderError(t *testing.T) {
	b := mustSnapshot(t, populatedState(t))
	boom := errors.New("disk on fire")
	for _, cut := range []int{0, 1, len(b) / 2, len(b) - 1} {
		r := io.MultiReader(bytes.NewReader(b[:cut]), iotest.ErrReader(boom))
		s, err := ReadSnapshot(r, Limits{})
		if !errors.Is(err, boom) || errors.Is(err, ErrCorrupt) || s != nil {
			t.Errorf("cut at %d: ReadSnapshot = %v, %v; want the reader's error", cut, s, err)
		}
	}
}

// TestReadSnapshotFieldOrder: fields come in the order they are written, once each.
func TestReadSnapshotFieldOrder(t *testing.T) {
	for name, body := range map[string]string{
		"locks before leases": `{"seq":1,"locks":[{"name":"x","class":2,"hold":{"lease":"@A","token":1}}],"leases":[{"id":"@A","ttl":5}],"tombstones":null}`,
		"seq twice":           `{"seq":1,"seq":2,"leases":[],"locks":[],"tombstones":null}`,
		"kv before kvRev":     `{"seq":0,"leases":[],"locks":[],"tombstones":null,"kv":[{"key":"k","version":1}],"kvRev":1}`,
		"leases not an array": `{"seq":0,"leases":{},"locks":[],"tombstones":null}`,
		"top level array":     `[]`,
		"top level null":      `null`,
		"key in other case":   `{"SEQ":0}`,
	} {
		if _, err := RestoreState(snapJSON(body), Limits{}); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: RestoreState = %v, want ErrCorrupt", name, err)
		}
	}
	for name, body := range map[string]string{
		"empty object":   `{}`,
		"only some":      `{"leases":[{"id":"@A","ttl":5}],"members":[{"id":"n1","apiAddr":"h:1"}]}`,
		"null arrays":    `{"seq":0,"leases":null,"locks":null,"tombstones":null,"kv":null,"members":null}`,
		"spaces":         " {\n \"seq\" : 3 ,\"leases\":[ ] , \"locks\" : [],\"tombstones\":null }\n\n",
		"no end newline": `{"seq":0,"leases":[],"locks":[],"tombstones":null}`,
	} {
		if _, err := RestoreState(snapJSON(body), Limits{}); err != nil {
			t.Errorf("%s: RestoreState = %v", name, err)
		}
	}
	if !strings.HasPrefix(string(mustSnapshot(t, NewState(Limits{}))), "\x02{\"seq\":0,\"leases\":[],\"locks\":[],\"tombstones\":null}") {
		t.Error("the empty snapshot changed")
	}
}

// TestSnapshotLogIndex: a backup's log position (AtLogIndex) comes back from
// ReadSnapshot; a snapshot without one (raft's, and old backups) reads as 0 and encodes
// with no "logIndex" field, as before the field existed.
func TestSnapshotLogIndex(t *testing.T) {
	s := populatedState(t)
	plain := mustSnapshot(t, s)
	if bytes.Contains(plain, []byte(`"logIndex"`)) {
		t.Fatal("a snapshot with no log position wrote one")
	}
	v := s.SnapshotView()
	v.AtLogIndex(1 << 40)
	b, err := v.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	r, err := RestoreState(b, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if got := r.SnapshotLogIndex(); got != 1<<40 {
		t.Fatalf("SnapshotLogIndex = %d, want %d", got, uint64(1<<40))
	}
	if p, err := RestoreState(plain, Limits{}); err != nil || p.SnapshotLogIndex() != 0 {
		t.Fatalf("a snapshot with no log position: %v, index %d", err, p.SnapshotLogIndex())
	}
}

// TestLockRecordSize guards the per-lock memory: a held lock's record is 64 bytes on
// 64-bit platforms (BenchmarkHeldLocksMemory measures the whole cost per lock).
func TestLockRecordSize(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) == 8 && unsafe.Sizeof(lock{}) > 64 {
		t.Errorf("lock record is %d bytes, want at most 64", unsafe.Sizeof(lock{}))
	}
}

func boolCompare(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}
