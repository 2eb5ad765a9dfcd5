package leader

import (
	"errors"
	"time"

	"github.com/leasehold/leasehold/core"
)

// HeldReason is why an acquire was not granted (Explanation.Reason). The numbers match
// leasehold.v1.HeldReason.
type HeldReason uint8

// The reasons.
const (
	// HeldByOthers: held in a mode that excludes the one asked for.
	HeldByOthers HeldReason = 1
	// HeldInOtherMode: held shared while exclusive was asked for, or the other way.
	HeldInOtherMode HeldReason = 2
	// HeldInLockDelay: nobody holds it, but it is in its lock-delay.
	HeldInLockDelay HeldReason = 3
	// HeldWaitersAhead: it would admit the caller, but others wait before it.
	HeldWaitersAhead HeldReason = 4
)

// Explanation is an explained answer: why an acquire that did not wait, or whose wait
// ran out, was not granted, as the leader saw the lock at that moment.
type Explanation struct {
	Holders     []HeldBy
	QueueLength int
	// Position is the caller's place in the queue when its wait ran out (1 = first);
	// 0 when it did not wait.
	Position   int
	Reason     HeldReason
	DelayUntil time.Time // for HeldInLockDelay
	HeldMode   core.Mode
}

// HeldBy is one holder in an Explanation.
type HeldBy struct {
	Token  uint64
	Holder core.Holder
	Since  time.Time // the grant, by the ledger; zero when unknown (the ledger did not time it)
}

// explained attaches the explanation to a *LockHeldError that has none yet.
func (l *Leader) explained(a AcquireArgs, err error) error {
	if lh := new(LockHeldError); errors.As(err, &lh) && lh.Explain == nil {
		lh.Explain = l.explain(a, lh.Name)
	}
	return err
}

// explain describes lock name as acquire a finds it.
func (l *Leader) explain(a AcquireArgs, name string) *Explanation {
	l.mu.Lock()
	defer l.mu.Unlock()
	var lk *core.Lock
	since := map[uint64]int64{}
	if l.names.inMemoryLocked(name) {
		lk = l.eff.Get(name)
		for _, t := range l.effLedger.History(name, l.eff) {
			if t.End == 0 {
				since[t.Token] = t.StartMillis
			}
		}
	} else {
		l.log.Read(func(s *core.State) {
			lk = s.Locks().Get(name)
			for _, t := range s.History(name) {
				if t.End == 0 {
					since[t.Token] = t.StartMillis
				}
			}
		})
	}
	e := &Explanation{Reason: HeldByOthers}
	if lk == nil {
		return e // gone since: the caller may try again
	}
	holds := lk.Holds
	if lk.Hold != nil {
		holds = []core.Hold{*lk.Hold}
	}
	for _, h := range holds {
		hb := HeldBy{Token: h.Token, Holder: h.Holder}
		if ms := since[h.Token]; ms != 0 {
			hb.Since = time.UnixMilli(ms) // the ledger's start: the grant (its proposal)
		}
		e.Holders = append(e.Holders, hb)
	}
	e.QueueLength = len(lk.Waiters)
	for i, w := range lk.Waiters {
		if w.Lease == a.Lease {
			e.Position = i + 1
		}
	}
	e.HeldMode = lk.Mode()
	switch {
	case len(holds) == 0 && lk.Delayed:
		e.Reason = HeldInLockDelay
		if d := l.delays[name]; d != nil {
			e.DelayUntil = d.deadline
		}
	case len(holds) == 0:
		e.Reason = HeldWaitersAhead
	case a.Mode == core.Exclusive && e.HeldMode == core.Shared, a.Mode == core.Shared && e.HeldMode == core.Exclusive:
		e.Reason = HeldInOtherMode
	}
	return e
}
