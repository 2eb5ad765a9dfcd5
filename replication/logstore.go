package replication

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"go.etcd.io/bbolt"

	"github.com/leasehold/leasehold/replication/wal"
)

// Log store kinds for openLogStore.
const (
	// LogStoreAuto picks LogStoreBolt for a data dir that already holds raft.db and
	// LogStoreWAL otherwise. The default.
	LogStoreAuto = "auto"
	// LogStoreBolt keeps the raft log and stable store in DataDir/raft.db with
	// raft-boltdb: two fsyncs and B+tree work per commit.
	LogStoreBolt = "bolt"
	// LogStoreWAL keeps them in DataDir/wal with package replication/wal: append-only
	// segments, one fsync per commit — about half bolt's commit latency (PERFORMANCE.md).
	LogStoreWAL = "wal"
)

// openLogStore opens the raft log and stable store of the given kind in dir ("" means
// LogStoreAuto); observeSync, if set, times each sync of a LogStoreWAL log, and lg, if
// set, hears when opening it cut a torn tail (never acknowledged). The closer
// closes both. It fails with ErrDataDirInUse when another
// process has the store open, and refuses to open one kind over a directory that holds
// the other kind's state: raft would start from an empty log, and a node with Bootstrap
// set would then found a new cluster. Switching kinds needs a migration, which does not
// exist yet.
func openLogStore(dir string, kind string, observeSync func(time.Duration), lg *slog.Logger) (raft.LogStore, raft.StableStore, io.Closer, error) {
	boltPath := filepath.Join(dir, "raft.db")
	walDir := filepath.Join(dir, "wal")
	exists := func(p string) bool {
		_, err := os.Stat(p)
		return !errors.Is(err, fs.ErrNotExist)
	}
	if kind == "" || kind == LogStoreAuto {
		kind = LogStoreWAL
		if exists(boltPath) {
			kind = LogStoreBolt
		}
	}
	switch kind {
	case LogStoreBolt:
		if exists(walDir) {
			return nil, nil, nil, fmt.Errorf("replication: %s holds a %q log store but %q was asked for", dir, LogStoreWAL, LogStoreBolt)
		}
		store, err := raftboltdb.New(raftboltdb.Options{
			Path:        boltPath,
			BoltOptions: &bbolt.Options{Timeout: time.Second},
		})
		if err != nil {
			if errors.Is(err, bbolt.ErrTimeout) {
				return nil, nil, nil, fmt.Errorf("%w: %s", ErrDataDirInUse, dir)
			}
			return nil, nil, nil, fmt.Errorf("replication: open log store: %w", err)
		}
		return store, store, store, nil
	case LogStoreWAL:
		if exists(boltPath) {
			return nil, nil, nil, fmt.Errorf("replication: %s holds a %q log store but %q was asked for", dir, LogStoreBolt, LogStoreWAL)
		}
		store, err := wal.Open(walDir, wal.Options{ObserveSync: observeSync, Logger: lg})
		if err != nil {
			if errors.Is(err, wal.ErrLocked) {
				return nil, nil, nil, fmt.Errorf("%w: %s", ErrDataDirInUse, dir)
			}
			return nil, nil, nil, fmt.Errorf("replication: open log store: %w", err)
		}
		return store, store, store, nil
	default:
		return nil, nil, nil, fmt.Errorf("replication: unknown log store kind %q (want %q or %q)", kind, LogStoreBolt, LogStoreWAL)
	}
}
