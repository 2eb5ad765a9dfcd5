package wal

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
)

// chainFSM records which command ids it applied and a hash chain over the commands in
// the order applied, so replicas that applied the same sequence have the same hash.
type chainFSM struct {
	mu   sync.Mutex
	hash [32]byte
	seen map[uint64]bool
}

func newChainFSM() *chainFSM { return &chainFSM{seen: map[uint64]bool{}} }

func (f *chainFSM) Apply(l *raft.Log) any {
	if l.Type != raft.LogCommand {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seen[binary.BigEndian.Uint64(l.Data)] = true
	f.hash = sha256.Sum256(append(f.hash[:], l.Data...))
	return nil
}

func (f *chainFSM) state() (int, [32]byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.seen), f.hash
}

func (f *chainFSM) Snapshot() (raft.FSMSnapshot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b := append([]byte(nil), f.hash[:]...)
	for id := range f.seen {
		b = binary.BigEndian.AppendUint64(b, id)
	}
	return chainSnapshot(b), nil
}

func (f *chainFSM) Restore(r io.ReadCloser) error {
	defer r.Close()
	b, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	if len(b) < 32 || (len(b)-32)%8 != 0 {
		return fmt.Errorf("bad snapshot: %d bytes", len(b))
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	copy(f.hash[:], b)
	f.seen = map[uint64]bool{}
	for p := b[32:]; len(p) > 0; p = p[8:] {
		f.seen[binary.BigEndian.Uint64(p)] = true
	}
	return nil
}

type chainSnapshot []byte

func (s chainSnapshot) Persist(sink raft.SnapshotSink) error {
	if _, err := sink.Write(s); err != nil {
		_ = sink.Cancel()
		return err
	}
	return sink.Close()
}
func (chainSnapshot) Release() {}

func command(id uint64) []byte {
	return append(binary.BigEndian.AppendUint64(nil, id), bytes.Repeat([]byte{byte(id)}, 56)...)
}

// testWriter routes raft's log lines to t.Log (shown only on failure) until the test
// ends.
type testWriter struct {
	mu   sync.Mutex
	t    testing.TB
	done bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

type node struct {
	id    raft.ServerID
	addr  raft.ServerAddress
	dir   string
	store *Log
	fsm   *chainFSM
	trans *raft.InmemTransport
	raft  *raft.Raft
}

// cluster is an in-process raft cluster on InmemTransport whose nodes keep their log,
// stable store and snapshots in a directory each, so they can be stopped and restarted.
type cluster struct {
	t      *testing.T
	nodes  []*node
	logger hclog.Logger
	conf   func(id raft.ServerID) *raft.Config
}

func newCluster(t *testing.T, n int, tune func(*raft.Config)) *cluster {
	w := &testWriter{t: t}
	t.Cleanup(func() { w.mu.Lock(); w.done = true; w.mu.Unlock() })
	c := &cluster{t: t, logger: hclog.New(&hclog.LoggerOptions{Name: "raft", Level: hclog.Info, Output: w})}
	c.conf = func(id raft.ServerID) *raft.Config {
		conf := raft.DefaultConfig()
		conf.LocalID = id
		conf.HeartbeatTimeout = 500 * time.Millisecond
		conf.ElectionTimeout = 500 * time.Millisecond
		conf.LeaderLeaseTimeout = 250 * time.Millisecond
		conf.CommitTimeout = 5 * time.Millisecond
		conf.MaxAppendEntries = 64
		conf.BatchApplyCh = true
		conf.NoLegacyTelemetry = true
		conf.Logger = c.logger.Named(string(id))
		tune(conf)
		return conf
	}
	var servers []raft.Server
	for i := range n {
		id := raft.ServerID(fmt.Sprintf("n%d", i+1))
		nd := &node{id: id, addr: raft.ServerAddress(id), dir: t.TempDir()}
		c.nodes = append(c.nodes, nd)
		servers = append(servers, raft.Server{ID: id, Address: nd.addr})
	}
	for _, nd := range c.nodes {
		c.start(nd, &raft.Configuration{Servers: servers})
	}
	t.Cleanup(func() {
		for _, nd := range c.nodes {
			if nd.raft != nil {
				c.stop(nd)
			}
		}
	})
	return c
}

// start opens nd's store and starts raft on it; bootstrap, if not nil, is applied first.
func (c *cluster) start(nd *node, bootstrap *raft.Configuration) {
	t := c.t
	t.Helper()
	var err error
	nd.store, err = Open(filepath.Join(nd.dir, "wal"), Options{SegmentSize: 16 << 10})
	must(t, err)
	snaps, err := raft.NewFileSnapshotStoreWithLogger(nd.dir, 3, c.logger)
	must(t, err)
	_, nd.trans = raft.NewInmemTransport(nd.addr)
	for _, o := range c.nodes {
		if o != nd && o.raft != nil {
			o.trans.Connect(nd.addr, nd.trans)
			nd.trans.Connect(o.addr, o.trans)
		}
	}
	conf := c.conf(nd.id)
	if bootstrap != nil {
		must(t, raft.BootstrapCluster(conf, nd.store, nd.store, snaps, nd.trans, *bootstrap))
	}
	nd.fsm = newChainFSM()
	nd.raft, err = raft.NewRaft(conf, nd.fsm, nd.store, nd.store, snaps, nd.trans)
	must(t, err)
}

func (c *cluster) stop(nd *node) {
	c.t.Helper()
	must(c.t, nd.raft.Shutdown().Error())
	for _, o := range c.nodes {
		if o != nd && o.raft != nil {
			o.trans.Disconnect(nd.addr)
		}
	}
	_ = nd.trans.Close()
	must(c.t, nd.store.Close())
	nd.raft = nil
}

func (c *cluster) leader() *node {
	c.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		for _, nd := range c.nodes {
			if nd.raft != nil && nd.raft.State() == raft.Leader {
				return nd
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.t.Fatal("no leader within 30s")
	return nil
}

// apply commits commands from..to, retrying on a new leader any whose outcome is
// unknown (a retried command may apply twice; the FSM counts ids, not applications).
func (c *cluster) apply(from, to uint64) {
	c.t.Helper()
	var pending []uint64
	for id := from; id <= to; id++ {
		pending = append(pending, id)
	}
	for attempt := 0; len(pending) > 0; attempt++ {
		if attempt == 10 {
			c.t.Fatalf("%d commands still failing after 10 attempts", len(pending))
		}
		ld := c.leader()
		futures := make([]raft.ApplyFuture, len(pending))
		for i, id := range pending {
			futures[i] = ld.raft.Apply(command(id), 10*time.Second)
		}
		var failed []uint64
		for i, f := range futures {
			if err := f.Error(); err != nil {
				c.t.Logf("apply %d: %v (retrying)", pending[i], err)
				failed = append(failed, pending[i])
			}
		}
		pending = failed
	}
}

// converge waits until every running node has applied the leader's last index and all
// FSMs agree, then checks they hold want ids.
func (c *cluster) converge(want int) {
	c.t.Helper()
	ld := c.leader()
	must(c.t, ld.raft.Barrier(10*time.Second).Error())
	target := ld.raft.LastIndex()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ok := true
		for _, nd := range c.nodes {
			if nd.raft != nil && nd.raft.AppliedIndex() < target {
				ok = false
			}
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("nodes did not apply up to %d within 30s", target)
		}
		time.Sleep(10 * time.Millisecond)
	}
	n0, h0 := ld.fsm.state()
	if n0 != want {
		c.t.Fatalf("leader's FSM holds %d commands; want %d", n0, want)
	}
	// raft advances a follower's AppliedIndex when it hands entries to the FSM
	// goroutine, a moment before the FSM has applied them: give the FSMs until the
	// deadline to agree.
	for _, nd := range c.nodes {
		if nd.raft == nil {
			continue
		}
		for {
			n, h := nd.fsm.state()
			if n == n0 && h == h0 {
				break
			}
			if time.Now().After(deadline) {
				c.t.Fatalf("%s's FSM (%d commands, hash %x) differs from the leader's (%d, %x)", nd.id, n, h[:6], n0, h0[:6])
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	c.checkLogsMatch()
}

// checkLogsMatch checks raft's Log Matching property on the stores: where two nodes
// both hold an index, they hold the same entry.
func (c *cluster) checkLogsMatch() {
	c.t.Helper()
	ref := c.leader()
	for _, nd := range c.nodes {
		if nd.raft == nil || nd == ref {
			continue
		}
		f1, _ := ref.store.FirstIndex()
		l1, _ := ref.store.LastIndex()
		f2, _ := nd.store.FirstIndex()
		l2, _ := nd.store.LastIndex()
		for i := max(f1, f2); i <= min(l1, l2); i++ {
			var a, b raft.Log
			if err := ref.store.GetLog(i, &a); err != nil {
				if errors.Is(err, raft.ErrLogNotFound) {
					continue // compacted meanwhile
				}
				c.t.Fatal(err)
			}
			if err := nd.store.GetLog(i, &b); err != nil {
				if errors.Is(err, raft.ErrLogNotFound) {
					continue
				}
				c.t.Fatal(err)
			}
			if a.Term != b.Term || a.Type != b.Type || !bytes.Equal(a.Data, b.Data) {
				c.t.Fatalf("index %d differs: %s has term %d, %s has term %d", i, ref.id, a.Term, nd.id, b.Term)
			}
		}
	}
}

// TestRaftCluster runs three raft nodes on this store through 2,000 commands with
// frequent snapshots and compaction, a follower that misses enough to need a snapshot
// installed (which makes raft delete its whole log, this store being monotonic), and a
// restart of every node; all FSMs must end up identical.
func TestRaftCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a raft cluster on real fsyncs")
	}
	c := newCluster(t, 3, func(conf *raft.Config) {
		conf.SnapshotThreshold = 150
		conf.SnapshotInterval = 100 * time.Millisecond
		conf.TrailingLogs = 40
	})
	c.apply(1, 800)
	c.converge(800)

	// A follower misses 600 commands while the others snapshot and compact past it.
	ld := c.leader()
	var lagger *node
	for _, nd := range c.nodes {
		if nd != ld {
			lagger = nd
			break
		}
	}
	lagLast, _ := lagger.store.LastIndex()
	c.stop(lagger)
	c.apply(801, 1400)
	ld = c.leader()
	if err := ld.raft.Snapshot().Error(); err != nil && !errors.Is(err, raft.ErrNothingNewToSnapshot) {
		t.Fatal(err)
	}
	if first, _ := ld.store.FirstIndex(); first <= lagLast+1 {
		t.Fatalf("leader's log starts at %d, not past the lagging follower's %d: no snapshot install would happen", first, lagLast)
	}
	c.start(lagger, nil)
	c.converge(1400)
	if first, _ := lagger.store.FirstIndex(); first <= lagLast {
		t.Fatalf("lagging follower's log starts at %d (it ended at %d before): the installed snapshot did not replace it", first, lagLast)
	}

	c.apply(1401, 2000)
	c.converge(2000)
	// Each node snapshots on its own timer (SnapshotInterval, with raft's jitter), so
	// give a busy machine a few seconds before calling compaction missing.
	deadline := time.Now().Add(10 * time.Second)
	for _, nd := range c.nodes {
		for {
			first, _ := nd.store.FirstIndex()
			if first > 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("%s's log still starts at %d: compaction never ran", nd.id, first)
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	// Restart everyone: state comes back from snapshots plus the logs on disk.
	for _, nd := range c.nodes {
		c.stop(nd)
	}
	for _, nd := range c.nodes {
		c.start(nd, nil)
	}
	c.converge(2000)
}

// TestRaftSingleNodeRestart: a one-node cluster applies commands, shuts down, and a new
// raft on the reopened store (with snapshots effectively off) rebuilds its FSM from the
// log alone.
func TestRaftSingleNodeRestart(t *testing.T) {
	c := newCluster(t, 1, func(conf *raft.Config) {
		conf.HeartbeatTimeout = 100 * time.Millisecond
		conf.ElectionTimeout = 100 * time.Millisecond
		conf.LeaderLeaseTimeout = 50 * time.Millisecond
		conf.SnapshotThreshold = 1 << 40
		conf.SnapshotInterval = time.Hour
	})
	c.apply(1, 500)
	c.converge(500)
	nd := c.nodes[0]
	c.stop(nd)

	// Every command is in the reopened log.
	store, err := Open(filepath.Join(nd.dir, "wal"), Options{})
	must(t, err)
	first, _ := store.FirstIndex()
	last, _ := store.LastIndex()
	seen := map[uint64]bool{}
	for i := first; i <= last; i++ {
		var e raft.Log
		must(t, store.GetLog(i, &e))
		if e.Type == raft.LogCommand {
			seen[binary.BigEndian.Uint64(e.Data)] = true
		}
	}
	if first != 1 || len(seen) != 500 {
		t.Fatalf("reopened log [%d, %d] holds %d distinct commands; want [1, ...] with 500", first, last, len(seen))
	}
	if term, _ := store.GetUint64([]byte("CurrentTerm")); term == 0 {
		t.Fatal("CurrentTerm not persisted")
	}
	must(t, store.Close())

	c.start(nd, nil)
	c.apply(501, 510)
	c.converge(510)
}
