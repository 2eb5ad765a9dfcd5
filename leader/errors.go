package leader

import (
	"errors"
	"fmt"

	"github.com/leasehold/leasehold/core"
)

// Errors returned by Leader. Errors from core (lease not found, not holder, class
// conflict, limits) pass through wrapped.
var (
	// ErrNotLeader is returned when this node is not (or not yet) the serving leader, or
	// could not confirm with a quorum that it still is (KeepAlive, CheckToken; the error
	// then wraps the log's). Nothing was changed that another leader would see; retry on
	// the leader.
	ErrNotLeader = errors.New("leader: not the serving leader")
	// ErrWaitTimeout is returned by Acquire when the lock stayed held for the whole wait.
	// The lease is no longer queued.
	ErrWaitTimeout = errors.New("leader: lock stayed held for the whole wait")
	// ErrUndoing is returned by an Acquire or a Campaign while another attempt of the
	// same request by the same lease, whose caller left, is being taken back (its place
	// in the queue cancelled, or its grant released): the attempt is refused, or its
	// wait ended, since the place or grant it would have had is the one going away.
	// Nothing is held for it; retry after a pause (the client does), which waits anew.
	ErrUndoing = errors.New("leader: another attempt of this request is being taken back; retry after a pause")
	// ErrEpochLost is returned to an Acquire waiting in an efficiency lock's queue when
	// this node stops being leader: the in-memory table that queued it is gone, and with
	// it the place in the queue. Retry on the new leader (a new epoch).
	ErrEpochLost = errors.New("leader: efficiency lock state was lost with the leader")
)

// LeaseGoneError is returned for a lease that no longer exists, with the reason the
// replicated state remembers. It matches core.ErrLeaseNotFound.
type LeaseGoneError struct {
	Lease  core.LeaseID
	Reason core.EndReason
}

func (e *LeaseGoneError) Error() string {
	return fmt.Sprintf("leader: lease %s not found (%s)", e.Lease, e.Reason)
}

// Unwrap makes LeaseGoneError match core.ErrLeaseNotFound.
func (e *LeaseGoneError) Unwrap() error { return core.ErrLeaseNotFound }

// LockHeldError is returned by Acquire when the lock is held (try-once) or stayed held
// for the whole wait. It matches core.ErrLockHeld and, after a wait, ErrWaitTimeout.
type LockHeldError struct {
	Name        string
	HolderToken uint64
	Holder      core.Holder
	Waited      bool
	// Explain says why, in full (holders, queue, reason); nil if not known.
	Explain *Explanation
}

func (e *LockHeldError) Error() string {
	if e.Waited {
		return fmt.Sprintf("leader: lock %q stayed held for the whole wait (holder token %d)", e.Name, e.HolderToken)
	}
	return fmt.Sprintf("leader: lock %q is held (holder token %d)", e.Name, e.HolderToken)
}

// Is makes LockHeldError match core.ErrLockHeld, and ErrWaitTimeout after a wait.
func (e *LockHeldError) Is(target error) bool {
	return target == core.ErrLockHeld || (e.Waited && target == ErrWaitTimeout)
}
