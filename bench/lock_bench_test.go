package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/client"
)

// BenchmarkAcquireRelease measures uncontended acquire+release pairs through the Go
// client: each worker has its own client (its own lease) and its own lock name. One
// benchmark iteration is one pair. Reported: pairs/s, and acquire/release latency
// percentiles in microseconds.
func BenchmarkAcquireRelease(b *testing.B) {
	for _, class := range []struct {
		name string
		opt  client.LockOption
	}{{"efficiency", client.Efficiency}, {"correctness", client.Correctness}} {
		for _, workers := range []int{1, 64} {
			b.Run(fmt.Sprintf("class=%s/workers=%d", class.name, workers), func(b *testing.B) {
				benchPairs(b, class.opt, workers)
			})
		}
	}
}

func benchPairs(b *testing.B, class client.LockOption, workers int) {
	addr := startStack(b)
	ctx := context.Background()
	clients := make([]*client.Client, workers)
	for i := range clients {
		c, err := client.Dial(ctx, addr, client.WithTTL(30*time.Second))
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close(ctx)
		clients[i] = c
		// Warm up: create the lease and the connection.
		l, err := c.Lock(ctx, fmt.Sprintf("bench/%d", i), class)
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
	}
	acq := make([][]time.Duration, workers)
	rel := make([][]time.Duration, workers)
	var next sync.Mutex
	remaining := b.N
	take := func() bool {
		next.Lock()
		defer next.Unlock()
		remaining--
		return remaining >= 0
	}
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("bench/%d", w)
			for take() {
				t0 := time.Now()
				l, err := clients[w].Lock(ctx, name, class, client.TryOnce)
				t1 := time.Now()
				if err != nil {
					b.Error(err)
					return
				}
				if err := l.Unlock(ctx); err != nil {
					b.Error(err)
					return
				}
				acq[w] = append(acq[w], t1.Sub(t0))
				rel[w] = append(rel[w], time.Since(t1))
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "pairs/s")
	report(b, "acquire", slices.Concat(acq...))
	report(b, "release", slices.Concat(rel...))
}

func report(b *testing.B, what string, d []time.Duration) {
	if len(d) == 0 {
		return
	}
	slices.Sort(d)
	pct := func(p float64) float64 {
		return float64(d[min(len(d)-1, int(p*float64(len(d))))].Microseconds())
	}
	b.ReportMetric(pct(0.50), what+"-p50-µs")
	b.ReportMetric(pct(0.99), what+"-p99-µs")
}

// BenchmarkFsync measures the machine's fsync latency on the filesystem the benchmark
// data dirs live on: one 4 KiB write plus fdatasync per iteration — the floor under
// every correctness commit.
func BenchmarkFsync(b *testing.B) {
	f, err := os.Create(filepath.Join(b.TempDir(), "fsync"))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		if _, err := f.WriteAt(buf, int64(i%256)*4096); err != nil {
			b.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	b.StopTimer()
	report(b, "fsync", lat)
}
