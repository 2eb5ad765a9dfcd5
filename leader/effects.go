package leader

import (
	"container/heap"
	"time"

	"github.com/leasehold/leasehold/core"
)

// OnEffects acts on the effects of an applied command. replication calls it from its
// apply goroutine on every node, in log order.
func (l *Leader) OnEffects(effects []core.Effect) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range effects {
		switch e.Kind {
		case core.EffectGranted:
			l.notifyLocked(e.Lease, e.Name, outcome{token: e.Token})
		case core.EffectWaitEnded:
			// Nothing to do here: EffectLeaseEnded follows in the same batch and tells
			// the waiter, with the reason its lease ended (expired or revoked).
		case core.EffectLeaseGranted:
			if l.active {
				l.addCountdownLocked(e.Lease, e.TTLMillis, time.Now())
			}
		case core.EffectLeaseEnded:
			if c := l.leases[e.Lease]; c != nil {
				heap.Remove(&l.queue, c.index)
				delete(l.leases, e.Lease)
			}
			delete(l.lost, e.Lease)
			if l.active {
				var r core.Result
				l.eff.DropLease(e.Lease, e.Reason == core.EndExpired, &l.effSeq, &r)
				l.effEffectsLocked(r.Effects)
			}
			l.notifyLeaseLocked(e.Lease, &LeaseGoneError{Lease: e.Lease, Reason: e.Reason})
		case core.EffectDelayed:
			if l.active {
				l.startDelayLocked(e.Name, core.Correctness, e.DelayMillis)
			}
		case core.EffectRevokedHold:
			if l.active {
				l.lost[e.Lease] = append(l.lost[e.Lease], LostLock{Name: e.Name, Token: e.Token, Reason: e.Note})
			}
		}
	}
}
