package report

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/leasehold/leasehold/bench/internal/run"
)

// A target is one of the performance targets leasehold is held to (issue #16,
// docs/PERFORMANCE.md): a leasehold system against a peer — or against another
// leasehold system — in one scenario.
type target struct {
	what     string // the target in words
	system   string // the leasehold system
	peer     string // the system it is compared with
	scenario string
	// score compares one round: the ratio that the target bounds, and whether that
	// round meets it.
	score func(lh, peer run.Result) (ratio float64, met bool)
}

// atLeast is the target "pairs/s ≥ min × the peer's", with fairness ≤ 1.1 when fair.
func atLeast(min float64, fair bool) func(lh, peer run.Result) (float64, bool) {
	return func(lh, peer run.Result) (float64, bool) {
		v := lh.PairsPerSec / peer.PairsPerSec
		return v, v >= min && (!fair || fairness(lh) <= 1.1)
	}
}

// p50AtMost is the target "acquire p50 ≤ max × the peer's".
func p50AtMost(max float64) func(lh, peer run.Result) (float64, bool) {
	return func(lh, peer run.Result) (float64, bool) {
		v := float64(lh.AcqP50) / float64(peer.AcqP50)
		return v, v <= max
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

// targets are issue #16's, each judged for both recipes: a client per worker against
// the peer with a client per worker, one shared client against the pipelining peer.
var targets = func() []target {
	type recipe struct{ suffix, how, peer, peerName string }
	var ts []target
	for _, class := range []struct {
		name, system string
		workers      []int
		recipes      []recipe
	}{
		{"efficiency", "leasehold-efficiency", []int{1, 16, 64}, []recipe{
			{"-per-worker", "a client per worker", "redis-mem", "Redis in memory (go-redis)"},
			{"", "one shared client", "redis-mem-rueidis", "Redis in memory (rueidis)"},
		}},
		{"correctness", "leasehold-correctness", []int{16, 64}, []recipe{
			{"-per-worker", "a client per worker", "redis-aof", "Redis-AOF (go-redis)"},
			{"", "one shared client", "redis-aof-rueidis", "Redis-AOF (rueidis)"},
		}},
	} {
		for _, rc := range class.recipes {
			sys := class.system + rc.suffix
			for _, w := range class.workers {
				workers := fmt.Sprintf("%d workers", w)
				if w == 1 {
					workers = "1 worker"
				}
				ts = append(ts, target{fmt.Sprintf("%s, %s ≥ 1.0× %s, pairs/s at %s", class.name, rc.how, rc.peerName, workers),
					sys, rc.peer, fmt.Sprintf("uncontended-%d", w), atLeast(1, false)})
			}
			ts = append(ts,
				target{fmt.Sprintf("%s, %s: acquire p50 at 1 worker ≤ %s's (ratio of p50s)", class.name, rc.how, rc.peerName),
					sys, rc.peer, "uncontended-1", p50AtMost(1)},
				target{fmt.Sprintf("%s, %s: hand-offs on one lock (16 workers) ≥ 1.0× %s, fairness ≤ 1.1", class.name, rc.how, rc.peerName),
					sys, rc.peer, "contended-16", atLeast(1, true)})
		}
	}
	return append(ts,
		target{"correctness, 3 nodes ≥ 10× etcd's 3 members, pairs/s at 64 workers", "leasehold-correctness-3", "etcd-3", "uncontended-64", atLeast(10, false)},
		target{"correctness, 3 nodes: acquire p50 at 1 worker ≤ 2× one node's (ratio of p50s)", "leasehold-correctness-3", "leasehold-correctness", "uncontended-1", p50AtMost(2)},
	)
}()

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
		var ratios []float64
		var met int
		for _, round := range rounds {
			lh, ok := find(round, t.system, t.scenario)
			if !ok {
				continue
			}
			peer, ok := find(round, t.peer, t.scenario)
			if !ok {
				continue
			}
			v, m := t.score(lh, peer)
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
	b.WriteString("Each round judged on its own: leasehold ÷ the peer measured in the same round (for a latency target, the ratio of the acquire p50s). Each recipe is judged against the peer with the same kind of client: a client per worker against go-redis, one shared client against rueidis.\n\n")
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
