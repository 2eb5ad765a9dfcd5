package etcdraft

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/leasehold/leasehold/core"
)

// gatedLog holds StoreLogs back while it is closed (block), as a stalled disk would.
type gatedLog struct {
	LogStore
	mu   sync.Mutex
	gate chan struct{} // nil: writes pass
}

func (g *gatedLog) StoreLogs(logs []*raft.Log) error {
	g.mu.Lock()
	gate := g.gate
	g.mu.Unlock()
	if gate != nil {
		<-gate
	}
	return g.LogStore.StoreLogs(logs)
}

func (g *gatedLog) block() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.gate = make(chan struct{})
}

func (g *gatedLog) unblock() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.gate != nil {
		close(g.gate)
		g.gate = nil
	}
}

// cluster starts three nodes on gated logs with a 1 s election timeout (a disk held
// back for a few hundred milliseconds must not cost the leader its lease).
// With direct, the transports write from the loop (Transport.Direct).
func cluster(t *testing.T, direct bool) ([]*Node, []*gatedLog) {
	t.Helper()
	gates := make([]*gatedLog, 3)
	nodes, err := StartCluster(ClusterConfig{Dir: t.TempDir(), Nodes: 3, ElectionTicks: 100, DirectSend: direct, Wrap: func(i int, l LogStore) LogStore {
		gates[i] = &gatedLog{LogStore: l}
		return gates[i]
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, g := range gates {
			g.unblock()
		}
		for _, n := range nodes {
			_ = n.Close()
		}
	})
	return nodes, gates
}

func leaderOf(t *testing.T, nodes []*Node) (*Node, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := WaitLeader(ctx, nodes)
	if err != nil {
		t.Fatal(err)
	}
	for i, n := range nodes {
		if n == l {
			return l, i
		}
	}
	panic("unreachable")
}

var lease = core.LeaseID{1}

func grant(t *testing.T, n *Node) {
	t.Helper()
	if res, err := n.Apply(context.Background(), core.Command{Op: core.OpGrant, Lease: lease, TTLMillis: 600000}); err != nil || res.Err != nil {
		t.Fatal(err, res.Err)
	}
}

func snapshotBytes(t *testing.T, n *Node) []byte {
	t.Helper()
	var buf bytes.Buffer
	n.Read(func(s *core.State) {
		if _, err := s.SnapshotView().WriteTo(&buf); err != nil {
			t.Fatal(err)
		}
	})
	return buf.Bytes()
}

// TestThreeNodesAgree: after N proposals from concurrent proposers, every node applies
// the same entries and ends with a byte-identical state, whose tokens are the ones the
// proposers were given.
func TestThreeNodesAgree(t *testing.T) {
	eachTransport(t, testThreeNodesAgree)
}

// eachTransport runs test with queued sends and with direct ones.
func eachTransport(t *testing.T, test func(*testing.T, bool)) {
	for _, direct := range []bool{false, true} {
		t.Run(fmt.Sprintf("direct=%v", direct), func(t *testing.T) { test(t, direct) })
	}
}

func testThreeNodesAgree(t *testing.T, direct bool) {
	nodes, _ := cluster(t, direct)
	l, _ := leaderOf(t, nodes)
	grant(t, l)
	const workers, rounds = 8, 25
	tokens := make([]uint64, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			name := fmt.Sprintf("lock/%d", w)
			for r := range rounds {
				res, err := l.Apply(context.Background(), core.Command{Op: core.OpAcquire, Lease: lease, Name: name, Class: core.Correctness})
				if err != nil || res.Err != nil {
					t.Error(err, res.Err)
					return
				}
				tokens[w] = res.Token
				if r == rounds-1 {
					return // the last hold stays, to compare below
				}
				if _, err := l.Apply(context.Background(), core.Command{Op: core.OpRelease, Lease: lease, Name: name, Token: res.Token}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	want := l.Applied()
	deadline := time.Now().Add(5 * time.Second)
	for _, n := range nodes {
		for n.Applied() < want {
			if time.Now().After(deadline) {
				t.Fatalf("a node applied %d of %d entries", n.Applied(), want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	ref := snapshotBytes(t, l)
	for i, n := range nodes {
		if got := snapshotBytes(t, n); !bytes.Equal(got, ref) {
			t.Errorf("node %d's state differs from the leader's", i+1)
		}
		n.Read(func(s *core.State) {
			for w, tok := range tokens {
				if h := s.Locks().Get(fmt.Sprintf("lock/%d", w)).Hold.Token; h != tok {
					t.Errorf("node %d: lock/%d held under %d, acknowledged %d", i+1, w, h, tok)
				}
			}
		})
	}
}

// applyAsync proposes an acquire on l and returns where its outcome arrives.
func applyAsync(l *Node, name string) <-chan error {
	done := make(chan error, 1)
	go func() {
		res, err := l.Apply(context.Background(), core.Command{Op: core.OpAcquire, Lease: lease, Name: name, Class: core.Correctness})
		done <- errors.Join(err, res.Err)
	}()
	return done
}

func notYet(t *testing.T, done <-chan error, why string) {
	t.Helper()
	select {
	case err := <-done:
		t.Fatalf("proposal answered (err %v) while %s", err, why)
	case <-time.After(300 * time.Millisecond):
	}
}

func answered(t *testing.T, done <-chan error) {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("proposal not answered")
	}
}

// TestAnswerWaitsForDisk (G3): a proposal is answered only once a quorum has it on
// disk and the leader has too. With both followers' writes held back the leader's own
// copy is not a quorum; with the leader's held back the followers' copies are a quorum,
// but the leader still waits for its own. Releasing one held write lets it through.
func TestAnswerWaitsForDisk(t *testing.T) {
	eachTransport(t, func(t *testing.T, direct bool) {
		t.Run("followers held", func(t *testing.T) { testAnswerWaitsForDisk(t, direct, true) })
		t.Run("leader held", func(t *testing.T) { testAnswerWaitsForDisk(t, direct, false) })
	})
}

func testAnswerWaitsForDisk(t *testing.T, direct, followers bool) {
	nodes, gates := cluster(t, direct)
	l, li := leaderOf(t, nodes)
	grant(t, l)
	held, why := []*gatedLog{gates[li]}, "the leader's own write has not ended"
	if followers {
		held, why = nil, "no follower has it on disk"
		for i, g := range gates {
			if i != li {
				held = append(held, g)
			}
		}
	}
	for _, g := range held {
		g.block()
	}
	done := applyAsync(l, "a")
	notYet(t, done, why)
	held[0].unblock()
	answered(t, done)
}

// TestFollowerRefuses: a follower answers ErrNotLeader and writes nothing.
func TestFollowerRefuses(t *testing.T) {
	nodes, _ := cluster(t, false)
	_, li := leaderOf(t, nodes)
	f := nodes[(li+1)%3]
	if _, err := f.Apply(context.Background(), core.Command{Op: core.OpGrant, Lease: lease, TTLMillis: 1000}); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("follower Apply: %v, want ErrNotLeader", err)
	}
}
