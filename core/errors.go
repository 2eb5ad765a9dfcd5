package core

import "errors"

// Errors returned by State.Apply and the Locks methods. They are wrapped with context
// (%w); match them with errors.Is.
var (
	// ErrLeaseNotFound is returned when a command names a lease that does not exist: it
	// expired, was revoked, or was never granted.
	ErrLeaseNotFound = errors.New("core: lease not found")
	// ErrLeaseExists is returned by OpGrant when the lease id is already in use.
	ErrLeaseExists = errors.New("core: lease already exists")
	// ErrNotHolder is returned by Release when the lease does not hold the lock, or holds
	// it under a different token.
	ErrNotHolder = errors.New("core: lease does not hold the lock")
	// ErrNotWaiting is returned by CancelWait when the lease neither holds nor waits for
	// the lock.
	ErrNotWaiting = errors.New("core: lease is not waiting for the lock")
	// ErrClassConflict is returned by Acquire when the lock is held or waited for in the
	// other class.
	ErrClassConflict = errors.New("core: lock is in use with the other class")
	// ErrModeConflict is returned by Acquire when the lock is held, waited for or
	// delayed as another kind (a readers-writer lock, or a semaphore of another limit),
	// or when the lease already holds or waits for it in the other mode of a
	// readers-writer lock (an upgrade or downgrade, which leasehold does not do).
	ErrModeConflict = errors.New("core: lock is in use in another mode")
	// ErrSetConflict is returned by Acquire when the lease already holds or waits for
	// one of the names under another acquire: a lock set that overlaps its own holds,
	// or one name of a set asked for on its own.
	ErrSetConflict = errors.New("core: the lease holds or waits for the lock under another acquire")
	// ErrLockHeld is returned by a try-once Acquire when another lease holds the lock (or
	// the lock is in its lock-delay).
	ErrLockHeld = errors.New("core: lock is held")
	// ErrTooManyLeases is returned by OpGrant when the lease limit is reached.
	ErrTooManyLeases = errors.New("core: too many leases")
	// ErrTooManyLocks is returned by Acquire when the lease already holds or waits for
	// the maximum number of locks.
	ErrTooManyLocks = errors.New("core: too many locks for one lease")
	// ErrTooManyWaiters is returned by Acquire when the lock's queue is full.
	ErrTooManyWaiters = errors.New("core: too many waiters for the lock")
	// ErrTooManyKeys is returned by OpBegin when Limits.IdempotencyKeys keys are in
	// progress already.
	ErrTooManyKeys = errors.New("core: too many idempotency keys in progress")
	// ErrTooManyGroups is returned by OpGroupCreate when Limits.MaxGroups groups exist.
	ErrTooManyGroups = errors.New("core: too many groups")
	// ErrTooManyMembers is returned by OpGroupJoin when the group has
	// Limits.MaxGroupMembers members.
	ErrTooManyMembers = errors.New("core: too many members in the group")
	// ErrGroupNotFound is returned by the group commands for a group that does not
	// exist.
	ErrGroupNotFound = errors.New("core: group not found")
	// ErrGroupExists is returned by OpGroupCreate when the group exists with another
	// partition count or drain deadline.
	ErrGroupExists = errors.New("core: group exists with other settings")
	// ErrMemberExists is returned by OpGroupJoin when the member name is taken by
	// another lease (a previous process of the member whose lease has not ended yet).
	ErrMemberExists = errors.New("core: member exists under another lease")
	// ErrNotMember is returned by OpGroupLeave when the lease is not that member's.
	ErrNotMember = errors.New("core: not a member of the group")
	// ErrNotOwner is returned by OpGroupRelease when the lease does not own the
	// partition at that epoch (and the epoch has not ended: releasing an ended epoch
	// succeeds and changes nothing).
	ErrNotOwner = errors.New("core: not the owner of the partition")
	// ErrStaleToken is returned by a fenced OpPut or OpDelete whose token is lower than
	// the highest token the key has accepted (the error is then a *StaleTokenError), and
	// by OpComplete whose token is not that of the Begin the idempotency key is in
	// progress under.
	ErrStaleToken = errors.New("core: stale fencing token")
	// ErrVersionMismatch is returned by a compare-and-set whose expected version is not
	// the key's. The error is a *VersionMismatchError.
	ErrVersionMismatch = errors.New("core: version mismatch")
	// ErrInvalid is returned when a command carries a value the state machine refuses
	// (an invalid name, class or TTL). The server validates first, so this only guards
	// the log against commands written by a buggy or hostile proposer.
	ErrInvalid = errors.New("core: invalid command")
	// ErrClusterID is returned by OpSetClusterID when the state already carries another
	// cluster ID: a cluster is named once.
	ErrClusterID = errors.New("core: the cluster already has another ID")
	// ErrHistoryCompacted is returned by State.ElectionChanges (as a
	// *HistoryCompactedError) for a resume point below the history an election still
	// has: a change after it is no longer held.
	ErrHistoryCompacted = errors.New("core: the election history is no longer held (compacted)")
	// ErrCorrupt is returned when an encoded command or snapshot cannot be decoded.
	ErrCorrupt = errors.New("core: corrupt encoding")
)
