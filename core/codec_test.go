package core

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

// sampleCommands has one command of every op with every field its op uses.
func sampleCommands() []Command {
	return []Command{
		{Op: OpGrant, Lease: leaseA, TTLMillis: 10_000},
		{Op: OpRevoke, Lease: leaseA},
		{Op: OpDisconnect, Lease: leaseB},
		{Op: OpCampaign, Lease: leaseA, Name: "svc/primary", Value: []byte("10.0.0.1:80"), Holder: Holder{Host: "h", PID: 3}, Wait: true},
		{Op: OpProclaim, Lease: leaseA, Name: "svc/primary", Token: 9, Value: []byte("10.0.0.2:80")},
		{Op: OpResign, Lease: leaseA, Name: "svc/primary", Token: 9},
		{Op: OpWithdraw, Lease: leaseB, Name: "svc/primary"},
		{Op: OpExpire, Lease: leaseB},
		{Op: OpAcquire, Lease: leaseA, Name: "orders/42", Class: Correctness, Holder: Holder{Host: "web-1", PID: 9, Note: "<script>&é"}, Wait: true, DelayMillis: 500},
		{Op: OpRelease, Lease: leaseA, Name: "orders/42", Token: 7},
		{Op: OpCancelWait, Lease: leaseC, Name: "orders/42"},
		{Op: OpForceRelease, Name: "orders/42", Reason: "operator: stuck"},
		{Op: OpEndDelay, Name: "orders/42"},
		{Op: OpReserve, Count: 1000},
		{Op: OpPut, Key: "cfg/x", Value: []byte{0, 1, 2, 0xff}, Name: "orders/42", Token: 7, RequireHolder: true, CheckVersion: true, Version: 3},
		{Op: OpDelete, Key: "cfg/x", Name: "orders/42", Token: 8},
		{Op: OpSetMember, Node: "node-1", Addr: "10.0.0.1:7740", FastLane: "10.0.0.1:7742"},
		{Op: OpRemoveMember, Node: "node-1"},
		{Op: OpSetClusterID, ClusterID: testClusterID},
		{Op: OpAcquire, Lease: leaseA, Name: "readers", Class: Correctness, Mode: Shared, Wait: true},
		{Op: OpAcquire, Lease: leaseB, Name: "pool", Class: Correctness, Mode: Semaphore, Limit: 8},
		{Op: OpAcquire, Lease: leaseC, Names: []string{"a", "b/c", "z"}, Class: Correctness, Mode: Shared, Wait: true, DelayMillis: 100},
		{Op: OpRelease, Lease: leaseA, Name: "orders/42", Token: 9, WallMillis: 1_796_000_000_000},
		{Op: OpExpire, Lease: leaseB, WallMillis: -1},
		{Op: OpGroupCreate, Name: "orders", Count: 64, DrainMillis: 10_000},
		{Op: OpGroupJoin, Name: "orders", Member: "worker-1", Lease: leaseA, Weight: 3},
		{Op: OpGroupLeave, Name: "orders", Member: "worker-1", Lease: leaseA},
		{Op: OpGroupRelease, Name: "orders", Partition: 63, Token: 9, Lease: leaseA},
		{Op: OpGroupDrainEnd, Name: "orders", Partition: 1, Token: 9},
	}
}

func TestCommandRoundTrip(t *testing.T) {
	for _, c := range sampleCommands() {
		b, err := EncodeCommand(c)
		if err != nil {
			t.Fatal(err)
		}
		if b[0] != commandV2 {
			t.Fatalf("%v: version byte %d", c.Op, b[0])
		}
		got, err := DecodeCommand(b)
		if err != nil {
			t.Fatalf("%v: %v", c.Op, err)
		}
		if !reflect.DeepEqual(got, c) {
			t.Fatalf("%v round trip:\n got  %+v\n want %+v", c.Op, got, c)
		}
	}
}

// encodeV1 writes c in the version-1 (JSON) format that logs written before version 2
// hold.
func encodeV1(t testing.TB, c Command) []byte {
	t.Helper()
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	return append([]byte{commandV1}, append(b, '\n')...)
}

// TestDecodeCommandV1 keeps logs written before the binary format readable: every
// version-1 command decodes to what was encoded.
func TestDecodeCommandV1(t *testing.T) {
	for _, c := range sampleCommands() {
		got, err := DecodeCommand(encodeV1(t, c))
		if err != nil {
			t.Fatalf("%v: %v", c.Op, err)
		}
		if !reflect.DeepEqual(got, c) {
			t.Fatalf("%v:\n got  %+v\n want %+v", c.Op, got, c)
		}
	}
}

func TestDecodeCommandRejects(t *testing.T) {
	v1 := encodeV1(t, Command{Op: OpRevoke, Lease: leaseA})
	v2, _ := EncodeCommand(Command{Op: OpRelease, Lease: leaseA, Name: "a", Token: 7})
	mask := func(m uint64, rest ...byte) []byte { // a v2 release with the given mask
		return append(binary.AppendUvarint([]byte{commandV2, byte(OpRelease)}, m), rest...)
	}
	for name, b := range map[string][]byte{
		"empty":         nil,
		"version 0":     append([]byte{0}, v1[1:]...),
		"version 3":     append([]byte{3}, v2[1:]...),
		"v1 as v2":      append([]byte{commandV2}, v1[1:]...),
		"v2 as v1":      append([]byte{commandV1}, v2[1:]...),
		"version only":  {commandV1},
		"v2 only":       {commandV2},
		"v2 no mask":    {commandV2, byte(OpRelease)},
		"v2 truncated":  v2[:len(v2)-1],
		"v2 bad varint": mask(1<<fToken, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff),
		"v2 zero lease": mask(1<<fLease, make([]byte, 16)...),
		"v2 zero token": mask(1<<fToken, 0),
		"v2 empty name": mask(1<<fName, 0),
		"v2 long name":  mask(1<<fName, 200, 1, 'a'),
		"v2 big pid":    mask(1<<fHolderPID, 0x80, 0x80, 0x80, 0x80, 0x10),
		"v2 unknown":    mask(1 << numFields),
		"not json":      []byte("\x01hello"),
		"truncated":     v1[:len(v1)-4],
		"unknown field": []byte("\x01{\"op\":2,\"surprise\":1}"),
		"bad lease hex": []byte("\x01{\"op\":2,\"lease\":\"zz\"}"),
		"zero lease":    []byte("\x01{\"op\":2,\"lease\":\"00000000000000000000000000000000\"}"),
		"op too big":    []byte("\x01{\"op\":300}"),
		"negative op":   []byte("\x01{\"op\":-1}"),
		"wrong type":    []byte("\x01{\"op\":\"grant\"}"),
		"array":         []byte("\x01[1,2]"),
		"too big":       append([]byte("\x01{\"reason\":\""), bytes.Repeat([]byte("a"), MaxCommandSize)...),
	} {
		if _, err := DecodeCommand(b); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: DecodeCommand = %v, want ErrCorrupt", name, err)
		}
	}
}

// TestDecodeCommandRejectsTrailingData: "Any malformed input yields an error wrapping
// ErrCorrupt". A log entry with bytes after the JSON value was not written by
// EncodeCommand; today it decodes as if the tail were not there.
//
// KNOWN BUG (fails today): codec.go DecodeCommand (line 42) and RestoreState (line 95)
// stop after the first JSON value. Fix: after dec.Decode succeeds, require the end of
// the input (the encoder's trailing newline is skipped by Token):
//
//	if _, err := dec.Token(); err != io.EOF {
//		return Command{}, fmt.Errorf("%w: trailing data after the command", ErrCorrupt)
//	}
func TestDecodeCommandRejectsTrailingData(t *testing.T) {
	good, _ := EncodeCommand(Command{Op: OpExpire, Lease: leaseA})
	for _, good := range [][]byte{good, encodeV1(t, Command{Op: OpExpire, Lease: leaseA})} {
		for _, tail := range []string{"garbage", "{\"op\":1}", "]", "\x00"} {
			b := append(bytes.Clone(good), tail...)
			if c, err := DecodeCommand(b); !errors.Is(err, ErrCorrupt) {
				t.Errorf("DecodeCommand(%q) = %+v, %v; want ErrCorrupt", b, c, err)
			}
		}
	}
	snap := mustSnapshot(t, populatedState(t))
	if _, err := RestoreState(append(snap, "{}"...), Limits{}); !errors.Is(err, ErrCorrupt) {
		t.Errorf("RestoreState with trailing data = %v, want ErrCorrupt", err)
	}
}

// populatedState returns a State with leases, held, waited and delayed locks, tombstones,
// KV entries (live and fenced-deleted) and members.
func populatedState(t testing.TB) *State {
	t.Helper()
	s := NewState(Limits{})
	for _, c := range []Command{
		{Op: OpGrant, Lease: leaseA, TTLMillis: 1000},
		{Op: OpGrant, Lease: leaseB, TTLMillis: 2000},
		{Op: OpGrant, Lease: leaseC, TTLMillis: 3000},
		{Op: OpGrant, Lease: leaseD, TTLMillis: 4000},
		{Op: OpAcquire, Lease: leaseA, Name: "held", Class: Correctness, Holder: Holder{Host: "h", PID: 1, Note: "<n>"}},
		{Op: OpAcquire, Lease: leaseB, Name: "held", Class: Correctness, Wait: true, DelayMillis: 20},
		{Op: OpAcquire, Lease: leaseC, Name: "held", Class: Correctness, Wait: true, Holder: Holder{Note: "c"}},
		{Op: OpAcquire, Lease: leaseD, Name: "delayed", Class: Correctness, DelayMillis: 300},
		{Op: OpAcquire, Lease: leaseC, Name: "delayed", Class: Correctness, Wait: true},
		{Op: OpExpire, Lease: leaseD},
		{Op: OpGrant, Lease: lid(0xE), TTLMillis: 1},
		{Op: OpRevoke, Lease: lid(0xE)},
		{Op: OpReserve, Count: 10},
		{Op: OpPut, Key: "k/live", Value: []byte("v")},
		{Op: OpPut, Key: "k/fenced", Value: []byte("w"), Name: "held", Token: 1},
		{Op: OpDelete, Key: "k/fenced", Name: "held", Token: 1},
		{Op: OpSetMember, Node: "n1", Addr: "127.0.0.1:7740"},
		{Op: OpAcquire, Lease: leaseA, Name: "forced", Class: Correctness},
		{Op: OpForceRelease, Name: "forced", Reason: "operator: stuck \"job\""},
		{Op: OpSetMember, Node: "n2", Addr: "127.0.0.1:17740", FastLane: "127.0.0.1:17742"},
		{Op: OpSetClusterID, ClusterID: testClusterID},
	} {
		if r := s.Apply(c); r.Err != nil {
			t.Fatalf("%+v: %v", c, r.Err)
		}
	}
	return s
}

func TestSnapshotRoundTrip(t *testing.T) {
	for name, s := range map[string]*State{"empty": NewState(Limits{}), "populated": populatedState(t)} {
		t.Run(name, func(t *testing.T) {
			b := mustSnapshot(t, s)
			if again := mustSnapshot(t, s); !bytes.Equal(b, again) {
				t.Fatal("two snapshots of one state differ")
			}
			r, err := RestoreState(b, Limits{})
			if err != nil {
				t.Fatal(err)
			}
			if got := mustSnapshot(t, r); !bytes.Equal(got, b) {
				t.Fatalf("restored state encodes differently:\n%s\n%s", b, got)
			}
			if err := checkState(r); err != nil {
				t.Fatal(err)
			}
			// The restored state answers the same queries.
			if r.LastToken() != s.LastToken() || r.NumLeases() != s.NumLeases() || r.KVRevision() != s.KVRevision() ||
				r.EndedReason(lid(0xE)) != s.EndedReason(lid(0xE)) || r.EndedReason(leaseD) != s.EndedReason(leaseD) ||
				!reflect.DeepEqual(r.Members(), s.Members()) || r.ClusterID() != s.ClusterID() || !reflect.DeepEqual(r.Locks().HeldBy(leaseA), s.Locks().HeldBy(leaseA)) ||
				r.Locks().LeaseLocks(leaseC) != s.Locks().LeaseLocks(leaseC) {
				t.Fatal("restored state answers differently")
			}
			// And behaves the same from here on.
			for _, c := range []Command{
				{Op: OpExpire, Lease: leaseA},
				{Op: OpEndDelay, Name: "delayed"},
				{Op: OpForceRelease, Name: "held"},
				{Op: OpPut, Key: "k/fenced", Value: []byte("x"), Name: "held", Token: 1},
				{Op: OpReserve, Count: 3},
				{Op: OpRevoke, Lease: leaseC},
			} {
				if err := sameResult(s.Apply(c), r.Apply(c)); err != nil {
					t.Fatalf("%+v: %v", c, err)
				}
				if !bytes.Equal(mustSnapshot(t, s), mustSnapshot(t, r)) {
					t.Fatalf("after %+v the states differ", c)
				}
			}
		})
	}
}

func TestRestoreStateKeepsIndexUsable(t *testing.T) {
	s, err := RestoreState(mustSnapshot(t, populatedState(t)), Limits{MaxLocksPerLease: 2})
	if err != nil {
		t.Fatal(err)
	}
	// C waits for two locks: the restored index must know, and the restored limits apply.
	if r := s.Apply(acq(leaseC, "third")); !errors.Is(r.Err, ErrTooManyLocks) {
		t.Fatalf("restored index or limits lost: %v", r.Err)
	}
	r := s.Apply(Command{Op: OpRevoke, Lease: leaseC})
	want := []Effect{
		{Kind: EffectWaitEnded, Lease: leaseC, Name: "delayed"},
		{Kind: EffectWaitEnded, Lease: leaseC, Name: "held"},
		{Kind: EffectLeaseEnded, Lease: leaseC, Reason: EndRevoked},
	}
	if !effectsEqual(r.Effects, want) {
		t.Fatalf("effects %+v", r.Effects)
	}
	if err := checkState(s); err != nil {
		t.Fatal(err)
	}
}

// snapJSON builds a version-1 snapshot from JSON text for the lease ids A..D written as
// @A, @B, @C, @D.
func snapJSON(body string) []byte { return snapJSONVersion(snapshotV1, body) }

// snapJSONVersion is snapJSON for a given snapshot version.
func snapJSONVersion(version byte, body string) []byte {
	r := strings.NewReplacer("@A", leaseA.String(), "@B", leaseB.String(), "@C", leaseC.String(), "@D", leaseD.String())
	return append([]byte{version}, r.Replace(body)...)
}

// TestRestoreStateRejects covers the checks RestoreState makes today.
func TestRestoreStateRejects(t *testing.T) {
	for name, b := range map[string][]byte{
		"empty":               nil,
		"version 3":           append([]byte{3}, mustSnapshot(t, NewState(Limits{}))[1:]...),
		"lost in version 1":   snapJSON(`{"seq":1,"leases":[{"id":"@A","ttl":5}],"locks":[],"tombstones":null,"lost":[{"lease":"@A","name":"x","token":1}]}`),
		"lost, unknown lease": snapJSONVersion(2, `{"seq":1,"leases":[{"id":"@A","ttl":5}],"locks":[],"tombstones":null,"lost":[{"lease":"@B","name":"x","token":1}]}`),
		"lost, future token":  snapJSONVersion(2, `{"seq":1,"leases":[{"id":"@A","ttl":5}],"locks":[],"tombstones":null,"lost":[{"lease":"@A","name":"x","token":2}]}`),
		"lost, no token":      snapJSONVersion(2, `{"seq":1,"leases":[{"id":"@A","ttl":5}],"locks":[],"tombstones":null,"lost":[{"lease":"@A","name":"x"}]}`),
		"lost, bad name":      snapJSONVersion(2, `{"seq":1,"leases":[{"id":"@A","ttl":5}],"locks":[],"tombstones":null,"lost":[{"lease":"@A","name":"","token":1}]}`),
		"lost, too many":      snapJSONVersion(2, `{"seq":1,"leases":[{"id":"@A","ttl":5}],"locks":[],"tombstones":null,"lost":[`+strings.Repeat(`{"lease":"@A","name":"x","token":1},`, MaxLostPerLease)+`{"lease":"@A","name":"x","token":1}]}`),
		"lost, unknown field": snapJSONVersion(2, `{"seq":1,"leases":[{"id":"@A","ttl":5}],"locks":[],"tombstones":null,"lost":[{"lease":"@A","name":"x","token":1,"by":"x"}]}`),
		"junk":                []byte("\x01not json"),
		"unknown field":       snapJSON(`{"seq":0,"leases":[],"locks":[],"tombstones":null,"extra":1}`),
		"null lease":          snapJSON(`{"seq":0,"leases":[null],"locks":[],"tombstones":null}`),
		"lease without id":    snapJSON(`{"seq":0,"leases":[{"ttl":5}],"locks":[],"tombstones":null}`),
		"duplicate lease":     snapJSON(`{"seq":0,"leases":[{"id":"@A","ttl":5},{"id":"@A","ttl":5}],"locks":[],"tombstones":null}`),
		"null lock":           snapJSON(`{"seq":1,"leases":[],"locks":[null],"tombstones":null}`),
		"bad lock name":       snapJSON(`{"seq":1,"leases":[{"id":"@A","ttl":5}],"locks":[{"name":"a//b","class":2,"hold":{"lease":"@A","token":1}}],"tombstones":null}`),
		"duplicate lock":      snapJSON(`{"seq":2,"leases":[{"id":"@A","ttl":5}],"locks":[{"name":"x","class":2,"hold":{"lease":"@A","token":1}},{"name":"x","class":2,"hold":{"lease":"@A","token":2}}],"tombstones":null}`),
		"free lock":           snapJSON(`{"seq":1,"leases":[{"id":"@A","ttl":5}],"locks":[{"name":"x","class":2,"waiters":[{"lease":"@A"}]}],"tombstones":null}`),
		"holder unknown":      snapJSON(`{"seq":1,"leases":[],"locks":[{"name":"x","class":2,"hold":{"lease":"@A","token":1}}],"tombstones":null}`),
		"future token":        snapJSON(`{"seq":1,"leases":[{"id":"@A","ttl":5}],"locks":[{"name":"x","class":2,"hold":{"lease":"@A","token":2}}],"tombstones":null}`),
		"waiter unknown":      snapJSON(`{"seq":1,"leases":[{"id":"@A","ttl":5}],"locks":[{"name":"x","class":2,"hold":{"lease":"@A","token":1},"waiters":[{"lease":"@B"}]}],"tombstones":null}`),
		"bad member":          snapJSON(`{"seq":0,"leases":[],"locks":[],"tombstones":null,"members":[{"id":"a b","apiAddr":"h:1"}]}`),
		"bad member addr":     snapJSON(`{"seq":0,"leases":[],"locks":[],"tombstones":null,"members":[{"id":"n1","apiAddr":"h"}]}`),
		"null kv":             snapJSON(`{"seq":0,"leases":[],"locks":[],"tombstones":null,"kvRev":1,"kv":[null]}`),
		"kv future version":   snapJSON(`{"seq":0,"leases":[],"locks":[],"tombstones":null,"kvRev":1,"kv":[{"key":"k","version":2}]}`),
		"kv bad key":          snapJSON(`{"seq":0,"leases":[],"locks":[],"tombstones":null,"kvRev":1,"kv":[{"key":"/k","version":1}]}`),
		"kv duplicate key":    snapJSON(`{"seq":0,"leases":[],"locks":[],"tombstones":null,"kvRev":2,"kv":[{"key":"k","version":1},{"key":"k","version":2}]}`),
		"lease id not hex":    snapJSON(`{"seq":0,"leases":[{"id":"xyz","ttl":5}],"locks":[],"tombstones":null}`),
		"negative seq":        snapJSON(`{"seq":-1,"leases":[],"locks":[],"tombstones":null}`),
		"truncated snapshot":  mustSnapshot(t, populatedState(t))[:100],
		"bad fast lane addr":  snapJSON(`{"seq":0,"leases":[],"locks":[],"tombstones":null,"members":[{"id":"n1","apiAddr":"h:1","fastLaneAddr":"h"}]}`),
		"bad cluster id":      snapJSON(`{"seq":0,"leases":[],"locks":[],"tombstones":null,"clusterId":"XYZ"}`),
		"zero cluster id":     snapJSON(`{"seq":0,"leases":[],"locks":[],"tombstones":null,"clusterId":"00000000000000000000000000000000"}`),
		"cluster id first":    snapJSON(`{"seq":0,"leases":[],"locks":[],"tombstones":null,"clusterId":"` + testClusterID + `","members":[]}`),
	} {
		if _, err := RestoreState(b, Limits{}); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: RestoreState = %v, want ErrCorrupt", name, err)
		}
	}
}

// TestRestoreStateRejectsInconsistentLocks: RestoreState promises "Malformed or
// inconsistent input yields an error wrapping ErrCorrupt", and checkRestoredLock exists
// for that, but it does not check the queue (a lease queued twice, the holder queued for
// its own lock), the class, the delay fields, or the tokens' uniqueness. Each snapshot
// below decodes into a state that Apply can never reach and that breaks the lock
// invariants (see TestRestoredDuplicateWaiterIsNeverGrantedAfterItsLeaseEnds for what
// follows).
//
// KNOWN BUG (fails today): codec.go checkRestoredLock (line 131). Proposed fix, after the
// existing switch:
//
//	if l.Class != Correctness { return bad("class") }
//	if l.Hold != nil && (l.Delayed || l.Hold.Token == 0 || l.Hold.DelayMillis < 0) { return bad(...) }
//	if l.Delayed != (l.DelayMillis > 0) { return bad(...) }
//	seen := map[LeaseID]bool{}; if l.Hold != nil { seen[l.Hold.Lease] = true }
//	for _, w := range l.Waiters { if seen[w.Lease] || w.DelayMillis < 0 { return bad(...) }; seen[w.Lease] = true }
//
// and in RestoreState keep a set of hold tokens across locks (a token held twice is
// corrupt) and reject leases with TTLMillis <= 0 (line 101). RestoreState also reads
// operator backups (replication.RestoreDataDir), not only raft's checksummed snapshots.
func TestRestoreStateRejectsInconsistentLocks(t *testing.T) {
	for name, body := range inconsistentSnapshots() {
		t.Run(name, func(t *testing.T) {
			s, err := RestoreState(snapJSON(body), Limits{})
			if !errors.Is(err, ErrCorrupt) {
				inv := "<nil>"
				if s != nil {
					if e := checkState(s); e != nil {
						inv = e.Error()
					}
				}
				t.Errorf("RestoreState accepted an inconsistent snapshot (err %v); invariant broken: %s", err, inv)
			}
		})
	}
}

// TestRestoredDuplicateWaiterIsNeverGrantedAfterItsLeaseEnds shows the harm of the gap
// above: a lease queued twice keeps its second place after it ends, and is then granted
// the lock — a lock held by a lease that does not exist, which no release can free and
// which blocks every other acquirer until an operator force-releases it. It passes once
// RestoreState rejects the snapshot (or once the state machine copes with it).
func TestRestoredDuplicateWaiterIsNeverGrantedAfterItsLeaseEnds(t *testing.T) {
	body := `{"seq":1,"leases":[{"id":"@A","ttl":1000},{"id":"@B","ttl":1000},{"id":"@C","ttl":1000}],` +
		`"locks":[{"name":"x","class":2,"hold":{"lease":"@A","token":1},"waiters":[{"lease":"@B"},{"lease":"@B"},{"lease":"@C"}]}],"tombstones":null}`
	s, err := RestoreState(snapJSON(body), Limits{})
	if err != nil {
		return // rejected as corrupt: fine
	}
	s.Apply(Command{Op: OpRevoke, Lease: leaseB})
	r := s.Apply(Command{Op: OpRelease, Lease: leaseA, Name: "x", Token: 1})
	for _, e := range r.Effects {
		if e.Kind == EffectGranted && s.Lease(e.Lease) == nil {
			t.Errorf("lock %q granted (token %d) to lease %s, which ended before", e.Name, e.Token, e.Lease)
		}
	}
	if l := s.Locks().Get("x"); l == nil || l.Hold == nil || l.Hold.Lease != leaseC {
		t.Errorf("C, the only live waiter, should hold x; lock is %+v", l)
	}
}

// TestRestoreStateOutputRestores: whatever RestoreState accepts, MarshalSnapshot of the
// result must restore again — otherwise a node that restored it (from a peer, or from an
// operator's backup through replication.RestoreDataDir) writes raft snapshots that neither
// it nor its followers can load. Found by FuzzRestoreState.
//
// KNOWN BUG (fails today): a tombstone with the zero lease id ("tombstones":[{}] or
// "id":null) is accepted, and MarshalSnapshot then writes "id":"000…0", which
// LeaseID.UnmarshalText rejects. Fix in codec.go RestoreState, in the tombstone loop:
//
//	if t.ID.IsZero() { return nil, fmt.Errorf("%w: bad tombstone in snapshot", ErrCorrupt) }
func TestRestoreStateOutputRestores(t *testing.T) {
	for name, body := range map[string]string{
		"tombstone without id": `{"seq":0,"leases":[],"locks":[],"tombstones":[{}]}`,
		"tombstone null id":    `{"seq":0,"leases":[],"locks":[],"tombstones":[{"id":null,"reason":1}]}`,
		"odd tombstone reason": `{"seq":0,"leases":[],"locks":[],"tombstones":[{"id":"@A","reason":9}]}`,
		"duplicate tombstones": `{"seq":0,"leases":[],"locks":[],"tombstones":[{"id":"@A","reason":1},{"id":"@A","reason":2}]}`,
	} {
		t.Run(name, func(t *testing.T) {
			s, err := RestoreState(snapJSON(body), Limits{})
			if err != nil {
				if !errors.Is(err, ErrCorrupt) {
					t.Fatal(err)
				}
				return // rejected: fine
			}
			b := mustSnapshot(t, s)
			if _, err := RestoreState(b, Limits{}); err != nil {
				t.Errorf("RestoreState accepted %s, but its own snapshot does not restore: %v\n%s", body, err, b)
			}
		})
	}
}

// inconsistentSnapshots are snapshots (for snapJSON) of states Apply can never reach.
func inconsistentSnapshots() map[string]string {
	lease := func(ids ...string) string {
		var parts []string
		for _, id := range ids {
			parts = append(parts, `{"id":"`+id+`","ttl":1000}`)
		}
		return `"leases":[` + strings.Join(parts, ",") + `]`
	}
	return map[string]string{
		"lease queued twice":           `{"seq":1,` + lease("@A", "@B") + `,"locks":[{"name":"x","class":2,"hold":{"lease":"@A","token":1},"waiters":[{"lease":"@B"},{"lease":"@B"}]}],"tombstones":null}`,
		"holder queued for its lock":   `{"seq":1,` + lease("@A", "@B") + `,"locks":[{"name":"x","class":2,"hold":{"lease":"@A","token":1},"waiters":[{"lease":"@A"}]}],"tombstones":null}`,
		"efficiency lock in the state": `{"seq":1,` + lease("@A") + `,"locks":[{"name":"x","class":1,"hold":{"lease":"@A","token":1}}],"tombstones":null}`,
		"unknown class":                `{"seq":1,` + lease("@A") + `,"locks":[{"name":"x","class":7,"hold":{"lease":"@A","token":1}}],"tombstones":null}`,
		"held and delayed":             `{"seq":1,` + lease("@A") + `,"locks":[{"name":"x","class":2,"hold":{"lease":"@A","token":1},"delayed":true,"delayMillis":5}],"tombstones":null}`,
		"delayed without a delay":      `{"seq":1,` + lease("@A") + `,"locks":[{"name":"x","class":2,"delayed":true,"waiters":[{"lease":"@A"}]}],"tombstones":null}`,
		"token zero":                   `{"seq":1,` + lease("@A") + `,"locks":[{"name":"x","class":2,"hold":{"lease":"@A","token":0}}],"tombstones":null}`,
		"one token held twice":         `{"seq":1,` + lease("@A", "@B") + `,"locks":[{"name":"x","class":2,"hold":{"lease":"@A","token":1}},{"name":"y","class":2,"hold":{"lease":"@B","token":1}}],"tombstones":null}`,
		"negative hold delay":          `{"seq":1,` + lease("@A") + `,"locks":[{"name":"x","class":2,"hold":{"lease":"@A","token":1,"delay":-5}}],"tombstones":null}`,
		"lease with no ttl":            `{"seq":0,"leases":[{"id":"@A","ttl":0}],"locks":[],"tombstones":null}`,
	}
}

// TestRestoreSnapshotBeforeFastLaneAndClusterID: a snapshot written before members had a
// fast-lane address and the state a cluster ID restores, with neither.
func TestRestoreSnapshotBeforeFastLaneAndClusterID(t *testing.T) {
	s, err := RestoreState(snapJSON(`{"seq":3,"leases":[],"locks":[],"tombstones":null,"members":[{"id":"n1","apiAddr":"h:1"}]}`), Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if m := s.Members(); len(m) != 1 || m[0] != (Member{ID: "n1", APIAddr: "h:1"}) || s.ClusterID() != "" {
		t.Fatalf("members %+v, cluster ID %q", m, s.ClusterID())
	}
	// An OpSetMember of a log written before fast-lane addresses decodes too.
	b := appendCommand(nil, Command{Op: OpSetMember, Node: "n1", Addr: "h:1"})
	if c, err := DecodeCommand(b); err != nil || c.FastLane != "" {
		t.Fatalf("decode %+v, %v", c, err)
	}
}
