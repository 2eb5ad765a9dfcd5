package leader

import (
	"context"
	"time"

	"github.com/leasehold/leasehold/core"
)

// Partition drains (core/groups.go): when a partition starts to drain, the leader
// starts a timer of the group's drain deadline and, when it runs out, proposes
// OpGroupDrainEnd, which takes the partition from its owner if it still drains at that
// epoch. Like a lock-delay, the deadline is counted on this leader's monotonic clock
// only; a new leader restarts every drain at its full length (Promote), so a drain never
// ends sooner than its deadline after it began, whichever node leads.
//
// Every node (leader or not) also tells the Assignments streams it serves that a
// partition moved: GroupsChanged.

// drainKey names one drain: a partition of a group at an epoch.
type drainKey struct {
	group     string
	partition uint32
	epoch     uint64
}

// startDrainLocked starts the drain timer of k.
func (l *Leader) startDrainLocked(k drainKey, millis int64) {
	if t := l.drains[k]; t != nil {
		t.Stop()
	}
	stop := l.stop
	var t *time.Timer
	t = time.AfterFunc(time.Duration(millis)*time.Millisecond, func() {
		select {
		case <-stop:
			return
		default:
		}
		cmd := core.Command{Op: core.OpGroupDrainEnd, Name: k.group, Partition: k.partition, Token: k.epoch}
		if _, err := l.log.Apply(context.Background(), cmd); err != nil {
			l.lg.Warn("could not end a partition's drain", "group", k.group, "partition", k.partition, "epoch", k.epoch, "err", err)
		}
		l.mu.Lock()
		if l.drains[k] == t {
			delete(l.drains, k)
		}
		l.mu.Unlock()
	})
	l.drains[k] = t
}

// endDrainLocked stops the drain timer of k, if any (the partition was released).
func (l *Leader) endDrainLocked(k drainKey) {
	if t := l.drains[k]; t != nil {
		t.Stop()
		delete(l.drains, k)
	}
}

// groupsChangedLocked wakes everyone waiting on GroupsChanged.
func (l *Leader) groupsChangedLocked() {
	close(l.groupsChanged)
	l.groupsChanged = make(chan struct{})
}

// GroupsChanged returns a channel that is closed the next time a partition of any
// group is assigned, starts to drain or is released on this node's copy of the state
// (leader or not). Read the state after receiving it: the change is applied by then.
func (l *Leader) GroupsChanged() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.groupsChanged
}
