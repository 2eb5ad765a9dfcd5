package client_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/core"
	"github.com/leasehold/leasehold/internal/clustertest"
	"github.com/leasehold/leasehold/internal/testnode"
	"github.com/leasehold/leasehold/service"
)

// seenChange is what an observer was shown.
type seenChange struct {
	ok    bool
	epoch uint64
	value string
}

func (s seenChange) String() string { return fmt.Sprintf("{%v %d %q}", s.ok, s.epoch, s.value) }

// observer runs Observe of name on c in the background.
type observer struct {
	mu   sync.Mutex
	seen []seenChange
	revs []uint64
	err  error
	done chan struct{}
}

func observeInBackground(ctx context.Context, c *client.Client, name string, opts ...client.ObserveOption) *observer {
	o := &observer{done: make(chan struct{})}
	go func() {
		defer close(o.done)
		err := c.Observe(ctx, name, func(l client.ElectionLeader, ok bool) error {
			o.mu.Lock()
			defer o.mu.Unlock()
			o.seen = append(o.seen, seenChange{ok, l.Epoch, string(l.Value)})
			o.revs = append(o.revs, l.Revision)
			return nil
		}, opts...)
		o.mu.Lock()
		o.err = err
		o.mu.Unlock()
	}()
	return o
}

func (o *observer) snapshot() ([]seenChange, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]seenChange(nil), o.seen...), o.err
}

// TestObserveAcrossNodeKill is G8 for the Go client: candidates on their own clients
// lead in turn, each proclaiming a new value and resigning, while the leader's node
// is killed and later restarted; an observer on another client, whose stream breaks
// with the node, shows exactly the cluster's sequence of changes — every leadership,
// every proclaimed value, every "nobody leads", in order, none twice.
func TestObserveAcrossNodeKill(t *testing.T) {
	c := clustertest.MakeCluster(t, 3, clustertest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const name = "observed"
	octx, ostop := context.WithCancel(ctx)
	defer ostop()
	obs := observeInBackground(octx, dialWatch(t, c.Addrs()), name)
	clustertest.WaitFor(t, func() bool { s, _ := obs.snapshot(); return len(s) > 0 }, "the observer's first message")

	var (
		mu    sync.Mutex
		terms []uint64 // the epochs the candidates led under
		wg    sync.WaitGroup
	)
	wctx, wstop := context.WithCancel(ctx)
	for w := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := dialWatch(t, c.Addrs())
			for i := 0; wctx.Err() == nil; i++ {
				_ = cl.Elect(wctx, name, []byte(fmt.Sprintf("w%d-%d", w, i)), func(ctx context.Context, l client.Leadership) error {
					mu.Lock()
					terms = append(terms, l.Epoch())
					mu.Unlock()
					_ = l.Proclaim(ctx, []byte(fmt.Sprintf("w%d-%d+", w, i)))
					time.Sleep(20 * time.Millisecond)
					return nil // resign
				}, client.ElectTTL(5*time.Second))
			}
		}()
	}
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(terms) }
	clustertest.WaitFor(t, func() bool { return count() >= 4 }, "4 leaderships")
	old := c.Leader()
	c.Kill(old)
	before := count()
	clustertest.WaitFor(t, func() bool { return count() >= before+4 }, "4 leaderships after the kill")
	c.Restart(old)
	before = count()
	clustertest.WaitFor(t, func() bool { return count() >= before+2 }, "2 more leaderships")
	wstop()
	wg.Wait()

	// The cluster's sequence: the election history on the leader, from the start.
	lead := c.Leader()
	var history []core.ElectionChange
	clustertest.WaitFor(t, func() bool {
		var err error
		lead.Raft().Read(func(s *core.State) { history, err = s.ElectionChanges(name, 0, nil) })
		if err != nil {
			t.Fatalf("the cluster's history: %v (the test made more changes than it holds)", err)
		}
		return len(history) > 0 && history[len(history)-1].Kind == core.ChangeLeaderless
	}, "the last candidate's leadership to end")
	want := []seenChange{{}} // nobody led when the observer started
	for _, h := range history {
		want = append(want, seenChange{h.Kind != core.ChangeLeaderless, h.Epoch, string(h.Value)})
	}
	var seen []seenChange
	clustertest.WaitFor(t, func() bool {
		var err error
		seen, err = obs.snapshot()
		if err != nil {
			t.Fatalf("Observe ended: %v", err)
		}
		return len(seen) >= len(want)
	}, fmt.Sprintf("the observer to show %d changes", len(want)))
	if fmt.Sprint(seen) != fmt.Sprint(want) {
		t.Fatalf("the observer showed\n %v\nthe cluster's changes\n %v", seen, want)
	}
	led := map[uint64]bool{}
	for _, s := range seen {
		if s.ok {
			led[s.epoch] = true
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, e := range terms {
		if !led[e] {
			t.Fatalf("epoch %d led (the candidate ran) but was never shown: %v", e, seen)
		}
	}
	t.Logf("%d changes, %d leaderships, node %s killed and restarted", len(seen), len(terms), old.ID)
}

// TestObserveCompacted: an Observe resumed (ObserveAfter) from a point the history no
// longer holds returns a *CompactedError naming the oldest point held, never a gap;
// ObserveAfter that point shows every change after it.
func TestObserveCompacted(t *testing.T) {
	n := testnode.StartWith(t, func(cfg *service.Config) { cfg.Raft.Limits.ElectionHistory = 3 })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := dialWatch(t, n.Addr())
	err := c.Elect(ctx, "small", []byte("v0"), func(ctx context.Context, l client.Leadership) error {
		for i := 1; i <= 4; i++ {
			if err := l.Proclaim(ctx, []byte(fmt.Sprint("v", i))); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Held: v3, v4, and the end; v0 to v2 are gone.
	err = c.Observe(ctx, "small", func(client.ElectionLeader, bool) error { return errors.New("shown a change") }, client.ObserveAfter(0))
	var ce *client.CompactedError
	if !errors.As(err, &ce) || !errors.Is(err, client.ErrCompacted) || ce.Oldest == 0 || ce.After != 0 {
		t.Fatalf("Observe from the start = %v, want a CompactedError", err)
	}
	octx, ostop := context.WithCancel(ctx)
	defer ostop()
	obs := observeInBackground(octx, c, "small", client.ObserveAfter(ce.Oldest))
	clustertest.WaitFor(t, func() bool { s, _ := obs.snapshot(); return len(s) >= 3 }, "the held changes")
	seen, _ := obs.snapshot()
	if got := fmt.Sprint(seen); got != fmt.Sprint([]seenChange{{true, seen[0].epoch, "v3"}, {true, seen[0].epoch, "v4"}, {false, seen[0].epoch, ""}}) {
		t.Fatalf("after the oldest point held: %v", got)
	}
}
