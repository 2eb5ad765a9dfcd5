package leader

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/leasehold/leasehold/core"
)

// Grant creates a lease with the given TTL. The lease is durable when Grant returns.
func (l *Leader) Grant(ctx context.Context, ttl time.Duration) (core.LeaseID, error) {
	if !l.Active() {
		return core.LeaseID{}, ErrNotLeader
	}
	var id core.LeaseID
	if _, err := rand.Read(id[:]); err != nil {
		return id, fmt.Errorf("leader: lease id: %w", err)
	}
	res, err := l.log.Apply(ctx, core.Command{Op: core.OpGrant, Lease: id, TTLMillis: ttl.Milliseconds()})
	if err == nil {
		err = res.Err
	}
	return id, err
}

// KeepAliveResult is a keepalive's answer.
type KeepAliveResult struct {
	// TTL is the lease's TTL; its countdown restarted at full TTL when KeepAlive was
	// called.
	TTL time.Duration
	// Epoch identifies the in-memory state that holds this leader's efficiency locks: an
	// efficiency grant that carried another epoch is lost.
	Epoch string
	// Lost are the locks the lease lost to a force release while it lived: its
	// correctness locks (kept in the replicated state, so any later leader reports them
	// too), then its efficiency locks (kept by this leader), each oldest first and at
	// most core.MaxLostPerLease of each. Every answer repeats them until the lease ends;
	// the holder matches them to its grants by name and token.
	Lost []core.LostLock
}

// KeepAlive restarts lease's countdown at full TTL from now, then confirms with a quorum
// that this node still leads (Log.VerifyLeader, in a round that begins after the
// countdown restarted), and only then answers (G4). Without the confirmation, a leader
// that was paused or cut off while another was elected would acknowledge keepalives the
// new leader never sees, and the new leader would expire the lease sooner than TTL after
// them. With it, any newer leader was elected after the confirmation, so it restarts the
// countdown later still.
//
// Errors:
//   - ErrNotLeader: this node does not serve as leader, or could not confirm it still
//     leads (the error then wraps the log's). The countdown may have restarted here;
//     that changes nothing any other leader does.
//   - *LeaseGoneError (matching core.ErrLeaseNotFound): the lease is unknown, ended, or
//     its expiry is already being proposed (the keepalive came too late and is not
//     acknowledged). Said only after the same confirmation: a deposed leader that has
//     not noticed may count as gone a lease that the new leader still keeps.
//   - ctx's error, when ctx ended before the confirmation did.
func (l *Leader) KeepAlive(ctx context.Context, lease core.LeaseID) (KeepAliveResult, error) {
	res, err := l.renew(lease)
	if errors.Is(err, ErrNotLeader) {
		return KeepAliveResult{}, err
	}
	if cerr := l.confirm(ctx); cerr != nil {
		return KeepAliveResult{}, cerr
	}
	return res, err
}

// KeepAliveThen is KeepAlive without the wait: it restarts the countdown at once and
// then gets the answer once a quorum round that began after the restart confirmed this
// node still leads (G4), on the goroutine that runs confirmation rounds (it must not
// block), or at once when the lease is unknown to a node that is not the leader. The
// fast-lane reader serves keepalives this way: a million leases renewed every ten
// seconds need no goroutine per keepalive.
func (l *Leader) KeepAliveThen(lease core.LeaseID, then func(KeepAliveResult, error)) {
	res, err := l.renew(lease)
	if errors.Is(err, ErrNotLeader) {
		then(KeepAliveResult{}, err)
		return
	}
	l.log.VerifyLeaderThen(func(cerr error) {
		if cerr != nil {
			then(KeepAliveResult{}, notConfirmed(cerr))
			return
		}
		then(res, err)
	})
}

// renew restarts lease's countdown and returns the answer to a keepalive, or that the
// lease is gone.
func (l *Leader) renew(lease core.LeaseID) (KeepAliveResult, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.active {
		return KeepAliveResult{}, ErrNotLeader
	}
	c, ok := l.leases[lease]
	if !ok || c.expiring {
		return KeepAliveResult{}, l.goneLocked(lease, ok)
	}
	c.deadline = l.now() + c.ttl // later than its place in the queue: see countdownHeap
	l.leases[lease] = c
	return KeepAliveResult{TTL: c.ttl, Epoch: l.epoch, Lost: l.lostLocked(lease, c)}, nil
}

// lostLocked returns the locks c's lease lost to force releases, correctness then
// efficiency (see KeepAliveResult.Lost). It reads the replicated state only for a lease
// known to have lost some there (countdown.lost): a keepalive that races the apply of a
// force release may miss it, and the next one reports it.
func (l *Leader) lostLocked(lease core.LeaseID, c countdown) []core.LostLock {
	var lost []core.LostLock
	if c.lost {
		lost = l.replicatedLost(lease)
	}
	if eff := l.eff.Lost(lease); len(eff) > 0 {
		lost = append(slices.Clip(lost), eff...) // never append to the state's slice
	}
	return lost
}

// replicatedLost returns lease's lost locks as the replicated state keeps them. (Apart
// from lostLocked so that a keepalive that reads nothing allocates nothing.)
func (l *Leader) replicatedLost(lease core.LeaseID) (lost []core.LostLock) {
	l.log.Read(func(s *core.State) { lost = s.Locks().Lost(lease) })
	return lost
}

// confirm asks a quorum whether this node still leads (Log.VerifyLeader). A failure is
// ErrNotLeader wrapping the log's error; a context's error passes through.
func (l *Leader) confirm(ctx context.Context) error {
	err := l.log.VerifyLeader(ctx)
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return notConfirmed(err)
}

// notConfirmed is ErrNotLeader for a leadership confirmation that failed with err.
func notConfirmed(err error) error {
	return fmt.Errorf("%w: leadership not confirmed: %w", ErrNotLeader, err)
}

// Revoke ends lease now and releases its locks.
func (l *Leader) Revoke(ctx context.Context, lease core.LeaseID) error {
	return l.end(ctx, core.OpRevoke, lease)
}

// Disconnect ends lease now, as Revoke does, because the connection it was bound to
// (release on disconnect, G7) ended; the lease is remembered as ended by
// core.EndDisconnected, and its holders' lock-delays apply as after an expiry. Errors
// are Revoke's: ErrNotLeader, *LeaseGoneError when the lease had already ended.
func (l *Leader) Disconnect(ctx context.Context, lease core.LeaseID) error {
	return l.end(ctx, core.OpDisconnect, lease)
}

// end ends lease by op (OpRevoke or OpDisconnect).
func (l *Leader) end(ctx context.Context, op core.Op, lease core.LeaseID) error {
	if !l.Active() {
		return ErrNotLeader
	}
	res, err := l.log.Apply(ctx, core.Command{Op: op, Lease: lease})
	if err != nil {
		return err
	}
	if errors.Is(res.Err, core.ErrLeaseNotFound) {
		return l.gone(lease)
	}
	return res.Err
}

func (l *Leader) gone(lease core.LeaseID) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.goneLocked(lease, false)
}

func (l *Leader) goneLocked(lease core.LeaseID, expiring bool) error {
	reason := core.EndExpired
	if !expiring {
		l.log.Read(func(s *core.State) { reason = s.EndedReason(lease) })
	}
	return &LeaseGoneError{Lease: lease, Reason: reason}
}
