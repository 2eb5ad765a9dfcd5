package clustertest

import (
	"errors"
	"io"
	"sync"

	"github.com/hashicorp/raft"
)

// errCut is what a node's raft gets for a message to a peer it is cut off from.
var errCut = errors.New("clustertest: partitioned from the peer")

// hub connects the nodes' in-memory transports and decides which messages get through.
// Every link is checked on the sending side, and both directions are cut together.
type hub struct {
	mu      sync.Mutex
	trans   map[string]*raft.InmemTransport // the running incarnation of each node
	cut     map[[2]string]bool              // both orders of each cut pair
	deposed map[string]bool                 // cut off, but its heartbeats are answered
}

func newHub() *hub {
	return &hub{trans: map[string]*raft.InmemTransport{}, cut: map[[2]string]bool{}, deposed: map[string]bool{}}
}

// attach makes a new transport for node id (a first start or a restart) and connects it
// with every running node. Cut links stay cut: they are checked when a message is sent.
func (h *hub) attach(id string) raft.Transport {
	_, t := raft.NewInmemTransport(raft.ServerAddress(id))
	h.mu.Lock()
	defer h.mu.Unlock()
	h.trans[id] = t
	for other, ot := range h.trans {
		if other != id {
			t.Connect(raft.ServerAddress(other), ot)
			ot.Connect(raft.ServerAddress(id), t)
		}
	}
	return &link{InmemTransport: t, h: h, from: id}
}

// detach forgets a stopped node: messages to it fail at once, as to a dead process.
func (h *hub) detach(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.trans, id)
	for _, ot := range h.trans {
		ot.Disconnect(raft.ServerAddress(id))
	}
}

func (h *hub) cutLocked(a, b string) {
	h.cut[[2]string{a, b}] = true
	h.cut[[2]string{b, a}] = true
}

func (h *hub) heal() {
	h.mu.Lock()
	defer h.mu.Unlock()
	clear(h.cut)
	clear(h.deposed)
}

// route says what becomes of a message from one node to another.
type route int

const (
	deliver    route = iota
	drop             // the sender gets errCut
	fakeAnswer       // heartbeats get a "yes" in the peer's place; the rest is dropped
)

func (h *hub) route(from, to string) route {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case !h.cut[[2]string{from, to}]:
		return deliver
	case h.deposed[from]:
		return fakeAnswer
	default:
		return drop
	}
}

// link is one node's side of the hub: its raft sends through it. Pipelining is off, as
// it is on the TCP transport leasehold uses (replication/node.go), so every
// AppendEntries passes through AppendEntries here.
type link struct {
	*raft.InmemTransport
	h    *hub
	from string
}

func (l *link) AppendEntriesPipeline(raft.ServerID, raft.ServerAddress) (raft.AppendPipeline, error) {
	return nil, raft.ErrPipelineReplicationNotSupported
}

func (l *link) AppendEntries(id raft.ServerID, target raft.ServerAddress, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	switch l.h.route(l.from, string(target)) {
	case drop:
		return errCut
	case fakeAnswer:
		if !isHeartbeat(args) {
			return errCut
		}
		// What a follower answered to a heartbeat before the cut: yes, you lead.
		*resp = raft.AppendEntriesResponse{RPCHeader: raft.RPCHeader{ID: []byte(target), Addr: []byte(target)}, Term: args.Term, Success: true}
		return nil
	}
	return l.InmemTransport.AppendEntries(id, target, args, resp)
}

// isHeartbeat tells raft's heartbeat (replication.go: only the term and the leader) from
// an AppendEntries that carries entries or the commit index.
func isHeartbeat(a *raft.AppendEntriesRequest) bool {
	return len(a.Entries) == 0 && a.PrevLogEntry == 0 && a.PrevLogTerm == 0 && a.LeaderCommitIndex == 0
}

func (l *link) RequestVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestVoteRequest, resp *raft.RequestVoteResponse) error {
	if l.h.route(l.from, string(target)) != deliver {
		return errCut
	}
	return l.InmemTransport.RequestVote(id, target, args, resp)
}

func (l *link) RequestPreVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestPreVoteRequest, resp *raft.RequestPreVoteResponse) error {
	if l.h.route(l.from, string(target)) != deliver {
		return errCut
	}
	return l.InmemTransport.RequestPreVote(id, target, args, resp)
}

func (l *link) TimeoutNow(id raft.ServerID, target raft.ServerAddress, args *raft.TimeoutNowRequest, resp *raft.TimeoutNowResponse) error {
	if l.h.route(l.from, string(target)) != deliver {
		return errCut
	}
	return l.InmemTransport.TimeoutNow(id, target, args, resp)
}

func (l *link) InstallSnapshot(id raft.ServerID, target raft.ServerAddress, args *raft.InstallSnapshotRequest, resp *raft.InstallSnapshotResponse, data io.Reader) error {
	if l.h.route(l.from, string(target)) != deliver {
		return errCut
	}
	return l.InmemTransport.InstallSnapshot(id, target, args, resp, data)
}
