package server

import (
	"context"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/core"
	"github.com/leasehold/leasehold/leader"
)

// ---- ElectionService (G8) ---------------------------------------------------------------

// electionArgs checks an election request's name, lease and value.
func electionArgs(name, lease string, value []byte) (core.LeaseID, error) {
	if err := core.ValidateName("name", name); err != nil {
		return core.LeaseID{}, err
	}
	if len(value) > core.MaxValueLen {
		return core.LeaseID{}, core.Invalid("value", "is %d bytes, the limit is %d", len(value), core.MaxValueLen)
	}
	return leaseID(lease)
}

// Campaign serves ElectionService.Campaign: it waits until the lease leads.
func (s *Server) Campaign(ctx context.Context, req *leaseholdv1.CampaignRequest) (*leaseholdv1.CampaignResponse, error) {
	id, err := electionArgs(req.GetName(), req.GetLeaseId(), req.GetValue())
	if err != nil {
		return nil, err
	}
	h := holderFromProto(req.GetHolder())
	if err := core.ValidateHolder("holder", h); err != nil {
		return nil, err
	}
	epoch, err := s.leader.Campaign(ctx, id, req.GetName(), req.GetValue(), h)
	if err != nil {
		return nil, err
	}
	return &leaseholdv1.CampaignResponse{Epoch: epoch}, nil
}

// Proclaim serves ElectionService.Proclaim.
func (s *Server) Proclaim(ctx context.Context, req *leaseholdv1.ProclaimRequest) (*leaseholdv1.ProclaimResponse, error) {
	id, err := electionArgs(req.GetName(), req.GetLeaseId(), req.GetValue())
	if err != nil {
		return nil, err
	}
	if req.GetEpoch() == 0 {
		return nil, core.Invalid("epoch", "must be set")
	}
	if err := s.leader.Proclaim(ctx, id, req.GetName(), req.GetEpoch(), req.GetValue()); err != nil {
		return nil, err
	}
	return &leaseholdv1.ProclaimResponse{}, nil
}

// Resign serves ElectionService.Resign.
func (s *Server) Resign(ctx context.Context, req *leaseholdv1.ResignRequest) (*leaseholdv1.ResignResponse, error) {
	id, err := electionArgs(req.GetName(), req.GetLeaseId(), nil)
	if err != nil {
		return nil, err
	}
	if req.GetEpoch() == 0 {
		return nil, core.Invalid("epoch", "must be set")
	}
	if err := s.leader.Resign(ctx, id, req.GetName(), req.GetEpoch()); err != nil {
		return nil, err
	}
	return &leaseholdv1.ResignResponse{}, nil
}

// Leader serves ElectionService.Leader from the leader's replicated state (the request
// goes to the leader, as a Describe does), linearizably: after a read barrier.
func (s *Server) Leader(ctx context.Context, req *leaseholdv1.LeaderRequest) (*leaseholdv1.LeaderResponse, error) {
	if err := core.ValidateName("name", req.GetName()); err != nil {
		return nil, err
	}
	// Linearizable: a leader deposed without knowing it must not answer from its
	// stale state (TestElectionLeaderIsNotReadFromADeposedLeader).
	if err := s.readBarrier(ctx, false); err != nil {
		return nil, err
	}
	ld, ok := s.leader.LeaderOf(req.GetName())
	if !ok {
		return &leaseholdv1.LeaderResponse{}, nil
	}
	return &leaseholdv1.LeaderResponse{HasLeader: true, Epoch: ld.Epoch, Value: ld.Value, Holder: holderToProto(ld.Holder)}, nil
}

// Observe serves ElectionService.Observe: the leader now, or the changes after the
// resume point, then every change, in log order (leader.Observe).
func (s *Server) Observe(ctx context.Context, req *leaseholdv1.ObserveRequest, send func(*leaseholdv1.ObserveResponse) error) error {
	if err := core.ValidateName("name", req.GetName()); err != nil {
		return err
	}
	return s.leader.Observe(ctx, req.GetName(), req.GetAfterRevision(), req.AfterRevision != nil, func(c leader.ElectionChange) error {
		resp := &leaseholdv1.ObserveResponse{HasLeader: c.Leads, Epoch: c.Epoch, Value: c.Value, Revision: c.Rev,
			Ended: tenureEnd(c.Ended), UnixMs: c.WallMillis}
		if c.Leads {
			resp.Holder = holderToProto(c.Holder)
		}
		return send(resp)
	})
}
