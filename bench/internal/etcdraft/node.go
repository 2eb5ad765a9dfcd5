// Package etcdraft is a prototype of leasehold's replication layer on go.etcd.io/raft/v3
// (issue #16), kept in the bench module so that the server's dependencies do not grow:
// the server runs package replication (hashicorp/raft) and nothing here.
//
// One goroutine per node (run) owns the raft.RawNode and drives its Ready loop: it sends
// the leader's appends to the followers before it writes them to its own log, so the
// leader's fsync and the followers' overlap; it writes entries and hard state to a
// LogStore (replication/wal, the server's log, one fdatasync per Ready); it applies
// committed entries to a core.State and answers the proposers. A command is answered
// only once raft has committed it (a quorum has it on disk) and this node has written it
// to its own disk too, since committed entries are applied only after the Ready that
// carried them was written (G3, on the leader as on every node).
//
// Left out of the prototype: snapshots and log compaction, membership changes (the
// voters are fixed when the cluster starts), restart from an existing log, ReadIndex and
// leadership notifications, TLS.
package etcdraft

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"

	"github.com/leasehold/leasehold/core"
)

// Errors returned by Node.Apply, with the meanings of package replication's.
var (
	// ErrNotLeader: this node is not the leader; nothing was written.
	ErrNotLeader = errors.New("etcdraft: not the leader")
	// ErrOutcomeUnknown: leadership was lost or the node stopped after the command was
	// proposed; it may or may not be committed.
	ErrOutcomeUnknown = errors.New("etcdraft: outcome unknown")
	// ErrStopped: the node is closed; nothing was written.
	ErrStopped = errors.New("etcdraft: node stopped")
)

// Config configures a Node.
type Config struct {
	// ID is this node's raft ID, one of Voters. Required.
	ID uint64
	// Voters are the IDs of the cluster's voters, fixed for its life. Required.
	Voters []uint64
	// Log is the node's durable log, empty at start. Required; Close closes it.
	Log LogStore
	// Transport carries messages to the other voters (AddPeer each). Required; Close
	// closes it.
	Transport *Transport
	// Limits bound the state machine; every node must use the same.
	Limits core.Limits
	// Tick is raft's clock; a heartbeat goes out every HeartbeatTicks and an election
	// starts after ElectionTicks without one. Defaults: 10 ms, 5 and 50 (the 50 ms
	// heartbeat and 500 ms election timeout of package replication).
	Tick                          time.Duration
	HeartbeatTicks, ElectionTicks int
}

// proposal is one command waiting for its outcome.
type proposal struct {
	cmd  []byte // the encoded command
	done chan outcome
}

type outcome struct {
	res core.Result
	err error
}

// Node is one voter of a prototype cluster.
type Node struct {
	cfg     Config
	rn      *raft.RawNode
	storage *raft.MemoryStorage
	disk    durable

	propc chan proposal
	recvc chan *pb.Message
	stop  chan struct{}
	done  chan struct{}

	// Owned by run.
	queued  []proposal          // taken in this turn, not yet proposed
	pending map[uint64]proposal // proposed, by request ID
	nextReq uint64
	leader  bool

	mu      sync.RWMutex // guards state, applied and status
	state   *core.State
	applied uint64
	status  raft.StateType
	lead    uint64
}

// Start starts a node of a new cluster: its log must be empty. All voters start with
// the same Voters; one of them is elected within an election timeout or so.
func Start(cfg Config) (*Node, error) {
	if cfg.ID == 0 || len(cfg.Voters) == 0 || cfg.Log == nil || cfg.Transport == nil {
		return nil, errors.New("etcdraft: ID, Voters, Log and Transport are required")
	}
	if cfg.Tick <= 0 {
		cfg.Tick = 10 * time.Millisecond
	}
	if cfg.HeartbeatTicks <= 0 {
		cfg.HeartbeatTicks = 5
	}
	if cfg.ElectionTicks <= 0 {
		cfg.ElectionTicks = 50
	}
	// The cluster starts from a snapshot at index 1 that holds only the configuration,
	// so that no configuration entries need applying (raft's recommended bootstrap).
	storage := raft.NewMemoryStorage()
	snap := &pb.Snapshot{Metadata: &pb.SnapshotMetadata{
		Index: new(uint64(1)), Term: new(uint64(1)),
		ConfState: &pb.ConfState{Voters: cfg.Voters},
	}}
	if err := storage.ApplySnapshot(snap); err != nil {
		return nil, fmt.Errorf("etcdraft: bootstrap: %w", err)
	}
	rn, err := raft.NewRawNode(&raft.Config{
		ID:              cfg.ID,
		ElectionTick:    cfg.ElectionTicks,
		HeartbeatTick:   cfg.HeartbeatTicks,
		Storage:         storage,
		Applied:         1,
		MaxSizePerMsg:   1 << 20,
		MaxInflightMsgs: 256,
		CheckQuorum:     true,
		PreVote:         true,
		Logger:          quietLogger{},
	})
	if err != nil {
		return nil, fmt.Errorf("etcdraft: start raft: %w", err)
	}
	n := &Node{
		cfg: cfg, rn: rn, storage: storage, disk: durable{log: cfg.Log},
		propc:   make(chan proposal, 1024),
		recvc:   make(chan *pb.Message, 4096),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
		pending: map[uint64]proposal{},
		nextReq: cfg.ID << 48,
		state:   core.NewState(cfg.Limits),
	}
	cfg.Transport.start(n.receive)
	if len(cfg.Voters) == 1 {
		_ = rn.Campaign() // a lone voter need not wait out an election timeout
	}
	go n.run()
	return n, nil
}

// receive hands a message from the transport to the loop.
func (n *Node) receive(m *pb.Message) {
	select {
	case n.recvc <- m:
	case <-n.stop:
	}
}

// Apply proposes cmd and waits until it is committed by a quorum, on this node's disk
// and applied; it returns the state machine's result. Errors: ErrNotLeader (nothing
// written), ErrOutcomeUnknown (may be committed), ErrStopped, or the context's (the
// command may still commit).
func (n *Node) Apply(ctx context.Context, cmd core.Command) (core.Result, error) {
	b, err := core.EncodeCommand(cmd)
	if err != nil {
		return core.Result{}, err
	}
	p := proposal{cmd: b, done: make(chan outcome, 1)}
	select {
	case n.propc <- p:
	case <-n.stop:
		return core.Result{}, ErrStopped
	case <-ctx.Done():
		return core.Result{}, ctx.Err()
	}
	select {
	case o := <-p.done:
		return o.res, o.err
	case <-ctx.Done():
		return core.Result{}, ctx.Err()
	}
}

// Read calls fn with the state under a read lock (not linearizable: no ReadIndex).
func (n *Node) Read(fn func(*core.State)) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	fn(n.state)
}

// Applied is the index of the last entry applied.
func (n *Node) Applied() uint64 {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.applied
}

// IsLeader reports whether this node believes it leads.
func (n *Node) IsLeader() bool {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.status == raft.StateLeader
}

// Leader is the ID of the leader this node knows, 0 if none.
func (n *Node) Leader() uint64 {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.lead
}

// Close stops the node, fails the commands in flight with ErrOutcomeUnknown, and closes
// the transport and the log.
func (n *Node) Close() error {
	select {
	case <-n.stop:
		return nil
	default:
	}
	close(n.stop)
	terr := n.cfg.Transport.Close()
	<-n.done
	return errors.Join(terr, n.cfg.Log.Close())
}

// maxDrain bounds how many proposals and messages one turn of the loop takes in before
// it handles a Ready, so that the log write of a turn stays bounded.
const maxDrain = 1024

// run is the node's loop: take in what arrived, then handle the Ready.
func (n *Node) run() {
	defer close(n.done)
	ticker := time.NewTicker(n.cfg.Tick)
	defer ticker.Stop()
	for {
		select {
		case <-n.stop:
			n.failPending(ErrOutcomeUnknown)
			n.failQueued()
			return
		case <-ticker.C:
			n.rn.Tick()
		case p := <-n.propc:
			n.propose(p)
		case m := <-n.recvc:
			n.step(m)
		}
	drain:
		for range maxDrain {
			select {
			case p := <-n.propc:
				n.propose(p)
			case m := <-n.recvc:
				n.step(m)
			default:
				break drain
			}
		}
		n.flush()
		for n.rn.HasReady() {
			if err := n.handleReady(n.rn.Ready()); err != nil {
				// The log can no longer be written: stop, as the server's node does
				// when its log fails (nothing unwritten was acknowledged).
				n.failPending(ErrOutcomeUnknown)
				n.failQueued()
				return
			}
		}
	}
}

func (n *Node) step(m *pb.Message) {
	_ = n.rn.Step(m) // messages from an old term or an unknown peer are dropped
}

// propose queues p for the entry the loop proposes when it has taken in what arrived.
func (n *Node) propose(p proposal) {
	if !n.leader {
		p.done <- outcome{err: ErrNotLeader}
		return
	}
	n.queued = append(n.queued, p)
}

// flush proposes the queued commands as one entry (group commit: one record, one
// message per follower and one decode however many commands arrived during the last
// write), each under a request ID that tells its proposer when the entry is applied.
// Entry format: uvarint count, then per command its request ID (8 bytes), uvarint
// length and encoding.
func (n *Node) flush() {
	if len(n.queued) == 0 {
		return
	}
	size := binary.MaxVarintLen64
	for _, p := range n.queued {
		size += 8 + binary.MaxVarintLen64 + len(p.cmd)
	}
	data := binary.AppendUvarint(make([]byte, 0, size), uint64(len(n.queued)))
	first := n.nextReq + 1
	for _, p := range n.queued {
		n.nextReq++
		data = binary.BigEndian.AppendUint64(data, n.nextReq)
		data = binary.AppendUvarint(data, uint64(len(p.cmd)))
		data = append(data, p.cmd...)
	}
	if err := n.rn.Propose(data); err != nil {
		for _, p := range n.queued {
			p.done <- outcome{err: fmt.Errorf("%w: %w", ErrNotLeader, err)}
		}
	} else {
		for i, p := range n.queued {
			n.pending[first+uint64(i)] = p
		}
	}
	clear(n.queued)
	n.queued = n.queued[:0]
}

// handleReady sends, persists and applies one Ready, in the order that keeps G3:
//
//  1. Messages that do not acknowledge anything (the leader's appends and heartbeats, a
//     candidate's vote requests) go at once, unless the term or vote changed: those are
//     written first. A follower then writes its copy while the leader writes its own.
//  2. Entries and hard state are written: one StoreLogs, one fdatasync.
//  3. Acknowledgements (append and vote responses) go only now.
//  4. Committed entries are applied and their proposers answered: they are committed
//     by a quorum, and on this node's disk since step 2 of this or an earlier Ready.
func (n *Node) handleReady(rd raft.Ready) error {
	if rd.SoftState != nil {
		n.changeRole(rd.SoftState)
	}
	early := !n.disk.hardStateChanged(rd.HardState)
	var later []*pb.Message
	for _, m := range rd.Messages {
		if early && !isAck(m.GetType()) {
			n.cfg.Transport.Send(m)
		} else {
			later = append(later, m)
		}
	}
	if err := n.disk.saveHardState(rd.HardState); err != nil {
		return err
	}
	if err := n.disk.saveEntries(rd.Entries); err != nil {
		return err
	}
	if rd.HardState != nil {
		_ = n.storage.SetHardState(rd.HardState)
	}
	if err := n.storage.Append(rd.Entries); err != nil {
		return fmt.Errorf("etcdraft: append to memory storage: %w", err)
	}
	for _, m := range later {
		n.cfg.Transport.Send(m)
	}
	n.apply(rd.CommittedEntries)
	n.rn.Advance(rd)
	return nil
}

// isAck reports whether a message of type t acknowledges what this node has written
// (it must wait until the Ready is on disk).
func isAck(t pb.MessageType) bool {
	switch t {
	case pb.MsgAppResp, pb.MsgVoteResp, pb.MsgPreVoteResp:
		return true
	}
	return false
}

// changeRole records the new role; a leader that steps down fails what it proposed.
func (n *Node) changeRole(ss *raft.SoftState) {
	n.mu.Lock()
	n.status, n.lead = ss.RaftState, ss.Lead
	n.mu.Unlock()
	was := n.leader
	n.leader = ss.RaftState == raft.StateLeader
	if was && !n.leader {
		n.failPending(ErrOutcomeUnknown)
	}
}

// apply applies committed entries to the state and answers their proposers.
func (n *Node) apply(ents []*pb.Entry) {
	if len(ents) == 0 {
		return
	}
	type answer struct {
		p proposal
		o outcome
	}
	var answers []answer
	n.mu.Lock()
	for _, e := range ents {
		if e.GetType() != pb.EntryNormal || len(e.GetData()) == 0 {
			continue // the leader's empty entry of its term; no configuration changes here
		}
		err := eachCommand(e.GetData(), func(id uint64, data []byte) {
			var o outcome
			if cmd, err := core.DecodeCommand(data); err != nil {
				o.res.Err = err // skipped identically on every node
			} else {
				o.res = n.state.Apply(cmd)
			}
			if p, ok := n.pending[id]; ok {
				delete(n.pending, id)
				answers = append(answers, answer{p, o})
			}
		})
		if err != nil {
			// The commands before the damage are applied; the rest of the entry is
			// skipped, identically on every node. Their proposer learns it from the
			// request IDs it never sees (ErrOutcomeUnknown when leadership goes).
			continue
		}
	}
	n.applied = ents[len(ents)-1].GetIndex()
	n.mu.Unlock()
	for _, a := range answers {
		a.p.done <- a.o
	}
}

// eachCommand calls fn with each command of an entry (see flush), in order.
func eachCommand(b []byte, fn func(id uint64, cmd []byte)) error {
	count, k := binary.Uvarint(b)
	if k <= 0 {
		return errors.New("bad command count")
	}
	b = b[k:]
	for i := range count {
		if len(b) < 8 {
			return fmt.Errorf("command %d: short request ID", i)
		}
		id := binary.BigEndian.Uint64(b)
		l, k := binary.Uvarint(b[8:])
		if k <= 0 || l > uint64(len(b)-8-k) {
			return fmt.Errorf("command %d: bad length", i)
		}
		fn(id, b[8+k:8+k+int(l)])
		b = b[8+k+int(l):]
	}
	if len(b) != 0 {
		return fmt.Errorf("%d bytes after the last command", len(b))
	}
	return nil
}

func (n *Node) failPending(err error) {
	for id, p := range n.pending {
		p.done <- outcome{err: err}
		delete(n.pending, id)
	}
}

// failQueued answers the proposals not yet proposed: nothing of them was written.
func (n *Node) failQueued() {
	for _, p := range n.queued {
		p.done <- outcome{err: ErrStopped}
	}
	n.queued = nil
	for {
		select {
		case p := <-n.propc:
			p.done <- outcome{err: ErrStopped}
		default:
			return
		}
	}
}

// quietLogger drops raft's log lines but its panics.
type quietLogger struct{}

func (quietLogger) Debug(...any)            {}
func (quietLogger) Debugf(string, ...any)   {}
func (quietLogger) Info(...any)             {}
func (quietLogger) Infof(string, ...any)    {}
func (quietLogger) Warning(...any)          {}
func (quietLogger) Warningf(string, ...any) {}
func (quietLogger) Error(...any)            {}
func (quietLogger) Errorf(string, ...any)   {}
func (quietLogger) Fatal(v ...any)          { panic(fmt.Sprint(v...)) }
func (quietLogger) Fatalf(f string, v ...any) {
	panic(fmt.Sprintf(f, v...))
}
func (quietLogger) Panic(v ...any)            { panic(fmt.Sprint(v...)) }
func (quietLogger) Panicf(f string, v ...any) { panic(fmt.Sprintf(f, v...)) }
