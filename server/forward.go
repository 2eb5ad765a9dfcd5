package server

import (
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/leasehold/leasehold/api/leasehold/v1/leaseholdv1connect"
	"github.com/leasehold/leasehold/core"
	"github.com/leasehold/leasehold/internal/tlsconf"
)

// forwardedHeader marks a request a node forwarded to the leader. A forwarded request is
// never forwarded again: if its receiver is not the leader either, it answers
// Unavailable and the client retries.
const forwardedHeader = "Leasehold-Forwarded-By"

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
		DialContext: (&net.Dialer{Timeout: 2 * time.Second}).DialContext,
		Protocols:   new(http.Protocols),
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
