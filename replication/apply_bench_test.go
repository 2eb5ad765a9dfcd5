package replication_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/leasehold/leasehold/core"
	"github.com/leasehold/leasehold/internal/cputime"
	"github.com/leasehold/leasehold/replication"
)

// BenchmarkApply measures the commit path alone (no network, no handlers): one-voter
// cluster, WAL log store, correctness acquire+release pairs from W proposers, each on
// its own lock. ns/op is per pair.
func BenchmarkApply(b *testing.B) {
	for _, workers := range []int{1, 64} {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
			n := open(b, b.TempDir(), replication.LogStoreWAL)
			defer n.Close()
			ctx := context.Background()
			lease := core.LeaseID{1}
			if _, err := n.Apply(ctx, core.Command{Op: core.OpGrant, Lease: lease, TTLMillis: 600000}); err != nil {
				b.Fatal(err)
			}
			var left atomic.Int64
			left.Store(int64(b.N))
			var wg sync.WaitGroup
			b.ResetTimer()
			cpu0 := cputime.Process()
			index0 := n.Status().AppliedIndex
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					name := fmt.Sprintf("lock/%d", w)
					for left.Add(-1) >= 0 {
						res, err := n.Apply(ctx, core.Command{Op: core.OpAcquire, Lease: lease, Name: name, Class: core.Correctness})
						if err != nil || res.Err != nil {
							b.Error(err, res.Err)
							return
						}
						if _, err := n.Apply(ctx, core.Command{Op: core.OpRelease, Lease: lease, Name: name, Token: res.Token}); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "pairs/s")
			b.ReportMetric(float64((cputime.Process()-cpu0).Microseconds())/float64(b.N), "cpu-µs/pair")
			if entries := n.Status().AppliedIndex - index0; entries > 0 {
				b.ReportMetric(float64(2*b.N)/float64(entries), "cmds/entry")
			}
		})
	}
}
