package leader

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"time"

	"github.com/leasehold/leasehold/core"
)

// LostLock is a lock a lease lost while it was alive (force release), reported on its
// next keepalive.
type LostLock struct {
	Name   string
	Token  uint64
	Reason string
}

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

// KeepAlive restarts lease's countdown at full TTL from now. It returns the TTL, the
// efficiency epoch, and locks the lease lost to a force release since the last call.
// A lease whose expiry is already being proposed is reported gone: the keepalive came
// too late and is not acknowledged.
func (l *Leader) KeepAlive(lease core.LeaseID) (time.Duration, string, []LostLock, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.active {
		return 0, "", nil, ErrNotLeader
	}
	c := l.leases[lease]
	if c == nil || c.expiring {
		return 0, "", nil, l.goneLocked(lease, c != nil)
	}
	c.deadline = time.Now().Add(c.ttl) // later than its place in the queue: see countdownHeap
	lost := l.lost[lease]
	delete(l.lost, lease)
	return c.ttl, l.epoch, lost, nil
}

// Revoke ends lease now and releases its locks.
func (l *Leader) Revoke(ctx context.Context, lease core.LeaseID) error {
	if !l.Active() {
		return ErrNotLeader
	}
	res, err := l.log.Apply(ctx, core.Command{Op: core.OpRevoke, Lease: lease})
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
