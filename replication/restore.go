package replication

import (
	"fmt"
	"os"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/leasehold/leasehold/core"
)

// RestoreDataDir seeds an empty data directory with state (as written by
// Node.SnapshotState, e.g. by `leasehold snapshot save`), as a one-voter cluster of
// nodeID at raftAddr. A node started on dir then serves that state: leases restart
// their countdowns at full TTL, locks are held by the same leases with the same tokens,
// and the token sequence continues tokenGap above the last token in the snapshot — so
// that tokens the old cluster issued after the backup (fewer than tokenGap) are never
// issued again — and so do KV versions, so that no version names two values. The log
// continues tokenGap above the backup's log position as well, so that a lock Watch
// revision the old cluster gave (a log position) lies below everything the restored
// cluster holds: a watcher resuming with one is told "compacted" rather than shown the
// new cluster's events as if they followed. A backup that names no log position
// (written before backups did) counts from 0. Other nodes join it as usual. dir must
// not exist or be empty.
func RestoreDataDir(dir, nodeID, raftAddr string, state []byte, limits core.Limits, tokenGap uint64) error {
	st, err := core.RestoreState(state, limits)
	if err != nil {
		return fmt.Errorf("replication: the snapshot does not decode: %w", err)
	}
	at := st.SnapshotLogIndex()
	if at > ^uint64(0)/4 || tokenGap > ^uint64(0)/4 {
		return fmt.Errorf("replication: the backup's log index %d plus the gap %d would overflow", at, tokenGap)
	}
	at += tokenGap + 1 // the restored snapshot's index: the new log begins after it
	if tokenGap > 0 {
		if res := st.Apply(core.Command{Op: core.OpReserve, Count: tokenGap}); res.Err != nil {
			return fmt.Errorf("replication: advance the token sequence: %w", res.Err)
		}
		if err := st.SkipKVVersions(tokenGap); err != nil {
			return fmt.Errorf("replication: advance the KV versions: %w", err)
		}
		if state, err = st.MarshalSnapshot(); err != nil {
			return err
		}
	}
	if entries, err := os.ReadDir(dir); err == nil && len(entries) > 0 {
		return fmt.Errorf("replication: %s is not empty; restore into a new directory", dir)
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return fmt.Errorf("replication: create data dir: %w", err)
	}
	snaps, err := raft.NewFileSnapshotStoreWithLogger(dir, 2, hclog.NewNullLogger())
	if err != nil {
		return fmt.Errorf("replication: snapshot store: %w", err)
	}
	_, trans := raft.NewInmemTransport(raft.ServerAddress(raftAddr))
	conf := raft.Configuration{Servers: []raft.Server{{Suffrage: raft.Voter, ID: raft.ServerID(nodeID), Address: raft.ServerAddress(raftAddr)}}}
	sink, err := snaps.Create(1, at, 1, conf, 1, trans)
	if err != nil {
		return fmt.Errorf("replication: create snapshot: %w", err)
	}
	if _, err := sink.Write(state); err != nil {
		_ = sink.Cancel()
		return fmt.Errorf("replication: write snapshot: %w", err)
	}
	if err := sink.Close(); err != nil {
		return fmt.Errorf("replication: write snapshot: %w", err)
	}
	_, stable, closer, err := openLogStore(dir, LogStoreAuto, nil, nil)
	if err != nil {
		return err
	}
	defer closer.Close()
	// The snapshot is at term 1; the node's first election starts term 2.
	if err := stable.SetUint64([]byte("CurrentTerm"), 1); err != nil {
		return fmt.Errorf("replication: write term: %w", err)
	}
	return nil
}

// SnapshotState returns the state machine's state as snapshot bytes, for a backup that
// RestoreDataDir can restore: the state's MarshalSnapshot bytes with the log position
// they were copied at (core.SnapshotView.AtLogIndex) — the last log index, which no
// event of the copied state is above. Applies wait only while the state is copied, not
// while it is encoded.
func (n *Node) SnapshotState() ([]byte, error) {
	n.fsm.mu.RLock()
	v := n.fsm.state.SnapshotView()
	applied := n.fsm.applied
	n.fsm.mu.RUnlock()
	v.AtLogIndex(max(applied, n.raft.LastIndex()))
	return v.Bytes()
}
