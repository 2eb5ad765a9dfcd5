package etcdraft

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/leasehold/leasehold/core"
	"github.com/leasehold/leasehold/replication/wal"
)

// ClusterConfig configures StartCluster.
type ClusterConfig struct {
	// Dir holds one wal directory per node (node1, node2, …). Required.
	Dir string
	// Nodes is the number of voters. Default 1.
	Nodes int
	// Limits bound the state machine.
	Limits core.Limits
	// ElectionTicks of 10 ms each; default 50 (Config).
	ElectionTicks int
	// DirectSend sets every transport's Direct.
	DirectSend bool
	// Wrap, if set, wraps node i's log (tests hold disk writes back with it).
	Wrap func(i int, l LogStore) LogStore
}

// StartCluster starts a new cluster of cfg.Nodes voters on loopback TCP, each on its own
// replication/wal log, and waits (up to 10 s) until one of them leads. Close every node.
func StartCluster(cfg ClusterConfig) ([]*Node, error) {
	if cfg.Nodes <= 0 {
		cfg.Nodes = 1
	}
	ts := make([]*Transport, cfg.Nodes)
	voters := make([]uint64, cfg.Nodes)
	var nodes []*Node
	fail := func(err error) ([]*Node, error) {
		for _, n := range nodes {
			_ = n.Close()
		}
		for _, t := range ts[len(nodes):] {
			if t != nil {
				_ = t.Close()
			}
		}
		return nil, err
	}
	for i := range ts {
		t, err := Listen("127.0.0.1:0")
		if err != nil {
			return fail(err)
		}
		t.Direct = cfg.DirectSend
		ts[i], voters[i] = t, uint64(i+1)
	}
	for i, t := range ts {
		for j, u := range ts {
			if i != j {
				t.AddPeer(uint64(j+1), u.Addr())
			}
		}
	}
	for i, t := range ts {
		var log LogStore
		log, err := wal.Open(filepath.Join(cfg.Dir, fmt.Sprintf("node%d", i+1)), wal.Options{})
		if err != nil {
			return fail(err)
		}
		if cfg.Wrap != nil {
			log = cfg.Wrap(i, log)
		}
		n, err := Start(Config{ID: voters[i], Voters: voters, Log: log, Transport: t, Limits: cfg.Limits, ElectionTicks: cfg.ElectionTicks})
		if err != nil {
			_ = log.Close()
			return fail(err)
		}
		nodes = append(nodes, n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := WaitLeader(ctx, nodes); err != nil {
		return fail(err)
	}
	return nodes, nil
}

// WaitLeader waits until one of nodes leads and has applied its term's first entry
// (so that it answers proposals), and returns it.
func WaitLeader(ctx context.Context, nodes []*Node) (*Node, error) {
	for {
		for _, n := range nodes {
			if n.IsLeader() && n.Applied() > 1 {
				return n, nil
			}
		}
		select {
		case <-ctx.Done():
			return nil, errors.Join(errors.New("etcdraft: no leader"), ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}
