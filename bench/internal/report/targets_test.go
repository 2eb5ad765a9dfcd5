package report

import (
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/bench/internal/run"
)

// TestTargetsPerRound checks that every round is judged against the peer of the same
// round, that fairness and the fsync bound count, and that a target whose systems did
// not both run is left out.
func TestTargetsPerRound(t *testing.T) {
	pairs := func(sys, sc string, pps float64) run.Result {
		return run.Result{System: sys, Scenario: sc, PairsPerSec: pps}
	}
	contended := func(sys string, pps float64, lo, hi int) run.Result {
		r := pairs(sys, "contended-16", pps)
		r.MinPerWorker, r.MaxPerWorker = lo, hi
		return r
	}
	p50 := func(sys string, d time.Duration) run.Result {
		r := pairs(sys, "uncontended-1", 1)
		r.AcqP50 = d
		return r
	}
	r := &Report{
		Fsync: Fsync{P50: 100 * time.Microsecond},
		Rounds: [][]run.Result{
			{pairs("leasehold-efficiency", "uncontended-64", 90), pairs("redis-mem", "uncontended-64", 100),
				contended("leasehold-efficiency", 50, 100, 105), contended("redis-mem", 40, 90, 110),
				p50("leasehold-correctness", 150*time.Microsecond)},
			{pairs("leasehold-efficiency", "uncontended-64", 120), pairs("redis-mem", "uncontended-64", 60),
				contended("leasehold-efficiency", 50, 100, 120), contended("redis-mem", 40, 90, 110),
				p50("leasehold-correctness", 300*time.Microsecond)},
			{pairs("leasehold-efficiency", "uncontended-64", 110), pairs("redis-mem", "uncontended-64", 100),
				contended("leasehold-efficiency", 30, 100, 105), contended("redis-mem", 40, 90, 110),
				p50("leasehold-correctness", 190*time.Microsecond)},
		},
	}
	var b strings.Builder
	r.targets(&b)
	out := b.String()
	for _, want := range []string{
		// 0.90, 2.00, 1.10: median 1.10, two rounds of three meet it.
		"| efficiency ≥ 1.0× Redis in memory, pairs/s at 64 workers | 1.10× | 0.90×, 2.00×, 1.10× | met in 2 of 3 |",
		// Round 2 is faster but unfair (1.2); round 3 is fair but slower.
		"| efficiency hand-offs on one lock ≥ 1.0× Redis in memory, fairness ≤ 1.1 | 1.25× | 1.25×, 1.25×, 0.75× | met in 1 of 3 |",
		// 150, 300 and 190 µs against 200 µs.
		"| correctness acquire p50 at 1 worker ≤ fsync p50 + 100 µs (ratio to that bound) | 0.95× | 0.75×, 1.50×, 0.95× | met in 2 of 3 |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("targets table lacks\n%s\nin\n%s", want, out)
		}
	}
	if strings.Contains(out, "3 nodes") || strings.Contains(out, "Redis with fsync") {
		t.Errorf("targets whose systems did not run are listed:\n%s", out)
	}

	var none strings.Builder
	(&Report{}).targets(&none)
	if none.Len() != 0 {
		t.Errorf("an empty report writes a targets section: %q", none.String())
	}
}
