package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/core"
	"github.com/leasehold/leasehold/replication"
)

// ClusterIDHeader carries a cluster ID over Connect: every response has the answering
// node's (when it has one), and a request may carry the ID its client expects, which the
// node refuses to serve unless it is its own (FailedPrecondition, reason
// "wrong_cluster"; Unavailable, reason "no_cluster_id", on a node that does not know its
// cluster yet).
const ClusterIDHeader = "Leasehold-Cluster-Id"

// Membership changes wait this long at most for a new member to catch up before it is
// promoted to voter, and promote it once its applied index is within maxCatchUpLag
// entries of the leader's commit index.
const (
	catchUpTimeout = 10 * time.Second
	maxCatchUpLag  = 128
	// memberCheckTimeout bounds the Status call to a node about to be added.
	memberCheckTimeout = 5 * time.Second
)

// ClusterID returns the ID of the cluster this node belongs to, "" while its state has
// none (a node that has not joined a cluster, or not yet applied the entry naming it).
// Once named, a cluster keeps its ID (core: OpSetClusterID), so the ID is cached then.
func (s *Server) ClusterID() string {
	if id := s.clusterID.Load(); id != nil {
		return *id
	}
	var id string
	s.raft.Read(func(st *core.State) { id = st.ClusterID() })
	if id != "" {
		s.clusterID.Store(&id)
	}
	return id
}

// NameCluster gives the cluster a random 128-bit ID if its state has none yet. The
// leader calls it when it takes over, so a new cluster is named by its first leader;
// one that already has an ID (or gets one from a concurrent call) keeps it.
func (s *Server) NameCluster(ctx context.Context) error {
	if s.ClusterID() != "" {
		return nil
	}
	var b [core.ClusterIDLen / 2]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	res, err := s.raft.Apply(ctx, core.Command{Op: core.OpSetClusterID, ClusterID: hex.EncodeToString(b[:])})
	if err == nil && res.Err != nil && !errors.Is(res.Err, core.ErrClusterID) {
		err = res.Err
	}
	return err
}

// withClusterID sets ClusterIDHeader on every response of h.
func (s *Server) withClusterID(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if id := s.ClusterID(); id != "" {
			w.Header().Set(ClusterIDHeader, id)
		}
		h.ServeHTTP(w, r)
	})
}

// checkClusterID checks the cluster ID a caller expects ("": it does not say): it
// refuses, before the request is served, another cluster than this node's
// (errWrongCluster), or any cluster on a node that has none yet (errNoClusterID: a node
// that has just joined and not applied the entry naming the cluster; the caller tries
// another node).
func (s *Server) checkClusterID(want string) error {
	if want == "" {
		return nil
	}
	switch own := s.ClusterID(); own {
	case want:
		return nil
	case "":
		return fmt.Errorf("%w: the caller expects cluster %s; node %s has not learnt its cluster yet", errNoClusterID, want, s.cfg.NodeID)
	default:
		return fmt.Errorf("%w: the caller expects cluster %s; node %s belongs to cluster %s", errWrongCluster, want, s.cfg.NodeID, own)
	}
}

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
	recorded := make(map[string]core.Member, len(servers))
	s.raft.Read(func(st *core.State) {
		for _, m := range st.Members() {
			recorded[m.ID] = m
		}
	})
	out := make([]*leaseholdv1.Member, 0, len(servers))
	for _, sv := range servers {
		suffrage := "nonvoter"
		if sv.Voter {
			suffrage = "voter"
		}
		m := recorded[sv.ID]
		out = append(out, &leaseholdv1.Member{NodeId: sv.ID, RaftAddr: sv.RaftAddr, ApiAddr: m.APIAddr, FastLaneAddr: m.FastLaneAddr, Suffrage: suffrage, Leader: sv.ID == leaderID})
	}
	return out, nil
}

// AddMember serves ClusterService.AddMember on the leader: it adds a node as a non-voter
// and, once it has caught up,
// promotes it to voter. See the API documentation for the checks it makes first.
func (s *Server) AddMember(ctx context.Context, req *leaseholdv1.AddMemberRequest) (*leaseholdv1.AddMemberResponse, error) {
	id, raftAddr, apiAddr := req.GetNodeId(), req.GetRaftAddr(), req.GetApiAddr()
	if err := core.ValidateNodeID("node_id", id); err != nil {
		return nil, err
	}
	if err := core.ValidateAddr("raft_addr", raftAddr); err != nil {
		return nil, err
	}
	if err := core.ValidateAddr("api_addr", apiAddr); err != nil {
		return nil, err
	}
	target, err := s.checkNewMember(ctx, id, raftAddr, apiAddr)
	if err != nil {
		return nil, err
	}
	servers, err := s.raft.Configuration()
	if err != nil {
		return nil, err
	}
	var current *replication.Server
	for i := range servers {
		switch sv := servers[i]; {
		case sv.ID == id:
			current = &servers[i]
		case sv.RaftAddr == raftAddr:
			// Raft refuses two members at one address (and would answer Internal).
			return nil, fmt.Errorf("%w: raft_addr %s is member %s's; remove %s first if it is gone", errMemberCheck, raftAddr, sv.ID, sv.ID)
		}
	}
	switch {
	case current != nil && current.Voter && current.RaftAddr == raftAddr:
	case current != nil && current.Voter && target.GetClusterId() == "":
		// Moving a voter keeps its vote and its place in the quorum: only a node that
		// has its data (this cluster's ID) may take them. An empty one would count at
		// once with none of the log, and an entry committed on the old voter and one
		// other could be lost with that other.
		return nil, fmt.Errorf("%w: node %s is a voter at raft address %s, and the node at api_addr %s has no data (no cluster ID): it cannot take over the vote; to replace %s with an empty node, remove %s first, then add the new one", errMemberCheck, id, current.RaftAddr, apiAddr, id, id)
	case current != nil && current.Voter:
		err = s.raft.AddVoter(ctx, id, raftAddr) // a voter's new address, with its data
	default:
		err = s.raft.AddNonvoter(ctx, id, raftAddr)
	}
	if err != nil {
		return nil, err
	}
	fastLane := target.GetFastLaneAddr()
	if core.ValidateAddr("fast_lane_addr", fastLane) != nil {
		fastLane = ""
	}
	if err := s.register(ctx, id, apiAddr, fastLane); err != nil {
		return nil, err
	}
	if current == nil || !current.Voter {
		// Everything up to the change that added it, at least: proof that the node
		// receives the log (its API may answer while its raft port is unreachable).
		base := s.raft.Status().CommitIndex
		if err := s.waitCaughtUp(ctx, id, apiAddr, base); err != nil {
			return nil, err
		}
		if err := s.raft.AddVoter(ctx, id, raftAddr); err != nil {
			return nil, err
		}
	}
	members, err := s.members()
	if err != nil {
		return nil, err
	}
	return &leaseholdv1.AddMemberResponse{Members: members}, nil
}

// checkNewMember asks the node at apiAddr for its Status: it must be node id, with raft
// address raftAddr, and belong to no cluster or to this one. Anything else (including no
// answer) is errMemberCheck naming what is wrong.
func (s *Server) checkNewMember(ctx context.Context, id, raftAddr, apiAddr string) (*leaseholdv1.StatusResponse, error) {
	sctx, cancel := context.WithTimeout(ctx, memberCheckTimeout)
	defer cancel()
	st, err := s.PeerCluster(apiAddr).Status(withCallerCredentials(sctx), &leaseholdv1.StatusRequest{})
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		// The peer's error is text here: its code (Unavailable) is not this answer's.
		return nil, fmt.Errorf("%w: no leasehold node answers at api_addr %s (%s); start the new node first (with --join or --bootstrap=false), and check the address", errMemberCheck, apiAddr, err.Error())
	}
	own := s.ClusterID()
	switch {
	case st.GetNodeId() != id:
		return nil, fmt.Errorf("%w: the node at api_addr %s is %q, not node_id %q", errMemberCheck, apiAddr, st.GetNodeId(), id)
	case !sameAddr(ctx, st.GetRaftAddr(), raftAddr):
		return nil, fmt.Errorf("%w: node %s advertises raft address %q, not raft_addr %q", errMemberCheck, id, st.GetRaftAddr(), raftAddr)
	case st.GetClusterId() != "" && st.GetClusterId() != own:
		return nil, fmt.Errorf("%w: node %s holds the data of another cluster (%s; this is %s): give it an empty data dir", errMemberCheck, id, st.GetClusterId(), own)
	}
	return st, nil
}

// withCallerCredentials returns ctx for a call to the node being added, carrying the
// credential AddMember's caller came with (a token, or a certificate's subject): the
// new node authorizes the Status calls as the caller's. Without it, a cluster with auth
// and no peer TLS (no peer certificate to identify this node) could never add a node:
// the new node refuses an anonymous Status.
func withCallerCredentials(ctx context.Context) context.Context {
	cctx, info := connect.NewClientContext(ctx)
	forwardCredentials(ctx, info.RequestHeader())
	return cctx
}

// sameAddr reports whether the host:port addresses a and b are the same, literally or
// once resolved: a node reports its raft address resolved (n4:7741 as 172.18.0.5:7741).
func sameAddr(ctx context.Context, a, b string) bool {
	if a == b {
		return true
	}
	resolve := func(addr string) []string {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil
		}
		ips, err := net.DefaultResolver.LookupHost(ctx, host)
		if err != nil {
			return nil
		}
		for i, ip := range ips {
			ips[i] = net.JoinHostPort(ip, port)
		}
		return ips
	}
	ra := resolve(a)
	for _, x := range resolve(b) {
		if slices.Contains(ra, x) {
			return true
		}
	}
	return false
}

// waitCaughtUp waits (at most catchUpTimeout) until the node at apiAddr has applied the
// log up to base at least, and to within maxCatchUpLag entries of this leader's commit
// index.
func (s *Server) waitCaughtUp(ctx context.Context, id, apiAddr string, base uint64) error {
	ctx, cancel := context.WithTimeout(ctx, catchUpTimeout)
	defer cancel()
	var applied, commit uint64
	var why string
	for {
		st, err := s.PeerCluster(apiAddr).Status(withCallerCredentials(ctx), &leaseholdv1.StatusRequest{})
		commit = s.raft.Status().CommitIndex
		if err == nil {
			applied = st.GetAppliedIndex()
			if applied >= base && applied+maxCatchUpLag >= commit {
				return nil
			}
			why = "still behind"
		} else {
			why = err.Error() // text: the peer's code is not this answer's
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: node %s has applied %d of the leader's %d entries after %v (%s); it stays a non-voter: AddMember again promotes it once it has caught up", errNotCaughtUp, id, applied, commit, catchUpTimeout, why)
		case <-time.After(50 * time.Millisecond):
		}
	}
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
	known, voter, voters := false, false, 0
	for _, sv := range servers {
		if sv.Voter {
			voters++
		}
		if sv.ID == req.GetNodeId() {
			known, voter = true, sv.Voter
		}
	}
	switch {
	case !known:
		return nil, fmt.Errorf("%w: node %q is not a member", errNoSuchMember, req.GetNodeId())
	case voter && voters == 1:
		return nil, fmt.Errorf("%w: node %q is the only voter; a cluster without voters cannot serve (to move it, add the new node first)", errLastVoter, req.GetNodeId())
	case voter:
		if err := s.checkRemovalQuorum(ctx, req.GetNodeId(), servers); err != nil {
			return nil, err
		}
	}
	// Forget the addresses first: once the raft change commits, a removed leader steps
	// down and could not propose it any more.
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

// removalCheckTimeout bounds the Status call to each voter that would remain after a
// removal.
const removalCheckTimeout = 2 * time.Second

// checkRemovalQuorum refuses (errQuorumAtRisk) to remove the voter removed unless a
// majority of the voters that remain answer now: this node, and each other voter whose
// Status, at its registered API address, names this node as the leader of this term.
// Raft counts a new configuration as soon as it is appended, so the removal itself
// needs that majority to commit: without it the change never commits, this leader
// loses its quorum, and no node can be elected until the silent voters come back (a
// cluster of three with one node down, and the removal of one of the other two).
func (s *Server) checkRemovalQuorum(ctx context.Context, removed string, servers []replication.Server) error {
	self := s.raft.Status()
	var remain []string
	for _, sv := range servers {
		if sv.Voter && sv.ID != removed {
			remain = append(remain, sv.ID)
		}
	}
	answers := make([]bool, len(remain))
	var wg sync.WaitGroup
	for i, id := range remain {
		if id == self.NodeID {
			answers[i] = true
			continue
		}
		var api string
		s.raft.Read(func(st *core.State) { api = st.Member(id) })
		if api == "" {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sctx, cancel := context.WithTimeout(ctx, removalCheckTimeout)
			defer cancel()
			st, err := s.PeerCluster(api).Status(withCallerCredentials(sctx), &leaseholdv1.StatusRequest{})
			answers[i] = err == nil && st.GetLeader() == self.NodeID && st.GetTerm() == self.Term
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return err
	}
	var silent []string
	for i, ok := range answers {
		if !ok {
			silent = append(silent, remain[i])
		}
	}
	if live := len(remain) - len(silent); 2*live > len(remain) {
		return nil
	}
	return fmt.Errorf("%w: without node %q the cluster has %d voters, and %s (%d) do not answer this leader: the removal could not commit and the cluster would stop serving; bring them back first, or remove one of them", errQuorumAtRisk, removed, len(remain), strings.Join(silent, ", "), len(silent))
}

// Register records (idempotently) that node id serves its API at api and its fast lane
// at fastLane ("" for none). The leader calls it for itself when it takes over, so
// followers can always forward to it and clients find every node's fast lane.
func (s *Server) Register(ctx context.Context, id, api, fastLane string) error {
	return s.register(ctx, id, api, fastLane)
}

func (s *Server) register(ctx context.Context, id, api, fastLane string) error {
	var known core.Member
	s.raft.Read(func(st *core.State) {
		for _, m := range st.Members() {
			if m.ID == id {
				known = m
			}
		}
	})
	if known.APIAddr == api && known.FastLaneAddr == fastLane {
		return nil
	}
	res, err := s.raft.Apply(ctx, core.Command{Op: core.OpSetMember, Node: id, Addr: api, FastLane: fastLane})
	if err == nil {
		err = res.Err
	}
	return err
}
