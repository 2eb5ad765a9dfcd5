package report

import (
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/bench/internal/run"
)

// mustContain fails t for every line of want that out lacks.
func mustContain(t *testing.T, what, out string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("%s lacks\n%s\nin\n%s", what, w, out)
		}
	}
}

func pairs(sys, sc string, pps float64) run.Result {
	return run.Result{System: sys, Scenario: sc, PairsPerSec: pps}
}

// TestTargetsPerRound checks that every round is judged against the peer of the same
// round, that each recipe is judged against the peer of its kind (a client per worker
// against go-redis, the shared client against rueidis), that fairness and the ratio of
// p50s count, and that a target whose systems did not both run is left out.
func TestTargetsPerRound(t *testing.T) {
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
	const pw, shared = "leasehold-efficiency-per-worker", "leasehold-efficiency"
	r := &Report{
		Rounds: [][]run.Result{
			{pairs(pw, "uncontended-64", 90), pairs("redis-mem", "uncontended-64", 100),
				pairs(shared, "uncontended-64", 200), pairs("redis-mem-rueidis", "uncontended-64", 400),
				contended(pw, 50, 100, 105), contended("redis-mem", 40, 90, 110),
				p50("leasehold-correctness", 150*time.Microsecond), p50("leasehold-correctness-3", 290*time.Microsecond)},
			{pairs(pw, "uncontended-64", 120), pairs("redis-mem", "uncontended-64", 60),
				pairs(shared, "uncontended-64", 200), pairs("redis-mem-rueidis", "uncontended-64", 100),
				contended(pw, 50, 100, 120), contended("redis-mem", 40, 90, 110),
				p50("leasehold-correctness", 100*time.Microsecond), p50("leasehold-correctness-3", 300*time.Microsecond)},
			{pairs(pw, "uncontended-64", 110), pairs("redis-mem", "uncontended-64", 100),
				pairs(shared, "uncontended-64", 150), pairs("redis-mem-rueidis", "uncontended-64", 200),
				contended(pw, 30, 100, 105), contended("redis-mem", 40, 90, 110),
				p50("leasehold-correctness", 200*time.Microsecond), p50("leasehold-correctness-3", 380*time.Microsecond)},
		},
	}
	var b strings.Builder
	r.targets(&b)
	out := b.String()
	mustContain(t, "targets table", out,
		// 0.90, 2.00, 1.10: median 1.10, two rounds of three meet it.
		"| efficiency, a client per worker ≥ 1.0× Redis in memory (go-redis), pairs/s at 64 workers | 1.10× | 0.90×, 2.00×, 1.10× | met in 2 of 3 |",
		// The shared client against rueidis, never against go-redis: 0.50, 2.00, 0.75.
		"| efficiency, one shared client ≥ 1.0× Redis in memory (rueidis), pairs/s at 64 workers | 0.75× | 0.50×, 2.00×, 0.75× | met in 1 of 3 |",
		// Round 2 is faster but unfair (1.2); round 3 is fair but slower.
		"| efficiency, a client per worker: hand-offs on one lock (16 workers) ≥ 1.0× Redis in memory (go-redis), fairness ≤ 1.1 | 1.25× | 1.25×, 1.25×, 0.75× | met in 1 of 3 |",
		// 290/150, 300/100, 380/200 against at most 2×.
		"| correctness, 3 nodes: acquire p50 at 1 worker ≤ 2× one node's (ratio of p50s) | 1.93× | 1.93×, 3.00×, 1.90× | met in 2 of 3 |",
	)
	for _, absent := range []string{"etcd", "Redis-AOF", "16 workers |", "at 1 worker ≤ Redis"} {
		if strings.Contains(out, absent) {
			t.Errorf("targets whose systems did not run are listed (%q):\n%s", absent, out)
		}
	}

	var none strings.Builder
	(&Report{}).targets(&none)
	if none.Len() != 0 {
		t.Errorf("an empty report writes a targets section: %q", none.String())
	}
}

// TestLikeForLike: each leasehold recipe is set beside the peer of its kind, with
// pairs/s, their ratio, and server and client CPU per pair; a comparison with one
// side missing is named as such instead of being left out silently.
func TestLikeForLike(t *testing.T) {
	res := func(sys string, pps float64, server, client time.Duration) run.Result {
		r := pairs(sys, "uncontended-64", pps)
		r.CPUPerPair, r.ClientCPUPerPair, r.AcqP50 = server, client, time.Millisecond
		return r
	}
	r := &Report{
		Systems: []System{
			{Name: "leasehold-efficiency", Baseline: true, SharedClient: true},
			{Name: "leasehold-efficiency-per-worker", Baseline: true},
			{Name: "redis-mem"},
			{Name: "redis-mem-rueidis", SharedClient: true},
			{Name: "leasehold-correctness", Baseline: true, SharedClient: true},
		},
		Scenarios: []run.Scenario{{Name: "uncontended-64", Workers: 64}},
		Results: []run.Result{
			res("leasehold-efficiency", 20000, 20*time.Microsecond, 24*time.Microsecond),
			res("leasehold-efficiency-per-worker", 15000, 31*time.Microsecond, 40*time.Microsecond),
			res("redis-mem", 16000, 23*time.Microsecond, 35*time.Microsecond),
			res("redis-mem-rueidis", 30000, 12*time.Microsecond, 17500*time.Nanosecond),
			res("leasehold-correctness", 10000, 40*time.Microsecond, 30*time.Microsecond),
		},
	}
	var b strings.Builder
	r.likeForLike(&b)
	out := b.String()
	mustContain(t, "like-for-like section", out,
		"| efficiency, a client per worker ÷ Redis in memory, go-redis | 15000 / 16000 | **0.94×** | 1.00 ms / 1.00 ms | 31.0 µs / 23.0 µs | 40.0 µs / 35.0 µs |",
		"| efficiency, one shared client ÷ Redis in memory, rueidis | 20000 / 30000 | **0.67×** | 1.00 ms / 1.00 ms | 20.0 µs / 12.0 µs | 24.0 µs / 17.5 µs |",
		"correctness, one shared client ÷ Redis appendfsync always, rueidis (redis-aof-rueidis did not run)",
	)
	if strings.Contains(out, "| correctness") {
		t.Errorf("a comparison without its peer has a row:\n%s", out)
	}
}
