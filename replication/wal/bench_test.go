package wal

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
)

// benchStore is one implementation under benchmark. syncs returns how many segment
// syncs it has made, or -1 when it cannot tell (bbolt: two fdatasyncs per commit by
// construction, data pages then meta page, plus one more when the file grows).
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
	{"bolt", func(b *testing.B, dir string) (raft.LogStore, func() int64, func() error) {
		s, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(dir, "raft.db")})
		must(b, err)
		return s, func() int64 { return -1 }, s.Close
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
// does per dispatch, and a follower per AppendEntries) for this package and raft-boltdb.
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

// BenchmarkGetLog reads random entries among the last 1,000 written, as raft's
// replication goroutines do.
func BenchmarkGetLog(b *testing.B) {
	for _, bs := range benchStores {
		if bs.name == "wal-fsync" {
			continue
		}
		b.Run(bs.name, func(b *testing.B) {
			store, _, closeFn := bs.open(b, b.TempDir())
			defer func() { must(b, closeFn()) }()
			logs := benchEntries(100)
			for i := range 10 {
				for j, l := range logs {
					l.Index = uint64(i*100 + j + 1)
				}
				must(b, store.StoreLogs(logs))
			}
			rng := rand.New(rand.NewPCG(3, 4))
			var out raft.Log
			b.ResetTimer()
			for range b.N {
				if err := store.GetLog(1+rng.Uint64N(1000), &out); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkStoreLogsPaired alternates one StoreLogs on each store per iteration and
// reports each one's median and mean latency. On a shared machine whose disk latency
// drifts, this pairing compares the stores under the same conditions, which separate
// sub-benchmarks run seconds apart do not.
func BenchmarkStoreLogsPaired(b *testing.B) {
	for _, batch := range []int{1, 16, 128} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			type run struct {
				name  string
				store raft.LogStore
				logs  []*raft.Log
				next  uint64
				lat   []time.Duration
			}
			var runs []*run
			for _, bs := range benchStores {
				store, _, closeFn := bs.open(b, b.TempDir())
				defer func() { must(b, closeFn()) }()
				runs = append(runs, &run{name: bs.name, store: store, logs: benchEntries(batch), next: 1})
			}
			b.ResetTimer()
			for range b.N {
				for _, r := range runs {
					for _, l := range r.logs {
						l.Index = r.next
						r.next++
					}
					start := time.Now()
					if err := r.store.StoreLogs(r.logs); err != nil {
						b.Fatal(err)
					}
					r.lat = append(r.lat, time.Since(start))
				}
			}
			b.StopTimer()
			for _, r := range runs {
				slices.Sort(r.lat)
				var sum time.Duration
				for _, d := range r.lat {
					sum += d
				}
				b.ReportMetric(float64(r.lat[len(r.lat)/2].Microseconds()), r.name+"-p50-µs")
				b.ReportMetric(float64(sum.Microseconds())/float64(len(r.lat)), r.name+"-mean-µs")
			}
		})
	}
}
