package service_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/core"
	"github.com/leasehold/leasehold/internal/testnode"
	"github.com/leasehold/leasehold/leader"
	"github.com/leasehold/leasehold/replication"
)

// BenchmarkIdleLeaseMemory measures the heap a serving node keeps per idle lease, end to
// end on the server side: the replicated state, raft's log and its caches, the leader's
// countdowns, the efficiency lock table and whatever else the node keeps per lease. A
// node (testnode: real raft log on disk, leader runtime) is granted 100,000 leases
// through the leader, 64 at a time as many clients would, each holding one efficiency
// lock as the scale-leases run's leases do ("with-lock"), or none ("bare").
// bytes/lease is the live heap after a full collection, less the heap before the
// leases, over their number. The transports' per-connection buffers are not counted
// (the leases come through no connection). Run it with -benchtime=1x.
func BenchmarkIdleLeaseMemory(b *testing.B) {
	for _, withLock := range []bool{false, true} {
		name := "bare"
		if withLock {
			name = "with-lock"
		}
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				benchIdleLeases(b, 100_000, withLock)
			}
		})
	}
}

var leaseHeap = flag.String("leaseheap", "", "BenchmarkIdleLeaseMemory: write the heap profile with the leases live to this file")

func writeHeapProfile(b *testing.B, file string) {
	f, err := os.Create(file)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		b.Fatal(err)
	}
}

func benchIdleLeases(b *testing.B, n int, withLock bool) {
	node := testnode.Start(b)
	ctx := context.Background()
	ids := make([]core.LeaseID, n)
	measure(b, n, "bytes/lease", func(w, i int) error {
		// Distinct TTLs, as the scale run's (a client keeps one lease per TTL).
		id, err := untilQueued(func() (core.LeaseID, error) {
			return node.Leader.Grant(ctx, 10*time.Minute+time.Duration(i%1000)*time.Millisecond)
		})
		ids[i] = id
		if err != nil || !withLock {
			return err
		}
		a := leader.AcquireArgs{AcquireArgs: core.AcquireArgs{Lease: id, Name: fmt.Sprintf("scale-leases/%d/%d", w, i),
			Class: core.Efficiency, Holder: core.Holder{Host: "worker-17.example.internal", PID: uint32(1000 + w)}}}
		_, err = untilQueued(func() (leader.Grant, error) { return node.Leader.Acquire(ctx, a) })
		return err
	})
	runtime.KeepAlive(ids)
}

// measure runs do(w, i) for every i below n, on 64 workers (w is the worker), and
// reports the live heap it added per item as unit; with -leaseheap it writes the heap
// profile at the point of measure.
func measure(b *testing.B, n int, unit string, do func(w, i int) error) {
	const workers = 64
	before := liveHeap()
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for i := w; i < n; i += workers {
				if err := do(w, i); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
	after := liveHeap()
	if *leaseHeap != "" {
		writeHeapProfile(b, *leaseHeap)
	}
	b.ReportMetric(float64(int64(after)-int64(before))/float64(n), unit)
}

// BenchmarkHeldLocksNodeMemory is core's BenchmarkHeldLocksMemory end to end on the
// server side: a node holds 200,000 correctness locks (20 leases × 10,000, granted
// through the leader and raft, 64 acquires at a time), and bytes/lock is the live heap
// after a full collection, less the heap with the leases and no lock, over the
// locks. Beside the core's lock table it counts what the node keeps per held lock: the
// leader's record of each hold (for the hold-time metric), and what the bounded parts
// (ledger, watch history, raft's log cache) fill up to at this size. Run it with
// -benchtime=1x; -args -leaseheap=FILE writes the heap profile.
func BenchmarkHeldLocksNodeMemory(b *testing.B) {
	for b.Loop() {
		benchHeldLocks(b, 20, 10_000)
	}
}

func benchHeldLocks(b *testing.B, leases, perLease int) {
	node := testnode.Start(b)
	ctx := context.Background()
	ids := make([]core.LeaseID, leases)
	for i := range ids {
		id, err := untilQueued(func() (core.LeaseID, error) { return node.Leader.Grant(ctx, 10*time.Minute) })
		if err != nil {
			b.Fatal(err)
		}
		ids[i] = id
	}
	n := leases * perLease
	measure(b, n, "bytes/lock", func(_, i int) error {
		a := leader.AcquireArgs{AcquireArgs: core.AcquireArgs{Lease: ids[i/perLease], Name: fmt.Sprintf("scale/lease-%d/lock-%05d", i/perLease, i%perLease),
			Class: core.Correctness, Holder: core.Holder{Host: "worker-17.example.internal", PID: uint32(1000 + i/perLease)}}}
		_, err := untilQueued(func() (leader.Grant, error) { return node.Leader.Acquire(ctx, a) })
		return err
	})
}

// untilQueued calls f again while it fails with replication.ErrBusy (nothing was
// written: on a loaded machine raft's queue may not take an entry in time), as the
// client does.
func untilQueued[T any](f func() (T, error)) (T, error) {
	for {
		v, err := f()
		if !errors.Is(err, replication.ErrBusy) {
			return v, err
		}
		time.Sleep(time.Millisecond)
	}
}

// liveHeap returns the bytes of live heap objects after a full collection.
func liveHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
