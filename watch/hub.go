// Package watch keeps the recent history of lock events that LockService.Watch streams
// (G10): a bounded, ordered log of events in memory, fed by the apply path of the
// replicated log (every command's events, stamped with the entry's index and their
// place in it) and by the leader (efficiency locks, which never enter the log), read by
// any number of watchers, each at its own pace.
//
// A revision orders every event a node publishes. An event of the replicated state has
// revision (log index, offset): the index of the log entry whose apply made it and its
// place among that entry's events, so every node gives it the same revision. An
// efficiency event takes the revision after the last one published (the index of the
// last applied entry, the next offset): it is ordered with the log's events as the
// leader saw them, and known to the leader that made it only — lost, like the lock,
// when that leader goes.
package watch

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/leasehold/leasehold/core"
)

// Revision is an event's place in the history: the log index of its entry and its
// offset among the entry's events.
type Revision struct {
	Index  uint64
	Offset uint32
}

// Less reports whether r comes before o.
func (r Revision) Less(o Revision) bool {
	return r.Index < o.Index || r.Index == o.Index && r.Offset < o.Offset
}

// Next returns the revision right after r: where a watcher that has seen r resumes.
func (r Revision) Next() Revision { return Revision{Index: r.Index, Offset: r.Offset + 1} }

func (r Revision) String() string { return fmt.Sprintf("%d.%d", r.Index, r.Offset) }

// Event is a published event: what changed, at which revision, and, for an efficiency
// lock's event, the leader's efficiency epoch.
type Event struct {
	core.Event
	Rev   Revision
	Epoch string
}

// ErrCompacted is returned (as *CompactedError) for a watch that starts, or has fallen
// behind, below the oldest revision the hub still holds.
var ErrCompacted = errors.New("watch: the revision is no longer held (compacted)")

// CompactedError is ErrCompacted naming the oldest revision still held.
type CompactedError struct {
	Asked, Oldest Revision
}

func (e *CompactedError) Error() string {
	return fmt.Sprintf("%v: asked %s, the oldest revision held is %s", ErrCompacted, e.Asked, e.Oldest)
}

func (e *CompactedError) Unwrap() error { return ErrCompacted }

// DefaultRetention is how many events a hub keeps by default (see docs/OPERATIONS.md
// for what that costs in memory).
const DefaultRetention = 100_000

// Hub is one node's event history. Its methods are safe for concurrent use.
type Hub struct {
	mu   sync.Mutex
	ring []Event // ring[seq % len(ring)] holds event seq, for first ≤ seq < end
	// first and end bound the sequence numbers held.
	first, end uint64
	// floor is the lowest revision from which the hub holds every event: events below
	// it were dropped or never seen (before the node's state was restored).
	floor Revision
	// cur is the revision the next efficiency event takes: after the last event
	// published.
	cur Revision
	// known is false until the first entry after a restore names where history starts.
	known bool
	// restored: the state was restored from a snapshot (Reset); history begins after it.
	restored bool
	// wake is closed by the next publish (or Reset) and set to nil: made only when a
	// reader that found nothing new takes it (waitLocked), so a publish nobody waits for
	// allocates nothing.
	wake chan struct{}
}

// NewHub returns a hub that keeps the last retention events (DefaultRetention when
// retention ≤ 0).
func NewHub(retention int) *Hub {
	if retention <= 0 {
		retention = DefaultRetention
	}
	return &Hub{ring: make([]Event, retention)}
}

// Retention returns how many events h keeps.
func (h *Hub) Retention() int { return len(h.ring) }

// Entry publishes the events of the log entry at index, in order (none: the entry
// changed no lock, which still moves the hub on). The apply path calls it for every
// command entry, in log order, before anyone can see the entry's effects.
func (h *Hub) Entry(index uint64, events []core.Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.known {
		// The first entry since the node started, or since its state was restored from a
		// snapshot: without a restore, the log is applied from its first entry and the
		// history is whole; after one, it starts here.
		h.first, h.end = 0, 0
		h.floor, h.known = Revision{}, true
		if h.restored {
			h.floor = Revision{Index: index}
		}
	}
	h.cur = Revision{Index: index}
	for _, e := range events {
		h.appendLocked(Event{Event: e, Rev: h.cur})
		h.cur.Offset++
	}
	h.wakeLocked()
}

// Publish publishes an event of the leader's, outside the log, with the leader's
// efficiency epoch.
func (h *Hub) Publish(e core.Event, epoch string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.appendLocked(Event{Event: e, Rev: h.cur, Epoch: epoch})
	h.cur.Offset++
	h.wakeLocked()
}

// Reset forgets the history: the node's state was replaced by a snapshot, so what comes
// next does not follow what the hub holds. History starts again at the next entry;
// until then watchers wait.
func (h *Hub) Reset() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.first, h.end, h.known, h.restored = 0, 0, false, true
	h.wakeLocked()
}

func (h *Hub) appendLocked(e Event) {
	n := uint64(len(h.ring))
	if h.end-h.first == n {
		h.floor = h.ring[h.first%n].Rev.Next()
		h.first++
	}
	h.ring[h.end%n] = e
	h.end++
}

func (h *Hub) wakeLocked() {
	if h.wake != nil {
		close(h.wake)
		h.wake = nil
	}
}

// waitLocked returns the channel the next publish closes.
func (h *Hub) waitLocked() <-chan struct{} {
	if h.wake == nil {
		h.wake = make(chan struct{})
	}
	return h.wake
}

// Cursor is one watcher's place in the history. The zero Cursor starts at the next
// event published ("now"); At starts at a given revision.
type Cursor struct {
	rev Revision
	set bool
}

// At returns a cursor at rev: the first event it reads is the first at or after rev.
func At(rev Revision) Cursor { return Cursor{rev: rev, set: true} }

// Rev returns the revision c reads next (the zero Revision for a cursor that has not
// started yet).
func (c *Cursor) Rev() Revision { return c.rev }

// Read appends to buf the events under prefix at or after c, up to cap(buf) events
// looked at, moves c past them, and returns them. When there is nothing new it returns
// no events and a channel closed at the next publish. It fails with *CompactedError
// when c is below what the hub holds. Every event is read once, in revision order.
func (h *Hub) Read(c *Cursor, prefix string, buf []Event) ([]Event, <-chan struct{}, error) {
	buf = buf[:0]
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.known {
		return buf, h.waitLocked(), nil
	}
	if !c.set {
		c.rev, c.set = h.cur, true
	}
	if c.rev.Less(h.floor) {
		oldest := h.floor
		if h.end > h.first {
			oldest = h.ring[h.first%uint64(len(h.ring))].Rev
		}
		return buf, nil, &CompactedError{Asked: c.rev, Oldest: oldest}
	}
	n := uint64(len(h.ring))
	held := int(h.end - h.first)
	i := sort.Search(held, func(i int) bool { return !h.ring[(h.first+uint64(i))%n].Rev.Less(c.rev) })
	for looked := 0; i < held && looked < max(cap(buf), 1); i, looked = i+1, looked+1 {
		e := &h.ring[(h.first+uint64(i))%n]
		c.rev = e.Rev.Next()
		if e.Name == "" || strings.HasPrefix(e.Name, prefix) {
			buf = append(buf, *e)
		}
	}
	if i == held && len(buf) == 0 {
		if c.rev.Less(h.cur) {
			c.rev = h.cur // nothing lies between (a cursor ahead of cur waits for it)
		}
		return buf, h.waitLocked(), nil
	}
	return buf, nil, nil
}

// Started reports whether c knows where it stands: a cursor made by At, or one that
// has read from a hub that knows its history.
func (c *Cursor) Started() bool { return c.set }
