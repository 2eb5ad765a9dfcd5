// Package reason names, once, the stable machine-readable reasons that travel in
// ErrorDetail.reason: the server sets them (server/errors.go) and the client matches
// them (package client), and neither types the strings again.
//
// The package is internal on purpose. The strings themselves are the public contract
// (documented with ErrorDetail in proto/leasehold/v1/leasehold.proto, for clients in any
// language); Go users of package client match its typed errors (ErrNotAcquired,
// ErrStaleToken, ...) instead. Keeping the constants internal lets the list grow with
// the coming RPCs, and move (into the method table, say), without a breaking change. It
// imports nothing, so the client pulls no server dependency through it.
package reason

// Reasons, by the code they come with.
const (
	// InvalidArgument: a field is malformed or out of range (ErrorDetail.field names it).
	InvalidArgument = "invalid_argument"

	// NotFound: the lease is gone, and why.
	LeaseUnknown = "lease_unknown" // never existed, or ended so long ago nobody remembers
	LeaseExpired = "lease_expired"
	LeaseRevoked = "lease_revoked"
	// LeaseDisconnected: a release-on-disconnect lease (G7) whose connection ended.
	LeaseDisconnected = "lease_disconnected"
	NoSuchMember      = "no_such_member"
	GroupUnknown      = "group_unknown"

	// FailedPrecondition.
	StaleToken      = "stale_token"
	VersionMismatch = "version_mismatch"
	NotHolder       = "not_holder"
	ClassConflict   = "class_conflict"
	ModeConflict    = "mode_conflict" // another mode or semaphore limit than the name is in use with
	SetConflict     = "set_conflict"  // a lock set that overlaps what the lease holds or waits for
	MemberCheck     = "member_check"  // the node to add does not answer as itself
	LastVoter       = "last_voter"
	QuorumAtRisk    = "quorum_at_risk" // the voters left after a removal would have no live majority
	WrongCluster    = "wrong_cluster"
	Compacted       = "compacted"  // a Watch start, or an Observe resume point, below the retained history (the message names the oldest revision)
	NotMember       = "not_member" // the lease is not the group member's
	NotOwner        = "not_owner"  // the lease does not own the partition at that epoch

	// DeadlineExceeded: the lock stayed held for the whole wait.
	LockHeld = "lock_held"

	// ResourceExhausted: a server limit.
	LimitLeases        = "limit_leases"
	LimitLocksPerLease = "limit_locks_per_lease"
	LimitWaiters       = "limit_waiters"
	LimitKeys          = "limit_idempotency_keys"
	LimitGroups        = "limit_groups"
	LimitGroupMembers  = "limit_group_members"
	Quota              = "quota"            // an identity's quota (auth); the message says which
	ObserverLagging    = "observer_lagging" // an Observe stream fell too far behind (servers before the election history; now "compacted")

	// AlreadyExists.
	LeaseExists  = "lease_exists"
	GroupExists  = "group_exists"  // with other settings
	MemberExists = "member_exists" // under another lease

	// Unavailable, the request not served by any leader: nothing was done, and the
	// request is safe to send again, to any node.
	NotLeader     = "not_leader"     // ErrorDetail.leader_api_addr names the leader when known
	LeaderUnknown = "leader_unknown" // this node knows no leader, or not yet its API address
	// Unavailable, the outcome unknown: the request may have taken effect.
	LeaderUnreachable = "leader_unreachable" // the forward to the leader got no answer
	OutcomeUnknown    = "outcome_unknown"    // leadership was lost before the commit was confirmed
	EpochLost         = "epoch_lost"
	// Unavailable, nothing done: try another node.
	NotCaughtUp  = "not_caught_up" // a new member added as a non-voter has not caught up
	NoClusterID  = "no_cluster_id" // this node does not know its cluster yet
	ShuttingDown = "shutting_down" // this node is shutting down and did not start the request
	// Unavailable, nothing done: send again to the same node after a pause.
	Busy = "busy" // the leader's log could not take the entry in time

	// Unauthenticated and PermissionDenied (auth, G11).
	Unauthenticated  = "unauthenticated"
	PermissionDenied = "permission_denied"

	// The context's own ends.
	DeadlineExceeded = "deadline_exceeded"
	Canceled         = "canceled"

	// Internal: anything not mapped.
	Internal = "internal"
)
