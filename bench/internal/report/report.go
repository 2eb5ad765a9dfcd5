// Package report turns a benchmark run into the markdown tables and the SVG chart that
// go in docs/PERFORMANCE.md, and a JSON file with every number.
package report

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"
	"time"

	"github.com/leasehold/leasehold/bench/internal/run"
	"github.com/leasehold/leasehold/bench/internal/scale"
)

// System is one system as the report lists it.
type System struct {
	Name     string
	Version  string
	Setup    string
	Skipped  string // why it did not run; empty when it ran
	Baseline bool   // a leasehold system: ratios are computed against the others
	// SharedClient: every worker's requests go through one client (peers.System).
	SharedClient bool `json:",omitempty"`
}

// recipe names a system's kind of client for the report.
func (s System) recipe() string {
	if s.SharedClient {
		return "one shared client"
	}
	return "a client per worker"
}

// Report is one run of the benchmark.
type Report struct {
	Started  time.Time
	Elapsed  time.Duration
	Machine  Machine
	Fsync    Fsync
	Warmup   time.Duration
	Duration time.Duration
	Notes    []string

	Systems   []System
	Scenarios []run.Scenario
	Results   []run.Result   // per system and scenario, the round of median pairs/s
	Rounds    [][]run.Result // every round, in the order they ran (empty for older runs)
	Locks     []scale.LocksResult
	Leases    []scale.LeasesResult
	Expiry    []scale.ExpiryResult
}

func (r *Report) result(system, scenario string) (run.Result, bool) {
	return find(r.Results, system, scenario)
}

func (r *Report) ran() []System {
	var out []System
	for _, s := range r.Systems {
		if s.Skipped == "" {
			out = append(out, s)
		}
	}
	return out
}

// JSON writes every number.
func (r *Report) JSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// ReadJSON reads a report written by JSON, to render it again.
func ReadJSON(rd io.Reader) (*Report, error) {
	var r Report
	if err := json.NewDecoder(rd).Decode(&r); err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	for i := range r.Results {
		x := &r.Results[i]
		x.Fairness = run.Ratio(float64(x.MaxPerWorker), float64(x.MinPerWorker))
	}
	return &r, nil
}

// Markdown writes the report as markdown.
func (r *Report) Markdown(w io.Writer) error {
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }

	p("## Lock benchmark: leasehold, Redis, etcd and ZooKeeper on one machine\n\n")
	p("Run %s, %v in all. ", r.Started.UTC().Format("2006-01-02 15:04 MST"), r.Elapsed.Round(time.Second))
	if len(r.Scenarios) > 0 {
		p("Each scenario: %v warm-up, then %v measured; only acquire+release pairs that start and end inside the measured window count. ", r.Warmup, r.Duration)
	}
	p("Every server is a separate process on loopback with its data in a temporary directory, started fresh for its system and stopped before the next one starts; the clients run in the benchmark process on the same machine.\n\n")
	for _, n := range r.Notes {
		p("%s\n\n", n)
	}

	m := r.Machine
	p("### Machine\n\n")
	p("| | |\n|---|---|\n")
	p("| CPUs (nproc) | %d × %s |\n", m.NProc, m.CPUModel)
	p("| memory | %s |\n", m.Memory)
	p("| kernel | %s (Debian %s) |\n", m.Kernel, m.Debian)
	p("| Go | %s |\n", m.GoVersion)
	p("| load average (1, 5, 15 min) | before %s; after %s |\n", m.LoadBefore, m.LoadAfter)
	f := r.Fsync
	if f.Err != "" {
		p("| fsync (4 KiB write + fdatasync) | failed: %s |\n", f.Err)
	} else {
		p("| fsync (4 KiB write + fdatasync, %s) | p50 %s, p99 %s (%d samples) |\n", f.FSType, dur(f.P50), dur(f.P99), f.Samples)
	}
	p("\n")

	if len(r.Systems) > 0 {
		r.systems(&b)
	}

	if len(r.Results) > 0 {
		p("### Summary: acquire+release pairs per second\n\n| system |")
		for _, sc := range r.Scenarios {
			p(" %s |", sc.Name)
		}
		p("\n|---|%s\n", strings.Repeat("---:|", len(r.Scenarios)))
		for _, s := range r.ran() {
			p("| %s |", s.Name)
			for _, sc := range r.Scenarios {
				if x, ok := r.result(s.Name, sc.Name); ok {
					p(" %s |", rate(x.PairsPerSec))
				} else {
					p(" — |")
				}
			}
			p("\n")
		}
		p("\n")
	}

	r.targets(&b)
	r.likeForLike(&b)
	for _, sc := range r.Scenarios {
		r.scenario(&b, sc)
	}
	r.scale(&b)

	p("Column notes: *acquire* is the time from the call until the lock is held (for a contended lock it includes waiting in line; Redis waits by retrying); *release* until the release is acknowledged. *server RSS* is VmRSS of the server process(es) at the end of the window; *server CPU* is the cores the server process(es) kept busy during the window, and *server CPU/pair* that time divided by the pairs done; *client CPU* is the cores the benchmark process itself (all the clients) used, and *client CPU/pair* that time per pair — on a small machine clients and server share the CPUs, so both count. *clients*: *one shared client* means every worker's requests go through one client that batches them (leasehold Sessions on one client, rueidis' auto-pipelining, etcd's clientv3); *a client per worker* means each request has a connection to itself (leasehold -per-worker, go-redis' pool, ZooKeeper's sessions) — compare each leasehold recipe with the peer of its kind. *ratio* columns are leasehold ÷ peer from this same run: above 1 means leasehold does more pairs per second; for latency and memory, below 1 means leasehold is lower.\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func (r *Report) systems(b *strings.Builder) {
	p := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	p("### Systems\n\n| system | version | clients | setup and recipe |\n|---|---|---|---|\n")
	for _, s := range r.Systems {
		if s.Skipped != "" {
			p("| %s | — | — | **SKIPPED: %s** |\n", s.Name, cell(s.Skipped))
			continue
		}
		p("| %s | %s | %s | %s |\n", s.Name, cell(s.Version), s.recipe(), cell(s.Setup))
	}
	p("\n")
}

func (r *Report) scenario(b *strings.Builder, sc run.Scenario) {
	p := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	p("### %s\n\n", sc.Title())
	p("| system | pairs/s | acquire p50 | acquire p99 | acquire p999 | release p50 | release p99 |")
	if sc.Shared {
		p(" fairness (max/min per worker) |")
	}
	p(" server RSS | server CPU | server CPU/pair | client CPU | client CPU/pair | errors |\n|---|")
	cols := 12
	if sc.Shared {
		cols++
	}
	p("%s\n", strings.Repeat("---:|", cols))
	for _, s := range r.ran() {
		var x run.Result
		found := false
		for _, y := range r.Results {
			if y.System == s.Name && y.Scenario == sc.Name {
				x, found = y, true
			}
		}
		if !found {
			continue
		}
		if x.Skipped != "" {
			p("| %s | — (%s) |%s\n", s.Name, cell(x.Skipped), strings.Repeat(" |", cols-1))
			continue
		}
		if x.Failed != "" {
			p("| %s | **FAILED: %s** |%s\n", s.Name, cell(x.Failed), strings.Repeat(" |", cols-1))
			continue
		}
		p("| %s | %s | %s | %s | %s | %s | %s |", s.Name, rate(x.PairsPerSec),
			dur(x.AcqP50), dur(x.AcqP99), dur(x.AcqP999), dur(x.RelP50), dur(x.RelP99))
		if sc.Shared {
			p(" %s (%d–%d) |", ratio(x.Fairness), x.MinPerWorker, x.MaxPerWorker)
		}
		errs := fmt.Sprint(x.Errors)
		if x.Errors > 0 {
			errs += ": " + cell(trunc(x.FirstError, 80))
		}
		p(" %s | %.2f | %s | %.2f | %s | %s |\n", mib(x.ServerRSS), x.ServerCPU, dur(x.CPUPerPair), x.BenchCPU, dur(x.ClientCPUPerPair), errs)
	}
	p("\n")

	var bases, others []System
	for _, s := range r.ran() {
		if _, ok := r.result(s.Name, sc.Name); !ok {
			continue
		}
		if s.Baseline {
			bases = append(bases, s)
		} else {
			others = append(others, s)
		}
	}
	if len(bases) == 0 || len(others) == 0 {
		return
	}
	p("Ratios, leasehold ÷ peer, each leasehold recipe against the peers whose workers use the same kind of client (— : the other kind, compared in the like-for-like tables only where it says so):\n\n| peer |")
	for _, bs := range bases {
		short := strings.TrimPrefix(bs.Name, "leasehold-")
		p(" %s pairs/s | %s acquire p99 | %s server RSS |", short, short, short)
	}
	p("\n|---|%s\n", strings.Repeat("---:|", 3*len(bases)))
	for _, o := range others {
		y, _ := r.result(o.Name, sc.Name)
		p("| %s (%s) |", o.Name, o.recipe())
		for _, bs := range bases {
			if bs.SharedClient != o.SharedClient {
				p(" — | — | — |")
				continue
			}
			x, _ := r.result(bs.Name, sc.Name)
			p(" %s | %s | %s |", ratio(run.Ratio(x.PairsPerSec, y.PairsPerSec)),
				ratio(run.Ratio(float64(x.AcqP99), float64(y.AcqP99))),
				ratio(run.Ratio(float64(x.ServerRSS), float64(y.ServerRSS))))
		}
		p("\n")
	}
	p("\n")
}

func (r *Report) scale(b *strings.Builder) {
	p := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	if len(r.Locks) > 0 {
		p("### Scale: many held locks (leasehold %s)\n\n", r.Locks[0].Version)
		p("| system | locks | leases | fill time (acquires in flight) | grants/s while filling | server RSS, no lock held | server RSS, all held | bytes per lock | server CPU while holding | locks lost | release (revoke all) |\n")
		p("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, x := range r.Locks {
			if x.Failed != "" {
				p("| %s | **FAILED: %s** | | | | | | | | | |\n", x.System, cell(x.Failed))
				continue
			}
			p("| %s | %d (server reports %d) | %d | %v (%d) | %s | %s | %s | %.0f | %.2f | %d | %v |\n",
				x.System, x.Locks, x.ServerLocks, x.Leases, x.Fill.Round(100*time.Millisecond), x.Fillers, rate(x.FillRate),
				mib(x.RSSBefore), mib(x.RSSAfter), x.BytesPerLock, x.HoldCPU, x.Lost, x.Release.Round(time.Millisecond))
		}
		p("\n")
	}
	if len(r.Leases) > 0 {
		p("### Scale: many live leases (leasehold %s)\n\n", r.Leases[0].Version)
		p("| leases | clients | TTL | setup | keepalives/s (client schedule) | server CPU | CPU per keepalive | server RSS | benchmark CPU | leases lost |\n")
		p("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, x := range r.Leases {
			if x.Failed != "" {
				p("| %d | **FAILED: %s** | | | | | | | | |\n", x.Leases, cell(x.Failed))
				continue
			}
			p("| %d (server reports %d) | %d | %v | %v | %s | %.2f over %v | %s | %s | %.2f | %d |\n",
				x.Leases, x.ServerLeases, x.Clients, x.TTL, x.Setup.Round(time.Second), rate(x.KeepalivesPerSec),
				x.ServerCPU, x.Window.Round(time.Second), dur(x.CPUPerKeepalive), mib(x.RSS), x.BenchCPU, x.Lost)
		}
		p("\n")
	}
	for _, x := range r.Expiry {
		r.expiry(b, x)
	}
}

// expiry writes the scale-expiry run: the leases kept alive, their expiry at once, and
// what the probe clients saw meanwhile.
func (r *Report) expiry(b *strings.Builder, x scale.ExpiryResult) {
	p := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	p("### Scale: %d leases kept alive, then expiring at once (leasehold %s)\n\n", x.Leases, x.Version)
	if x.Failed != "" {
		p("**FAILED: %s**\n\n", x.Failed)
	}
	p("| leases (server reports) | connections | TTL | grants/s | renewals/s | server CPU | CPU per renewal | server RSS | generator CPU | lost |\n")
	p("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	p("| %d (%d) | %d | %v | %s | %s | %.2f over %v | %s | %s | %.2f | %d |\n\n",
		x.Leases, x.ServerLeases, x.Conns, x.TTL, rate(x.GrantRate), rate(x.KeepalivesPerSec),
		x.ServerCPU, x.Window.Round(time.Second), dur(x.CPUPerKeepalive), mib(x.RSS), x.GenCPU, x.Lost)
	if x.Live > 0 {
		server := "—"
		if x.ServerLatenessUnavailable != "" {
			server = "no metrics: " + cell(x.ServerLatenessUnavailable)
		}
		if x.ServerExpired > 0 {
			server = fmt.Sprintf("%s (bucket ≤ %s), %.0f expiries", dur(x.ServerLateP99), dur(x.ServerLateP99Bucket), x.ServerExpired)
		}
		p("| killed | all gone after | none early | expiry lateness p99, server histogram | lateness from outside p50 / p99 / max | server CPU while expiring | left |\n")
		p("|---:|---:|---:|---:|---:|---:|---:|\n")
		p("| %d | %v | %v | %s | %s / %s / %s | %.2f | %d |\n\n", x.Live, x.AllGone.Round(time.Millisecond), x.Early == 0, server,
			dur(x.OutsideP50), dur(x.OutsideP99), dur(x.OutsideMax), x.ExpireCPU, x.Remaining)
	}
	if x.Failed == "" && x.Leases >= 1_000_000 {
		verdict := func(ok bool) string {
			if ok {
				return "**met**"
			}
			return "missed"
		}
		p("| target (issue #16) | measured | verdict |\n|---|---|---|\n")
		p("| 1,000,000 live leases: server ≤ 0.5 core | %.2f core | %s |\n", x.ServerCPU, verdict(x.ServerCPU <= 0.5))
		p("| … ≤ 1 GiB RSS, ≤ 1 KiB per lease | %s, %.0f B per lease | %s |\n", mib(x.RSS), float64(x.RSS)/float64(x.Leases), verdict(x.RSS <= 1<<30))
		p("| … none lost | %d lost | %s |\n", x.Lost, verdict(x.Lost == 0))
		p("| 1,000,000 expiring at once: lateness p99 ≤ 1 s (server histogram) | %s | %s |\n", dur(x.ServerLateP99), verdict(x.ServerExpired > 0 && x.ServerLateP99 <= time.Second))
		for _, pr := range x.Probes {
			if pr.Phase == "expiry" {
				p("| … other clients' grants p99 ≤ 10 ms (%s) | %s | %s |\n", pr.Class, dur(pr.P99), verdict(pr.N > 0 && pr.Errors == 0 && pr.P99 <= 10*time.Millisecond))
			}
		}
		p("\n")
	}
	if len(x.Probes) > 0 {
		p("Other clients meanwhile (one per class, an acquire and release every %v):\n\n", x.ProbeEvery)
		p("| class | phase | acquires | p50 | p99 | max | errors |\n|---|---|---:|---:|---:|---:|---:|\n")
		for _, pr := range x.Probes {
			p("| %s | %s | %d | %s | %s | %s | %d %s |\n", pr.Class, pr.Phase, pr.N, dur(pr.P50), dur(pr.P99), dur(pr.Max), pr.Errors, cell(pr.FirstError))
		}
		p("\n")
	}
}

// dur formats a latency with three significant digits.
func dur(d time.Duration) string {
	us := float64(d) / float64(time.Microsecond)
	switch {
	case d == 0:
		return "—"
	case us < 10:
		return fmt.Sprintf("%.2f µs", us)
	case us < 100:
		return fmt.Sprintf("%.1f µs", us)
	case us < 1000:
		return fmt.Sprintf("%.0f µs", us)
	case us < 10000:
		return fmt.Sprintf("%.2f ms", us/1000)
	case us < 100000:
		return fmt.Sprintf("%.1f ms", us/1000)
	case us < 1e6:
		return fmt.Sprintf("%.0f ms", us/1000)
	}
	return fmt.Sprintf("%.2f s", us/1e6)
}

func rate(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

func ratio(v float64) string {
	switch {
	case math.IsNaN(v):
		return "—"
	case math.IsInf(v, 1):
		return "∞"
	case v >= 10:
		return fmt.Sprintf("%.0f×", v)
	}
	return fmt.Sprintf("%.2f×", v)
}

func mib(b int64) string {
	if b == 0 {
		return "—"
	}
	return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
}

// cell makes s safe inside a markdown table cell.
func cell(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	return strings.ReplaceAll(s, "|", "\\|")
}

func trunc(s string, n int) string {
	if len([]rune(s)) <= n {
		return s
	}
	return string([]rune(s)[:n]) + "…"
}
