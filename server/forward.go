package server

import (
	"context"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/leasehold/leasehold/api/leasehold/v1/leaseholdv1connect"
	"github.com/leasehold/leasehold/core"
	"github.com/leasehold/leasehold/leader"
)

// forwardedHeader marks a request a node forwarded to the leader. A forwarded request is
// never forwarded again: if its receiver is not the leader either, it answers
// Unavailable and the client retries.
const forwardedHeader = "Leasehold-Forwarded-By"

// peerClients are Connect clients for one other node.
type peerClients struct {
	leases  leaseholdv1connect.LeaseServiceClient
	locks   leaseholdv1connect.LockServiceClient
	kv      leaseholdv1connect.KVServiceClient
	cluster leaseholdv1connect.ClusterServiceClient
}

// peers caches clients per API address; they share one HTTP/2 transport.
type peers struct {
	mu      sync.Mutex
	http    *http.Client
	clients map[string]*peerClients
}

func newPeers() *peers {
	tr := &http.Transport{
		DialContext: (&net.Dialer{Timeout: 2 * time.Second}).DialContext,
		Protocols:   new(http.Protocols),
	}
	tr.Protocols.SetUnencryptedHTTP2(true)
	return &peers{http: &http.Client{Transport: tr}, clients: make(map[string]*peerClients)}
}

func (p *peers) get(addr string) *peerClients {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c := p.clients[addr]; c != nil {
		return c
	}
	base := "http://" + addr
	opt := connect.WithSendCompression("identity")
	c := &peerClients{
		leases:  leaseholdv1connect.NewLeaseServiceClient(p.http, base, opt),
		locks:   leaseholdv1connect.NewLockServiceClient(p.http, base, opt),
		kv:      leaseholdv1connect.NewKVServiceClient(p.http, base, opt),
		cluster: leaseholdv1connect.NewClusterServiceClient(p.http, base, opt),
	}
	p.clients[addr] = c
	return c
}

// route returns nil when this node serves the request itself, or the leader's clients
// when the request must be forwarded. It fails with leader.ErrNotLeader (Unavailable)
// when no leader is known or the request was already forwarded once.
func (s *Server) route(ctx context.Context) (*peerClients, error) {
	if s.leader.Active() {
		return nil, nil
	}
	if info, ok := connect.CallInfoForHandlerContext(ctx); ok && info.RequestHeader().Get(forwardedHeader) != "" {
		return nil, leader.ErrNotLeader
	}
	addr := s.leaderAPIAddr()
	if addr == "" || addr == s.cfg.APIAddr {
		return nil, leader.ErrNotLeader
	}
	return s.peers.get(addr), nil
}

// leaderAPIAddr returns the leader's API address as registered in the state.
func (s *Server) leaderAPIAddr() string {
	id := s.raft.Status().LeaderID
	if id == "" {
		return ""
	}
	var addr string
	s.raft.Read(func(st *core.State) { addr = st.Member(id) })
	return addr
}

// call serves req locally on the leader, or forwards it to the leader with one hop.
func call[Req, Res any](ctx context.Context, s *Server, req *Req,
	local func(context.Context, *Req) (*Res, error),
	remote func(*peerClients) func(context.Context, *Req) (*Res, error),
) (*Res, error) {
	p, err := s.route(ctx)
	if err != nil {
		return nil, err
	}
	if p == nil {
		return local(ctx, req)
	}
	fctx, info := connect.NewClientContext(ctx)
	info.RequestHeader().Set(forwardedHeader, strings.ReplaceAll(s.cfg.NodeID, "\n", ""))
	if id := s.ClusterID(); id != "" {
		info.RequestHeader().Set(ClusterIDHeader, id) // a leader address reused by another cluster refuses it
	}
	res, err := remote(p)(fctx, req)
	if err != nil && connect.CodeOf(err) == connect.CodeUnavailable {
		// The leader we knew is gone or busy: say so plainly; the client retries.
		return nil, err
	}
	return res, err
}

// PeerCluster returns a ClusterService client for the node at addr (for joining).
func (s *Server) PeerCluster(addr string) leaseholdv1connect.ClusterServiceClient {
	return s.peers.get(addr).cluster
}
