package core

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Snapshot encoding versions; the first byte of a snapshot names its format.
//
// Version 1 is that byte followed by one JSON object (and a newline) with, in this order:
// "seq", "leases", "locks", "tombstones", then "kvRev", "kv", "members", "clusterId" and
// "idempotency" when they are not empty. Leases are in id order, locks in name order, KV entries in key
// order, members in id order and tombstones oldest first, so equal states encode to equal
// bytes. Idempotency keys in progress come in key order before the done keys, oldest
// first. A member's "fastLaneAddr", the "clusterId" and "idempotency" came later:
// snapshots written before them have none, and restore with no fast-lane addresses, no
// cluster ID and no idempotency keys.
//
// Version 2, written since lost locks are part of the replicated state, is version 1
// with one more field at the end, "lost" when not empty: every lease's lost locks
// (LostLock and the lease's "lease" id), leases in id order and each lease's oldest
// first. ReadSnapshot reads both versions; a version-1 snapshot has no lost locks.
// Since groups, a version-2 snapshot has one more field after "lost", "groups" when not
// empty: groups in name order (groupRecord); snapshots written before have no groups.
//
// Since the ledger, a version-2 snapshot may end with "ledger" (after "groups", when not
// empty): the
// ended tenures oldest first (Tenure), then the start of every hold still open (a
// Tenure with no "how"), in name and token order. Snapshots written before it have
// none: the ledger starts empty, and holds open then end with an unknown start.
const (
	snapshotV1 = 1
	snapshotV2 = 2
)

// snapshotFields are the keys of a version-2 snapshot, in the order they are written;
// a version-1 snapshot has those before "lost". "groups", "ledger" and then
// "elections" came after "lost" in version 2: a version-2 snapshot written before
// them has none of them, and restores with no groups, ledger or elections.
//
// Since the election history, a version-2 snapshot may end with "electionRev" (the last
// election change's revision), "electionFloor" (the highest revision the history's
// totals dropped) and "electionHistory" (the changes held, oldest first:
// ElectionChange), each when not zero or empty, after "elections". Snapshots written
// before have none: the history starts empty, at revision 0.
//
// A backup (SnapshotView.AtLogIndex) ends with "logIndex": the index of the last log
// entry applied to the state it copies. Raft's own snapshots carry none (their index is
// in raft's metadata), so a node that does not know the field still reads them.
var snapshotFields = []string{"seq", "leases", "locks", "tombstones", "kvRev", "kv", "members", "clusterId", "idempotency", "lost", "groups", "ledger", "elections",
	"electionRev", "electionFloor", "electionHistory", "logIndex"}

type tombstone struct {
	ID     LeaseID   `json:"id"`
	Reason EndReason `json:"reason"`
}

// lostRecord is one lost lock as a snapshot records it.
type lostRecord struct {
	Lease LeaseID `json:"lease"`
	LostLock
}

// leaseLost is one lease's lost locks in a SnapshotView.
type leaseLost struct {
	lease LeaseID
	lost  []LostLock // shared with the table, which never changes it in place
}

// SnapshotView is a point-in-time copy of a State, made to be encoded later: the State
// may change (and be applied to) while the view is written, and the view does not
// change. It shares only immutable data with the State.
type SnapshotView struct {
	seq        uint64
	leases     []Lease
	locks      []lock
	tombstones []tombstone
	kvRev      uint64
	kv         []Entry
	members    []Member
	clusterID  string
	lost       []leaseLost
	keys       []keyRecord // in progress (unsorted), then done oldest first
	inProgress int         // how many of keys are in progress
	groups     []groupRecord
	ledger     []Tenure     // the ledger's ended tenures (Ledger.viewRecords)
	ledgerOpen []openRecord // and its open holds' starts
	elections  []Election   // in name order; copies
	// The election history: its revision and floor, the changes held (copies).
	electionRev, electionFloor uint64
	history                    []ElectionChange
	logIndex                   uint64 // AtLogIndex; 0: not written
}

// AtLogIndex records in v that it copies the state after the log entry at index was
// applied: a backup carries it so that a restore can place the restored log above every
// position the old cluster's log reached (replication.RestoreDataDir), and a Watch
// revision of the old cluster is never taken for one of the new.
func (v *SnapshotView) AtLogIndex(index uint64) { v.logIndex = index }

// SnapshotLogIndex returns the log index a backup read by ReadSnapshot was taken at
// (SnapshotView.AtLogIndex), or 0 when the snapshot names none (raft's snapshots, and
// backups written before the field).
func (s *State) SnapshotLogIndex() uint64 { return s.logIndex }

// SnapshotView copies what a snapshot of s needs. It is meant to run where applies must
// wait (it takes time linear in the size of the state, but copies fixed-size records
// and does no encoding or sorting); the expensive part is SnapshotView.WriteTo, which
// may run concurrently with later changes to s.
func (s *State) SnapshotView() *SnapshotView {
	v := &SnapshotView{
		seq:        s.seq,
		leases:     make([]Lease, 0, len(s.leases)),
		locks:      s.locks.records(),
		tombstones: make([]tombstone, 0, len(s.tombs())),
		kvRev:      s.kv.rev,
		kv:         make([]Entry, 0, len(s.kv.entries)),
		members:    s.Members(),
		clusterID:  s.clusterID,
		lost:       make([]leaseLost, 0, len(s.locks.lost)),
	}
	for id, lost := range s.locks.lost {
		v.lost = append(v.lost, leaseLost{lease: id, lost: lost})
	}
	v.keys, v.inProgress = s.keys.records()
	v.groups = s.groups.records()
	v.ledger, v.ledgerOpen = s.ledger.viewRecords()
	v.elections = s.elections.records()
	v.electionRev, v.electionFloor, v.history = s.history.rev, s.history.floor, s.history.records()
	for id, ttl := range s.leases {
		v.leases = append(v.leases, Lease{ID: id, TTLMillis: ttl})
	}
	for _, id := range s.tombs() {
		v.tombstones = append(v.tombstones, tombstone{ID: id, Reason: s.tombstones[id]})
	}
	for _, e := range s.kv.entries {
		v.kv = append(v.kv, *e) // Entry.Value is replaced on writes, never changed in place
	}
	return v
}

// WriteTo writes the snapshot (version 2) to w, buffered, and returns the number of
// bytes written. Equal states give equal bytes, the same bytes MarshalSnapshot returns.
// WriteTo may be called more than once, but not concurrently.
func (v *SnapshotView) WriteTo(w io.Writer) (int64, error) {
	slices.SortFunc(v.leases, func(a, b Lease) int { return compareIDs(a.ID, b.ID) })
	slices.SortFunc(v.locks, func(a, b lock) int { return strings.Compare(a.name, b.name) })
	slices.SortFunc(v.kv, func(a, b Entry) int { return strings.Compare(a.Key, b.Key) })
	slices.SortFunc(v.keys[:v.inProgress], func(a, b keyRecord) int { return strings.Compare(a.Key, b.Key) })
	slices.SortFunc(v.lost, func(a, b leaseLost) int { return compareIDs(a.lease, b.lease) })

	cw := &countingWriter{w: w}
	e := newJSONWriter(cw)
	e.raw(`{"seq":`)
	e.uint(v.seq)
	e.raw(`,"leases":`)
	writeArray(e, v.leases)
	e.raw(`,"locks":[`)
	var view Lock
	var hold Hold
	var holds []Hold
	var waiters []Waiter
	for i := range v.locks {
		holds, waiters = v.locks[i].describe(&view, &hold, holds, waiters)
		e.elem(i, &view)
	}
	e.raw(`],"tombstones":`)
	if len(v.tombstones) == 0 {
		e.raw(`null`)
	} else {
		writeArray(e, v.tombstones)
	}
	if v.kvRev != 0 {
		e.raw(`,"kvRev":`)
		e.uint(v.kvRev)
	}
	if len(v.kv) > 0 {
		e.raw(`,"kv":`)
		writeArray(e, v.kv)
	}
	if len(v.members) > 0 {
		e.raw(`,"members":`)
		writeArray(e, v.members)
	}
	if v.clusterID != "" {
		e.raw(`,"clusterId":`)
		e.elem(0, v.clusterID)
	}
	if len(v.keys) > 0 {
		e.raw(`,"idempotency":`)
		writeArray(e, v.keys)
	}
	if len(v.lost) > 0 {
		e.raw(`,"lost":[`)
		i := 0
		for _, ll := range v.lost {
			for _, lk := range ll.lost {
				e.elem(i, &lostRecord{Lease: ll.lease, LostLock: lk})
				i++
			}
		}
		e.raw("]")
	}
	if len(v.groups) > 0 {
		e.raw(`,"groups":`)
		writeArray(e, v.groups)
	}
	writeLedger(e, v.ledger, v.ledgerOpen, v.locks)
	if len(v.elections) > 0 {
		e.raw(`,"elections":`)
		writeArray(e, v.elections)
	}
	if v.electionRev != 0 {
		e.raw(`,"electionRev":`)
		e.uint(v.electionRev)
	}
	if v.electionFloor != 0 {
		e.raw(`,"electionFloor":`)
		e.uint(v.electionFloor)
	}
	if len(v.history) > 0 {
		e.raw(`,"electionHistory":`)
		writeArray(e, v.history)
	}
	if v.logIndex != 0 {
		e.raw(`,"logIndex":`)
		e.uint(v.logIndex)
	}
	e.raw("}\n")
	err := e.flush()
	if err != nil && cw.err == nil {
		err = fmt.Errorf("core: encode snapshot: %w", err)
	}
	return cw.n, err
}

// Bytes returns the snapshot WriteTo would write, as one byte slice.
func (v *SnapshotView) Bytes() ([]byte, error) {
	var buf bytes.Buffer
	if _, err := v.WriteTo(&buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// MarshalSnapshot encodes the whole state as one byte slice, as SnapshotView().WriteTo
// would write it. Equal states encode to equal bytes.
func (s *State) MarshalSnapshot() ([]byte, error) { return s.SnapshotView().Bytes() }

// writeArray writes xs as a JSON array, element by element.
func writeArray[T any](e *jsonWriter, xs []T) {
	e.raw("[")
	for i := range xs {
		e.elem(i, &xs[i])
	}
	e.raw("]")
}

// jsonWriter writes a snapshot through a bufio.Writer, encoding each array element with
// encoding/json, so that the bytes are those of encoding the whole snapshot at once.
type jsonWriter struct {
	w       *bufio.Writer
	scratch bytes.Buffer
	enc     *json.Encoder
	num     []byte
	err     error
}

func newJSONWriter(w io.Writer) *jsonWriter {
	e := &jsonWriter{w: bufio.NewWriterSize(w, 64<<10)}
	e.enc = json.NewEncoder(&e.scratch)
	e.err = e.w.WriteByte(snapshotV2)
	return e
}

func (e *jsonWriter) raw(s string) {
	if e.err == nil {
		_, e.err = e.w.WriteString(s)
	}
}

func (e *jsonWriter) uint(n uint64) {
	e.num = strconv.AppendUint(e.num[:0], n, 10)
	if e.err == nil {
		_, e.err = e.w.Write(e.num)
	}
}

// elem writes element i of an array.
func (e *jsonWriter) elem(i int, v any) {
	if e.err != nil {
		return
	}
	if i > 0 {
		e.raw(",")
	}
	e.scratch.Reset()
	if e.err = e.enc.Encode(v); e.err != nil {
		return
	}
	b := e.scratch.Bytes()
	_, e.err = e.w.Write(b[:len(b)-1]) // Encode ends every value with a newline
}

func (e *jsonWriter) flush() error {
	if e.err != nil {
		return e.err
	}
	return e.w.Flush()
}

// countingWriter counts the bytes written through it and remembers w's first error.
type countingWriter struct {
	w   io.Writer
	n   int64
	err error
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	if err != nil && c.err == nil {
		c.err = err
	}
	return n, err
}

// RestoreState decodes a snapshot written by MarshalSnapshot into a new State with the
// given limits. Malformed or inconsistent input yields an error wrapping ErrCorrupt.
func RestoreState(b []byte, limits Limits) (*State, error) {
	return ReadSnapshot(bytes.NewReader(b), limits)
}

// ReadSnapshot reads a snapshot written by SnapshotView.WriteTo or MarshalSnapshot from
// r, to its end, into a new State with the given limits, without holding the encoded
// snapshot in memory. Malformed or inconsistent input yields an error wrapping
// ErrCorrupt; an error from r itself is returned wrapped as it is.
//
// A snapshot must have its fields in the order they are written in, each at most once
// (see snapshotV1 and snapshotV2), so that it can be checked as it is read.
func ReadSnapshot(r io.Reader, limits Limits) (*State, error) {
	er := &errReader{r: r}
	br := bufio.NewReaderSize(er, 64<<10)
	version, err := br.ReadByte()
	fields := snapshotFields
	switch {
	case err != nil:
	case version == snapshotV1:
		fields = snapshotFields[:slices.Index(snapshotFields, "lost")]
	case version != snapshotV2:
		err = fmt.Errorf("%w: snapshot version %d", ErrCorrupt, version)
	}
	var s *State
	if err == nil {
		dec := json.NewDecoder(br)
		dec.DisallowUnknownFields()
		s, err = readSnapshotJSON(dec, fields, limits)
	}
	switch {
	case er.err != nil:
		return nil, fmt.Errorf("core: read snapshot: %w", er.err)
	case errors.Is(err, io.EOF) && s == nil:
		return nil, fmt.Errorf("%w: empty snapshot", ErrCorrupt)
	case err != nil && !errors.Is(err, ErrCorrupt):
		return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
	case err != nil:
		return nil, err
	}
	return s, nil
}

// errReader remembers the first error of r other than io.EOF.
type errReader struct {
	r   io.Reader
	err error
}

func (e *errReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil && err != io.EOF && e.err == nil {
		e.err = err
	}
	return n, err
}

// readSnapshotJSON reads the JSON object of a snapshot whose version allows fields.
func readSnapshotJSON(dec *json.Decoder, fields []string, limits Limits) (*State, error) {
	if err := expectDelim(dec, '{'); err != nil {
		return nil, err
	}
	s := NewState(limits)
	next := 0 // index in snapshotFields of the first field that may still come
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		key, _ := tok.(string)
		i := slices.Index(fields[next:], key)
		if i < 0 {
			return nil, fmt.Errorf("%w: snapshot field %q unknown, repeated or out of order", ErrCorrupt, key)
		}
		next += i + 1
		switch key {
		case "seq":
			err = dec.Decode(&s.seq)
		case "leases":
			err = eachElement(dec, func(l *Lease) error {
				if l == nil || l.ID.IsZero() || l.TTLMillis <= 0 || s.live(l.ID) {
					return fmt.Errorf("%w: bad lease in snapshot", ErrCorrupt)
				}
				s.leases[l.ID] = l.TTLMillis
				return nil
			})
		case "locks":
			rs := s.locks.restorer(s.live, s.seq)
			if err = eachElement(dec, rs.add); err == nil {
				err = rs.finish()
			}
		case "tombstones":
			err = eachElement(dec, func(t tombstone) error {
				if t.ID.IsZero() {
					return fmt.Errorf("%w: bad tombstone in snapshot", ErrCorrupt)
				}
				s.remember(t.ID, t.Reason)
				return nil
			})
		case "kvRev":
			err = dec.Decode(&s.kv.rev)
		case "kv":
			versions := make(map[uint64]bool) // a version names one value
			err = eachElement(dec, func(e *Entry) error {
				if e == nil || ValidateName("key", e.Key) != nil || s.kv.entries[e.Key] != nil || e.Version > s.kv.rev || len(e.Value) > MaxValueLen {
					return fmt.Errorf("%w: bad KV entry in snapshot", ErrCorrupt)
				}
				// Only what writes make: a live key has a version of its own (a version 0
				// would let IfVersion(0), "only if absent", overwrite it); a deleted key is
				// kept only for its fence, with no value and no version.
				if e.Deleted && (e.Version != 0 || len(e.Value) != 0 || e.FenceToken == 0) ||
					!e.Deleted && (e.Version == 0 || versions[e.Version]) {
					return fmt.Errorf("%w: KV entry %q in snapshot is not one writes make", ErrCorrupt, e.Key)
				}
				versions[e.Version] = !e.Deleted
				s.kv.entries[e.Key] = e
				return nil
			})
		case "members":
			err = eachElement(dec, func(m Member) error {
				if ValidateNodeID("id", m.ID) != nil || ValidateAddr("addr", m.APIAddr) != nil ||
					(m.FastLaneAddr != "" && ValidateAddr("fast_lane_addr", m.FastLaneAddr) != nil) {
					return fmt.Errorf("%w: bad member in snapshot", ErrCorrupt)
				}
				s.members[m.ID] = memberAddrs{api: m.APIAddr, fastLane: m.FastLaneAddr}
				return nil
			})
		case "clusterId":
			if err = dec.Decode(&s.clusterID); err == nil && ValidateClusterID("clusterId", s.clusterID) != nil {
				err = fmt.Errorf("%w: bad cluster ID in snapshot", ErrCorrupt)
			}
		case "idempotency":
			err = eachElement(dec, s.restoreKey)
		case "lost":
			err = eachElement(dec, s.restoreLost)
		case "groups":
			err = eachElement(dec, s.restoreGroup)
		case "ledger":
			err = eachElement(dec, s.restoreTenure)
		case "elections":
			err = eachElement(dec, s.restoreElection)
		case "electionRev":
			err = dec.Decode(&s.history.rev)
		case "electionFloor":
			if err = dec.Decode(&s.history.floor); err == nil && s.history.floor > s.history.rev {
				err = fmt.Errorf("%w: election history floor above its revision in snapshot", ErrCorrupt)
			}
		case "electionHistory":
			err = eachElement(dec, s.restoreChange)
		case "logIndex":
			err = dec.Decode(&s.logIndex)
		}
		if err != nil {
			return nil, err
		}
	}
	if err := expectDelim(dec, '}'); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: trailing data after the snapshot", ErrCorrupt)
	}
	return s, nil
}

// eachElement decodes each element of the JSON array that comes next in dec and hands it to fn;
// null counts as an empty array.
func eachElement[T any](dec *json.Decoder, fn func(T) error) error {
	tok, err := dec.Token()
	if err != nil || tok == nil {
		return err
	}
	if tok != json.Delim('[') {
		return fmt.Errorf("%w: snapshot: expected an array, got %v", ErrCorrupt, tok)
	}
	for dec.More() {
		var v T
		if err := dec.Decode(&v); err != nil {
			return err
		}
		if err := fn(v); err != nil {
			return err
		}
	}
	return expectDelim(dec, ']')
}

func expectDelim(dec *json.Decoder, d json.Delim) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	if tok != d {
		return fmt.Errorf("%w: snapshot: expected %v, got %v", ErrCorrupt, d, tok)
	}
	return nil
}

// restoreLost adds a lost lock read from a snapshot, after checking it.
func (s *State) restoreLost(r lostRecord) error {
	lost := s.locks.lost[r.Lease]
	switch {
	case !s.live(r.Lease):
		return fmt.Errorf("%w: lost lock of an unknown lease in snapshot", ErrCorrupt)
	case ValidateName("name", r.Name) != nil || r.Token == 0 || r.Token > s.seq:
		return fmt.Errorf("%w: lost lock with a bad name or token in snapshot", ErrCorrupt)
	case len(r.Reason) > MaxReasonLen || !utf8.ValidString(r.Reason):
		return fmt.Errorf("%w: lost lock with a bad reason in snapshot", ErrCorrupt)
	case len(lost) >= MaxLostPerLease:
		return fmt.Errorf("%w: more than %d lost locks for one lease in snapshot", ErrCorrupt, MaxLostPerLease)
	}
	s.locks.lost[r.Lease] = append(lost, r.LostLock)
	return nil
}
