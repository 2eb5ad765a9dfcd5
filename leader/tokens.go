package leader

import (
	"context"
	"fmt"

	"github.com/leasehold/leasehold/core"
)

// block is a range of tokens reserved through the log for efficiency grants.
type block struct{ next, end uint64 } // [next, end)

func (b *block) remaining() uint64 {
	if b.next >= b.end {
		return 0
	}
	return b.end - b.next
}

// Next implements core.Sequence. It never runs dry: see tokensNeededLocked.
func (b *block) Next() uint64 {
	v := b.next
	b.next++
	return v
}

// tokensNeededLocked is how many tokens the efficiency block must still hold before an
// operation that may itself consume extra tokens. The table consumes tokens without an
// Acquire only by granting queued waiters (on a release, an expiry, a force release or
// the end of a lock-delay), at most one per waiter; so if every operation that adds a
// grant or a waiter first makes sure the block covers all waiters plus its own needs,
// the block can never run dry inside OnEffects, where nothing can wait for a commit.
func (l *Leader) tokensNeededLocked(extra int) uint64 {
	return uint64(l.eff.Waiting() + extra)
}

func (l *Leader) reserve(ctx context.Context) error { return l.reserveAtLeast(ctx, 0) }

// reserveAtLeast reserves a new block of ReserveBlock tokens, or of 2×need when that is
// larger, and installs it in place of the current one (whose unused tokens are skipped).
// A block reserved in an earlier epoch is never installed: its answer may arrive after
// this node was deposed, another leader reserved later blocks and granted from them, and
// this node leads again; granting from it would take a lock's token backwards (G1).
func (l *Leader) reserveAtLeast(ctx context.Context, need uint64) error {
	l.mu.Lock()
	epoch := l.epoch
	l.mu.Unlock()
	count := max(l.cfg.ReserveBlock, 2*need)
	res, err := l.log.Apply(ctx, core.Command{Op: core.OpReserve, Count: count})
	if err == nil {
		err = res.Err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case !l.active:
		return ErrNotLeader
	case l.epoch != epoch:
		return fmt.Errorf("leader: reserve tokens: %w", ErrEpochLost)
	}
	l.refill = false
	if err != nil {
		return fmt.Errorf("leader: reserve tokens: %w", err)
	}
	// Reservations that complete out of order must not move tokens backwards: keep the
	// current block when this one starts below its next token (it was reserved earlier).
	if res.Token >= l.effSeq.next {
		l.effSeq = block{next: res.Token, end: res.Token + count}
	}
	return nil
}

// refillLocked starts a background reservation when the block is half used, so that the
// acquire path rarely waits for one.
func (l *Leader) refillLocked() {
	if l.effSeq.end != 0 && l.effSeq.remaining() < l.cfg.ReserveBlock/2 && !l.refill {
		l.refill = true
		go func() { _ = l.reserve(context.Background()) }()
	}
}
