package core

import (
	"cmp"
	"fmt"
	"slices"
)

// The election history (G8): the recent changes of every election, part of the
// replicated state (and of snapshots), so that an Observe stream that broke can resume
// on any node, after a failover or a restart, from the last change it showed — with no
// gap and no repeat — or be told that the changes it missed are no longer held.
//
// Every change gets a revision: one counter for all elections, the same on every node
// (it is part of the state), strictly increasing. A change's revision is the larger of
// the last revision plus one and the token sequence's last token, so revisions never
// fall below the tokens: a cluster restored from a backup continues its token sequence
// far above the backup (replication.RestoreDataDir), and its revisions with it, above
// every revision the old cluster gave after the backup — a client resuming from one of
// those never mistakes a new change for one it has seen.
//
// The history is bounded (Limits.ElectionHistory, ElectionHistoryTotal,
// ElectionHistoryBytes): each election keeps its last changes, and the oldest of all are
// dropped first beyond the totals. A resume point below what is held for an election is
// refused (ErrHistoryCompacted), never answered with a gap.

// EffectProclaimed reports that the leader of election Name (epoch Token) changed its
// value to Value.
const EffectProclaimed EffectKind = 35

// ChangeKind is what an ElectionChange reports.
type ChangeKind uint8

// The kinds of election changes.
const (
	// ChangeElected: a leadership began (Epoch, with the campaign's Value and Holder).
	ChangeElected ChangeKind = 1
	// ChangeProclaimed: the leader under Epoch changed its value to Value.
	ChangeProclaimed ChangeKind = 2
	// ChangeLeaderless: the leadership under Epoch ended with no candidate to follow.
	ChangeLeaderless ChangeKind = 3
)

// ElectionChange is one change of an election, as the history keeps it.
type ElectionChange struct {
	Rev    uint64     `json:"rev"`
	Name   string     `json:"name"`
	Kind   ChangeKind `json:"kind"`
	Epoch  uint64     `json:"epoch"`
	Value  []byte     `json:"value,omitempty"`
	Holder Holder     `json:"holder,omitzero"`
	// Ended is how the leadership before this change ended, for a change that ended
	// one (a new leader after another, or nobody after one): EventReleased (it
	// resigned), EventExpired, EventRevoked or EventDisconnected (its lease ended so);
	// 0 otherwise.
	Ended EventKind `json:"ended,omitempty"`
	// WallMillis is the proposer's wall clock when it proposed the change (Unix ms; 0:
	// unknown). Display only.
	WallMillis int64 `json:"wall,omitempty"`
}

// logName and logSize make an ElectionChange an entry of a boundedLog.
func (c *ElectionChange) logName() string { return c.Name }

// logSize is what c costs the history's byte bound: its variable parts and a fixed
// overhead per change.
func (c *ElectionChange) logSize() int {
	return changeOverhead + len(c.Name) + len(c.Value) + len(c.Holder.Host) + len(c.Holder.Note)
}

// changeOverhead is the memory of one held change besides its strings, rounded up:
// the struct (in its allocation size class) and its pointers in two slices, measured
// by TestElectionChangeBytes.
const changeOverhead = 168

// Defaults of the history's bounds (Limits): 64 changes per election, 10,000 in all, 16
// MiB in all (see docs/OPERATIONS.md).
const (
	DefaultElectionHistory      = 64
	DefaultElectionHistoryTotal = 10_000
	DefaultElectionHistoryBytes = 16 << 20
)

// HistoryCompactedError is ErrHistoryCompacted naming the oldest resume point held.
type HistoryCompactedError struct {
	Name string
	// After is the resume point asked for; Oldest the lowest one still accepted.
	After, Oldest uint64
}

func (e *HistoryCompactedError) Error() string {
	return fmt.Sprintf("%v: election %q asked after revision %d, the oldest resume point held is %d", ErrHistoryCompacted, e.Name, e.After, e.Oldest)
}

func (e *HistoryCompactedError) Unwrap() error { return ErrHistoryCompacted }

// history is the bounded record of recent election changes: a boundedLog by election,
// with the revisions.
type history struct {
	rev uint64 // the last revision given
	// floor is the highest revision dropped by the totals (0: none): a change of any
	// election at or below it may be gone.
	floor   uint64
	changes boundedLog[ElectionChange, *ElectionChange]
}

func newHistory(l Limits) history {
	return history{changes: newBoundedLog[ElectionChange](l.ElectionHistory, l.ElectionHistoryTotal, l.ElectionHistoryBytes)}
}

// note records a change of election name (c without its revision) made by the command
// being applied, and returns its revision.
func (s *State) note(c ElectionChange) uint64 {
	h := &s.history
	c.Rev = max(h.rev+1, s.seq)
	c.WallMillis = s.now
	h.add(c)
	return c.Rev
}

// add appends c (its revision above every one held), dropping the election's oldest
// beyond ElectionHistory and the oldest of all beyond the totals.
func (h *history) add(c ElectionChange) {
	h.rev = c.Rev
	if old, ok := h.changes.add(c); ok {
		h.floor = old.Rev
	}
}

// oldest returns the lowest resume point from which every later change of election
// name is held.
func (h *history) oldest(name string) uint64 {
	if h.changes.full(name) { // its older changes may have been dropped
		return max(h.floor, h.changes.of(name)[0].v.Rev-1)
	}
	return h.floor
}

// ElectionRev returns the revision of the last election change applied (0: none): every
// later change has a higher one.
func (s *State) ElectionRev() uint64 { return s.history.rev }

// ElectionChanges appends to buf election name's changes with a revision above after,
// oldest first, and returns them; it fails with a *HistoryCompactedError when a change
// above after is no longer held. An after above ElectionRev is a point not reached
// yet (a node behind in the log, or a resume point another node gave): no change is
// above it until the changes reach it.
func (s *State) ElectionChanges(name string, after uint64, buf []ElectionChange) ([]ElectionChange, error) {
	h := &s.history
	if oldest := h.oldest(name); after < oldest {
		return buf, &HistoryCompactedError{Name: name, After: after, Oldest: oldest}
	}
	list := h.changes.of(name)
	i, _ := slices.BinarySearchFunc(list, after+1, func(c *logEntry[ElectionChange], rev uint64) int {
		return cmp.Compare(c.v.Rev, rev)
	})
	for _, c := range list[i:] {
		buf = append(buf, c.v)
	}
	return buf, nil
}

// LastElectionChange returns election name's newest change held, and false when none
// is.
func (s *State) LastElectionChange(name string) (ElectionChange, bool) {
	list := s.history.changes.of(name)
	if len(list) == 0 {
		return ElectionChange{}, false
	}
	return list[len(list)-1].v, true
}

// records returns the changes held, oldest first, for a snapshot.
func (h *history) records() []ElectionChange {
	return h.changes.appendTo(make([]ElectionChange, 0, h.changes.live))
}

// restoreChange adds a change read from a snapshot (records' order), after checking it.
func (s *State) restoreChange(c ElectionChange) error {
	h := &s.history
	bad := ValidateName("name", c.Name) != nil || c.Rev > h.rev || c.Rev <= max(h.lastHeld(), h.floor) ||
		c.Epoch == 0 || c.Epoch > s.seq || len(c.Value) > MaxValueLen || ValidateHolder("holder", c.Holder) != nil
	switch c.Kind {
	case ChangeElected, ChangeProclaimed, ChangeLeaderless:
	default:
		bad = true
	}
	switch c.Ended {
	case 0, EventReleased, EventExpired, EventRevoked, EventDisconnected:
	default:
		bad = true
	}
	if bad {
		return fmt.Errorf("%w: bad election change in snapshot", ErrCorrupt)
	}
	rev := h.rev
	h.add(c)
	h.rev = rev // add moves rev to c's; the snapshot's "electionRev" came first
	return nil
}

// lastHeld returns the revision of the newest change held (0: none).
func (h *history) lastHeld() uint64 {
	if c, ok := h.changes.newest(); ok {
		return c.Rev
	}
	return 0
}
