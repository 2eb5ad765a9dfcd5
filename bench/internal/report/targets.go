package report

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/leasehold/leasehold/bench/internal/run"
)

// A target is one of the performance targets leasehold is held to (docs/PERFORMANCE.md):
// a leasehold system against a peer, or against the disk, in one scenario.
type target struct {
	what     string // the target in words
	system   string // the leasehold system
	peer     string // the system it is compared with; "" for a target against the disk
	scenario string
	// score compares one round: the ratio that the target bounds, and whether that
	// round meets it.
	score func(lh, peer run.Result, fsync time.Duration) (ratio float64, met bool)
}

// atLeast is the target "pairs/s ≥ min × the peer's", with fairness ≤ 1.1 when fair.
func atLeast(min float64, fair bool) func(lh, peer run.Result, _ time.Duration) (float64, bool) {
	return func(lh, peer run.Result, _ time.Duration) (float64, bool) {
		v := lh.PairsPerSec / peer.PairsPerSec
		return v, v >= min && (!fair || fairness(lh) <= 1.1)
	}
}

// fairness is max/min acquisitions per worker (+Inf when a worker got none); a result
// read back from JSON has only the two counts.
func fairness(x run.Result) float64 {
	if x.MinPerWorker == 0 {
		return math.Inf(1)
	}
	return float64(x.MaxPerWorker) / float64(x.MinPerWorker)
}

var targets = []target{
	{"efficiency ≥ 1.0× Redis in memory, pairs/s at 64 workers", "leasehold-efficiency", "redis-mem", "uncontended-64", atLeast(1, false)},
	{"efficiency acquire p50 at 1 worker ≤ Redis in memory's (ratio of p50s)", "leasehold-efficiency", "redis-mem", "uncontended-1",
		func(lh, peer run.Result, _ time.Duration) (float64, bool) {
			v := float64(lh.AcqP50) / float64(peer.AcqP50)
			return v, v <= 1
		}},
	{"efficiency hand-offs on one lock ≥ 1.0× Redis in memory, fairness ≤ 1.1", "leasehold-efficiency", "redis-mem", "contended-16", atLeast(1, true)},
	{"correctness ≥ 1.0× Redis with fsync, pairs/s at 64 workers", "leasehold-correctness", "redis-aof", "uncontended-64", atLeast(1, false)},
	{"correctness acquire p50 at 1 worker ≤ fsync p50 + 100 µs (ratio to that bound)", "leasehold-correctness", "", "uncontended-1",
		func(lh, _ run.Result, fsync time.Duration) (float64, bool) {
			v := float64(lh.AcqP50) / float64(fsync+100*time.Microsecond)
			return v, v <= 1
		}},
	{"correctness hand-offs on one lock ≥ 1.0× Redis with fsync, fairness ≤ 1.1", "leasehold-correctness", "redis-aof", "contended-16", atLeast(1, true)},
	{"correctness, 3 nodes ≥ 5× etcd's 3-node Mutex, pairs/s at 64 workers", "leasehold-correctness-3", "etcd-3", "uncontended-64", atLeast(5, false)},
}

// targets writes the table of targets the run can judge. With several rounds, each
// round is judged on its own — leasehold against the peer as measured in that same
// round, minutes apart at most — because this machine's speed drifts by a third within
// an hour, more than the ratio of two medians taken at different times can hide.
func (r *Report) targets(b *strings.Builder) {
	rounds := r.Rounds
	if len(rounds) == 0 && len(r.Results) > 0 {
		rounds = [][]run.Result{r.Results}
	}
	var rows []string
	for _, t := range targets {
		if t.peer == "" && r.Fsync.P50 == 0 {
			continue // judged against the disk, which was not measured
		}
		var ratios []float64
		var met int
		for _, round := range rounds {
			lh, ok := find(round, t.system, t.scenario)
			if !ok {
				continue
			}
			var peer run.Result
			if t.peer != "" {
				if peer, ok = find(round, t.peer, t.scenario); !ok {
					continue
				}
			}
			v, m := t.score(lh, peer, r.Fsync.P50)
			ratios = append(ratios, v)
			if m {
				met++
			}
		}
		if len(ratios) == 0 {
			continue
		}
		each := make([]string, len(ratios))
		for i, v := range ratios {
			each[i] = ratio(v)
		}
		sorted := slices.Sorted(slices.Values(ratios))
		verdict := fmt.Sprintf("met in %d of %d", met, len(ratios))
		switch met {
		case len(ratios):
			verdict = "**met**"
		case 0:
			verdict = "missed"
		}
		rows = append(rows, fmt.Sprintf("| %s | %s | %s | %s |\n", t.what, ratio(sorted[(len(sorted)-1)/2]), strings.Join(each, ", "), verdict))
	}
	if len(rows) == 0 {
		return
	}
	b.WriteString("### Against the targets\n\n")
	b.WriteString("Each round judged on its own: leasehold ÷ the peer measured in the same round (for the latency target, leasehold's p50 ÷ the fsync probe's p50 + 100 µs).\n\n")
	b.WriteString("| target | median ratio | ratio per round | verdict |\n|---|---:|---|---|\n")
	for _, row := range rows {
		b.WriteString(row)
	}
	b.WriteString("\n")
}

// find returns the result of system in scenario from one round, if it did not fail.
func find(round []run.Result, system, scenario string) (run.Result, bool) {
	for _, x := range round {
		if x.System == system && x.Scenario == scenario && x.Failed == "" && x.Skipped == "" {
			return x, true
		}
	}
	return run.Result{}, false
}
