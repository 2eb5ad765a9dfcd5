package server

import (
	"bytes"
	"context"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/core"
)

// Begin serves IdempotencyService.Begin: it claims a key for a lease, committed and
// fsynced when it returns (G3), or answers who has it or its stored result.
func (s *Server) Begin(ctx context.Context, req *leaseholdv1.BeginRequest) (*leaseholdv1.BeginResponse, error) {
	if err := core.ValidateName("key", req.GetKey()); err != nil {
		return nil, err
	}
	id, err := leaseID(req.GetLeaseId())
	if err != nil {
		return nil, err
	}
	h := holderFromProto(req.GetHolder())
	if err := core.ValidateHolder("holder", h); err != nil {
		return nil, err
	}
	res, err := s.apply(ctx, core.Command{Op: core.OpBegin, Key: req.GetKey(), Lease: id, Holder: h})
	if err != nil {
		return nil, err
	}
	v := res.Key
	return &leaseholdv1.BeginResponse{Status: keyStatus(v.Status), Token: v.Token, Holder: holderToProto(v.Holder), Result: bytes.Clone(v.Result)}, nil
}

// Complete serves IdempotencyService.Complete: it marks a key done, fenced by the token
// of its Begin, committed and fsynced when it returns (G3).
func (s *Server) Complete(ctx context.Context, req *leaseholdv1.CompleteRequest) (*leaseholdv1.CompleteResponse, error) {
	if len(req.GetResult()) > core.MaxResultLen {
		return nil, core.Invalid("result", "is %d bytes, the limit is %d (32 KiB)", len(req.GetResult()), core.MaxResultLen)
	}
	cmd, err := keyCommand(core.OpComplete, req.GetKey(), req.GetToken())
	if err != nil {
		return nil, err
	}
	cmd.Value = req.GetResult()
	if _, err := s.apply(ctx, cmd); err != nil {
		return nil, err
	}
	return &leaseholdv1.CompleteResponse{}, nil
}

// Abandon serves IdempotencyService.Abandon: it gives a key in progress back.
func (s *Server) Abandon(ctx context.Context, req *leaseholdv1.AbandonRequest) (*leaseholdv1.AbandonResponse, error) {
	cmd, err := keyCommand(core.OpAbandon, req.GetKey(), req.GetToken())
	if err != nil {
		return nil, err
	}
	if _, err := s.apply(ctx, cmd); err != nil {
		return nil, err
	}
	return &leaseholdv1.AbandonResponse{}, nil
}

// GetKey serves IdempotencyService.Get, linearizably.
func (s *Server) GetKey(ctx context.Context, req *leaseholdv1.IdempotencyServiceGetRequest) (*leaseholdv1.IdempotencyServiceGetResponse, error) {
	if err := core.ValidateName("key", req.GetKey()); err != nil {
		return nil, err
	}
	if err := s.readBarrier(ctx, false); err != nil {
		return nil, err
	}
	resp := &leaseholdv1.IdempotencyServiceGetResponse{}
	s.raft.Read(func(st *core.State) {
		v := st.Key(req.GetKey())
		resp.Status, resp.Token, resp.Holder, resp.Result = keyStatus(v.Status), v.Token, holderToProto(v.Holder), bytes.Clone(v.Result)
	})
	return resp, nil
}

func keyCommand(op core.Op, key string, token uint64) (core.Command, error) {
	if err := core.ValidateName("key", key); err != nil {
		return core.Command{}, err
	}
	if token == 0 {
		return core.Command{}, core.Invalid("token", "must be the token Begin returned (positive)")
	}
	return core.Command{Op: op, Key: key, Token: token}, nil
}

func keyStatus(st core.KeyStatus) leaseholdv1.KeyStatus {
	switch st {
	case core.KeyNew:
		return leaseholdv1.KeyStatus_KEY_STATUS_NEW
	case core.KeyInProgress:
		return leaseholdv1.KeyStatus_KEY_STATUS_IN_PROGRESS
	case core.KeyDone:
		return leaseholdv1.KeyStatus_KEY_STATUS_DONE
	}
	return leaseholdv1.KeyStatus_KEY_STATUS_UNSPECIFIED
}
