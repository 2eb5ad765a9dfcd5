package server

import (
	"context"
	"errors"

	"connectrpc.com/connect"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/core"
	"github.com/leasehold/leasehold/internal/auth"
	"github.com/leasehold/leasehold/internal/reason"
	"github.com/leasehold/leasehold/leader"
	"github.com/leasehold/leasehold/replication"
	"github.com/leasehold/leasehold/watch"
)

// errorCodes is the one table that maps errors to RPC codes and stable reasons. Entries
// are matched in order with errors.Is, so wrapped errors map too. The fast lane and
// Connect both use it (see ToConnect).
var errorCodes = []struct {
	err    error
	code   connect.Code
	reason string
}{
	{core.ErrInvalid, connect.CodeInvalidArgument, reason.InvalidArgument},
	{core.ErrStaleToken, connect.CodeFailedPrecondition, reason.StaleToken},
	{core.ErrVersionMismatch, connect.CodeFailedPrecondition, reason.VersionMismatch},
	{core.ErrLeaseNotFound, connect.CodeNotFound, reason.LeaseUnknown},
	{core.ErrNotHolder, connect.CodeFailedPrecondition, reason.NotHolder},
	{core.ErrClassConflict, connect.CodeFailedPrecondition, reason.ClassConflict},
	{core.ErrModeConflict, connect.CodeFailedPrecondition, reason.ModeConflict},
	{core.ErrSetConflict, connect.CodeFailedPrecondition, reason.SetConflict},
	{core.ErrLockHeld, connect.CodeDeadlineExceeded, reason.LockHeld},
	{core.ErrTooManyLeases, connect.CodeResourceExhausted, reason.LimitLeases},
	{core.ErrTooManyLocks, connect.CodeResourceExhausted, reason.LimitLocksPerLease},
	{core.ErrTooManyWaiters, connect.CodeResourceExhausted, reason.LimitWaiters},
	{core.ErrTooManyKeys, connect.CodeResourceExhausted, reason.LimitKeys},
	{core.ErrLeaseExists, connect.CodeAlreadyExists, reason.LeaseExists},
	{core.ErrTooManyGroups, connect.CodeResourceExhausted, reason.LimitGroups},
	{core.ErrTooManyMembers, connect.CodeResourceExhausted, reason.LimitGroupMembers},
	{core.ErrGroupNotFound, connect.CodeNotFound, reason.GroupUnknown},
	{core.ErrGroupExists, connect.CodeAlreadyExists, reason.GroupExists},
	{core.ErrMemberExists, connect.CodeAlreadyExists, reason.MemberExists},
	{core.ErrNotMember, connect.CodeFailedPrecondition, reason.NotMember},
	{core.ErrNotOwner, connect.CodeFailedPrecondition, reason.NotOwner},
	{errLeaderUnknown, connect.CodeUnavailable, reason.LeaderUnknown},
	{errLeaderUnreachable, connect.CodeUnavailable, reason.LeaderUnreachable},
	{leader.ErrNotLeader, connect.CodeUnavailable, reason.NotLeader},
	{replication.ErrNotLeader, connect.CodeUnavailable, reason.NotLeader},
	{replication.ErrOutcomeUnknown, connect.CodeUnavailable, reason.OutcomeUnknown},
	{replication.ErrBusy, connect.CodeUnavailable, reason.Busy},
	{leader.ErrEpochLost, connect.CodeUnavailable, reason.EpochLost},
	{leader.ErrUndoing, connect.CodeUnavailable, reason.Busy},
	{errNoSuchMember, connect.CodeNotFound, reason.NoSuchMember},
	{errMemberCheck, connect.CodeFailedPrecondition, reason.MemberCheck},
	{errLastVoter, connect.CodeFailedPrecondition, reason.LastVoter},
	{errQuorumAtRisk, connect.CodeFailedPrecondition, reason.QuorumAtRisk},
	{errNotCaughtUp, connect.CodeUnavailable, reason.NotCaughtUp},
	{errWrongCluster, connect.CodeFailedPrecondition, reason.WrongCluster},
	{watch.ErrCompacted, connect.CodeFailedPrecondition, reason.Compacted},
	{core.ErrHistoryCompacted, connect.CodeFailedPrecondition, reason.Compacted},
	{errNoClusterID, connect.CodeUnavailable, reason.NoClusterID},
	{ErrShuttingDown, connect.CodeUnavailable, reason.ShuttingDown},
	{auth.ErrUnauthenticated, connect.CodeUnauthenticated, reason.Unauthenticated},
	{auth.ErrPermissionDenied, connect.CodePermissionDenied, reason.PermissionDenied},
	{auth.ErrQuota, connect.CodeResourceExhausted, reason.Quota},
	{context.DeadlineExceeded, connect.CodeDeadlineExceeded, reason.DeadlineExceeded},
	{context.Canceled, connect.CodeCanceled, reason.Canceled},
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
	detail := &leaseholdv1.ErrorDetail{Reason: reason.Internal}
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
		if r, ok := leaseGoneReasons[lg.Reason]; ok {
			detail.Reason = r
		}
	}
	if hint := new(leaderHint); errors.As(err, &hint) {
		detail.LeaderApiAddr = hint.addr
	}
	if lh := new(leader.LockHeldError); errors.As(err, &lh) {
		detail.HolderToken = lh.HolderToken
		detail.Holder = holderToProto(lh.Holder)
		detail.HeldLock = lh.Name
		detail.Explanation = explanationToProto(lh.Explain)
	}
	if st := new(core.StaleTokenError); errors.As(err, &st) {
		detail.HighestToken = st.Highest
	}
	if vm := new(core.VersionMismatchError); errors.As(err, &vm) {
		detail.CurrentVersion = vm.Current
	}
	if hc := new(core.HistoryCompactedError); errors.As(err, &hc) {
		detail.OldestRevision = hc.Oldest
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
	// errQuorumAtRisk is returned by RemoveMember, having changed nothing, when the
	// voters that would remain do not have a majority that answers the leader now.
	errQuorumAtRisk = errors.New("server: the removal would leave the cluster without a quorum")
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

// leaseGoneReasons are the reasons of a lease that is gone, by why it ended.
var leaseGoneReasons = map[core.EndReason]string{
	core.EndUnknown: reason.LeaseUnknown,
	core.EndExpired: reason.LeaseExpired,
	core.EndRevoked: reason.LeaseRevoked,

	core.EndDisconnected: reason.LeaseDisconnected,
}

// limitError is a request that exceeds a size bound of the server (not a field rule).
type limitError struct {
	field string
	msg   string
}

func (e *limitError) Error() string { return e.field + ": " + e.msg }

// explanationToProto is an explained answer as ErrorDetail carries it (nil: none).
func explanationToProto(e *leader.Explanation) *leaseholdv1.HeldExplanation {
	if e == nil {
		return nil
	}
	out := &leaseholdv1.HeldExplanation{
		QueueLength: uint32(e.QueueLength), Position: uint32(e.Position),
		Reason: leaseholdv1.HeldReason(e.Reason), HeldMode: modeToProto(e.HeldMode),
	}
	if !e.DelayUntil.IsZero() {
		out.DelayUntilUnixMs = e.DelayUntil.UnixMilli()
	}
	for _, h := range e.Holders {
		hb := &leaseholdv1.HeldBy{Token: h.Token, Holder: holderToProto(h.Holder)}
		if !h.Since.IsZero() {
			hb.SinceUnixMs = h.Since.UnixMilli()
		}
		out.Holders = append(out.Holders, hb)
	}
	return out
}
