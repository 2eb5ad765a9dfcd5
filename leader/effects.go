package leader

import "github.com/leasehold/leasehold/core"

// OnEffects acts on the effects of an applied command. replication calls it from its
// apply goroutine on every node, in log order.
func (l *Leader) OnEffects(effects []core.Effect) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range effects {
		switch e.Kind {
		case core.EffectPartitionDraining:
			if l.active {
				l.startDrainLocked(drainKey{e.Name, e.Partition, e.Token}, e.DelayMillis)
			}
			l.groupsChangedLocked()
		case core.EffectPartitionReleased:
			l.endDrainLocked(drainKey{e.Name, e.Partition, e.Token})
			l.groupsChangedLocked()
		case core.EffectPartitionAssigned:
			l.groupsChangedLocked()
		case core.EffectGranted:
			l.waits.notify(e.Lease, e.Name, outcome{token: e.Token})
		case core.EffectElected:
			l.waits.notify(e.Lease, electionKey(e.Name), outcome{token: e.Token})
			l.observedLocked(e.Name)
		case core.EffectLeaderless, core.EffectProclaimed:
			l.observedLocked(e.Name)
		case core.EffectWaitEnded:
			// Nothing to do here: EffectLeaseEnded follows in the same batch and tells
			// the waiter, with the reason its lease ended (expired or revoked).
		case core.EffectLeaseGranted:
			if l.active {
				l.addCountdownLocked(e.Lease, e.TTLMillis, l.now(), false)
			}
		case core.EffectLeaseEnded:
			c, counted := l.dropCountdownLocked(e.Lease)
			if l.active {
				l.leaseEndedLocked(c, counted, e.Reason)
				var r core.Result
				if e.Reason == core.EndDisconnected {
					l.eff.DropDisconnected(e.Lease, &l.effSeq, &r)
				} else {
					l.eff.DropLease(e.Lease, e.Reason == core.EndExpired, &l.effSeq, &r)
				}
				l.effEffectsLocked(r.Effects)
			}
			l.waits.failLease(e.Lease, &LeaseGoneError{Lease: e.Lease, Reason: e.Reason})
		case core.EffectDelayed:
			if l.active {
				l.startDelayLocked(e.Name, core.Correctness, e.DelayMillis)
			}
		case core.EffectRevokedHold:
			// The replicated state keeps the lost lock for the holder's keepalives
			// (core.Locks.Lost), so that any later leader reports it too; a new leader
			// sets the flag from the state (Promote).
			if c, ok := l.leases[e.Lease]; ok {
				c.lost = true
				l.leases[e.Lease] = c
			}
			if l.active {
				l.obs.ForceReleased(core.Correctness)
			}
		}
	}
}
