package client_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/internal/cputime"
	"github.com/leasehold/leasehold/internal/testnode"
)

// BenchmarkOnce measures Begin+Complete pairs (one op = one Once on a fresh key: a
// Begin that claims it and a Complete that stores a 16-byte result, each committed and
// fsynced) at 1 and 64 workers, each worker a Session of one Client over the fast lane
// (as lockbench's workers), against an in-process node.
func BenchmarkOnce(b *testing.B) {
	n := testnode.Start(b)
	for _, workers := range []int{1, 64} {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
			ctx := context.Background()
			c, err := client.Dial(ctx, n.Addr(), client.WithTTL(30*time.Second))
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close(ctx)
			sessions := make([]*client.Session, workers)
			for i := range sessions {
				sessions[i] = c.NewSession()
				if _, err := sessions[i].Once(ctx, fmt.Sprintf("bench/%d/warm/%d", workers, i), work); err != nil {
					b.Fatal(err)
				}
			}
			var next atomic.Int64
			done := make(chan struct{})
			b.ResetTimer()
			start := time.Now()
			cpu0 := cputime.Process()
			for _, s := range sessions {
				go func() {
					defer func() { done <- struct{}{} }()
					for {
						i := next.Add(1)
						if i > int64(b.N) {
							return
						}
						if _, err := s.Once(ctx, fmt.Sprintf("bench/%d/%d", workers, i), work); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			for range sessions {
				<-done
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "pairs/s")
			b.ReportMetric(float64((cputime.Process()-cpu0).Microseconds())/float64(b.N), "cpu-µs/pair")
		})
	}
}

func work(context.Context, uint64) ([]byte, error) { return []byte("sixteen bytes..."), nil }
