package leader

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/leasehold/leasehold/core"
)

// Run follows leadership changes until ctx ends: true promotes, false demotes.
func (l *Leader) Run(ctx context.Context, changes <-chan bool) {
	defer l.Demote()
	for {
		select {
		case <-ctx.Done():
			return
		case isLeader := <-changes:
			if !isLeader {
				l.Demote()
				continue
			}
			l.lg.Info("raft made this node leader; taking over")
			if err := l.Promote(ctx); err != nil {
				l.lg.Warn("could not take over as leader", "err", err)
			}
		}
	}
}

// Promote starts serving as leader: it waits until every committed entry is applied,
// starts a full-TTL countdown for every lease, a full lock-delay for every delayed
// lock and a full drain deadline for every draining partition, and opens a new efficiency
// epoch (with no tokens reserved yet, and an empty efficiency ledger).
func (l *Leader) Promote(ctx context.Context) error {
	if err := l.log.Barrier(ctx); err != nil {
		return fmt.Errorf("leader: barrier: %w", err)
	}
	l.mu.Lock()
	if l.active {
		l.mu.Unlock()
		return nil
	}
	var e [8]byte
	_, _ = rand.Read(e[:])
	l.epoch = hex.EncodeToString(e[:])
	l.stop = make(chan struct{})
	l.kick = make(chan struct{}, 1)
	l.eff = core.NewLocks(l.cfg.Limits)
	l.effSeq, l.refill = block{}, false // a refill still in flight is of the old epoch
	l.effLedger = core.NewLedger(l.cfg.Limits)
	l.recordLocked()
	l.since = time.Now()
	now := l.now()
	var delayed []*core.Lock
	type drain struct {
		k      drainKey
		millis int64
	}
	var drains []drain
	l.log.Read(func(s *core.State) {
		l.lostSome = s.LastToken() > 0
		s.Draining(func(group string, partition int, epoch uint64, millis int64) {
			drains = append(drains, drain{drainKey{group, uint32(partition), epoch}, millis})
		})
		s.Leases(func(ls *core.Lease) {
			l.addCountdownLocked(ls.ID, ls.TTLMillis, now, s.Locks().Lost(ls.ID) != nil)
		})
		delayed = append(delayed, s.Locks().DelayedLocks()...)
	})
	l.active = true
	l.obs.Promoted()
	for _, lk := range delayed {
		l.startDelayLocked(lk.Name, core.Correctness, lk.DelayMillis)
	}
	for _, d := range drains {
		l.startDrainLocked(d.k, d.millis)
	}
	stop, kick, epoch, counting := l.stop, l.kick, l.epoch, len(l.leases)
	l.mu.Unlock()
	go l.expiryLoop(stop, kick)
	if l.cfg.OnPromote != nil {
		pctx, cancel := context.WithCancel(context.Background())
		go func() {
			defer cancel()
			select {
			case <-stop:
			case <-pctx.Done():
			}
		}()
		go func() {
			defer cancel()
			l.cfg.OnPromote(pctx)
		}()
	}
	l.lg.Info("serving as leader", "epoch", epoch, "leases", counting)
	return nil
}

// Demote stops serving: countdowns stop, efficiency locks and their ledger are dropped
// (their holders learn it from the epoch in keepalive answers), an Acquire waiting in an efficiency
// queue fails with ErrEpochLost and one waiting for a correctness grant with
// ErrNotLeader (its place in the replicated queue stays: retried on the new leader, the
// acquire finds it).
func (l *Leader) Demote() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.active {
		return
	}
	l.active = false
	close(l.stop)
	clear(l.leases)
	l.queue, l.staleQueued = nil, 0
	for _, d := range l.delays {
		d.timer.Stop()
	}
	clear(l.delays)
	for _, t := range l.drains {
		t.Stop()
	}
	clear(l.drains)
	l.waits.failAll(func(name string) error {
		if l.names.inMemoryLocked(name) {
			return ErrEpochLost
		}
		return ErrNotLeader
	})
	l.eff = core.NewLocks(l.cfg.Limits)
	l.effLedger = core.NewLedger(l.cfg.Limits)
	l.lg.Info("stopped serving as leader")
}

// Epoch returns the current efficiency epoch ("" when not serving).
func (l *Leader) Epoch() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.active {
		return ""
	}
	return l.epoch
}

// Active reports whether this node is serving as leader.
func (l *Leader) Active() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.active
}
