package nemesis

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/client"
)

// TestElectionAcrossLeaderFailover (G8): three candidates (client.Elect, TTL 3 s) on a
// three-node cluster whose raft leader is killed with SIGKILL, and started again, three
// times, while each leader resigns after a second. An Observe stream (which resumes at
// another node when its node dies) shows epochs that strictly rise, each change once;
// no epoch is handed to two candidates; and the terms the candidates ran are among the
// changes Observe showed, every one: a resumed stream replays what it missed.
func TestElectionAcrossLeaderFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real cluster; skipped with -short")
	}
	c := NewCluster(t, false)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	settle(t, c)

	type change struct {
		epoch uint64
		ok    bool
	}
	var mu sync.Mutex
	var observed []change
	terms := map[uint64]string{} // epoch → candidate

	oc, err := client.Dial(ctx, c.Addrs())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = oc.Close(context.Background()) }()
	octx, ostop := context.WithCancel(ctx)
	odone := make(chan error, 1)
	go func() {
		odone <- oc.Observe(octx, "nemesis/election", func(l client.ElectionLeader, ok bool) error {
			mu.Lock()
			observed = append(observed, change{l.Epoch, ok})
			mu.Unlock()
			return nil
		})
	}()

	ectx, estop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for i := range 3 {
		who := fmt.Sprintf("cand-%d", i)
		cl, err := client.Dial(ctx, c.Addrs(), client.WithTTL(3*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = cl.Close(context.Background()) }()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ectx.Err() == nil {
				_ = cl.Elect(ectx, "nemesis/election", []byte(who), func(ctx context.Context, l client.Leadership) error {
					mu.Lock()
					if prev, dup := terms[l.Epoch()]; dup {
						t.Errorf("epoch %d handed to %s and %s", l.Epoch(), prev, who)
					}
					terms[l.Epoch()] = who
					mu.Unlock()
					select {
					case <-ctx.Done():
					case <-time.After(time.Second):
					}
					return nil // resign
				})
			}
		}()
	}

	for round := range 3 {
		time.Sleep(3 * time.Second)
		leader, err := c.Leader(30 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Nodes[leader].Kill9(); err != nil {
			t.Fatal(err)
		}
		if _, err := c.WaitNewLeader(ctx, leader); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if err := c.Nodes[leader].Start(); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(4 * time.Second)
	estop()
	wg.Wait()
	time.Sleep(time.Second)
	ostop()
	if err := <-odone; err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("Observe ended with %v", err)
	}

	mu.Lock()
	defer mu.Unlock()
	shown := map[uint64]bool{}
	var last change
	for i, ch := range observed {
		switch {
		case i == 0:
		case ch.ok && ch.epoch <= last.epoch:
			t.Errorf("G8: Observe showed epoch %d after %d (change %d)", ch.epoch, last.epoch, i)
		case !ch.ok && (!last.ok || ch.epoch != last.epoch):
			t.Errorf("Observe showed the end of epoch %d after %+v (change %d)", ch.epoch, last, i)
		}
		if ch.ok {
			shown[ch.epoch] = true
		}
		last = ch
	}
	missing := 0
	for e := range terms {
		if !shown[e] {
			missing++ // never: a resumed stream replays its gap from the election history
		}
	}
	t.Logf("%d terms ran; Observe showed %d changes; %d terms not shown", len(terms), len(observed), missing)
	if len(terms) < 6 {
		t.Errorf("only %d terms in about 20 s of one-second terms", len(terms))
	}
	if missing > 0 {
		t.Errorf("G8: Observe missed %d of %d terms", missing, len(terms))
	}
}
