package leader

import (
	"context"
	"time"

	"github.com/leasehold/leasehold/core"
)

// LockView is what anyone may see about a lock.
type LockView struct {
	Name           string
	Class          core.Class
	Held           bool
	Token          uint64
	Holder         core.Holder
	TTLRemaining   time.Duration // -1 when unknown
	Waiters        int
	DelayRemaining time.Duration
	DelayMillis    int64
}

// Describe returns the view of one lock (Held false when nobody holds or waits).
func (l *Leader) Describe(name string) (LockView, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.active {
		return LockView{}, ErrNotLeader
	}
	if l.names.inMemoryLocked(name) {
		return l.viewLocked(l.eff.Get(name)), nil
	}
	v := LockView{Name: name, TTLRemaining: -1}
	l.log.Read(func(s *core.State) {
		if lk := s.Locks().Get(name); lk != nil {
			v = l.viewLocked(lk)
		}
	})
	return v, nil
}

// List returns up to limit locks of both classes under prefix in name order, and
// whether more matched.
func (l *Leader) List(prefix string, limit int) ([]LockView, bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.active {
		return nil, false, ErrNotLeader
	}
	effLocks, t1 := l.eff.List(prefix, limit)
	var corr []LockView
	var t2 bool
	l.log.Read(func(s *core.State) {
		locks, truncated := s.Locks().List(prefix, limit)
		t2 = truncated
		// Views are built under the read lock: the state's locks change after it.
		for _, lk := range locks {
			corr = append(corr, l.viewLocked(lk))
		}
	})
	merged := make([]LockView, 0, min(limit, len(effLocks)+len(corr)))
	i, j := 0, 0
	for len(merged) < limit && (i < len(effLocks) || j < len(corr)) {
		if j >= len(corr) || (i < len(effLocks) && effLocks[i].Name < corr[j].Name) {
			merged = append(merged, l.viewLocked(effLocks[i]))
			i++
		} else {
			merged = append(merged, corr[j])
			j++
		}
	}
	return merged, t1 || t2 || i < len(effLocks) || j < len(corr), nil
}

func (l *Leader) viewLocked(lk *core.Lock) LockView {
	v := LockView{Name: lk.Name, Class: lk.Class, Waiters: len(lk.Waiters), TTLRemaining: -1}
	if lk.Hold != nil {
		v.Held, v.Token, v.Holder, v.DelayMillis = true, lk.Hold.Token, lk.Hold.Holder, lk.Hold.DelayMillis
		if c := l.leases[lk.Hold.Lease]; c != nil {
			v.TTLRemaining = max(0, time.Until(c.deadline))
		}
	}
	if d := l.delays[lk.Name]; d != nil && lk.Delayed {
		v.DelayRemaining = max(0, time.Until(d.deadline))
	}
	return v
}

// CheckToken returns the token of name's current holder (0 when nobody holds it), read
// after a quorum confirmed that this node still leads, in a round that began after the
// call: a deposed leader must not vouch for a token that a newer leader has superseded.
// The answer holds at the moment it was read; the holder may lose the lock right after.
// Errors: ErrNotLeader (not serving, or not confirmed, as for KeepAlive) and ctx's error.
func (l *Leader) CheckToken(ctx context.Context, name string) (holderToken uint64, err error) {
	if !l.Active() {
		return 0, ErrNotLeader
	}
	if err := l.confirm(ctx); err != nil {
		return 0, err
	}
	v, err := l.Describe(name)
	return v.Token, err
}

// Stats are counts for status and metrics.
type Stats struct {
	Leases, Locks, EfficiencyLocks int
	// Waiters are the acquires queued for a lock, by class.
	CorrectnessWaiters, EfficiencyWaiters int
	Epoch                                 string
	LastToken                             uint64
}

// Stats returns current counts.
func (l *Leader) Stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := Stats{EfficiencyLocks: l.eff.Len(), EfficiencyWaiters: l.eff.Waiting()}
	if l.active {
		st.Epoch = l.epoch
	}
	l.log.Read(func(s *core.State) {
		st.Leases = s.NumLeases()
		st.Locks = s.Locks().Len() + st.EfficiencyLocks
		st.CorrectnessWaiters = s.Locks().Waiting()
		st.LastToken = s.LastToken()
	})
	return st
}
