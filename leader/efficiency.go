package leader

import (
	"context"
	"fmt"

	"github.com/leasehold/leasehold/core"
)

// ServesInMemory reports whether name is an efficiency lock this node holds in memory
// while it leads: releasing it touches no disk and never waits. The answer may be stale
// by the time the caller acts on it; it is a hint for scheduling, never for safety.
func (l *Leader) ServesInMemory(name string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.active && l.eff.Has(name)
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
	defer l.mu.Unlock()
	if err := l.effAdmitLocked(a); err != nil {
		return Grant{}, err
	}
	res := l.eff.Acquire(a.AcquireArgs, &l.effSeq)
	l.refillLocked()
	g := Grant{Token: res.Token, Class: core.Efficiency, Epoch: l.epoch}
	if err := l.acquireErr(a, res); err != nil || !res.Queued {
		return g, err
	}
	ch := l.registerLocked(a.Lease, a.Name)
	l.mu.Unlock()
	g, err := l.await(ctx, a, ch, res)
	l.mu.Lock()
	return g, err
}

// effAdmitLocked checks that an efficiency acquire may go ahead: its lease is live and
// not expiring, and the name is not in use as a correctness lock.
func (l *Leader) effAdmitLocked(a AcquireArgs) error {
	if c := l.leases[a.Lease]; c == nil || c.expiring {
		return l.goneLocked(a.Lease, c != nil)
	}
	conflict := l.pending[a.Name] > 0
	if !conflict {
		l.askName = a.Name
		l.log.Read(l.askHas)
		conflict, l.askName = l.askHeld, ""
	}
	if conflict {
		return fmt.Errorf("%w: %q is in use as correctness", core.ErrClassConflict, a.Name)
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
	return Grant{Token: res.Token, Class: core.Efficiency, Epoch: l.epoch}, true
}

// effEffectsLocked acts on effects of the efficiency table.
func (l *Leader) effEffectsLocked(effects []core.Effect) {
	for _, e := range effects {
		switch e.Kind {
		case core.EffectGranted:
			l.notifyLocked(e.Lease, e.Name, outcome{token: e.Token})
		case core.EffectWaitEnded:
			// Only DropLease reports it, and OnEffects tells the lease's waiters right
			// after, with the reason the lease ended.
		case core.EffectDelayed:
			l.startDelayLocked(e.Name, core.Efficiency, e.DelayMillis)
		case core.EffectRevokedHold:
			l.lost[e.Lease] = append(l.lost[e.Lease], LostLock{Name: e.Name, Token: e.Token, Reason: e.Note})
		}
	}
	l.refillLocked()
}
