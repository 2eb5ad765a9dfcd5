package replication

import (
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/leasehold/leasehold/replication/wal"
)

// countFSM counts applied commands; its snapshot is the count.
type countFSM struct {
	mu        sync.Mutex
	n         uint64
	onRestore func() // if set, called (once) at the start of Restore
}

func (f *countFSM) Apply(l *raft.Log) any {
	if l.Type == raft.LogCommand {
		f.mu.Lock()
		f.n++
		f.mu.Unlock()
	}
	return nil
}

func (f *countFSM) count() uint64 { f.mu.Lock(); defer f.mu.Unlock(); return f.n }

func (f *countFSM) Snapshot() (raft.FSMSnapshot, error) { return countSnap(f.count()), nil }

func (f *countFSM) Restore(r io.ReadCloser) error {
	defer r.Close()
	if f.onRestore != nil {
		f.onRestore()
		f.onRestore = nil
	}
	var b [8]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return err
	}
	f.mu.Lock()
	f.n = binary.BigEndian.Uint64(b[:])
	f.mu.Unlock()
	return nil
}

type countSnap uint64

func (s countSnap) Persist(sink raft.SnapshotSink) error {
	if _, err := sink.Write(binary.BigEndian.AppendUint64(nil, uint64(s))); err != nil {
		_ = sink.Cancel()
		return err
	}
	return sink.Close()
}
func (countSnap) Release() {}

// TestLaggingFollowerCatchesUpThroughSnapshot: the WAL cannot hold a gap, so it tells
// raft so (raft.MonotonicLogStore) and raft deletes a follower's whole log when it
// installs a snapshot. The store raft gets is the WAL beneath raft's log cache and
// the batcher's wrapper, as in Open (node.go): the property must survive the wrapping.
// A follower that was down while the leader compacted past its log gets a snapshot
// and must then accept the entries after it.
func TestLaggingFollowerCatchesUpThroughSnapshot(t *testing.T) {
	laggingFollower(t, false)
}

// TestCrashDuringSnapshotInstallHeals: raft persists an installed snapshot, restores
// the FSM from it, and only then deletes the old log. A follower that dies in between
// (while the FSM restores, which takes long for a large state) restarts with the
// snapshot and a log that ends below it, a gap the WAL cannot hold: raft does not
// delete the old log on restart. The appends after the snapshot are refused, the leader
// walks back to its first index and sends the snapshot again, and this time the
// install deletes the old log (it does so only when raft sees IsMonotonic through the
// log cache). The follower must catch up.
func TestCrashDuringSnapshotInstallHeals(t *testing.T) {
	laggingFollower(t, true)
}

// copyDir copies the regular files of src to dst, recursively (a crash image: the
// files as they are at this moment).
func copyDir(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o750)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(target, b, 0o640)
	})
}

func laggingFollower(t *testing.T, crashInInstall bool) {
	type rnode struct {
		id    raft.ServerID
		dir   string
		store *wal.Log
		fsm   *countFSM
		trans *raft.InmemTransport
		r     *raft.Raft
	}
	logger := hclog.New(&hclog.LoggerOptions{Level: hclog.Error, Output: io.Discard})
	var nodes []*rnode
	var servers []raft.Server
	for i := range 3 {
		id := raft.ServerID(fmt.Sprintf("n%d", i+1))
		nodes = append(nodes, &rnode{id: id, dir: t.TempDir()})
		servers = append(servers, raft.Server{ID: id, Address: raft.ServerAddress(id)})
	}
	start := func(nd *rnode, bootstrap bool) {
		t.Helper()
		conf := raft.DefaultConfig()
		conf.LocalID = nd.id
		conf.HeartbeatTimeout = 200 * time.Millisecond
		conf.ElectionTimeout = 200 * time.Millisecond
		conf.LeaderLeaseTimeout = 100 * time.Millisecond
		conf.CommitTimeout = 5 * time.Millisecond
		conf.SnapshotThreshold = 1 << 40 // snapshots only when asked
		conf.SnapshotInterval = time.Hour
		conf.TrailingLogs = 10
		conf.Logger = logger
		var err error
		nd.store, err = wal.Open(filepath.Join(nd.dir, "wal"), wal.Options{SegmentSize: 16 << 10})
		must(t, err)
		snaps, err := raft.NewFileSnapshotStoreWithLogger(nd.dir, 2, logger)
		must(t, err)
		_, nd.trans = raft.NewInmemTransport(raft.ServerAddress(nd.id))
		for _, o := range nodes {
			if o != nd && o.r != nil {
				o.trans.Connect(raft.ServerAddress(nd.id), nd.trans)
				nd.trans.Connect(raft.ServerAddress(o.id), o.trans)
			}
		}
		// As in Open (node.go).
		cached, err := raft.NewLogCache(logCacheEntries, batchStore{LogStore: nd.store, b: &batcher{}})
		must(t, err)
		if bootstrap {
			must(t, raft.BootstrapCluster(conf, cached, nd.store, snaps, nd.trans, raft.Configuration{Servers: servers}))
		}
		if nd.fsm == nil {
			nd.fsm = &countFSM{}
		}
		nd.r, err = raft.NewRaft(conf, nd.fsm, cached, nd.store, snaps, nd.trans)
		must(t, err)
	}
	stop := func(nd *rnode) {
		t.Helper()
		must(t, nd.r.Shutdown().Error())
		for _, o := range nodes {
			if o != nd && o.r != nil {
				o.trans.Disconnect(raft.ServerAddress(nd.id))
			}
		}
		_ = nd.trans.Close()
		must(t, nd.store.Close())
		nd.r = nil
	}
	for _, nd := range nodes {
		start(nd, true)
	}
	t.Cleanup(func() {
		for _, nd := range nodes {
			if nd.r != nil {
				stop(nd)
			}
		}
	})
	leader := func() *rnode {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			for _, nd := range nodes {
				if nd.r != nil && nd.r.State() == raft.Leader {
					return nd
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatal("no leader")
		return nil
	}
	applyN := func(n int) {
		t.Helper()
		ld := leader()
		var fs []raft.ApplyFuture
		for i := range n {
			fs = append(fs, ld.r.Apply([]byte(fmt.Sprint(i)), 5*time.Second))
		}
		for _, f := range fs {
			must(t, f.Error())
		}
	}
	waitCount := func(nd *rnode, want uint64, d time.Duration) bool {
		deadline := time.Now().Add(d)
		for time.Now().Before(deadline) {
			if nd.fsm.count() == want {
				return true
			}
			time.Sleep(10 * time.Millisecond)
		}
		return false
	}

	applyN(20)
	ld := leader()
	var lagger *rnode
	for _, nd := range nodes {
		if nd != ld {
			lagger = nd
			break
		}
	}
	if !waitCount(lagger, 20, 10*time.Second) {
		t.Fatal("follower did not apply the first 20 commands")
	}
	stop(lagger)
	applyN(300)
	ld = leader()
	must(t, ld.r.Snapshot().Error())
	lagLast := uint64(30) // well above the lagger's last index (20 commands + a few entries)
	if first, _ := ld.store.FirstIndex(); first <= lagLast {
		t.Fatalf("leader's log starts at %d: no snapshot install would happen", first)
	}
	var crashImage string
	copied := make(chan error, 1)
	if crashInInstall {
		// The crash image is taken when the FSM starts restoring the installed
		// snapshot: the snapshot is durable, the old log not yet deleted.
		crashImage = t.TempDir()
		dir := lagger.dir
		lagger.fsm = &countFSM{onRestore: func() { copied <- copyDir(dir, crashImage) }}
	}
	start(lagger, false)
	if !waitCount(lagger, 320, 10*time.Second) {
		t.Fatalf("the follower did not install the snapshot: %d commands applied", lagger.fsm.count())
	}
	if crashInInstall {
		// The follower crashed there: it restarts from the crash image.
		must(t, <-copied)
		stop(lagger)
		lagger.dir, lagger.fsm = crashImage, nil
		start(lagger, false)
		if last, _ := lagger.store.LastIndex(); last >= 320 {
			t.Fatalf("the crash image's log ends at %d: the test wants it below the snapshot", last)
		}
		if !waitCount(lagger, 320, 10*time.Second) {
			t.Fatalf("the restarted follower did not restore the snapshot: %d commands applied", lagger.fsm.count())
		}
	}
	applyN(10) // entries after the snapshot: the follower must append them
	if !waitCount(lagger, 330, 5*time.Second) {
		first, _ := lagger.store.FirstIndex()
		last, _ := lagger.store.LastIndex()
		t.Fatalf("the follower applied %d of 330 commands after the snapshot install; its log is [%d, %d], leader's last index %d",
			lagger.fsm.count(), first, last, ld.r.LastIndex())
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
