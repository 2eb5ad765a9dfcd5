package server

import (
	"context"
	"errors"
	"fmt"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/core"
	"github.com/leasehold/leasehold/replication"
)

// Members serves ClusterService.Members: the cluster's nodes from this node's latest
// raft configuration, on any node.
func (s *Server) Members(context.Context, *leaseholdv1.MembersRequest) (*leaseholdv1.MembersResponse, error) {
	members, err := s.members()
	if err != nil {
		return nil, err
	}
	return &leaseholdv1.MembersResponse{Members: members}, nil
}

func (s *Server) members() ([]*leaseholdv1.Member, error) {
	servers, err := s.raft.Configuration()
	if err != nil {
		return nil, err
	}
	leaderID := s.raft.Status().LeaderID
	out := make([]*leaseholdv1.Member, 0, len(servers))
	s.raft.Read(func(st *core.State) {
		for _, sv := range servers {
			suffrage := "nonvoter"
			if sv.Voter {
				suffrage = "voter"
			}
			out = append(out, &leaseholdv1.Member{NodeId: sv.ID, RaftAddr: sv.RaftAddr, ApiAddr: st.Member(sv.ID), Suffrage: suffrage, Leader: sv.ID == leaderID})
		}
	})
	return out, nil
}

// AddMember serves ClusterService.AddMember on the leader: it adds a voter and
// registers its API address.
func (s *Server) AddMember(ctx context.Context, req *leaseholdv1.AddMemberRequest) (*leaseholdv1.AddMemberResponse, error) {
	if err := core.ValidateNodeID("node_id", req.GetNodeId()); err != nil {
		return nil, err
	}
	if err := core.ValidateAddr("raft_addr", req.GetRaftAddr()); err != nil {
		return nil, err
	}
	if err := core.ValidateAddr("api_addr", req.GetApiAddr()); err != nil {
		return nil, err
	}
	if err := s.raft.AddVoter(ctx, req.GetNodeId(), req.GetRaftAddr()); err != nil {
		return nil, err
	}
	if err := s.register(ctx, req.GetNodeId(), req.GetApiAddr()); err != nil {
		return nil, err
	}
	members, err := s.members()
	if err != nil {
		return nil, err
	}
	return &leaseholdv1.AddMemberResponse{Members: members}, nil
}

// RemoveMember serves ClusterService.RemoveMember on the leader.
func (s *Server) RemoveMember(ctx context.Context, req *leaseholdv1.RemoveMemberRequest) (*leaseholdv1.RemoveMemberResponse, error) {
	if err := core.ValidateNodeID("node_id", req.GetNodeId()); err != nil {
		return nil, err
	}
	servers, err := s.raft.Configuration()
	if err != nil {
		return nil, err
	}
	known := false
	for _, sv := range servers {
		known = known || sv.ID == req.GetNodeId()
	}
	if !known {
		return nil, fmt.Errorf("%w: node %q is not a member", errNoSuchMember, req.GetNodeId())
	}
	// Forget the API address first: once the raft change commits, a removed leader
	// steps down and could not propose it any more.
	if _, err := s.raft.Apply(ctx, core.Command{Op: core.OpRemoveMember, Node: req.GetNodeId()}); err != nil {
		return nil, err
	}
	if err := s.raft.RemoveServer(ctx, req.GetNodeId()); err != nil {
		return nil, err
	}
	members, err := s.members()
	if err != nil && !errors.Is(err, replication.ErrNotLeader) {
		return nil, err
	}
	return &leaseholdv1.RemoveMemberResponse{Members: members}, nil
}

// Register records (idempotently) that node id serves its API at addr. The leader calls
// it for itself when it takes over, so followers can always forward to it.
func (s *Server) Register(ctx context.Context, id, addr string) error {
	return s.register(ctx, id, addr)
}

func (s *Server) register(ctx context.Context, id, addr string) error {
	known := ""
	s.raft.Read(func(st *core.State) { known = st.Member(id) })
	if known == addr {
		return nil
	}
	res, err := s.raft.Apply(ctx, core.Command{Op: core.OpSetMember, Node: id, Addr: addr})
	if err == nil {
		err = res.Err
	}
	return err
}
