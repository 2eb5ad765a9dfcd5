package server

import (
	"context"
	"errors"

	"connectrpc.com/connect"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/core"
	"github.com/leasehold/leasehold/internal/reason"
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
	{core.ErrInvalid, connect.CodeInvalidArgument, reason.InvalidArgument},
	{core.ErrStaleToken, connect.CodeFailedPrecondition, reason.StaleToken},
	{core.ErrVersionMismatch, connect.CodeFailedPrecondition, reason.VersionMismatch},
	{core.ErrLeaseNotFound, connect.CodeNotFound, reason.LeaseUnknown},
	{core.ErrNotHolder, connect.CodeFailedPrecondition, reason.NotHolder},
	{core.ErrClassConflict, connect.CodeFailedPrecondition, reason.ClassConflict},
	{core.ErrLockHeld, connect.CodeDeadlineExceeded, reason.LockHeld},
	{core.ErrTooManyLeases, connect.CodeResourceExhausted, reason.LimitLeases},
	{core.ErrTooManyLocks, connect.CodeResourceExhausted, reason.LimitLocksPerLease},
	{core.ErrTooManyWaiters, connect.CodeResourceExhausted, reason.LimitWaiters},
	{core.ErrLeaseExists, connect.CodeAlreadyExists, reason.LeaseExists},
	{errLeaderUnknown, connect.CodeUnavailable, reason.LeaderUnknown},
	{errLeaderUnreachable, connect.CodeUnavailable, reason.LeaderUnreachable},
	{leader.ErrNotLeader, connect.CodeUnavailable, reason.NotLeader},
	{replication.ErrNotLeader, connect.CodeUnavailable, reason.NotLeader},
	{replication.ErrOutcomeUnknown, connect.CodeUnavailable, reason.OutcomeUnknown},
	{leader.ErrEpochLost, connect.CodeUnavailable, reason.EpochLost},
	{errNoSuchMember, connect.CodeNotFound, reason.NoSuchMember},
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
	}
	if st := new(core.StaleTokenError); errors.As(err, &st) {
		detail.HighestToken = st.Highest
	}
	if vm := new(core.VersionMismatchError); errors.As(err, &vm) {
		detail.CurrentVersion = vm.Current
	}
	var lim *limitError
	if errors.As(err, &lim) {
		code, detail.Field = connect.CodeResourceExhausted, lim.field
	}
	return code, detail
}

// leaseGoneReasons are the reasons of a lease that is gone, by why it ended.
var leaseGoneReasons = map[core.EndReason]string{
	core.EndUnknown: reason.LeaseUnknown,
	core.EndExpired: reason.LeaseExpired,
	core.EndRevoked: reason.LeaseRevoked,
}

// errNoSuchMember is returned by RemoveMember for a node that is not in the cluster.
var errNoSuchMember = errors.New("server: no such member")

// limitError is a request that exceeds a size bound of the server (not a field rule).
type limitError struct {
	field string
	msg   string
}

func (e *limitError) Error() string { return e.field + ": " + e.msg }
