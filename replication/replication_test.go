package replication_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold/core"
	"github.com/leasehold/leasehold/replication"
	"github.com/leasehold/leasehold/watch"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// open starts a one-node cluster on dir and waits until it leads and has applied every
// committed entry (as the leader runtime does before serving: entries of earlier terms
// are applied only once the new leader commits in its own term).
func open(t testing.TB, dir, store string) *replication.Node {
	t.Helper()
	n, err := replication.Open(replication.Config{DataDir: dir, RaftAddr: "127.0.0.1:0", Bootstrap: true, LogStore: store, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for !n.IsLeader() {
		if ctx.Err() != nil {
			t.Fatal("no leader")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := n.Barrier(ctx); err != nil {
		t.Fatal(err)
	}
	return n
}

func apply(t testing.TB, n *replication.Node, c core.Command) core.Result {
	t.Helper()
	res, err := n.Apply(context.Background(), c)
	if err != nil || res.Err != nil {
		t.Fatalf("%v: %v %v", c.Op, err, res.Err)
	}
	return res
}

// TestDurableAcrossReopen checks G3 at the replication layer for both log stores: what
// Apply acknowledged is there after a close and reopen, and the token sequence goes on
// above it.
func TestDurableAcrossReopen(t *testing.T) {
	for _, store := range []string{replication.LogStoreWAL, replication.LogStoreBolt} {
		t.Run(store, func(t *testing.T) {
			dir := t.TempDir()
			n := open(t, dir, store)
			lease := core.LeaseID{1}
			apply(t, n, core.Command{Op: core.OpGrant, Lease: lease, TTLMillis: 10000})
			tok := apply(t, n, core.Command{Op: core.OpAcquire, Lease: lease, Name: "a", Class: core.Correctness}).Token
			if err := n.Close(); err != nil {
				t.Fatal(err)
			}
			n = open(t, dir, store)
			defer n.Close()
			var held uint64
			n.Read(func(s *core.State) { held = s.Locks().Get("a").Hold.Token })
			if held != tok {
				t.Fatalf("after reopen lock a is held under %d, acknowledged %d", held, tok)
			}
			if next := apply(t, n, core.Command{Op: core.OpAcquire, Lease: lease, Name: "b", Class: core.Correctness}).Token; next <= tok {
				t.Fatalf("token after reopen %d is not above %d", next, tok)
			}
		})
	}
}

// TestAutoLogStore checks that auto keeps a data dir's existing store and picks the WAL
// for a new one, and that a store of the other kind is refused rather than ignored.
func TestAutoLogStore(t *testing.T) {
	boltDir := t.TempDir()
	n := open(t, boltDir, replication.LogStoreBolt)
	apply(t, n, core.Command{Op: core.OpGrant, Lease: core.LeaseID{2}, TTLMillis: 10000})
	_ = n.Close()
	n = open(t, boltDir, replication.LogStoreAuto)
	var leases int
	n.Read(func(s *core.State) { leases = s.NumLeases() })
	_ = n.Close()
	if leases != 1 {
		t.Fatalf("auto on a bolt data dir lost its state: %d leases", leases)
	}
	if _, err := replication.Open(replication.Config{DataDir: boltDir, RaftAddr: "127.0.0.1:0", LogStore: replication.LogStoreWAL, Logger: quiet()}); err == nil {
		t.Fatal("opening a bolt data dir as wal succeeded; it must be refused")
	}
	newDir := t.TempDir()
	n = open(t, newDir, "")
	_ = n.Close()
	if _, err := os.Stat(filepath.Join(newDir, "wal")); err != nil {
		t.Fatalf("a new data dir did not get the WAL: %v", err)
	}
}

// TestRestoreDataDir checks disaster recovery: a snapshot restored into a new data dir
// serves the same locks, and the token sequence jumps by the gap (G1 across a restore).
func TestRestoreDataDir(t *testing.T) {
	n := open(t, t.TempDir(), "")
	lease := core.LeaseID{3}
	apply(t, n, core.Command{Op: core.OpGrant, Lease: lease, TTLMillis: 10000})
	tok := apply(t, n, core.Command{Op: core.OpAcquire, Lease: lease, Name: "x", Class: core.Correctness}).Token
	apply(t, n, core.Command{Op: core.OpPut, Key: "acct", Value: []byte("100")})
	snap, err := n.SnapshotState()
	if err != nil {
		t.Fatal(err)
	}
	seen := apply(t, n, core.Command{Op: core.OpPut, Key: "acct", Value: []byte("90")}).Token // after the backup
	_ = n.Close()

	dir := filepath.Join(t.TempDir(), "restored")
	const gap = 1000
	if err := replication.RestoreDataDir(dir, "node1", "127.0.0.1:0", snap, core.Limits{}, gap); err != nil {
		t.Fatal(err)
	}
	if err := replication.RestoreDataDir(dir, "node1", "127.0.0.1:0", snap, core.Limits{}, gap); err == nil {
		t.Fatal("restoring into a non-empty dir succeeded")
	}
	r, err := replication.Open(replication.Config{DataDir: dir, RaftAddr: "127.0.0.1:0", Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for !r.IsLeader() {
		time.Sleep(5 * time.Millisecond)
	}
	if err := r.Barrier(context.Background()); err != nil {
		t.Fatal(err)
	}
	var held uint64
	r.Read(func(s *core.State) { held = s.Locks().Get("x").Hold.Token })
	if held != tok {
		t.Fatalf("restored lock x held under %d, want %d", held, tok)
	}
	next := apply(t, r, core.Command{Op: core.OpAcquire, Lease: lease, Name: "y", Class: core.Correctness}).Token
	if next <= tok+gap {
		t.Fatalf("first token after restore %d is not above %d + gap %d", next, tok, gap)
	}
	// A version the old cluster gave out after the backup names no value here: a CAS
	// made with it fails rather than applying over a value its caller never read.
	if v := apply(t, r, core.Command{Op: core.OpPut, Key: "acct", Value: []byte("5000")}).Token; v <= seen {
		t.Fatalf("the restored cluster gave version %d, not above %d the old one gave after the backup", v, seen)
	}
	if res, err := r.Apply(context.Background(), core.Command{Op: core.OpPut, Key: "acct", Value: []byte("80"), CheckVersion: true, Version: seen}); err != nil || res.Err == nil {
		t.Fatalf("a CAS with the old cluster's version %d applied over a value its caller never read", seen)
	}
	if err := replication.RestoreDataDir(t.TempDir(), "node1", "127.0.0.1:0", []byte("not a snapshot"), core.Limits{}, gap); err == nil {
		t.Fatal("a corrupt snapshot was restored")
	}
}

// TestRestoreMovesWatchRevisionsOn (G10 across a restore): lock Watch revisions are log
// positions, so a restored cluster's log continues above the backup's position plus the
// gap. A watcher resuming with a revision the old cluster gave — before the backup or
// after it — is told "compacted", never shown the restored cluster's events as if they
// followed the ones it saw.
func TestRestoreMovesWatchRevisionsOn(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	oldHub := watch.NewHub(0)
	n, err := replication.Open(replication.Config{DataDir: t.TempDir(), RaftAddr: "127.0.0.1:0", Bootstrap: true, Events: oldHub, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	for !n.IsLeader() {
		time.Sleep(5 * time.Millisecond)
	}
	lease := core.LeaseID{4}
	apply(t, n, core.Command{Op: core.OpGrant, Lease: lease, TTLMillis: 10000})
	for i := range 50 {
		name := fmt.Sprintf("w/%d", i)
		tok := apply(t, n, core.Command{Op: core.OpAcquire, Lease: lease, Name: name, Class: core.Correctness}).Token
		apply(t, n, core.Command{Op: core.OpRelease, Lease: lease, Name: name, Token: tok})
	}
	snap, err := n.SnapshotState()
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 { // after the backup
		apply(t, n, core.Command{Op: core.OpAcquire, Lease: lease, Name: fmt.Sprintf("after/%d", i), Class: core.Correctness})
	}
	var seen []watch.Revision // every revision the old cluster gave
	for c := watch.At(watch.Revision{}); ; {
		evs, _, err := oldHub.Read(&c, "", make([]watch.Event, 0, 256))
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) == 0 {
			break
		}
		for _, e := range evs {
			seen = append(seen, e.Rev)
		}
	}
	_ = n.Close()
	if len(seen) < 120 {
		t.Fatalf("the old cluster published %d events, want at least 120", len(seen))
	}

	dir := filepath.Join(t.TempDir(), "restored")
	const gap = 1 << 20
	if err := replication.RestoreDataDir(dir, "node1", "127.0.0.1:0", snap, core.Limits{}, gap); err != nil {
		t.Fatal(err)
	}
	hub := watch.NewHub(0)
	r, err := replication.Open(replication.Config{DataDir: dir, RaftAddr: "127.0.0.1:0", Events: hub, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for !r.IsLeader() {
		time.Sleep(5 * time.Millisecond)
	}
	if err := r.Barrier(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 200 { // the restored cluster's own events, more than the old one gave
		apply(t, r, core.Command{Op: core.OpAcquire, Lease: lease, Name: fmt.Sprintf("new/%d", i), Class: core.Correctness})
	}
	last := seen[len(seen)-1]
	if got := r.Status().AppliedIndex; got <= last.Index+gap {
		t.Fatalf("the restored log is at %d, not above the old cluster's last revision %s plus the gap %d", got, last, gap)
	}
	for _, rev := range []watch.Revision{seen[0], seen[len(seen)/2], last, last.Next()} {
		c := watch.At(rev)
		evs, _, err := hub.Read(&c, "", make([]watch.Event, 0, 16))
		if !errors.Is(err, watch.ErrCompacted) {
			t.Fatalf("resuming at the old cluster's revision %s: %d events (first %v), err %v; want compacted", rev, len(evs), evs, err)
		}
	}
}

// TestStatusAppliedIndexIsVisible: Status().AppliedIndex never counts an entry whose
// effects readers cannot see yet. raft's own applied index counts entries handed to the
// FSM's goroutine; a reader that read the state and then watched from that index
// (fence.Follow) would miss the change of an entry still on its way.
func TestStatusAppliedIndexIsVisible(t *testing.T) {
	var gate atomic.Bool
	release := make(chan struct{})
	n, err := replication.Open(replication.Config{DataDir: t.TempDir(), RaftAddr: "127.0.0.1:0", Bootstrap: true, Logger: quiet(),
		ObserveHoldEnds: func([]core.EndedHold) {
			if gate.CompareAndSwap(true, false) {
				<-release // a slow apply goroutine: the entry after this one waits behind it
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	for !n.IsLeader() {
		time.Sleep(5 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.Barrier(ctx); err != nil {
		t.Fatal(err)
	}
	lease := core.LeaseID{5}
	apply(t, n, core.Command{Op: core.OpGrant, Lease: lease, TTLMillis: 10000})
	tok := apply(t, n, core.Command{Op: core.OpAcquire, Lease: lease, Name: "a", Class: core.Correctness}).Token
	gate.Store(true)
	first := make(chan error, 1)
	go func() {
		_, err := n.Apply(ctx, core.Command{Op: core.OpRelease, Lease: lease, Name: "a", Token: tok})
		first <- err
	}()
	for gate.Load() { // until the apply goroutine is held handing on the release's end of hold
		if ctx.Err() != nil {
			t.Fatal("the release's end of hold was never handed on")
		}
		time.Sleep(time.Millisecond)
	}
	second := make(chan error, 1)
	go func() {
		_, err := n.Apply(ctx, core.Command{Op: core.OpAcquire, Lease: lease, Name: "b", Class: core.Correctness})
		second <- err
	}()
	time.Sleep(200 * time.Millisecond) // b's entry is committed and handed on meanwhile
	during := n.Status().AppliedIndex
	var bHeld bool
	n.Read(func(s *core.State) { bHeld = s.Locks().Get("b") != nil })
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if err := <-second; err != nil {
		t.Fatal(err)
	}
	after := n.Status().AppliedIndex
	if !bHeld && during >= after {
		t.Fatalf("Status said applied %d while b's acquire (applied at %d) was not visible", during, after)
	}
}

// TestVerifyLeaderCommitsInCluster: with more than one voter, a leadership confirmation
// is a committed barrier (raft's heartbeat-based VerifyLeader can count an answer to a
// heartbeat sent before the check, see Node.confirmRound); with one voter it writes
// nothing.
func TestVerifyLeaderCommitsInCluster(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	n1 := open(t, t.TempDir(), replication.LogStoreWAL)
	defer n1.Close()
	confirm := func() (before, after uint64) {
		t.Helper()
		before = n1.Status().CommitIndex
		if err := n1.VerifyLeader(ctx); err != nil {
			t.Fatal(err)
		}
		return before, n1.Status().CommitIndex
	}
	if before, after := confirm(); after != before {
		t.Fatalf("one voter: commit index moved %d -> %d", before, after)
	}
	n2, err := replication.Open(replication.Config{NodeID: "node2", DataDir: t.TempDir(), RaftAddr: "127.0.0.1:0", Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer n2.Close()
	if err := n1.AddVoter(ctx, "node2", n2.RaftAddr()); err != nil {
		t.Fatal(err)
	}
	if before, after := confirm(); after <= before {
		t.Fatalf("two voters: commit index did not move (%d)", before)
	}
}
