package client_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/internal/testnode"
	"github.com/leasehold/leasehold/service"
)

// BenchmarkWatchCost is what watching costs the lock path: uncontended efficiency and
// correctness pairs at 64 workers (runPairs, over the fast lane) with 0, 1 and 100
// watchers on the workers' prefix, each its own stream. It reports pairs/s and, with
// watchers, the events per second each watcher received (2 per pair: acquired and
// released) — and fails unless every watcher got every event of the run.
func BenchmarkWatchCost(b *testing.B) {
	// Every run dials 64 clients anew; the ones closed linger a while (no per-IP bound).
	n := testnode.StartWith(b, func(cfg *service.Config) { cfg.Server.MaxConnsPerClient = -1 })
	for _, class := range []struct {
		name string
		opt  client.LockOption
	}{{"efficiency", client.Efficiency}, {"correctness", client.Correctness}} {
		for _, watchers := range []int{0, 1, 100} {
			b.Run(fmt.Sprintf("%s/watchers=%d", class.name, watchers), func(b *testing.B) {
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				wc, err := client.Dial(ctx, n.Addr())
				if err != nil {
					b.Fatal(err)
				}
				defer wc.Close(context.Background())
				counts := make([]atomic.Int64, watchers)
				for i := range watchers {
					ready := make(chan struct{})
					go func() {
						close(ready)
						for _, err := range wc.Watch(ctx, "t/") {
							if err != nil {
								return
							}
							counts[i].Add(1)
						}
					}()
					<-ready
				}
				time.Sleep(200 * time.Millisecond) // the streams are open
				start := time.Now()
				runPairs(b, n.Addr(), nil, class.opt, 64)
				want := int64(2 * (b.N + 64)) // runPairs takes and gives back one lock per worker first
				for i := range counts {
					for counts[i].Load() < want && time.Since(start) < time.Minute {
						time.Sleep(time.Millisecond)
					}
					if got := counts[i].Load(); got < want {
						b.Fatalf("watcher %d got %d events of %d", i, got, want)
					}
				}
				if watchers > 0 {
					b.ReportMetric(float64(want)/time.Since(start).Seconds(), "events/s/watcher")
				}
			})
		}
	}
}
