// Package replication runs leasehold's state machine on hashicorp/raft: the durable log
// and stable store (replication/wal, one fsync per commit; or raft-boltdb), snapshots,
// and the commit
// path every write takes. A single node is a one-voter cluster, so one code path serves
// both.
package replication

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/leasehold/leasehold/core"
	"github.com/leasehold/leasehold/watch"
)

// Errors returned by Node.
var (
	// ErrNotLeader is returned by Apply on a node that is not the leader. Nothing was
	// written; the caller may retry on the leader.
	ErrNotLeader = errors.New("replication: not the leader")
	// ErrOutcomeUnknown is returned by Apply when leadership was lost or the node shut
	// down after the command was handed to raft: it may or may not have been committed.
	ErrOutcomeUnknown = errors.New("replication: outcome unknown (leadership lost before commit was confirmed)")
	// ErrBusy is returned by Apply when the leader's log could not take the entry in time
	// (raft's queue stayed full for batchEnqueueTimeout). Nothing was written; the caller
	// may send it again, to this node, after a pause.
	ErrBusy = errors.New("replication: the log is busy (the entry was not queued in time; nothing was written)")
	// ErrDataDirInUse is returned by Open when another process has the data directory.
	ErrDataDirInUse = errors.New("replication: data directory is in use by another process")
)

// Config configures a Node. Every zero field but DataDir stands for its default
// (DefaultConfig), named in its comment.
type Config struct {
	// NodeID names this node in the cluster. Default "node1".
	NodeID string
	// DataDir holds the raft log (wal/ or raft.db) and snapshots. Required.
	DataDir string
	// LogStore is LogStoreAuto (default), LogStoreWAL or LogStoreBolt.
	LogStore string
	// RaftAddr is the host:port the raft transport binds and advertises. Port 0 picks a
	// free port. Default 127.0.0.1:7741.
	RaftAddr string
	// RaftAdvertise, if set, is the address other nodes dial instead of RaftAddr (for a
	// node bound to 0.0.0.0).
	RaftAdvertise string
	// PeerTLS, if set, runs raft over mutually authenticated TLS (tls.go); nil: plain
	// TCP, which anyone who reaches RaftAddr can join and write to.
	PeerTLS *PeerTLS
	// Transport, if set, carries raft's messages instead of a TCP transport on RaftAddr
	// (RaftAddr and RaftAdvertise are then unused; the node's address is the transport's
	// LocalAddr). Tests pass raft's in-memory transport (internal/clustertest). Open
	// takes it over: Close closes it.
	Transport raft.Transport
	// Bootstrap makes a node with no existing state start a cluster: of itself alone, or
	// of Peers when they are given (every node of a static cluster bootstraps with the
	// same Peers). A node without Bootstrap waits to be added (see AddVoter).
	Bootstrap bool
	// Peers is the static initial configuration (including this node). Optional.
	Peers []Peer
	// Limits bound the state machine; every node must use the same.
	Limits core.Limits
	// HeartbeatTimeout and ElectionTimeout default to 500ms, LeaderLeaseTimeout to
	// 500ms or the HeartbeatTimeout if that is shorter; it must not exceed it. A leader
	// that has heard from no quorum for LeaderLeaseTimeout steps down. Nothing safe rests
	// on it (keepalives and reads confirm the leadership with a commit, see
	// VerifyLeader); it only bounds how long a cut-off leader goes on answering. It was
	// 250ms: on a loaded machine a new leader then stepped down while its follower caught
	// up (no answer for 255 ms), and the next election took a second (failover bench).
	HeartbeatTimeout   time.Duration
	ElectionTimeout    time.Duration
	LeaderLeaseTimeout time.Duration
	// SnapshotThreshold is how many log entries trigger a snapshot. Default 8192.
	SnapshotThreshold uint64
	// SnapshotInterval is how often raft checks whether to snapshot. Default 30s.
	SnapshotInterval time.Duration
	// Logger receives raft's warnings and errors. Default slog.Default().
	Logger *slog.Logger
	// Observe, if set, is called with the effects of every applied command, in log
	// order, from raft's apply goroutine. It must not block and must not call Apply.
	Observe func([]core.Effect)
	// ObserveHoldEnds, if set, is called after each applied entry that ended holds
	// whose grant the ledger timed, with those ends (core.State.OnHoldEnd), from raft's
	// apply goroutine after Observe. It must not block, call Apply or keep the slice.
	ObserveHoldEnds func([]core.EndedHold)
	// Events, if set, receives the lock events of every applied command entry (G10),
	// stamped with the entry's index, while the entry is applied: a reader of the state
	// never sees a change before its event is in the hub. A restored snapshot resets it.
	Events *watch.Hub
	// LeaderChange, if set, receives true when this node becomes leader and false when
	// it stops being leader. Raft blocks until the value is received.
	LeaderChange chan<- bool
	// ObserveCommit, if set, gets how long each log entry this node proposed took from
	// its hand-off to raft to its apply; ObserveSync how long each sync of the log took
	// (LogStoreWAL only). For metrics: both are called on the commit path and must be
	// cheap and not block.
	ObserveCommit, ObserveSync func(time.Duration)
}

// Peer is one voter of a static initial configuration.
type Peer struct {
	ID       string
	RaftAddr string
}

// Defaults of Config that other layers refer to (the CLI's flags, service's checks).
const (
	DefaultNodeID   = "node1"
	DefaultRaftAddr = "127.0.0.1:7741"
)

// DefaultConfig returns the configuration that a zero Config stands for: every field
// that has a default, set to it. DataDir has none (it is required).
func DefaultConfig() Config {
	return Config{
		NodeID:             DefaultNodeID,
		RaftAddr:           DefaultRaftAddr,
		HeartbeatTimeout:   500 * time.Millisecond,
		ElectionTimeout:    500 * time.Millisecond,
		LeaderLeaseTimeout: 500 * time.Millisecond,
		SnapshotThreshold:  8192,
		SnapshotInterval:   30 * time.Second,
		Logger:             slog.Default(),
	}
}

// WithDefaults returns c with every zero field that has a default set to it
// (DefaultConfig). A negative duration counts as zero.
func (c Config) WithDefaults() Config {
	d := DefaultConfig()
	if c.NodeID == "" {
		c.NodeID = d.NodeID
	}
	if c.RaftAddr == "" {
		c.RaftAddr = d.RaftAddr
	}
	def := func(v *time.Duration, dv time.Duration) {
		if *v <= 0 {
			*v = dv
		}
	}
	def(&c.HeartbeatTimeout, d.HeartbeatTimeout)
	def(&c.ElectionTimeout, d.ElectionTimeout)
	def(&c.LeaderLeaseTimeout, min(d.LeaderLeaseTimeout, c.HeartbeatTimeout))
	def(&c.SnapshotInterval, d.SnapshotInterval)
	if c.SnapshotThreshold == 0 {
		c.SnapshotThreshold = d.SnapshotThreshold
	}
	if c.Logger == nil {
		c.Logger = d.Logger
	}
	return c
}

// Validate checks c, with its defaults (WithDefaults), against the rules that span
// fields, as raft's own config check does (LeaderLeaseTimeout ≤ HeartbeatTimeout). It
// does not change c.
func (c Config) Validate() error {
	c = c.WithDefaults()
	switch {
	case c.DataDir == "":
		return errors.New("replication: data dir is required")
	case c.LeaderLeaseTimeout > c.HeartbeatTimeout:
		return fmt.Errorf("replication: leader lease timeout %v exceeds heartbeat timeout %v", c.LeaderLeaseTimeout, c.HeartbeatTimeout)
	}
	return core.ValidateNodeID("node_id", c.NodeID)
}

// clusterIDKey is where the stable store keeps the cluster ID this node has applied.
var clusterIDKey = []byte("LeaseholdClusterID")

// maxAppendEntries bounds the entries raft writes, and sends a follower, in one batch.
const maxAppendEntries = 512

// logCacheEntries is how many of the newest log entries stay in memory: two full
// batches, so a follower that is one batch behind is still served from it.
const logCacheEntries = 2 * maxAppendEntries

// Node is one member of a leasehold raft cluster.
type Node struct {
	cfg       Config
	raft      *raft.Raft
	fsm       *fsm
	logs      raft.LogStore
	stable    raft.StableStore
	closer    io.Closer
	transport raft.Transport
	verifier  verifier
	futures   futures
	batcher   batcher
	watch     leaderWatch
}

// Open opens (or creates) the data directory, restores the latest snapshot, replays the
// log and joins raft. With Bootstrap and no existing state it starts a one-voter
// cluster. Open returns before an election completes: use WaitLeader.
func Open(cfg Config) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	if err := os.MkdirAll(cfg.DataDir, 0o750); err != nil {
		return nil, fmt.Errorf("replication: create data dir: %w", err)
	}
	logs, stable, closer, err := openLogStore(cfg.DataDir, cfg.LogStore, cfg.ObserveSync, cfg.Logger)
	if err != nil {
		return nil, err
	}
	n := &Node{cfg: cfg, logs: logs, stable: stable, closer: closer}
	n.batcher.submit = n.submit
	n.batcher.observe = cfg.ObserveCommit
	ok := false
	defer func() {
		if !ok {
			n.closeStores()
		}
	}()
	hlog := hclog.New(&hclog.LoggerOptions{
		Name:   "raft",
		Level:  hclog.Warn,
		Output: slogWriter{cfg.Logger},
	})
	snaps, err := raft.NewFileSnapshotStoreWithLogger(cfg.DataDir, 2, hlog)
	if err != nil {
		return nil, fmt.Errorf("replication: open snapshot store: %w", err)
	}
	n.transport = cfg.Transport
	if n.transport == nil {
		if n.transport, err = netTransport(cfg, transportConfig(cfg, hlog), n.watch.connEnded); err != nil {
			return nil, err
		}
	}
	n.fsm = &fsm{limits: cfg.Limits, observe: cfg.Observe, holdEnds: cfg.ObserveHoldEnds, events: cfg.Events, log: cfg.Logger}
	n.fsm.setState(core.NewState(cfg.Limits))

	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(cfg.NodeID)
	rc.HeartbeatTimeout = cfg.HeartbeatTimeout
	rc.ElectionTimeout = cfg.ElectionTimeout
	rc.LeaderLeaseTimeout = cfg.LeaderLeaseTimeout
	// CommitTimeout is how long a leader with nothing new to send waits before telling
	// followers the commit index anyway (raft's default). Under load the index travels
	// with every AppendEntries; when idle, 5 ms (the old value) kept the leader of an
	// idle three-node cluster at 12% of a core sending 200 RPCs a second per follower.
	// Followers only need the index to apply, and a new leader applies everything
	// committed before it serves (Barrier), so a later index costs nothing visible.
	rc.CommitTimeout = 50 * time.Millisecond
	rc.SnapshotThreshold = cfg.SnapshotThreshold
	rc.SnapshotInterval = cfg.SnapshotInterval
	rc.BatchApplyCh = true
	rc.MaxAppendEntries = maxAppendEntries
	rc.NotifyCh = cfg.LeaderChange
	rc.Logger = hlog
	rc.NoLegacyTelemetry = true

	if cfg.Bootstrap {
		has, herr := raft.HasExistingState(logs, stable, snaps)
		if herr != nil {
			return nil, fmt.Errorf("replication: inspect state: %w", herr)
		}
		if !has {
			conf := raft.Configuration{Servers: []raft.Server{{ID: rc.LocalID, Address: n.transport.LocalAddr()}}}
			if len(cfg.Peers) > 0 {
				conf.Servers = nil
				for _, p := range cfg.Peers {
					conf.Servers = append(conf.Servers, raft.Server{ID: raft.ServerID(p.ID), Address: raft.ServerAddress(p.RaftAddr)})
				}
			}
			if berr := raft.BootstrapCluster(rc, logs, stable, snaps, n.transport, conf); berr != nil {
				return nil, fmt.Errorf("replication: bootstrap: %w", berr)
			}
		}
	}
	// The cache keeps the newest entries in memory, so that neither the leader sending
	// them to followers nor a follower applying them reads them back from disk: without
	// it every replicated entry cost a pread and a decode per follower on the leader and
	// one more on each follower (PERFORMANCE.md, three nodes).
	// Beneath the cache, the batcher learns when each log write starts and ends.
	cached, err := raft.NewLogCache(logCacheEntries, batchStore{LogStore: logs, b: &n.batcher})
	if err != nil {
		return nil, fmt.Errorf("replication: log cache: %w", err)
	}
	n.fsm.saveClusterID = func(id string) {
		if err := stable.Set(clusterIDKey, []byte(id)); err != nil {
			cfg.Logger.Error("could not save the cluster ID", "err", err)
		}
	}
	n.raft, err = raft.NewRaft(rc, n.fsm, cached, stable, snaps, n.transport)
	if err != nil {
		return nil, fmt.Errorf("replication: start raft: %w", err)
	}
	if id, err := stable.Get(clusterIDKey); err == nil && len(id) > 0 {
		n.fsm.presetClusterID(string(id))
	}
	n.verifier.round = n.confirmRound
	n.watch.start(n)
	ok = true
	return n, nil
}

// Apply proposes cmd, waits until it is committed by a quorum, fsynced and applied, and
// returns the state machine's result. The command's own failure is in Result.Err; the
// error return is about replication: ErrNotLeader (nothing written), ErrOutcomeUnknown
// (may or may not be committed), or the context's error (the command may still commit).
//
// Commands proposed before the last entry sent is written share the next log entry
// (batch.go); each still gets its own result.
func (n *Node) Apply(ctx context.Context, cmd core.Command) (core.Result, error) {
	b, err := core.EncodeCommand(stamped(cmd))
	if err != nil {
		return core.Result{}, err
	}
	if err := ctx.Err(); err != nil {
		return core.Result{}, err
	}
	p := proposal{data: b, done: make(chan outcome, 1)}
	n.batcher.propose(p)
	select {
	case o := <-p.done:
		return o.result()
	case <-ctx.Done():
		return core.Result{}, ctx.Err()
	}
}

// HoldProposals makes the commands proposed from now on wait until unhold is called
// (once, and soon: nothing proposed meanwhile reaches raft before), then go to raft
// together, in one log entry where they fit. For a caller that knows more proposals
// are on the way; without it, the first of them goes to raft at once and alone, and
// the others wait for its log write.
func (n *Node) HoldProposals() (unhold func()) { return n.batcher.hold() }

// ApplyThen is Apply without the wait: it proposes cmd and returns, and then gets the
// result and error Apply would have returned (never a context's error: the proposal
// cannot be called back). then runs once, on the goroutine that hands out commit
// results, or on the caller's when cmd does not encode; it must not block, since the
// results of the commands committed after cmd wait for it.
func (n *Node) ApplyThen(cmd core.Command, then func(core.Result, error)) {
	b, err := core.EncodeCommand(stamped(cmd))
	if err != nil {
		then(core.Result{}, err)
		return
	}
	n.batcher.propose(proposal{data: b, then: func(o outcome) { then(o.result()) }})
}

// stamped sets the wall clock on a command that can start or end a hold or a
// leadership, or change a leader's value, for the ledger's and the election history's
// times (display only: the state machine depends on nothing but the log).
func stamped(cmd core.Command) core.Command {
	switch cmd.Op {
	case core.OpAcquire, core.OpRelease, core.OpCancelWait, core.OpRevoke, core.OpExpire, core.OpForceRelease, core.OpEndDelay,
		core.OpDisconnect, core.OpCampaign, core.OpProclaim, core.OpResign:
		if cmd.WallMillis == 0 {
			cmd.WallMillis = time.Now().UnixMilli()
		}
	}
	return cmd
}

// result is the outcome as Apply returns it, with raft's error mapped.
func (o outcome) result() (core.Result, error) {
	switch err := o.err; {
	case err == nil:
		return o.res, nil
	case errors.Is(err, raft.ErrNotLeader):
		return core.Result{}, fmt.Errorf("%w: %w", ErrNotLeader, err)
	case errors.Is(err, raft.ErrEnqueueTimeout):
		return core.Result{}, fmt.Errorf("%w: %w", ErrBusy, err)
	default:
		return core.Result{}, fmt.Errorf("%w: %w", ErrOutcomeUnknown, err)
	}
}

// submit hands one log entry to raft; done gets its outcome.
func (n *Node) submit(data []byte, done func(raft.ApplyFuture, error)) {
	n.futures.wait(n.raft.Apply(data, batchEnqueueTimeout), done)
}

// Barrier waits until every entry committed before it has been applied to the state
// machine. A new leader calls it before serving reads of the state.
func (n *Node) Barrier(ctx context.Context) error {
	f := n.raft.Barrier(0)
	done := make(chan error, 1)
	go func() { done <- f.Error() }()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("%w: %w", ErrNotLeader, err)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// VerifyLeader confirms with a quorum that this node is still the leader. It fails with
// ErrNotLeader on a node that was deposed, even one that has not noticed yet (a leader
// that was paused, or cut off, while another was elected). The confirming round started
// after the call; concurrent callers share rounds (see verifier and confirmRound).
func (n *Node) VerifyLeader(ctx context.Context) error {
	if n.raft.State() != raft.Leader {
		return ErrNotLeader
	}
	if err := n.verifier.verify(ctx); err != nil {
		if ctx.Err() != nil {
			return err
		}
		return fmt.Errorf("%w: %w", ErrNotLeader, err)
	}
	return nil
}

// VerifyLeaderThen is VerifyLeader without the wait: then gets what VerifyLeader would
// have returned, once, and must not block. It runs on the goroutine that runs the
// confirmation rounds, or at once on the caller's goroutine when this node is not the
// leader.
func (n *Node) VerifyLeaderThen(then func(error)) {
	if n.raft.State() != raft.Leader {
		then(ErrNotLeader)
		return
	}
	n.verifier.verifyThen(then)
}

// confirmRound starts one leadership confirmation. A one-voter cluster cannot be
// deposed, and raft answers its VerifyLeader at once. With more voters, raft's
// VerifyLeader is not enough: it counts the next heartbeat answer from each follower,
// including the answer to a heartbeat sent before the round began (a leader paused
// with a heartbeat in flight reads the followers' stale "yes" when it resumes, and
// TestDeposedLeaderKeepAlive caught it acknowledging a keepalive after another node had
// been elected). So the round commits a barrier entry instead: it is appended after the
// round began, and a majority accepting it in this node's term means no newer leader had
// been elected by any of them before that.
func (n *Node) confirmRound() raft.Future {
	if n.voters() == 1 {
		return n.raft.VerifyLeader()
	}
	return n.raft.Barrier(0)
}

// voters counts the voters of the latest configuration this node knows (0 if it cannot
// tell, which makes confirmRound take the safe path).
func (n *Node) voters() int {
	f := n.raft.GetConfiguration()
	if f.Error() != nil {
		return 0
	}
	count := 0
	for _, s := range f.Configuration().Servers {
		if s.Suffrage == raft.Voter {
			count++
		}
	}
	return count
}

// ReadIndex makes the next Read linearizable: it notes the commit index, confirms with a
// quorum that this node is still the leader, and waits until everything up to that index
// is applied. A read served after it reflects every write acknowledged before it began.
// It fails with ErrNotLeader on a node that is not (or no longer) the leader.
func (n *Node) ReadIndex(ctx context.Context) error {
	if n.raft.State() != raft.Leader {
		return ErrNotLeader
	}
	idx := n.raft.CommitIndex()
	if err := n.VerifyLeader(ctx); err != nil {
		return err
	}
	for n.raft.AppliedIndex() < idx {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Microsecond):
		}
	}
	return nil
}

// Read calls fn with the state machine's state under a read lock. fn must not keep the
// pointer or call Apply.
func (n *Node) Read(fn func(*core.State)) {
	n.fsm.mu.RLock()
	defer n.fsm.mu.RUnlock()
	fn(n.fsm.state)
}

// IsLeader reports whether this node believes it is the leader.
func (n *Node) IsLeader() bool { return n.raft.State() == raft.Leader }

// WaitLeader waits until some node is leader (as this node sees it).
func (n *Node) WaitLeader(ctx context.Context) error {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		if addr, _ := n.raft.LeaderWithID(); addr != "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// Status is a node's view of the cluster.
type Status struct {
	NodeID      string
	Role        string
	LeaderID    string
	LeaderAddr  string
	Term        uint64
	CommitIndex uint64
	// AppliedIndex is the index up to which every entry's effects are visible to readers
	// of this node's state (visibleIndex).
	AppliedIndex uint64
	// RaftAddr is this node's raft address as other nodes dial it.
	RaftAddr string
}

// Status reports this node's raft state.
func (n *Node) Status() Status {
	addr, id := n.raft.LeaderWithID()
	st := n.raft.Stats()
	var term, commit, snapped uint64
	_, _ = fmt.Sscan(st["term"], &term)
	_, _ = fmt.Sscan(st["commit_index"], &commit)
	_, _ = fmt.Sscan(st["last_snapshot_index"], &snapped)
	return Status{
		NodeID:       n.cfg.NodeID,
		Role:         map[raft.RaftState]string{raft.Leader: "leader", raft.Follower: "follower", raft.Candidate: "candidate", raft.Shutdown: "shutdown"}[n.raft.State()],
		LeaderID:     string(id),
		LeaderAddr:   string(addr),
		Term:         term,
		CommitIndex:  commit,
		AppliedIndex: n.visibleIndex(snapped),
		RaftAddr:     n.RaftAddr(),
	}
}

// visibleIndex returns the index up to which every entry's effects are visible to
// readers of the state, given the index of the node's last snapshot. raft.AppliedIndex
// counts the entries raft has handed to the FSM's goroutine, which may still be
// applying them; an entry the FSM never sees (the no-op that starts a term, a barrier,
// a configuration) has no effect on the state, and entries up to the last snapshot are
// in the state (it was taken of the state, or restored into it). So the answer is
// raft's applied index unless a command above those is still on its way to the FSM:
// then the index before that command. A reader that starts from it (fence.Follow reads
// the lock state, then watches from the index it was given) misses no change.
func (n *Node) visibleIndex(snapped uint64) uint64 {
	handed := n.raft.AppliedIndex()
	n.fsm.mu.RLock()
	done := max(n.fsm.applied, snapped)
	n.fsm.mu.RUnlock()
	if done >= handed {
		return handed
	}
	for i := done + 1; i <= handed; i++ {
		var l raft.Log
		if i > done+64 || n.logs.GetLog(i, &l) != nil || l.Type == raft.LogCommand {
			return i - 1 // entries done+1 .. i-1 have no effect on the state
		}
	}
	return handed
}

// NodeID returns this node's id.
func (n *Node) NodeID() string { return n.cfg.NodeID }

// RaftAddr returns the address the raft transport listens on.
func (n *Node) RaftAddr() string { return string(n.transport.LocalAddr()) }

// Snapshot forces a snapshot now (for tests and operators).
func (n *Node) Snapshot() error { return n.raft.Snapshot().Error() }

// Close shuts raft down and closes the log store. Commands in flight fail with
// ErrOutcomeUnknown.
func (n *Node) Close() error {
	err := n.raft.Shutdown().Error()
	n.futures.close() // raft has answered every future: the goroutine ends when it has handed them out
	n.closeStores()
	return err
}

func (n *Node) closeStores() {
	if t, ok := n.transport.(*raft.NetworkTransport); ok {
		// The connections to other nodes end with the node, as they do when its process
		// dies: what the others' leaderWatch looks for.
		t.CloseStreams()
	}
	if c, ok := n.transport.(raft.WithClose); ok {
		_ = c.Close()
	}
	if n.closer != nil {
		_ = n.closer.Close()
	}
}

// slogWriter routes hclog output into slog at warn level.
type slogWriter struct{ l *slog.Logger }

func (w slogWriter) Write(p []byte) (int, error) {
	w.l.Warn(string(trimNewline(p)), "component", "raft")
	return len(p), nil
}

func trimNewline(p []byte) []byte {
	for len(p) > 0 && (p[len(p)-1] == '\n' || p[len(p)-1] == '\r') {
		p = p[:len(p)-1]
	}
	return p
}
