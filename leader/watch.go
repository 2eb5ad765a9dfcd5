package leader

import (
	"time"

	"github.com/leasehold/leasehold/core"
	"github.com/leasehold/leasehold/watch"
)

// recordLocked opens a new epoch's record of the efficiency table's changes: every
// event goes into the epoch's ledger (ledger.go), which times the holds for the
// Observer, and, when the leader has a hub, to
// Watch's history, after the epoch's start (every efficiency lock of an earlier leader
// is gone), stamped with the epoch. The correctness locks' events come from the apply
// path (replication), not from here.
//
// The epoch's start is published with its first event, not at once: every efficiency
// event needs a token, and the epoch's first tokens come from an OpReserve of this
// leader's term, applied (and published) before the tokens are handed out. So every
// event of the epoch, its start included, takes a revision above every revision an
// earlier leader could have given (those are at most its last applied index, below
// this term's entries): a watcher resuming here from an earlier leader's revision
// skips none of them.
func (l *Leader) recordLocked() {
	hub, epoch, ledger, obs := l.cfg.Events, l.epoch, &l.effLedger, l.obs
	started := hub == nil
	l.eff.Record(func(e core.Event) {
		now := time.Now().UnixMilli()
		if start := ledger.Note(e, now); start > 0 {
			obs.Held(core.Efficiency, heldFor(start, now)) // the hold-time metric (observe.go)
		}
		if !started {
			started = true
			hub.Publish(core.Event{Kind: core.EventEpoch, Class: core.Efficiency}, epoch)
		}
		if hub != nil {
			hub.Publish(e, epoch)
		}
	})
}

// Serving returns a channel closed when this node stops serving as leader, and false
// when it does not serve now. A Watch stream ends with it: the efficiency events of a
// new leader come from that leader.
func (l *Leader) Serving() (<-chan struct{}, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.stop, l.active
}

// Events returns the hub the leader publishes to (nil if none).
func (l *Leader) Events() *watch.Hub { return l.cfg.Events }
