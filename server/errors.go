package server

import (
	"context"
	"errors"

	"connectrpc.com/connect"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/core"
	"github.com/leasehold/leasehold/internal/auth"
	"github.com/leasehold/leasehold/leader"
	"github.com/leasehold/leasehold/replication"
)

// errorCodes is the one table that maps errors to RPC codes and stable reasons. Entries
// are matched in order with errors.Is, so wrapped errors map too. The fast lane and
// Connect both use it (see ToConnect).
var errorCodes = []struct {
	err    error
	code   connect.Code
	reason string
}{
	{core.ErrInvalid, connect.CodeInvalidArgument, "invalid_argument"},
	{core.ErrStaleToken, connect.CodeFailedPrecondition, "stale_token"},
	{core.ErrVersionMismatch, connect.CodeFailedPrecondition, "version_mismatch"},
	{core.ErrLeaseNotFound, connect.CodeNotFound, "lease_unknown"},
	{core.ErrNotHolder, connect.CodeFailedPrecondition, "not_holder"},
	{core.ErrClassConflict, connect.CodeFailedPrecondition, "class_conflict"},
	{core.ErrModeConflict, connect.CodeFailedPrecondition, "mode_conflict"},
	{core.ErrSetConflict, connect.CodeFailedPrecondition, "set_conflict"},
	{core.ErrLockHeld, connect.CodeDeadlineExceeded, "lock_held"},
	{core.ErrTooManyLeases, connect.CodeResourceExhausted, "limit_leases"},
	{core.ErrTooManyLocks, connect.CodeResourceExhausted, "limit_locks_per_lease"},
	{core.ErrTooManyWaiters, connect.CodeResourceExhausted, "limit_waiters"},
	{core.ErrTooManyKeys, connect.CodeResourceExhausted, "limit_idempotency_keys"},
	{core.ErrLeaseExists, connect.CodeAlreadyExists, "lease_exists"},
	{leader.ErrNotLeader, connect.CodeUnavailable, "not_leader"},
	{replication.ErrNotLeader, connect.CodeUnavailable, "not_leader"},
	{replication.ErrOutcomeUnknown, connect.CodeUnavailable, "outcome_unknown"},
	{leader.ErrEpochLost, connect.CodeUnavailable, "epoch_lost"},
	{errNoSuchMember, connect.CodeNotFound, "no_such_member"},
	{errMemberCheck, connect.CodeFailedPrecondition, "member_check"},
	{errLastVoter, connect.CodeFailedPrecondition, "last_voter"},
	{errNotCaughtUp, connect.CodeUnavailable, "not_caught_up"},
	{errWrongCluster, connect.CodeFailedPrecondition, "wrong_cluster"},
	{errNoClusterID, connect.CodeUnavailable, "no_cluster_id"},
	{auth.ErrUnauthenticated, connect.CodeUnauthenticated, "unauthenticated"},
	{auth.ErrPermissionDenied, connect.CodePermissionDenied, "permission_denied"},
	{auth.ErrQuota, connect.CodeResourceExhausted, "quota"},
	{context.DeadlineExceeded, connect.CodeDeadlineExceeded, "deadline_exceeded"},
	{context.Canceled, connect.CodeCanceled, "canceled"},
}

// ToConnect converts an error from the leader, core or replication into a
// *connect.Error with the right code and an ErrorDetail. Errors that already are
// *connect.Error pass through.
func ToConnect(err error) error {
	if err == nil {
		return nil
	}
	if ce := new(connect.Error); errors.As(err, &ce) {
		return err
	}
	code, detail := Classify(err)
	ce := connect.NewError(code, err)
	if d, derr := connect.NewErrorDetail(detail); derr == nil {
		ce.AddDetail(d)
	}
	return ce
}

// detailOf returns the ErrorDetail that err, a *connect.Error, carries (nil if none).
func detailOf(err error) *leaseholdv1.ErrorDetail {
	ce := new(connect.Error)
	if !errors.As(err, &ce) {
		return nil
	}
	var detail *leaseholdv1.ErrorDetail
	for _, d := range ce.Details() {
		if v, derr := d.Value(); derr == nil {
			if ed, ok := v.(*leaseholdv1.ErrorDetail); ok {
				detail = ed
			}
		}
	}
	return detail
}

// Classify returns the RPC code and the ErrorDetail for err.
func Classify(err error) (connect.Code, *leaseholdv1.ErrorDetail) {
	detail := &leaseholdv1.ErrorDetail{Reason: "internal"}
	code := connect.CodeInternal
	for _, e := range errorCodes {
		if errors.Is(err, e.err) {
			code, detail.Reason = e.code, e.reason
			break
		}
	}
	if fe := new(core.FieldError); errors.As(err, &fe) {
		detail.Field = fe.Field
	}
	if lg := new(leader.LeaseGoneError); errors.As(err, &lg) {
		detail.Reason = "lease_" + lg.Reason.String()
	}
	if lh := new(leader.LockHeldError); errors.As(err, &lh) {
		detail.HolderToken = lh.HolderToken
		detail.Holder = holderToProto(lh.Holder)
		detail.HeldLock = lh.Name
	}
	if st := new(core.StaleTokenError); errors.As(err, &st) {
		detail.HighestToken = st.Highest
	}
	if vm := new(core.VersionMismatchError); errors.As(err, &vm) {
		detail.CurrentVersion = vm.Current
	}
	if q := new(auth.QuotaError); errors.As(err, &q) {
		detail.Reason = "quota_" + q.Quota
	}
	var lim *limitError
	if errors.As(err, &lim) {
		code, detail.Field = connect.CodeResourceExhausted, lim.field
	}
	return code, detail
}

// Errors of the membership and cluster-identity checks (cluster.go).
var (
	// errNoSuchMember is returned by RemoveMember for a node that is not in the cluster.
	errNoSuchMember = errors.New("server: no such member")
	// errMemberCheck is returned by AddMember, having changed nothing, when the node to
	// add does not answer as itself: no answer at its API address, another node id or
	// raft address, or the data of another cluster.
	errMemberCheck = errors.New("server: the node cannot be added")
	// errLastVoter is returned by RemoveMember, having changed nothing, for the only
	// voter.
	errLastVoter = errors.New("server: cannot remove the last voter")
	// errNotCaughtUp is returned by AddMember when the new member, added as a non-voter,
	// did not catch up with the log in time; it stays a non-voter.
	errNotCaughtUp = errors.New("server: the new member has not caught up")
	// errWrongCluster is returned, before the request is served, when the caller expects
	// another cluster than this node's.
	errWrongCluster = errors.New("server: wrong cluster")
	// errNoClusterID is returned, before the request is served, when the caller expects
	// a cluster and this node does not know its own yet.
	errNoClusterID = errors.New("server: this node does not know its cluster yet")
)

// limitError is a request that exceeds a size bound of the server (not a field rule).
type limitError struct {
	field string
	msg   string
}

func (e *limitError) Error() string { return e.field + ": " + e.msg }
