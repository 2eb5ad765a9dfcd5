package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/api/leasehold/v1/leaseholdv1connect"
	"github.com/leasehold/leasehold/core"
	"github.com/leasehold/leasehold/leader"
)

// forwardedHeader marks a request a node forwarded to the leader. A forwarded request is
// never forwarded again: if its receiver is not the leader either, it answers
// Unavailable and the client retries.
const forwardedHeader = "Leasehold-Forwarded-By"

// Errors of routing (mapped in errors.go). A not-leader answer names the leader when
// this node knows it (leaderHint), so the client can go there.
var (
	// errLeaderUnknown is returned by a node that is not the leader and does not know the
	// leader's API address: no leader is elected, or this node has not yet applied the
	// entry that registered it (a restarted follower catching up). Nothing was done.
	errLeaderUnknown = errors.New("server: this node does not know the leader's API address (yet); try another node")
	// errLeaderUnreachable is returned when a forwarded request got no answer from the
	// leader: the connection failed, or the leader stayed silent past the forward's
	// bound (see forwardContext). The request may or may not have been carried out.
	errLeaderUnreachable = errors.New("server: the leader did not answer the forwarded request")
)

// leaderHint is a routing error (leader.ErrNotLeader or errLeaderUnreachable) with the
// API address of the node this node believes leads ("" when it knows none).
type leaderHint struct {
	err  error
	addr string
}

func (e *leaderHint) Error() string {
	if e.addr == "" {
		return e.err.Error()
	}
	return fmt.Sprintf("%v (leader: %s)", e.err, e.addr)
}

func (e *leaderHint) Unwrap() error { return e.err }

// Peers are dialled and watched on the scale of raft's election timeout (500 ms by
// default): a leader that has sent nothing for peerPingAfter is pinged, and the
// connection fails — and with it every request forwarded on it — when the ping is not
// answered within peerPingTimeout. A forward to a leader cut off the network so ends
// about when the followers stop believing in it, instead of waiting out the client's
// whole deadline; a leader that is merely slow still answers pings, so a long wait in a
// lock's queue is never cut short.
const (
	peerDialTimeout = 500 * time.Millisecond
	peerPingAfter   = 500 * time.Millisecond
	peerPingTimeout = 500 * time.Millisecond
)

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
		DialContext: (&net.Dialer{Timeout: peerDialTimeout}).DialContext,
		Protocols:   new(http.Protocols),
		HTTP2:       &http.HTTP2Config{SendPingTimeout: peerPingAfter, PingTimeout: peerPingTimeout},
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
// (and address) when the request must be forwarded. It fails, Unavailable, with
// errLeaderUnknown when this node knows no leader's address, and with
// leader.ErrNotLeader — naming the leader when it can — when the request was already
// forwarded once or raft names this node leader before it serves.
func (s *Server) route(ctx context.Context) (*peerClients, string, error) {
	if s.leader.Active() {
		return nil, "", nil
	}
	addr := s.leaderAPIAddr()
	if info, ok := connect.CallInfoForHandlerContext(ctx); ok && info.RequestHeader().Get(forwardedHeader) != "" {
		if addr == s.cfg.APIAddr {
			addr = ""
		}
		return nil, "", &leaderHint{err: leader.ErrNotLeader, addr: addr}
	}
	switch addr {
	case "":
		return nil, "", errLeaderUnknown
	case s.cfg.APIAddr:
		return nil, "", leader.ErrNotLeader // elected, not serving yet: another node forwards here
	}
	return s.peers.get(addr), addr, nil
}

// forwardContext bounds a forward to the leader. A request that does not wait in a
// queue gets at most half of what is left of its caller's deadline, so that the caller
// still has time to try another node when the leader does not answer; silence without
// a deadline (the fast lane carries none) ends with the connection's failed ping. An
// Acquire that waits keeps the caller's deadline: only the ping can tell a silent leader
// from a lock that stays held.
func forwardContext(ctx context.Context, req any) (context.Context, context.CancelFunc) {
	if a, ok := req.(*leaseholdv1.AcquireRequest); ok && a.GetWaitMs() != 0 {
		return ctx, func() {}
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, time.Until(deadline)/2)
}

// forwardError is what a follower answers for a forward that failed: the leader's own
// answer as it is, the caller's context error as it is, and a failure of the forward
// itself — the connection failed, or the forward's bound passed — as
// errLeaderUnreachable naming the leader, with the outcome unknown.
func forwardError(ctx context.Context, addr string, err error) error {
	if ctx.Err() != nil {
		return err
	}
	ce := new(connect.Error)
	if !errors.As(err, &ce) {
		return err
	}
	for _, d := range ce.Details() {
		if v, derr := d.Value(); derr == nil {
			if _, ok := v.(*leaseholdv1.ErrorDetail); ok {
				return err // the leader's answer: every answer of the service has one
			}
		}
	}
	switch ce.Code() {
	case connect.CodeUnavailable, connect.CodeUnknown, connect.CodeDeadlineExceeded, connect.CodeCanceled:
		// Not wrapped: ToConnect would pass the peer client's *connect.Error through as it is.
		return &leaderHint{err: fmt.Errorf("%w: %s", errLeaderUnreachable, err.Error()), addr: addr}
	}
	return err
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
	p, addr, err := s.route(ctx)
	if err != nil {
		return nil, err
	}
	if p == nil {
		return local(ctx, req)
	}
	bounded, cancel := forwardContext(ctx, req)
	defer cancel()
	fctx, info := connect.NewClientContext(bounded)
	info.RequestHeader().Set(forwardedHeader, strings.ReplaceAll(s.cfg.NodeID, "\n", ""))
	res, err := remote(p)(fctx, req)
	if err != nil {
		return nil, forwardError(ctx, addr, err)
	}
	return res, nil
}

// PeerCluster returns a ClusterService client for the node at addr (for joining).
func (s *Server) PeerCluster(addr string) leaseholdv1connect.ClusterServiceClient {
	return s.peers.get(addr).cluster
}
