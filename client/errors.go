package client

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"connectrpc.com/connect"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/internal/reason"
)

// Errors returned by the client, and causes reported by a held lock's context
// (context.Cause). Match them with errors.Is.
var (
	// ErrNoClass is returned by Lock when no class option was given: every lock must
	// say whether it is an Efficiency or a Correctness lock.
	ErrNoClass = errors.New("client: every lock must declare its class: pass client.Efficiency or client.Correctness")
	// ErrNotAcquired is returned by Lock when the lock stayed held by someone else for
	// the whole wait (immediately, with TryOnce). The error is a *HeldError.
	ErrNotAcquired = errors.New("client: lock not acquired: held by another holder")
	// ErrClassConflict is returned by Lock when the name is in use with the other class.
	ErrClassConflict = errors.New("client: lock name is in use with the other class")
	// ErrModeConflict is returned by Lock when the name is in use as another kind — a
	// readers-writer lock (exclusive or Shared), or a Semaphore of another size — or
	// when the holder already holds or waits for it in the other mode (no upgrades).
	ErrModeConflict = errors.New("client: lock name is in use in another mode")
	// ErrSetConflict is returned by LockSet (and Lock) when the holder already holds
	// or waits for one of the names under another Lock or LockSet.
	ErrSetConflict = errors.New("client: the holder already has one of the names under another lock")
	// ErrNoNames is returned by LockSet when it is given no name.
	ErrNoNames = errors.New("client: LockSet needs at least one name")
	// ErrUnavailable wraps failures to reach a server that can serve the request: the
	// call's context ended while no node could serve it, or a call that must not be
	// repeated (Put, Delete, ForceRelease, membership changes) met a failure after
	// which its outcome is unknown. For Lock and Unlock the outcome on the server is
	// then unknown too; both retry for you until their context ends.
	ErrUnavailable = errors.New("client: no server available")
	// ErrClosed is returned by calls on a closed Client, and by Lock on a closed Session.
	ErrClosed = errors.New("client: closed")
	// ErrWrongCluster is returned (as a FailedPrecondition) when a node belongs to
	// another cluster than the client's (see WithClusterID): the request was not served
	// there. The client moves on to its next address, if it has one. From a node that
	// names no cluster yet (one that has just joined) it comes as an Unavailable, which
	// the client's retries treat like an unreachable node. Servers that predate cluster
	// IDs name none and cannot refuse a request: they serve it before the client sees
	// the answer.
	ErrWrongCluster = errors.New("client: the node belongs to another cluster")

	// ErrLockLost is returned by Unlock when the lock had been lost: before Unlock was
	// called (the lock's Context was done; the message says "before Unlock" and wraps
	// the cause), or found lost by Unlock (the server answered that the lease does not
	// hold it; "found by Unlock"). Either way the critical section may not have been
	// exclusive for its whole length. The lock is not held after the call.
	ErrLockLost = errors.New("client: the lock was lost")

	// ErrLeaseExpired: the server expired the lease (no keepalive reached it in time).
	ErrLeaseExpired = errors.New("client: lease expired on the server")
	// ErrLeaseRevoked: the lease was revoked (Client.Close, Session.Close, or an operator).
	ErrLeaseRevoked = errors.New("client: lease revoked")
	// ErrLeaseDeadline: no keepalive was acknowledged in time, so the client gave the
	// lock up at its cautious local deadline — before the server could expire the lease.
	// The server may still hold the lease for up to the safety margin plus network delay.
	ErrLeaseDeadline = errors.New("client: no keepalive acknowledged before the local deadline")
	// ErrReleasedByOperator: an operator force-released the lock.
	ErrReleasedByOperator = errors.New("client: lock released by an operator")
	// ErrStateLost: the leader that held this efficiency lock in memory restarted or
	// changed, and the lock is gone.
	ErrStateLost = errors.New("client: the leader lost the efficiency lock state")
	// ErrDisconnected: the lock hung on a release-on-disconnect lease (see
	// ReleaseOnDisconnect) whose fast-lane connection broke or fell silent; the server
	// revokes such a lease when it sees the connection end.
	ErrDisconnected = errors.New("client: disconnected")
	// ErrUnlocked is the cause of a lock context after a successful Unlock.
	ErrUnlocked = errors.New("client: unlocked")
	// ErrUnlockUnconfirmed is the cause of a lock context after an Unlock that no
	// server confirmed (it returned ErrUnavailable): the release goes on in the
	// background, and the holder must act as if the lock were gone.
	ErrUnlockUnconfirmed = errors.New("client: Unlock called, release not confirmed yet")
	// ErrCompacted: Observe could not resume, because the election changes after the
	// last one it showed are no longer held (the error is a *CompactedError).
	ErrCompacted = errors.New("client: the election history to resume from is no longer held (compacted)")
)

// HeldError is returned by Lock when the lock is held by someone else. It matches
// ErrNotAcquired. It explains the answer as the leader saw the lock when the attempt
// ended (a try-once, or a wait that ran out): Holders, the queue, where the caller
// stood, and Reason. Servers that predate explained answers fill only Name,
// HolderToken and Holder.
type HeldError struct {
	Name        string
	HolderToken uint64
	Holder      Holder
	// Holders are the lock's holders, oldest first, each with its token and since when
	// it holds the lock (zero when unknown).
	Holders []HeldBy
	// QueueLength is how many waited; Position the caller's place when its wait ran
	// out (1 = first), 0 for TryOnce.
	QueueLength, Position int
	// Reason is why: "held", "mode_conflict" (held shared while exclusive was asked, or
	// the other way), "lock_delay" (until DelayUntil), "waiters_ahead" (free, but others
	// queued first); "" from an older server.
	Reason     string
	DelayUntil time.Time
}

// HeldBy is one holder of a lock in a HeldError.
type HeldBy struct {
	Token  uint64
	Holder Holder
	Since  time.Time
}

func (e *HeldError) Error() string {
	msg := fmt.Sprintf("client: lock %q not acquired: held%s under token %d", e.Name, e.Holder.describe(), e.HolderToken)
	if len(e.Holders) > 0 && !e.Holders[0].Since.IsZero() {
		msg += " since " + e.Holders[0].Since.UTC().Format(time.RFC3339)
	}
	if n := len(e.Holders); n > 1 {
		msg += fmt.Sprintf(" (and %d more holders)", n-1)
	}
	switch e.Reason {
	case "mode_conflict":
		msg += "; held in the other mode"
	case "lock_delay":
		msg = fmt.Sprintf("client: lock %q not acquired: in its lock-delay until %s", e.Name, e.DelayUntil.UTC().Format(time.RFC3339Nano))
	case "waiters_ahead":
		msg = fmt.Sprintf("client: lock %q not acquired: others were queued first", e.Name)
	}
	if e.QueueLength > 0 {
		msg += fmt.Sprintf("; %d waiting", e.QueueLength)
		if e.Position > 0 {
			msg += fmt.Sprintf(", this caller was number %d", e.Position)
		}
	}
	return msg
}

// heldError builds a HeldError from a lock_held ErrorDetail.
func heldError(name string, d *leaseholdv1.ErrorDetail) *HeldError {
	holder := func(h *leaseholdv1.Holder) Holder {
		return Holder{Host: h.GetHost(), PID: h.GetPid(), Note: h.GetNote()}
	}
	e := &HeldError{Name: name, HolderToken: d.GetHolderToken(), Holder: holder(d.GetHolder())}
	if d.GetHeldLock() != "" {
		e.Name = d.GetHeldLock()
	}
	x := d.GetExplanation()
	if x == nil {
		return e
	}
	for _, h := range x.GetHolders() {
		hb := HeldBy{Token: h.GetToken(), Holder: holder(h.GetHolder())}
		if ms := h.GetSinceUnixMs(); ms != 0 {
			hb.Since = time.UnixMilli(ms)
		}
		e.Holders = append(e.Holders, hb)
	}
	e.QueueLength, e.Position = int(x.GetQueueLength()), int(x.GetPosition())
	e.Reason = strings.ToLower(strings.TrimPrefix(x.GetReason().String(), "HELD_REASON_"))
	if x.GetReason() == leaseholdv1.HeldReason_HELD_REASON_UNSPECIFIED {
		e.Reason = ""
	}
	if ms := x.GetDelayUntilUnixMs(); ms != 0 {
		e.DelayUntil = time.UnixMilli(ms)
	}
	return e
}

// Is makes HeldError match ErrNotAcquired.
func (e *HeldError) Is(target error) bool { return target == ErrNotAcquired }

// detail extracts the server's ErrorDetail from a Connect error.
func detail(err error) (connect.Code, *leaseholdv1.ErrorDetail) {
	ce := new(connect.Error)
	if !errors.As(err, &ce) {
		return connect.CodeUnknown, &leaseholdv1.ErrorDetail{}
	}
	for _, d := range ce.Details() {
		if v, derr := d.Value(); derr == nil {
			if ed, ok := v.(*leaseholdv1.ErrorDetail); ok {
				return ce.Code(), ed
			}
		}
	}
	return ce.Code(), &leaseholdv1.ErrorDetail{}
}

// detailReason is the reason of err's ErrorDetail ("" when it has none).
func detailReason(err error) string {
	_, d := detail(err)
	return d.GetReason()
}

// leaseGoneCause maps a NotFound keepalive to the cause a lock context reports.
func leaseGoneCause(err error) error {
	_, d := detail(err)
	switch d.GetReason() {
	case reason.LeaseRevoked:
		return fmt.Errorf("%w: %w", ErrLeaseRevoked, err)
	case reason.LeaseDisconnected:
		return fmt.Errorf("%w: %w", ErrDisconnected, err)
	}
	return fmt.Errorf("%w: %w", ErrLeaseExpired, err)
}
