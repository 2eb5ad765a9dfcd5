package replication

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/leasehold/leasehold/core"
)

// Server is a member of the raft configuration.
type Server struct {
	ID       string
	RaftAddr string
	Voter    bool
}

// Configuration returns the latest raft configuration this node knows.
func (n *Node) Configuration() ([]Server, error) {
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, fmt.Errorf("replication: configuration: %w", err)
	}
	return servers(f.Configuration()), nil
}

func servers(c raft.Configuration) []Server {
	var out []Server
	for _, s := range c.Servers {
		out = append(out, Server{ID: string(s.ID), RaftAddr: string(s.Address), Voter: s.Suffrage == raft.Voter})
	}
	return out
}

// AddVoter adds (or re-addresses) a voting member, or promotes a non-voter, and waits
// until the change commits. Only the leader can do it (ErrNotLeader otherwise). A new
// voter counts towards the quorum at once: add a node as a non-voter first and promote
// it once it has caught up (AddNonvoter), or a node that never answers leaves the
// cluster one voter short of a majority for good.
func (n *Node) AddVoter(ctx context.Context, id, raftAddr string) error {
	return n.await(ctx, n.raft.AddVoter(raft.ServerID(id), raft.ServerAddress(raftAddr), 0, 10*time.Second))
}

// AddNonvoter adds a member that receives the log but does not vote, and waits until
// the change commits: the quorum stays what it was, whatever the new member does. For a
// member that is already a voter it only updates the address. Only the leader can do it
// (ErrNotLeader otherwise).
func (n *Node) AddNonvoter(ctx context.Context, id, raftAddr string) error {
	return n.await(ctx, n.raft.AddNonvoter(raft.ServerID(id), raft.ServerAddress(raftAddr), 0, 10*time.Second))
}

// RemoveServer removes a member and waits until the change commits.
func (n *Node) RemoveServer(ctx context.Context, id string) error {
	return n.await(ctx, n.raft.RemoveServer(raft.ServerID(id), 0, 10*time.Second))
}

func (n *Node) await(ctx context.Context, f raft.Future) error {
	done := make(chan error, 1)
	go func() { done <- f.Error() }()
	select {
	case err := <-done:
		switch {
		case err == nil:
			return nil
		case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipLost):
			return fmt.Errorf("%w: %w", ErrNotLeader, err)
		default:
			return fmt.Errorf("replication: membership change: %w", err)
		}
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Recovery is what RecoverCluster found and did.
type Recovery struct {
	// Before is the configuration the data dir held; After the one it holds now.
	Before, After []Server
	// LastIndex and LastTerm are those of the last log entry found: everything up to it
	// is in the recovered state.
	LastIndex, LastTerm uint64
	// LastToken is the last token of the recovered sequence, after the gap.
	LastToken uint64
}

// RecoverCluster rewrites the raft configuration of the stopped node whose data dir is
// cfg.DataDir, for a cluster that lost its quorum for good: to servers, or, when servers
// is empty, to this node alone (cfg.NodeID at cfg.RaftAdvertise, else cfg.RaftAddr). It
// applies every log entry the node has — committed or not — to its state, advances the
// token sequence by tokenGap, writes that state as a snapshot holding the new
// configuration and empties the log (hashicorp/raft's RecoverCluster). Started again,
// the node is a member of the new configuration only; with other servers, each of them
// must be recovered with the same list before it starts.
//
// What it cannot promise: writes that a majority acknowledged but this node never
// received are lost; recover the most up-to-date survivor (the highest LastIndex). The
// token gap keeps G1 across that loss: tokens the lost nodes issued that this node never
// saw (fewer than tokenGap) are never issued again.
//
// It fails with ErrDataDirInUse while the node runs, and refuses a data dir with no
// state and a configuration without this node.
func RecoverCluster(cfg Config, members []Peer, tokenGap uint64) (Recovery, error) {
	if err := cfg.Validate(); err != nil {
		return Recovery{}, err
	}
	cfg = cfg.WithDefaults()
	self := cfg.RaftAdvertise
	if self == "" {
		self = cfg.RaftAddr
	}
	if len(members) == 0 {
		members = []Peer{{ID: cfg.NodeID, RaftAddr: self}}
	}
	conf := raft.Configuration{}
	for _, p := range members {
		conf.Servers = append(conf.Servers, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(p.ID), Address: raft.ServerAddress(p.RaftAddr)})
	}
	if !slices.ContainsFunc(members, func(p Peer) bool { return p.ID == cfg.NodeID }) {
		return Recovery{}, fmt.Errorf("replication: recover: the new configuration must include this node (%s)", cfg.NodeID)
	}
	if _, err := os.Stat(cfg.DataDir); err != nil {
		return Recovery{}, fmt.Errorf("replication: recover: %w", err)
	}
	logs, stable, closer, err := openLogStore(cfg.DataDir, cfg.LogStore, nil, cfg.Logger)
	if err != nil {
		return Recovery{}, err
	}
	defer closer.Close()
	hlog := hclog.New(&hclog.LoggerOptions{Name: "raft", Level: hclog.Warn, Output: slogWriter{cfg.Logger}})
	snaps, err := raft.NewFileSnapshotStoreWithLogger(cfg.DataDir, 2, hlog)
	if err != nil {
		return Recovery{}, fmt.Errorf("replication: open snapshot store: %w", err)
	}
	_, trans := raft.NewInmemTransport(raft.ServerAddress(self))
	defer trans.Close()
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(cfg.NodeID)
	rc.Logger = hlog
	rc.NoLegacyTelemetry = true

	var rec Recovery
	look := *rc // GetConfiguration marks the config it is given as not to be started
	before, err := raft.GetConfiguration(&look, &fsm{state: core.NewState(cfg.Limits), limits: cfg.Limits, log: cfg.Logger}, logs, stable, snaps, trans)
	if err != nil {
		return rec, fmt.Errorf("replication: recover: read the configuration: %w", err)
	}
	rec.Before = servers(before)
	f := &recoveryFSM{fsm: &fsm{state: core.NewState(cfg.Limits), limits: cfg.Limits, log: cfg.Logger}, gap: tokenGap}
	if err := raft.RecoverCluster(rc, f, logs, stable, snaps, trans, conf); err != nil {
		return rec, fmt.Errorf("replication: recover: %w", err)
	}
	if f.err != nil {
		return rec, f.err
	}
	rec.After = servers(conf)
	rec.LastToken = f.state.LastToken()
	if list, err := snaps.List(); err == nil && len(list) > 0 {
		rec.LastIndex, rec.LastTerm = list[0].Index, list[0].Term
	}
	return rec, nil
}

// recoveryFSM is the state machine RecoverCluster replays the log into; before the
// state is snapshotted it advances the token sequence by gap.
type recoveryFSM struct {
	*fsm
	gap uint64
	err error
}

func (f *recoveryFSM) Snapshot() (raft.FSMSnapshot, error) {
	if f.gap > 0 {
		f.mu.Lock()
		res := f.state.Apply(core.Command{Op: core.OpReserve, Count: f.gap})
		f.mu.Unlock()
		if res.Err != nil {
			f.err = fmt.Errorf("replication: recover: advance the token sequence: %w", res.Err)
			return nil, f.err
		}
	}
	return f.fsm.Snapshot()
}
