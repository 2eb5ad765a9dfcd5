package replication

import (
	"errors"
	"net"
	"slices"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/raft"
)

// leaderWatch lets a follower stand for election as soon as its leader's process is
// gone, rather than after raft's heartbeat timeout (500 ms to 1.5 s, and then the other
// follower still refuses its vote for as long as it has not timed out itself).
//
// When a process dies (kill -9, a crash, an OOM kill) its kernel closes its connections
// and refuses new ones at once. So when a connection another node opened to this one
// ends (stream reports it), a follower dials its leader's raft address; if the
// connection is refused, nothing listens there: the leader is dead, not slow or cut off
// (a silent partition times out, it does not refuse). The follower then asks its own
// raft to stand for election now, as a leadership transfer does (raft's TimeoutNow): the
// other voters grant the vote although they have not timed out yet, provided this
// node's log is as up to date as theirs — the log check of the vote, hence every safety
// property of raft, is untouched. The survivors take turns in the order of their IDs,
// standStagger apart, so that they do not split the vote; at its turn a survivor stays
// put if a new leader reached it or it voted for one before it, and stands if the one
// before it was refused its vote (its log was behind: one entry in flight when the leader
// died reached only this node). When the check cannot tell (a
// machine that vanished, a partition), raft's own timeouts elect a leader as before.
//
// Raft's leadership rules alone decide who leads; what leads faster is only when the
// election starts. Everything a new leader does before it serves (leader.Promote: a
// barrier, full-TTL countdowns, G4) stays as it was.
type leaderWatch struct {
	node    atomic.Pointer[Node] // nil until the node's raft runs
	probing atomic.Bool          // a check runs (one at a time)
	again   atomic.Bool          // a connection ended since the running check began
}

// standStagger is how long the n-th survivor in ID order waits before it stands, if no
// new leader has reached it by then: time for the one before it to win (a vote is one
// round trip and one fsync) even on a loaded machine.
const standStagger = 400 * time.Millisecond

// probeTimeout bounds the dial that asks whether the leader's process still listens;
// probeHold is how long an accepted probe connection must stay open for the leader to
// count as alive, and probeTries how many dials a dying leader gets (see gone).
const (
	probeTimeout = 250 * time.Millisecond
	probeHold    = 50 * time.Millisecond
	probeTries   = 3
)

func (w *leaderWatch) start(n *Node) { w.node.Store(n) }

// connEnded is stream's report that a connection from another node ended. It starts a
// check on its own goroutine, unless one runs; then that one checks again when it is
// done (the connections of a dying process may end before its listener does). The
// goroutine ends by itself: each check is two dials and at most a stagger, and it
// checks again only after another connection ended.
func (w *leaderWatch) connEnded() {
	n := w.node.Load()
	if n == nil || n.raft.State() != raft.Follower {
		return
	}
	w.again.Store(true)
	if !w.probing.CompareAndSwap(false, true) {
		return
	}
	go func() {
		for {
			for w.again.Swap(false) {
				n.standIfLeaderGone()
			}
			w.probing.Store(false)
			if !w.again.Load() || !w.probing.CompareAndSwap(false, true) {
				return
			}
		}
	}()
}

// standIfLeaderGone stands for election if the leader this follower knows refuses
// connections and, for all but the first survivor, no new leader has reached it by its
// turn.
func (n *Node) standIfLeaderGone() {
	addr, id := n.raft.LeaderWithID()
	if addr == "" || !gone(addr) {
		return
	}
	rank := n.survivorRank(id)
	if rank < 0 {
		return // not a voter: it cannot stand
	}
	if rank > 0 {
		time.Sleep(time.Duration(rank) * standStagger)
		// A survivor before this one that stood and was refused this node's vote (its log
		// was behind) cleared the leader this node knew: stand then, too.
		if now, _ := n.raft.LeaderWithID(); n.raft.State() != raft.Follower || now != "" && now != addr || n.votedForAnother() || !gone(addr) {
			return // a new leader got through, one is being elected, or this node stands already
		}
	}
	n.cfg.Logger.Warn("the leader refuses connections (its process is gone): standing for election now",
		"leader", string(id), "turn", rank)
	local := n.transport.LocalAddr()
	req := &raft.TimeoutNowRequest{RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(n.cfg.NodeID), Addr: []byte(local)}}
	if err := n.transport.TimeoutNow(raft.ServerID(n.cfg.NodeID), local, req, &raft.TimeoutNowResponse{}); err != nil {
		n.cfg.Logger.Warn("could not stand for election; raft's timeout will", "err", err)
	}
}

// votedForAnother reports whether this node gave its vote in the current term to another
// candidate, whose election is then under way (if it fails, raft's timeouts take over).
// It reads the vote raft keeps in the stable store (raft's keys LastVoteTerm and
// LastVoteCand, part of its data format).
func (n *Node) votedForAnother() bool {
	term, err := n.stable.GetUint64([]byte("LastVoteTerm"))
	if err != nil || term != n.raft.CurrentTerm() {
		return false
	}
	cand, err := n.stable.Get([]byte("LastVoteCand"))
	return err == nil && len(cand) > 0 && string(cand) != string(n.transport.LocalAddr())
}

// survivorRank is this node's place, in ID order, among the voters other than dead; -1
// if it is not one of them.
func (n *Node) survivorRank(dead raft.ServerID) int {
	f := n.raft.GetConfiguration()
	if f.Error() != nil {
		return -1
	}
	var ids []string
	for _, s := range f.Configuration().Servers {
		if s.Suffrage == raft.Voter && s.ID != dead {
			ids = append(ids, string(s.ID))
		}
	}
	slices.Sort(ids)
	return slices.Index(ids, n.cfg.NodeID)
}

// gone reports whether the process behind addr is gone: a TCP connection to it is
// refused, as nothing listens there. A connection that is accepted and then ends within
// probeHold, with nothing sent, is a process that is dying as it is dialled (its kernel
// completed the handshake; its listener closes unread): gone looks again, up to
// probeTries times. One that stays open is a live node (a raft node waits for the first
// byte), and so is one that cannot be told (a dial that times out: a partition).
func gone(addr raft.ServerAddress) bool {
	var b [1]byte
	for range probeTries {
		c, err := net.DialTimeout("tcp", string(addr), probeTimeout)
		if err != nil {
			return errors.Is(err, syscall.ECONNREFUSED)
		}
		_ = c.SetReadDeadline(time.Now().Add(probeHold))
		_, err = c.Read(b[:])
		_ = c.Close()
		if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() || err == nil {
			return false
		}
	}
	return false
}
