package core

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
)

// Snapshot encoding versions; the first byte of a snapshot names its format.
const (
	snapshotV1 = 1
)

type snapshot struct {
	Seq        uint64      `json:"seq"`
	Leases     []*Lease    `json:"leases"`
	Locks      []*Lock     `json:"locks"`
	Tombstones []tombstone `json:"tombstones"`
	KVRev      uint64      `json:"kvRev,omitempty"`
	KV         []*Entry    `json:"kv,omitempty"`
	Members    []Member    `json:"members,omitempty"`
}

// MarshalSnapshot encodes the whole state. Equal states encode to equal bytes.
func (s *State) MarshalSnapshot() ([]byte, error) {
	snap := snapshot{Seq: s.seq, Leases: make([]*Lease, 0, len(s.leases)), Locks: make([]*Lock, 0, s.locks.Len())}
	s.Leases(func(l *Lease) { snap.Leases = append(snap.Leases, l) })
	for _, n := range s.locks.sortedNames() {
		snap.Locks = append(snap.Locks, s.locks.Get(n))
	}
	for _, id := range s.tombOrder {
		snap.Tombstones = append(snap.Tombstones, tombstone{ID: id, Reason: s.tombstones[id]})
	}
	snap.Members = s.Members()
	snap.KVRev = s.kv.rev
	keys := make([]string, 0, len(s.kv.entries))
	for k := range s.kv.entries {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		snap.KV = append(snap.KV, s.kv.entries[k])
	}
	var buf bytes.Buffer
	buf.WriteByte(snapshotV1)
	if err := json.NewEncoder(&buf).Encode(&snap); err != nil {
		return nil, fmt.Errorf("core: encode snapshot: %w", err)
	}
	return buf.Bytes(), nil
}

// RestoreState decodes a snapshot written by MarshalSnapshot into a new State with the
// given limits. Malformed or inconsistent input yields an error wrapping ErrCorrupt.
func RestoreState(b []byte, limits Limits) (*State, error) {
	if len(b) == 0 || b[0] != snapshotV1 {
		return nil, fmt.Errorf("%w: snapshot version", ErrCorrupt)
	}
	var snap snapshot
	dec := json.NewDecoder(bytes.NewReader(b[1:]))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&snap); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: trailing data after the snapshot", ErrCorrupt)
	}
	s := NewState(limits)
	s.seq = snap.Seq
	for _, l := range snap.Leases {
		if l == nil || l.ID.IsZero() || l.TTLMillis <= 0 || s.leases[l.ID] != nil {
			return nil, fmt.Errorf("%w: bad lease in snapshot", ErrCorrupt)
		}
		s.leases[l.ID] = l
	}
	held := make(map[uint64]bool)
	for _, l := range snap.Locks {
		if err := s.checkRestoredLock(l); err != nil {
			return nil, err
		}
		if l.Hold != nil {
			if held[l.Hold.Token] {
				return nil, fmt.Errorf("%w: token %d held twice in snapshot", ErrCorrupt, l.Hold.Token)
			}
			held[l.Hold.Token] = true
		}
		s.locks.restore(l)
	}
	for _, t := range snap.Tombstones {
		if t.ID.IsZero() {
			return nil, fmt.Errorf("%w: bad tombstone in snapshot", ErrCorrupt)
		}
		s.remember(t.ID, t.Reason)
	}
	for _, m := range snap.Members {
		if ValidateNodeID("id", m.ID) != nil || ValidateAddr("addr", m.APIAddr) != nil {
			return nil, fmt.Errorf("%w: bad member in snapshot", ErrCorrupt)
		}
		s.members[m.ID] = m.APIAddr
	}
	s.kv.rev = snap.KVRev
	for _, e := range snap.KV {
		if e == nil || ValidateName("key", e.Key) != nil || s.kv.entries[e.Key] != nil || e.Version > s.kv.rev || len(e.Value) > MaxValueLen {
			return nil, fmt.Errorf("%w: bad KV entry in snapshot", ErrCorrupt)
		}
		s.kv.entries[e.Key] = e
	}
	return s, nil
}

func (s *State) checkRestoredLock(l *Lock) error {
	bad := func(why string) error { return fmt.Errorf("%w: lock in snapshot: %s", ErrCorrupt, why) }
	switch {
	case l == nil:
		return bad("null")
	case ValidateName("name", l.Name) != nil:
		return bad("invalid name")
	case s.locks.Get(l.Name) != nil:
		return bad("duplicate " + l.Name)
	case l.Hold == nil && !l.Delayed:
		return bad(l.Name + " is neither held nor delayed")
	case l.Hold != nil && (s.leases[l.Hold.Lease] == nil || l.Hold.Token > s.seq):
		return bad(l.Name + " held by an unknown lease or a future token")
	}
	switch {
	case l.Class != Correctness:
		return bad(l.Name + " is not a correctness lock")
	case l.Hold != nil && (l.Delayed || l.Hold.Token == 0 || l.Hold.DelayMillis < 0):
		return bad(l.Name + " has an impossible hold")
	case l.Delayed != (l.DelayMillis > 0):
		return bad(l.Name + " has an impossible delay")
	}
	seen := make(map[LeaseID]bool, len(l.Waiters)+1)
	if l.Hold != nil {
		seen[l.Hold.Lease] = true
	}
	for _, w := range l.Waiters {
		if s.leases[w.Lease] == nil {
			return bad(l.Name + " waited for by an unknown lease")
		}
		if seen[w.Lease] || w.DelayMillis < 0 {
			return bad(l.Name + " has a lease twice or a negative delay in its queue")
		}
		seen[w.Lease] = true
	}
	return nil
}
