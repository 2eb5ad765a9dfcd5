package leader_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/leasehold/leasehold/core"
	"github.com/leasehold/leasehold/internal/cputime"
	"github.com/leasehold/leasehold/leader"
	"github.com/leasehold/leasehold/metrics"
	"github.com/leasehold/leasehold/watch"
)

// The cost of one acquire+release pair in the leader, on the fake log (which applies at
// once): what the leader adds to a request, metrics included, apart from transports and
// raft. PERFORMANCE.md's server CPU per pair is tens of µs; these are its leader share.

// benchLeader returns a promoted leader with one lease, whose metrics go to obs (none
// when nil).
func benchLeader(b *testing.B, obs leader.Observer) (*leader.Leader, core.LeaseID) {
	b.Helper()
	fl := newFakeLog(core.Limits{})
	fl.forgetful = true
	l := newLeaderOn(b, fl, leader.Config{Observer: obs, Events: watch.NewHub(0)}) // as a node has
	if err := l.Promote(context.Background()); err != nil {
		b.Fatal(err)
	}
	id, err := l.Grant(context.Background(), time.Minute)
	if err != nil {
		b.Fatal(err)
	}
	return l, id
}

func benchPair(b *testing.B, class core.Class, now bool, obs leader.Observer) {
	l, id := benchLeader(b, obs)
	ctx := context.Background()
	a := leader.AcquireArgs{AcquireArgs: core.AcquireArgs{Lease: id, Name: "jobs/digest", Class: class, Holder: core.Holder{Host: "h", PID: 1}}}
	if g, err := l.Acquire(ctx, a); err != nil || l.Release(ctx, id, a.Name, g.Token) != nil {
		b.Fatal("the first pair failed", err) // it reserves the first block of efficiency tokens
	}
	b.ReportAllocs()
	cpu := cputime.Process()
	for b.Loop() {
		var g leader.Grant
		var err error
		if now {
			var ok bool
			if g, ok = l.AcquireNow(a); !ok {
				b.Fatal("AcquireNow refused a free lock")
			}
		} else if g, err = l.Acquire(ctx, a); err != nil {
			b.Fatal(err)
		}
		if err := l.Release(ctx, id, a.Name, g.Token); err != nil {
			b.Fatal(err)
		}
	}
	// CPU time is steadier than ns/op on a machine others share: it leaves out the time
	// this process waited for a CPU.
	b.ReportMetric(float64(cputime.Process()-cpu)/float64(b.N), "cpu-ns/op")
}

// BenchmarkPair is one acquire and its release, per class and path (Acquire as Connect
// serves it; AcquireNow as the fast lane's reader does for an efficiency lock), without
// metrics and with the node's (package metrics).
func BenchmarkPair(b *testing.B) {
	for _, m := range []struct {
		name string
		obs  func() leader.Observer
	}{
		{"no-metrics", func() leader.Observer { return nil }},
		{"metrics", func() leader.Observer { return metrics.New() }},
	} {
		b.Run("efficiency/"+m.name, func(b *testing.B) { benchPair(b, core.Efficiency, false, m.obs()) })
		b.Run("efficiency-now/"+m.name, func(b *testing.B) { benchPair(b, core.Efficiency, true, m.obs()) })
		b.Run("correctness/"+m.name, func(b *testing.B) { benchPair(b, core.Correctness, false, m.obs()) })
	}
}

// BenchmarkEfficiencyLedgerMemory measures the heap the leader's efficiency ledger keeps
// per entry (docs/OPERATIONS.md): 100,000 efficiency locks (names like
// "jobs/digest-000042", one tenure each, its holder a host of 100 and a pid), each
// acquired and released once, every name and host its own allocation as when decoded
// from a request. Released, the locks leave the table; what stays is the ledger.
// bytes/entry is the live heap after a GC, less the heap before, over the entries. Run
// it with -benchtime=1x.
func BenchmarkEfficiencyLedgerMemory(b *testing.B) {
	const n = 100_000
	for b.Loop() {
		l, id := benchLeader(b, nil)
		ctx := context.Background()
		before := liveHeap()
		for i := range n {
			a := leader.AcquireArgs{AcquireArgs: core.AcquireArgs{Lease: id, Name: fmt.Sprintf("jobs/digest-%06d", i), Class: core.Efficiency,
				Holder: core.Holder{Host: fmt.Sprintf("worker-%d.example.internal", i%100), PID: 4242}}}
			g, err := l.Acquire(ctx, a)
			if err != nil {
				b.Fatal(err)
			}
			if err := l.Release(ctx, id, a.Name, g.Token); err != nil {
				b.Fatal(err)
			}
		}
		after := liveHeap()
		b.ReportMetric(float64(after-before)/n, "bytes/entry")
		if h, err := l.EfficiencyHistory("jobs/digest-000000"); err != nil || len(h.Tenures) != 1 {
			b.Fatalf("the first lock's ledger: %+v, %v", h, err)
		}
		runtime.KeepAlive(l)
	}
}

func liveHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
