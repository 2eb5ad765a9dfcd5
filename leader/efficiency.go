package leader

import (
	"context"

	"github.com/leasehold/leasehold/core"
)

// ServesInMemory reports whether name is an efficiency lock this node holds in memory
// while it leads: releasing it touches no disk and never waits. The answer may be stale
// by the time the caller acts on it; it is a hint for scheduling, never for safety.
func (l *Leader) ServesInMemory(name string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.active && l.names.inMemoryLocked(name)
}

func (l *Leader) acquireEfficiency(ctx context.Context, a AcquireArgs) (Grant, error) {
	for {
		l.mu.Lock()
		if !l.active {
			l.mu.Unlock()
			return Grant{}, ErrNotLeader
		}
		// One token for a grant now, one for a place in a queue, and one for every
		// waiter already queued (see tokensNeededLocked).
		need := l.tokensNeededLocked(2)
		if l.effSeq.remaining() >= need {
			break
		}
		l.mu.Unlock()
		if err := l.reserveAtLeast(ctx, need); err != nil {
			return Grant{}, err
		}
	}
	var res core.Result
	err := l.effAdmitLocked(a)
	if err == nil {
		res = l.eff.Acquire(a.AcquireArgs, &l.effSeq)
		l.refillLocked()
		err = l.acquireErr(a, res)
	}
	g := Grant{Token: res.Token, Class: core.Efficiency, Epoch: l.epoch}
	var ch chan outcome
	if err == nil && res.Queued {
		// Registered before Leader.mu is let go: only a later change to the table can
		// grant the place in the queue.
		ch = l.waits.add(a.Lease, a.Key())
	}
	l.mu.Unlock()
	if ch == nil {
		return g, err
	}
	return l.await(ctx, a, ch, res)
}

// effAdmitLocked checks that an efficiency acquire may go ahead: its lease is live and
// not expiring, and the name may be taken as efficiency (class.go).
func (l *Leader) effAdmitLocked(a AcquireArgs) error {
	if c, ok := l.leases[a.Lease]; !ok || c.expiring {
		return l.goneLocked(a.Lease, ok)
	}
	for _, name := range a.LockNames() {
		if err := l.names.claimLocked(name, core.Efficiency); err != nil {
			return err
		}
	}
	return nil
}

// AcquireNow grants an efficiency lock when that takes neither a place in its queue nor
// a write to the log: the lock is free (or already held by the lease), and tokens are
// reserved. In every other case (held, delayed, the lease unknown or expiring, a class
// conflict, a limit, tokens to reserve, this node not leading) it changes nothing and
// reports false; Acquire then gives the full answer, waiting if asked to. The fast
// lane's reader uses it to answer an acquire that may wait without handing it to a
// goroutine, since it never blocks.
func (l *Leader) AcquireNow(a AcquireArgs) (Grant, bool) {
	if a.Class != core.Efficiency {
		return Grant{}, false
	}
	start := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.active || l.effSeq.remaining() < l.tokensNeededLocked(2) || l.effAdmitLocked(a) != nil {
		return Grant{}, false
	}
	try := a.AcquireArgs
	try.Wait = false
	res := l.eff.Acquire(try, &l.effSeq)
	if res.Err != nil || res.Queued {
		return Grant{}, false
	}
	l.refillLocked()
	now := l.now()
	l.obs.Waited(core.Efficiency, WaitGranted, now-start)
	return Grant{Token: res.Token, Class: core.Efficiency, Epoch: l.epoch}, true
}

// effEffectsLocked acts on effects of the efficiency table.
func (l *Leader) effEffectsLocked(effects []core.Effect) {
	for _, e := range effects {
		switch e.Kind {
		case core.EffectGranted:
			l.waits.notify(e.Lease, e.Name, outcome{token: e.Token})
		case core.EffectWaitEnded:
			// Only DropLease reports it, and OnEffects tells the lease's waiters right
			// after, with the reason the lease ended.
		case core.EffectDelayed:
			l.startDelayLocked(e.Name, core.Efficiency, e.DelayMillis)
		case core.EffectRevokedHold:
			// The table keeps the lost lock for the holder's keepalives (core.Locks.Lost).
			l.obs.ForceReleased(core.Efficiency)
		}
	}
	l.refillLocked()
}
