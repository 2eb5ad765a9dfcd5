package nemesis

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/client"
)

// TestFailoverTime measures how long correctness locks are unavailable when the leader
// is killed: a client acquires and releases a correctness lock in a loop; each round
// kills the leader with SIGKILL and takes the time from the kill to the first grant
// acknowledged after it, then restarts the killed node and waits until the cluster is
// healthy. It prints every sample, the median and the maximum. Run it with
// `make failover-bench` (it is skipped unless LEASEHOLD_FAILOVER_BENCH=1).
func TestFailoverTime(t *testing.T) {
	if os.Getenv("LEASEHOLD_FAILOVER_BENCH") != "1" {
		t.Skip("set LEASEHOLD_FAILOVER_BENCH=1 to measure failover (make failover-bench)")
	}
	const rounds = 12
	c := NewCluster(t, netnsUnavailable() == "")
	ctx := context.Background()
	cl, err := client.Dial(ctx, c.Addrs())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cl.Close(context.Background()) }()

	var mu sync.Mutex
	var grants []time.Time // acknowledgment times of successful grants
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			l, err := cl.Lock(lctx, "failover/bench", client.Correctness, client.WaitFor(2*time.Second), client.LockTTL(3*time.Second))
			cancel()
			if err != nil {
				if !errors.Is(err, client.ErrUnavailable) && !errors.Is(err, client.ErrNotAcquired) && !errors.Is(err, context.DeadlineExceeded) {
					t.Logf("lock: %v", err)
				}
				time.Sleep(5 * time.Millisecond)
				continue
			}
			now := time.Now()
			mu.Lock()
			grants = append(grants, now)
			mu.Unlock()
			uctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_ = l.Unlock(uctx)
			cancel()
		}
	})
	defer func() { close(stop); wg.Wait() }()

	firstAfter := func(t0 time.Time) (time.Time, bool) {
		mu.Lock()
		defer mu.Unlock()
		for _, g := range grants {
			if g.After(t0) {
				return g, true
			}
		}
		return time.Time{}, false
	}
	var samples []time.Duration
	for round := 0; round < rounds; round++ {
		hctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		leader, err := c.WaitHealthy(hctx)
		cancel()
		if err != nil {
			t.Fatalf("round %d: cluster not healthy: %v", round, err)
		}
		// Let the loop get going on the healthy cluster first.
		warm := time.Now()
		for {
			if _, ok := firstAfter(warm); ok {
				break
			}
			if time.Since(warm) > time.Minute {
				t.Fatalf("round %d: no grant on a healthy cluster for a minute", round)
			}
			time.Sleep(10 * time.Millisecond)
		}
		L := c.Nodes[leader]
		if err := L.Kill9(); err != nil {
			t.Fatal(err)
		}
		// From the moment the old leader is gone: a grant it acknowledged just before
		// the signal landed, and the loop recorded a moment later, is not a failover.
		killed := time.Now()
		var got time.Time
		for {
			if g, ok := firstAfter(killed); ok {
				got = g
				break
			}
			if time.Since(killed) > 2*time.Minute {
				t.Fatalf("round %d: no grant within 2 minutes of killing the leader %s", round, L.ID)
			}
			time.Sleep(2 * time.Millisecond)
		}
		d := got.Sub(killed)
		samples = append(samples, d)
		t.Logf("round %2d: killed leader %s; first grant after %v", round+1, L.ID, d.Round(time.Millisecond))
		if err := L.Start(); err != nil {
			t.Fatal(err)
		}
	}
	sorted := slices.Clone(samples)
	slices.Sort(sorted)
	med := sorted[len(sorted)/2]
	if len(sorted)%2 == 0 {
		med = (sorted[len(sorted)/2-1] + sorted[len(sorted)/2]) / 2
	}
	var parts []string
	for _, s := range samples {
		parts = append(parts, s.Round(time.Millisecond).String())
	}
	t.Logf("failover (kill -9 of the leader → first correctness grant), %d rounds: median %v, max %v, min %v\n  samples: %s",
		len(samples), med.Round(time.Millisecond), sorted[len(sorted)-1].Round(time.Millisecond), sorted[0].Round(time.Millisecond), strings.Join(parts, " "))
}
