package leader

import (
	"context"
	"errors"

	"github.com/leasehold/leasehold/core"
)

// Release gives up a lock held by lease under token; for a lock held as one of a lock
// set, the whole set.
func (l *Leader) Release(ctx context.Context, lease core.LeaseID, name string, token uint64) error {
	if done, err := l.releaseInMemory(lease, name, token); done {
		return err
	}
	res, err := l.log.Apply(ctx, releaseCommand(lease, name, token))
	return l.releaseResult(lease, token, res, err)
}

// ReleaseThen is Release without waiting for a correctness lock's commit: it proposes
// the release and returns; then gets what Release would have returned, on the
// goroutine that hands out commit results (so it must not block), or on the caller's
// for an efficiency lock or a leader that is not active.
func (l *Leader) ReleaseThen(lease core.LeaseID, name string, token uint64, then func(error)) {
	if done, err := l.releaseInMemory(lease, name, token); done {
		then(err)
		return
	}
	l.log.ApplyThen(releaseCommand(lease, name, token), func(res core.Result, err error) {
		then(l.releaseResult(lease, token, res, err))
	})
}

// releaseInMemory releases an efficiency lock, reporting done; for any other it reports
// not done and changes nothing (unless this node does not lead: done, ErrNotLeader).
func (l *Leader) releaseInMemory(lease core.LeaseID, name string, token uint64) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.active {
		return true, ErrNotLeader
	}
	if !l.names.inMemoryLocked(name) {
		return false, nil
	}
	if c, ok := l.leases[lease]; !ok || c.expiring {
		return true, l.goneLocked(lease, ok)
	}
	r := l.eff.Release(lease, name, token, &l.effSeq)
	if r.Err == nil {
		l.obs.Released(core.Efficiency)
	}
	l.effEffectsLocked(r.Effects)
	return true, r.Err
}

func releaseCommand(lease core.LeaseID, name string, token uint64) core.Command {
	return core.Command{Op: core.OpRelease, Lease: lease, Name: name, Token: token}
}

// releaseResult is Release's answer from the commit's outcome.
func (l *Leader) releaseResult(lease core.LeaseID, token uint64, res core.Result, err error) error {
	if err != nil {
		return err
	}
	if errors.Is(res.Err, core.ErrLeaseNotFound) {
		return l.gone(lease)
	}
	if res.Err == nil {
		l.mu.Lock()
		l.obs.Released(core.Correctness)
		l.mu.Unlock()
	}
	return res.Err
}

// ForceRelease releases a lock whoever holds it and consumes a token so every later
// grant is larger. It returns the released token (0 if none) and the consumed token.
// The old holder's lease keeps the lock among its lost locks, reported in every
// keepalive answer until the lease ends: for a correctness lock in the replicated
// state, so a later leader reports it too (core.Locks.Lost).
func (l *Leader) ForceRelease(ctx context.Context, name, reason string) (released, fence uint64, err error) {
	for {
		l.mu.Lock()
		if !l.active {
			l.mu.Unlock()
			return 0, 0, ErrNotLeader
		}
		if !l.names.inMemoryLocked(name) {
			l.mu.Unlock()
			break
		}
		// The fence token, and one for every waiter the release may grant to.
		if need := l.tokensNeededLocked(1); l.effSeq.remaining() < need {
			l.mu.Unlock()
			if err := l.reserveAtLeast(ctx, need); err != nil {
				return 0, 0, err
			}
			continue
		}
		defer l.mu.Unlock()
		r := core.Result{Token: l.effSeq.Next()}
		l.eff.ForceRelease(name, reason, &l.effSeq, &r)
		l.effEffectsLocked(r.Effects)
		l.lg.Warn("lock force-released", "name", name, "class", "efficiency", "released_token", r.Released, "fence_token", r.Token, "reason", reason)
		return r.Released, r.Token, nil
	}
	res, err := l.log.Apply(ctx, core.Command{Op: core.OpForceRelease, Name: name, Reason: reason})
	if err == nil {
		err = res.Err
	}
	if err == nil {
		l.lg.Warn("lock force-released", "name", name, "class", "correctness", "released_token", res.Released, "fence_token", res.Token, "reason", reason)
		// Every later grant must be above the fence token, efficiency grants too: replace
		// a block reserved before it. The force release stands even if this fails (then
		// leadership is being lost, and the next leader reserves afresh).
		l.mu.Lock()
		stale := l.active && l.effSeq.end != 0 && l.effSeq.next <= res.Token
		l.mu.Unlock()
		if stale {
			if rerr := l.reserve(ctx); rerr != nil {
				l.lg.Warn("could not reserve efficiency tokens above a force release's fence", "err", rerr)
			}
		}
	}
	return res.Released, res.Token, err
}
