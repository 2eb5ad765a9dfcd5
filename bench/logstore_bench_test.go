package bench

import (
	"fmt"
	"io"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	raftwal "github.com/hashicorp/raft-wal"

	"github.com/leasehold/leasehold/core"
	"github.com/leasehold/leasehold/replication/wal"
)

// logStore is one raft log store engine under comparison, opened in dir the way a
// server would open it. syncs returns how many segment syncs it has made, or -1 when
// it cannot tell.
type logStore struct {
	name string
	open func(tb testing.TB, dir string) (store raft.LogStore, syncs func() int64, closeFn func() error)
}

// logStores are the engines issue #12 asks to compare behind raft.LogStore: the
// project's replication/wal, hashicorp/raft-wal (Consul's WAL) and raft-boltdb/v2 (the
// store hashicorp/raft is usually paired with). Each is opened with its defaults.
var logStores = []logStore{
	{"wal", func(tb testing.TB, dir string) (raft.LogStore, func() int64, func() error) {
		l, err := wal.Open(dir, wal.Options{SegmentSize: wal.DefaultSegmentSize})
		mustOK(tb, err)
		return l, func() int64 { return int64(l.Syncs()) }, l.Close
	}},
	{"raft-wal", func(tb testing.TB, dir string) (raft.LogStore, func() int64, func() error) {
		l, err := raftwal.Open(dir, raftwal.WithLogger(hclog.New(&hclog.LoggerOptions{Output: io.Discard})))
		mustOK(tb, err)
		return l, func() int64 { return -1 }, l.Close
	}},
	{"bolt", func(tb testing.TB, dir string) (raft.LogStore, func() int64, func() error) {
		s, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(dir, "raft.db")})
		mustOK(tb, err)
		return s, func() int64 { return -1 }, s.Close
	}},
}

// cpuTime is the CPU time (user and system) the process has used so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func mustOK(tb testing.TB, err error) {
	tb.Helper()
	if err != nil {
		tb.Fatal(err)
	}
}

// logEntries returns n entries as leasehold writes them alone (a lone caller's command
// is its own entry): each a correctness acquire, encoded by core.EncodeCommand.
func logEntries(tb testing.TB, n int) []*raft.Log {
	logs := make([]*raft.Log, n)
	for i := range logs {
		data, err := core.EncodeCommand(core.Command{Op: core.OpAcquire, Lease: core.LeaseID{byte(i), 7}, Name: fmt.Sprintf("bench/lock/%04d", i), Class: core.Correctness})
		mustOK(tb, err)
		logs[i] = &raft.Log{Term: 3, Type: raft.LogCommand, Data: data, AppendedAt: time.Now()}
	}
	return logs
}

func entryBytes(logs []*raft.Log) int {
	n := 0
	for _, l := range logs {
		n += len(l.Data)
	}
	return n
}

// openWarm opens ls in a fresh directory and stores its first entries, so that what
// an engine does once for an empty log (the WAL zero-fills its first segment, raft-wal
// rebases its first segment on the first index) stays out of the measurement.
func openWarm(tb testing.TB, ls logStore, batch int) (*appender, func() int64, func() error) {
	store, syncs, closeFn := ls.open(tb, tb.TempDir())
	a := &appender{name: ls.name, store: store, logs: logEntries(tb, batch), next: 1}
	for range 10 {
		a.append(tb)
	}
	return a, syncs, closeFn
}

// appender stores batches of entries with consecutive indexes in one store.
type appender struct {
	name  string
	store raft.LogStore
	logs  []*raft.Log
	next  uint64
	lat   []time.Duration
}

func (a *appender) append(tb testing.TB) time.Duration {
	for _, l := range a.logs {
		l.Index = a.next
		a.next++
	}
	start := time.Now()
	if err := a.store.StoreLogs(a.logs); err != nil {
		tb.Fatal(err)
	}
	return time.Since(start)
}

// BenchmarkLogStores measures one durable StoreLogs call per op (what raft's leader loop
// does per dispatch, and a follower per AppendEntries) for each engine, one engine after
// the other, with the process's CPU time per op (the engine's background work
// included: on two cores the server's CPU is what the clients do not get). Run: cd bench && go test -run '^$' -bench 'LogStores$' -benchtime 2s .
func BenchmarkLogStores(b *testing.B) {
	for _, batch := range []int{1, 16, 128} {
		for _, ls := range logStores {
			b.Run(fmt.Sprintf("batch=%d/%s", batch, ls.name), func(b *testing.B) {
				a, syncs, closeFn := openWarm(b, ls, batch)
				defer func() { mustOK(b, closeFn()) }()
				b.SetBytes(int64(entryBytes(a.logs)))
				s0 := syncs()
				b.ResetTimer()
				cpu0 := cpuTime()
				for range b.N {
					a.append(b)
				}
				cpu := cpuTime() - cpu0
				b.StopTimer()
				b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/op")
				if s := syncs(); s >= 0 {
					b.ReportMetric(float64(s-s0)/float64(b.N), "fsyncs/op")
				}
				b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "entries/s")
			})
		}
	}
}

// BenchmarkLogStoresPaired alternates one StoreLogs on each engine per iteration (all
// on the same disk) and reports each one's p50, p99 and mean latency. On a shared
// machine whose disk latency drifts, this pairing compares the engines under the same
// conditions, which separate sub-benchmarks run seconds apart do not. The order of the
// engines rotates every iteration, so none always follows another's fsync.
// Run: cd bench && go test -run '^$' -bench LogStoresPaired -benchtime 2000x .
func BenchmarkLogStoresPaired(b *testing.B) {
	for _, batch := range []int{1, 16, 128} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			var as []*appender
			for _, ls := range logStores {
				a, _, closeFn := openWarm(b, ls, batch)
				defer func() { mustOK(b, closeFn()) }()
				as = append(as, a)
			}
			b.ResetTimer()
			for i := range b.N {
				for j := range as {
					a := as[(i+j)%len(as)]
					a.lat = append(a.lat, a.append(b))
				}
			}
			b.StopTimer()
			for _, a := range as {
				slices.Sort(a.lat)
				var sum time.Duration
				for _, d := range a.lat {
					sum += d
				}
				b.ReportMetric(float64(a.lat[len(a.lat)/2].Microseconds()), a.name+"-p50-µs")
				b.ReportMetric(float64(a.lat[len(a.lat)*99/100].Microseconds()), a.name+"-p99-µs")
				b.ReportMetric(float64(sum.Microseconds())/float64(len(a.lat)), a.name+"-mean-µs")
			}
		})
	}
}

// BenchmarkLogStoresGetLog reads random entries among the last 1,000 written, as raft's
// replication goroutines do when an entry has left raft's log cache.
func BenchmarkLogStoresGetLog(b *testing.B) {
	for _, ls := range logStores {
		b.Run(ls.name, func(b *testing.B) {
			a, _, closeFn := openWarm(b, ls, 100)
			defer func() { mustOK(b, closeFn()) }()
			store := a.store
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
