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

	gone bool // dropped by the per-election bound, still in the history's order
}

// size is what c costs the history's byte bound: its variable parts and a fixed
// overhead per change.
func (c *ElectionChange) size() int {
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

// history is the bounded record of recent election changes.
type history struct {
	perElection, total, bytes int
	rev                       uint64 // the last revision given
	// floor is the highest revision dropped by the totals (0: none): a change of any
	// election at or below it may be gone.
	floor  uint64
	byName map[string][]*ElectionChange // oldest first
	order  []*ElectionChange            // every change held, oldest first; some gone
	live   int                          // changes in order not gone
	gone   int                          // changes in order gone
	size   int                          // the size of the live
}

func newHistory(l Limits) history {
	return history{perElection: l.ElectionHistory, total: l.ElectionHistoryTotal, bytes: l.ElectionHistoryBytes,
		byName: make(map[string][]*ElectionChange)}
}

// note records a change of election name (c without its revision) made by the command
// being applied, and returns its revision.
func (s *State) note(c ElectionChange) uint64 {
	h := &s.history
	c.Rev = max(h.rev+1, s.seq)
	c.WallMillis = s.now
	h.add(&c)
	return c.Rev
}

// add appends c (its revision above every one held), dropping the election's oldest
// beyond perElection and the oldest of all beyond the totals.
func (h *history) add(c *ElectionChange) {
	h.rev = c.Rev
	list := append(h.byName[c.Name], c)
	if len(list) > h.perElection {
		list[0].gone = true
		h.gone++
		h.live--
		h.size -= list[0].size()
		list = slices.Delete(list, 0, 1)
	}
	h.byName[c.Name] = list
	h.order = append(h.order, c)
	h.live++
	h.size += c.size()
	for h.live > h.total || h.size > h.bytes && h.live > 1 {
		old := h.pop()
		h.live--
		h.size -= old.size()
		h.floor = old.Rev
		rest := h.byName[old.Name][1:] // old is its election's oldest
		if len(rest) == 0 {
			delete(h.byName, old.Name)
		} else {
			h.byName[old.Name] = rest
		}
	}
	h.trim()
	if 4*h.gone > h.live+64 {
		// A quiet election's old change at the front would keep the gone of a busy
		// one behind it: squeeze them out, so order stays within a quarter of live.
		h.order = slices.DeleteFunc(h.order, func(c *ElectionChange) bool { return c.gone })
		h.gone = 0
	}
}

// pop removes and returns the oldest change held (order's first not gone).
func (h *history) pop() *ElectionChange {
	h.trim()
	old := h.order[0]
	h.order[0] = nil
	h.order = h.order[1:]
	return old
}

// trim drops the gone from the front of order, so that it never fills with them.
func (h *history) trim() {
	for len(h.order) > 0 && h.order[0].gone {
		h.order[0] = nil
		h.order = h.order[1:]
		h.gone--
	}
}

// oldest returns the lowest resume point from which every later change of election
// name is held.
func (h *history) oldest(name string) uint64 {
	list := h.byName[name]
	if len(list) >= h.perElection { // full: its older changes may have been dropped
		return max(h.floor, list[0].Rev-1)
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
	list := h.byName[name]
	i, _ := slices.BinarySearchFunc(list, after+1, func(c *ElectionChange, rev uint64) int {
		return cmp.Compare(c.Rev, rev)
	})
	for _, c := range list[i:] {
		buf = append(buf, *c)
	}
	return buf, nil
}

// LastElectionChange returns election name's newest change held, and false when none
// is.
func (s *State) LastElectionChange(name string) (ElectionChange, bool) {
	list := s.history.byName[name]
	if len(list) == 0 {
		return ElectionChange{}, false
	}
	return *list[len(list)-1], true
}

// records returns the changes held, oldest first, for a snapshot.
func (h *history) records() []ElectionChange {
	out := make([]ElectionChange, 0, h.live)
	for _, c := range h.order {
		if !c.gone {
			out = append(out, *c)
		}
	}
	return out
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
	h.add(&c)
	h.rev = rev // add moves rev to c's; the snapshot's "electionRev" came first
	return nil
}

// lastHeld returns the revision of the newest change held (0: none).
func (h *history) lastHeld() uint64 {
	if len(h.order) == 0 {
		return 0
	}
	return h.order[len(h.order)-1].Rev
}
