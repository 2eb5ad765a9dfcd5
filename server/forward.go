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
	"github.com/leasehold/leasehold/internal/tlsconf"
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

// peers caches, per API address of another node, the Connect clients that forward
// requests there; they share one HTTP/2 transport.
type peers struct {
	mu     sync.Mutex
	http   *http.Client
	scheme string // "https" when the API serves TLS
	nodes  map[string]*peer
}

// peer is one other node: a Connect client per procedure, made when first used.
type peer struct {
	base    string
	http    *http.Client
	clients sync.Map // procedure → *connect.Client[Req, Res]
}

func newPeers(tc *tlsconf.Node) *peers {
	tr := &http.Transport{
		DialContext: (&net.Dialer{Timeout: peerDialTimeout}).DialContext,
		Protocols:   new(http.Protocols),
		HTTP2:       &http.HTTP2Config{SendPingTimeout: peerPingAfter, PingTimeout: peerPingTimeout},
	}
	scheme := "http"
	if tc != nil && tc.API() {
		scheme = "https"
		tr.DialTLSContext = forwardDialer(tc)
		tr.ForceAttemptHTTP2 = true
		tr.Protocols.SetHTTP2(true)
	} else {
		tr.Protocols.SetUnencryptedHTTP2(true)
	}
	return &peers{http: &http.Client{Transport: tr}, scheme: scheme, nodes: make(map[string]*peer)}
}

func (p *peers) get(addr string) *peer {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n := p.nodes[addr]; n != nil {
		return n
	}
	n := &peer{base: p.scheme + "://" + addr, http: p.http}
	p.nodes[addr] = n
	return n
}

// peerClient returns p's client for procedure.
func peerClient[Req, Res any](p *peer, procedure string) *connect.Client[Req, Res] {
	if c, ok := p.clients.Load(procedure); ok {
		return c.(*connect.Client[Req, Res])
	}
	c, _ := p.clients.LoadOrStore(procedure, connect.NewClient[Req, Res](p.http, p.base+procedure, connect.WithSendCompression("identity")))
	return c.(*connect.Client[Req, Res])
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
	case connect.CodeUnavailable, connect.CodeUnknown, connect.CodeDeadlineExceeded, connect.CodeCanceled,
		connect.CodeInternal: // a stream relayed from a leader that died mid-message: "incomplete envelope"
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

// PeerCluster returns a ClusterService client for the node at addr (for joining).
func (s *Server) PeerCluster(addr string) leaseholdv1connect.ClusterServiceClient {
	return leaseholdv1connect.NewClusterServiceClient(s.peers.http, s.peers.scheme+"://"+addr, connect.WithSendCompression("identity"))
}

// sanitizeHeader makes s safe to send as a header value.
func sanitizeHeader(s string) string { return strings.ReplaceAll(s, "\n", "") }
