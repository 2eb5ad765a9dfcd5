package wal

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// benchStore is one configuration of this package under benchmark; syncs returns how
// many segment syncs it has made. The comparison with other engines (hashicorp/raft-wal,
// raft-boltdb) is in the benchmark module: bench/logstore_bench_test.go.
type benchStore struct {
	name string
	open func(b *testing.B, dir string) (raft.LogStore, func() int64, func() error)
}

var benchStores = []benchStore{
	{"wal", func(b *testing.B, dir string) (raft.LogStore, func() int64, func() error) {
		l, err := Open(dir, Options{SegmentSize: DefaultSegmentSize})
		must(b, err)
		return l, func() int64 { return int64(l.Syncs()) }, l.Close
	}},
	{"wal-fsync", func(b *testing.B, dir string) (raft.LogStore, func() int64, func() error) {
		l, err := Open(dir, Options{SegmentSize: DefaultSegmentSize, fullSync: true})
		must(b, err)
		return l, func() int64 { return int64(l.Syncs()) }, l.Close
	}},
}

// benchEntries returns n entries shaped like leasehold commands: 128 bytes of data.
func benchEntries(n int) []*raft.Log {
	rng := rand.New(rand.NewPCG(1, 2))
	logs := make([]*raft.Log, n)
	for i := range logs {
		data := make([]byte, 128)
		for j := range data {
			data[j] = byte(rng.Uint32())
		}
		logs[i] = &raft.Log{Term: 3, Type: raft.LogCommand, Data: data, AppendedAt: time.Now()}
	}
	return logs
}

// BenchmarkStoreLogs measures one durable StoreLogs call per op (what raft's leader loop
// does per dispatch, and a follower per AppendEntries), flushing with fdatasync (the
// default) and with fsync.
// Run: go test -run '^$' -bench StoreLogs -benchtime 2s ./replication/wal/
func BenchmarkStoreLogs(b *testing.B) {
	for _, batch := range []int{1, 16, 128} {
		for _, bs := range benchStores {
			b.Run(fmt.Sprintf("batch=%d/%s", batch, bs.name), func(b *testing.B) {
				store, syncs, closeFn := bs.open(b, b.TempDir())
				defer func() { must(b, closeFn()) }()
				logs := benchEntries(batch)
				b.SetBytes(int64(batch * 128))
				next := uint64(1)
				s0 := syncs()
				b.ResetTimer()
				for range b.N {
					for _, l := range logs {
						l.Index = next
						next++
					}
					if err := store.StoreLogs(logs); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				if s := syncs(); s >= 0 {
					b.ReportMetric(float64(s-s0)/float64(b.N), "fsyncs/op")
				}
				b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "entries/s")
			})
		}
	}
}
