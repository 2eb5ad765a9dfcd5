package core

// EventKind names what a Watch event reports (G10).
type EventKind uint8

// The kinds of lock events a table records. The numbers match leasehold.v1.EventKind.
const (
	// EventAcquired: Holder was granted lock Name with Token, in Mode (the locks of a
	// lock set are granted under one token, one event each).
	EventAcquired EventKind = 1
	// EventReleased: the holder gave Name (Token) back.
	EventReleased EventKind = 2
	// EventExpired: the hold of Name (Token) ended because its lease expired.
	EventExpired EventKind = 3
	// EventRevoked: the hold of Name (Token) ended because its lease was revoked
	// (OpRevoke).
	EventRevoked EventKind = 4
	// EventForceReleased: an operator took Name (Token) away; Note says who and why.
	EventForceReleased EventKind = 5
	// EventQueued: Holder took place Position (1 = first) in Name's queue, for Mode.
	EventQueued EventKind = 6
	// EventWaitEnded: Holder left Name's queue without a grant (cancelled, or its lease
	// ended).
	EventWaitEnded EventKind = 7
	// EventEpoch: a new leader serves the efficiency locks with an empty table: every
	// efficiency lock of an earlier epoch is gone (published by the leader, not Apply).
	EventEpoch EventKind = 8
	// EventDisconnected: the hold of Name (Token) ended because its lease was bound to
	// a connection that ended (OpDisconnect, G7).
	EventDisconnected EventKind = 9
)

func (k EventKind) String() string {
	switch k {
	case EventAcquired:
		return "acquired"
	case EventReleased:
		return "released"
	case EventExpired:
		return "expired"
	case EventRevoked:
		return "revoked"
	case EventForceReleased:
		return "force_released"
	case EventQueued:
		return "queued"
	case EventWaitEnded:
		return "wait_ended"
	case EventEpoch:
		return "epoch"
	case EventDisconnected:
		return "disconnected"
	}
	return "unknown"
}

// Event is one change of a lock, as the table that made it records it (Locks.Record).
// It names no lease: lease IDs are shown only to their holder (G11).
type Event struct {
	Kind   EventKind
	Name   string
	Class  Class
	Token  uint64
	Holder Holder
	Mode   Mode
	// Limit is a semaphore's limit (0 for a readers-writer lock).
	Limit uint32
	// Position is a queued waiter's place, 1 for the head.
	Position int
	// Note is a force release's reason (with who asked, as the server records it).
	Note string
}

// Record makes the table call fn with every event of its changes, in the order they
// happen, while the change is made (fn must not call the table). nil stops recording.
func (t *Locks) Record(fn func(Event)) { t.rec = fn }

// emitHold records an event of kind about lease's hold of l, before the hold goes.
func (t *Locks) emitHold(kind EventKind, l *lock, lease LeaseID, note string) {
	if t.rec == nil {
		return
	}
	e := Event{Kind: kind, Name: l.name, Class: l.class, Limit: uint32(l.limit), Note: note}
	if l.heldBy(lease) {
		e.Token, e.Holder, e.Mode = l.token, l.terms.holder(), Exclusive
	} else if i := l.sharedIndex(lease); i >= 0 {
		h := l.more.holds[i]
		e.Token, e.Holder, e.Mode = h.token, h.terms.holder(), l.sharedMode()
	}
	t.rec(e)
}

// emitWaitEnded records that waiter w left l's queue without a grant.
func (t *Locks) emitWaitEnded(l *lock, w waiter) {
	if t.rec != nil {
		t.rec(Event{Kind: EventWaitEnded, Name: l.name, Class: l.class, Limit: uint32(l.limit), Holder: w.holder, Mode: w.mode})
	}
}
