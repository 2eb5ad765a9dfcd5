package report

import (
	"fmt"
	"strings"

	"github.com/leasehold/leasehold/bench/internal/run"
)

// A comparison pairs a leasehold recipe with the peer whose users write the same kind
// of client: a client (a connection) per worker against go-redis' pool or ZooKeeper's
// sessions, one shared client against rueidis' auto-pipelining or etcd's clientv3. A
// shared client batches many workers' requests into few system calls and a client per
// worker cannot, so a leasehold figure means something only beside the peer of its kind.
type comparison struct {
	what         string
	system, peer string
}

var comparisons = []comparison{
	{"efficiency, a client per worker ÷ Redis in memory, go-redis", "leasehold-efficiency-per-worker", "redis-mem"},
	{"efficiency, one shared client ÷ Redis in memory, rueidis", "leasehold-efficiency", "redis-mem-rueidis"},
	{"correctness, a client per worker ÷ Redis appendfsync always, go-redis", "leasehold-correctness-per-worker", "redis-aof"},
	{"correctness, one shared client ÷ Redis appendfsync always, rueidis", "leasehold-correctness", "redis-aof-rueidis"},
	{"correctness, one shared client ÷ etcd, 1 member", "leasehold-correctness", "etcd"},
	{"correctness, 3 nodes, one shared client ÷ etcd, 3 members", "leasehold-correctness-3", "etcd-3"},
	{"correctness, a client per worker ÷ ZooKeeper", "leasehold-correctness-per-worker", "zookeeper"},
}

// likeForLike writes, per scenario, every comparison whose two systems ran: pairs/s
// and their ratio, acquire p50, and the server's and the clients' CPU per pair, each
// leasehold / peer. Comparisons with one side missing are named, so that a leasehold
// figure without its peer is visible as such.
func (r *Report) likeForLike(b *strings.Builder) {
	p := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	ran := map[string]bool{}
	for _, s := range r.ran() {
		ran[s.Name] = true
	}
	var wrote bool
	for _, sc := range r.Scenarios {
		var rows []string
		for _, c := range comparisons {
			x, ok1 := r.result(c.system, sc.Name)
			y, ok2 := r.result(c.peer, sc.Name)
			if !ok1 || !ok2 {
				continue
			}
			row := fmt.Sprintf("| %s | %s / %s | **%s** | %s / %s | %s / %s | %s / %s |",
				c.what, rate(x.PairsPerSec), rate(y.PairsPerSec), ratio(run.Ratio(x.PairsPerSec, y.PairsPerSec)),
				dur(x.AcqP50), dur(y.AcqP50), dur(x.CPUPerPair), dur(y.CPUPerPair), dur(x.ClientCPUPerPair), dur(y.ClientCPUPerPair))
			if sc.Shared {
				row += fmt.Sprintf(" %s / %s |", ratio(fairness(x)), ratio(fairness(y)))
			}
			rows = append(rows, row)
		}
		if len(rows) == 0 {
			continue
		}
		if !wrote {
			p("### Like for like: each leasehold recipe beside the peer with the same kind of client\n\n")
			p("Every cell is leasehold / peer, from this run (rows: each system's round of median pairs/s). *server CPU/pair* sums the server processes; *client CPU/pair* is the benchmark process, where the clients run.\n\n")
			wrote = true
		}
		p("#### %s\n\n| comparison | pairs/s | ratio | acquire p50 | server CPU/pair | client CPU/pair |", sc.Title())
		if sc.Shared {
			p(" fairness |")
		}
		p("\n|---|---:|---:|---:|---:|---:|")
		if sc.Shared {
			p("---:|")
		}
		p("\n%s\n\n", strings.Join(rows, "\n"))
	}
	var missing []string
	for _, c := range comparisons {
		if ran[c.system] != ran[c.peer] {
			side := c.peer
			if !ran[c.system] {
				side = c.system
			}
			missing = append(missing, fmt.Sprintf("%s (%s did not run)", c.what, side))
		}
	}
	if len(missing) > 0 {
		p("Not compared, one side missing: %s.\n\n", strings.Join(missing, "; "))
	}
}
