package server

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/core"
	"github.com/leasehold/leasehold/leader"
)

// DefaultDrainMillis is a group's drain deadline when Create does not give one.
const DefaultDrainMillis = 10_000

// CreateGroup serves GroupService.Create, committed and fsynced when it returns (G3).
func (s *Server) CreateGroup(ctx context.Context, req *leaseholdv1.GroupServiceCreateRequest) (*leaseholdv1.GroupServiceCreateResponse, error) {
	drain := req.GetDrainMs()
	if drain == 0 {
		drain = DefaultDrainMillis
	}
	cmd := core.Command{Op: core.OpGroupCreate, Name: req.GetGroup(), Count: uint64(req.GetPartitions()), DrainMillis: drain}
	if _, err := s.applyGroup(ctx, cmd); err != nil {
		return nil, err
	}
	return &leaseholdv1.GroupServiceCreateResponse{}, nil
}

// JoinGroup serves GroupService.Join and answers the member's partitions once the join
// is committed.
func (s *Server) JoinGroup(ctx context.Context, req *leaseholdv1.JoinRequest) (*leaseholdv1.JoinResponse, error) {
	id, err := leaseID(req.GetLeaseId())
	if err != nil {
		return nil, err
	}
	cmd := core.Command{Op: core.OpGroupJoin, Name: req.GetGroup(), Member: req.GetMember(), Lease: id, Weight: req.GetWeight()}
	if _, err := s.applyGroup(ctx, cmd); err != nil {
		return nil, err
	}
	resp := &leaseholdv1.JoinResponse{}
	s.raft.Read(func(st *core.State) {
		parts, _ := st.GroupAssignments(req.GetGroup(), req.GetMember(), id)
		resp.Assignments = assignmentsToProto(parts)
	})
	return resp, nil
}

// LeaveGroup serves GroupService.Leave.
func (s *Server) LeaveGroup(ctx context.Context, req *leaseholdv1.LeaveRequest) (*leaseholdv1.LeaveResponse, error) {
	id, err := leaseID(req.GetLeaseId())
	if err != nil {
		return nil, err
	}
	if _, err := s.applyGroup(ctx, core.Command{Op: core.OpGroupLeave, Name: req.GetGroup(), Member: req.GetMember(), Lease: id}); err != nil {
		return nil, err
	}
	return &leaseholdv1.LeaveResponse{}, nil
}

// ReleasePartition serves GroupService.Release.
func (s *Server) ReleasePartition(ctx context.Context, req *leaseholdv1.GroupServiceReleaseRequest) (*leaseholdv1.GroupServiceReleaseResponse, error) {
	id, err := leaseID(req.GetLeaseId())
	if err != nil {
		return nil, err
	}
	cmd := core.Command{Op: core.OpGroupRelease, Name: req.GetGroup(), Partition: req.GetPartition(), Token: req.GetEpoch(), Lease: id}
	if _, err := s.applyGroup(ctx, cmd); err != nil {
		return nil, err
	}
	return &leaseholdv1.GroupServiceReleaseResponse{}, nil
}

// GroupStatus serves GroupService.Status, linearizably.
func (s *Server) GroupStatus(ctx context.Context, req *leaseholdv1.GroupServiceStatusRequest) (*leaseholdv1.GroupServiceStatusResponse, error) {
	if err := core.ValidateName("group", req.GetGroup()); err != nil {
		return nil, err
	}
	if err := s.readBarrier(ctx, false); err != nil {
		return nil, err
	}
	var v core.GroupView
	var ok bool
	s.raft.Read(func(st *core.State) { v, ok = st.Group(req.GetGroup()) })
	if !ok {
		return nil, fmt.Errorf("%w: %q", core.ErrGroupNotFound, req.GetGroup())
	}
	resp := &leaseholdv1.GroupServiceStatusResponse{Group: v.Name, DrainMs: v.DrainMillis}
	for _, m := range v.Members {
		resp.Members = append(resp.Members, &leaseholdv1.GroupMember{Name: m.Name, Weight: m.Weight, Owns: uint32(m.Owns)})
	}
	for _, p := range v.Partitions {
		resp.Partitions = append(resp.Partitions, &leaseholdv1.PartitionOwner{Partition: uint32(p.Partition), Owner: p.Owner, Epoch: p.Epoch, Draining: p.Draining})
	}
	return resp, nil
}

// applyGroup checks what a group command carries from the request (with the request's
// field names) and applies it.
func (s *Server) applyGroup(ctx context.Context, cmd core.Command) (core.Result, error) {
	if err := core.ValidateGroupCommand(cmd); err != nil {
		return core.Result{}, err
	}
	return s.apply(ctx, cmd)
}

func assignmentsToProto(parts []core.PartitionView) []*leaseholdv1.Assignment {
	out := make([]*leaseholdv1.Assignment, 0, len(parts))
	for _, p := range parts {
		out = append(out, &leaseholdv1.Assignment{Partition: uint32(p.Partition), Epoch: p.Epoch, Draining: p.Draining})
	}
	return out
}

// Assignments serves GroupService.Assignments: the member's partitions now, and again
// each time they change on this node's copy of the state, while this node leads.
func (s *Server) Assignments(ctx context.Context, req *leaseholdv1.AssignmentsRequest, send func(*leaseholdv1.AssignmentsResponse) error) error {
	id, err := leaseID(req.GetLeaseId())
	if err != nil {
		return err
	}
	probe := core.Command{Op: core.OpGroupLeave, Name: req.GetGroup(), Member: req.GetMember(), Lease: id}
	if err := core.ValidateGroupCommand(probe); err != nil {
		return err
	}
	var last *leaseholdv1.AssignmentsResponse
	recheck := time.NewTicker(time.Second) // a node that stopped leading ends the stream
	defer recheck.Stop()
	for {
		if !s.leader.Active() {
			return leader.ErrNotLeader
		}
		changed := s.leader.GroupsChanged() // before the read: no change is missed
		resp, err := s.assignments(req.GetGroup(), req.GetMember(), id)
		if err != nil {
			return err
		}
		if last == nil || !proto.Equal(resp, last) {
			if err := send(resp); err != nil {
				return err
			}
			last = resp
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		case <-recheck.C:
		}
	}
}

// assignments reads member's partitions of group from this node's state.
func (s *Server) assignments(group, member string, lease core.LeaseID) (*leaseholdv1.AssignmentsResponse, error) {
	var err error
	resp := &leaseholdv1.AssignmentsResponse{}
	s.raft.Read(func(st *core.State) {
		v, ok := st.Group(group)
		if !ok {
			err = fmt.Errorf("%w: %q", core.ErrGroupNotFound, group)
			return
		}
		parts, ok := st.GroupAssignments(group, member, lease)
		if !ok {
			err = fmt.Errorf("%w: %q is not a member of %q under this lease", core.ErrNotMember, member, group)
			return
		}
		resp.Assignments, resp.DrainMs = assignmentsToProto(parts), v.DrainMillis
	})
	return resp, err
}
