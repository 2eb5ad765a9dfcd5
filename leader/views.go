package leader

import (
	"context"
	"time"

	"github.com/leasehold/leasehold/core"
)

// LockView is what anyone may see about a lock. Token, Holder, TTLRemaining and
// DelayMillis describe the exclusive holder, or the oldest of several (shared, or a
// semaphore's); Holders lists every holder.
type LockView struct {
	Name           string
	Class          core.Class
	Mode           core.Mode // as core.Lock.Mode
	Limit          uint32    // a semaphore's limit
	Held           bool
	Token          uint64
	Holder         core.Holder
	TTLRemaining   time.Duration // -1 when unknown
	Holders        []HolderView
	Waiters        int
	DelayRemaining time.Duration
	DelayMillis    int64
}

// HolderView is one holder of a lock.
type HolderView struct {
	Token        uint64
	Holder       core.Holder
	TTLRemaining time.Duration // -1 when unknown
	DelayMillis  int64
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
	v := LockView{Name: lk.Name, Class: lk.Class, Mode: lk.Mode(), Limit: lk.Limit, Waiters: len(lk.Waiters), TTLRemaining: -1}
	holds := lk.Holds
	if lk.Hold != nil {
		holds = []core.Hold{*lk.Hold}
	}
	for _, h := range holds {
		hv := HolderView{Token: h.Token, Holder: h.Holder, TTLRemaining: -1, DelayMillis: h.DelayMillis}
		if c, ok := l.leases[h.Lease]; ok {
			hv.TTLRemaining = max(0, c.deadline-l.now())
		}
		v.Holders = append(v.Holders, hv)
	}
	if len(v.Holders) > 0 {
		first := v.Holders[0]
		v.Held, v.Token, v.Holder, v.DelayMillis, v.TTLRemaining = true, first.Token, first.Holder, first.DelayMillis, first.TTLRemaining
	}
	if d := l.delays[lk.Name]; d != nil && lk.Delayed {
		v.DelayRemaining = max(0, time.Until(d.deadline))
	}
	return v
}

// CheckToken reports whether token is the token of a current holder of name (any of
// them, for a lock held shared or a semaphore), and the holder's token (the exclusive
// holder's, or the oldest one's; 0 when nobody holds it), read after a quorum confirmed
// that this node still leads, in a round that began after the call: a deposed leader
// must not vouch for a token that a newer leader has superseded. The answer holds at the
// moment it was read; the holder may lose the lock right after. Errors: ErrNotLeader
// (not serving, or not confirmed, as for KeepAlive) and ctx's error.
func (l *Leader) CheckToken(ctx context.Context, name string, token uint64) (current bool, holderToken uint64, err error) {
	if !l.Active() {
		return false, 0, ErrNotLeader
	}
	if err := l.confirm(ctx); err != nil {
		return false, 0, err
	}
	v, err := l.Describe(name)
	for _, h := range v.Holders {
		current = current || h.Token == token
	}
	return current, v.Token, err
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
