package client_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/internal/cputime"
	"github.com/leasehold/leasehold/internal/testnode"
)

// BenchmarkTransport compares the fast lane with Connect for uncontended
// acquire+release pairs (one op = one pair), efficiency and correctness, at 1 and 64
// concurrent workers with one client each.
func BenchmarkTransport(b *testing.B) {
	n := testnode.Start(b)
	for _, tr := range []struct {
		name string
		opts []client.Option
	}{{"fastlane", nil}, {"connect", []client.Option{client.WithoutFastLane()}}} {
		for _, class := range []struct {
			name string
			opt  client.LockOption
		}{{"efficiency", client.Efficiency}, {"correctness", client.Correctness}} {
			for _, workers := range []int{1, 64} {
				b.Run(fmt.Sprintf("%s/%s/workers=%d", tr.name, class.name, workers), func(b *testing.B) {
					runPairs(b, n.Addr(), tr.opts, class.opt, workers)
				})
			}
		}
	}
}

func runPairs(b *testing.B, addr string, opts []client.Option, class client.LockOption, workers int) {
	ctx := context.Background()
	clients := make([]*client.Client, workers)
	for i := range clients {
		c, err := client.Dial(ctx, addr, append(opts, client.WithTTL(30*time.Second))...)
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close(ctx)
		clients[i] = c
		l, err := c.Lock(ctx, fmt.Sprintf("t/%d", i), class, client.TryOnce)
		if err != nil {
			b.Fatal(err)
		}
		_ = l.Unlock(ctx)
	}
	var mu sync.Mutex
	left := b.N
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	cpu0 := cputime.Process()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				left--
				more := left >= 0
				mu.Unlock()
				if !more {
					return
				}
				l, err := clients[w].Lock(ctx, fmt.Sprintf("t/%d", w), class, client.TryOnce)
				if err != nil {
					b.Error(err)
					return
				}
				if err := l.Unlock(ctx); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "pairs/s")
	b.ReportMetric(float64((cputime.Process()-cpu0).Microseconds())/float64(b.N), "cpu-µs/pair")
}
