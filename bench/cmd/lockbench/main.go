// Command lockbench compares leasehold's lock service with the lock recipes people use
// on Redis, etcd and ZooKeeper, on one machine in one run, and writes the results as a
// markdown table, an SVG chart and JSON (for docs/PERFORMANCE.md).
//
// It starts every server itself — on free loopback ports, with data in a temporary
// directory — one system at a time, and stops what it started when it is done, on
// SIGINT/SIGTERM, and at -timeout; the servers also get SIGKILL if it dies. Peers come
// from Debian packages (make bench-peers-install); a missing one is skipped with a loud
// message, never silently. The leasehold server is built from the parent module.
//
//	go run ./cmd/lockbench -duration 10s -warmup 2s             # the comparison
//	go run ./cmd/lockbench -scenarios scale-locks,scale-leases  # the scale runs
//	go run ./cmd/lockbench -scenarios scale-expiry             # 1M leases kept alive, then expiring at once
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/leasehold/leasehold/bench/internal/peers"
	"github.com/leasehold/leasehold/bench/internal/report"
	"github.com/leasehold/leasehold/bench/internal/run"
	"github.com/leasehold/leasehold/bench/internal/scale"
)

const defaultScenarios = "uncontended-1,uncontended-16,uncontended-64,contended-16"

type flags struct {
	systems, scenarios string
	rounds             int
	duration, warmup   time.Duration
	ttl, redisRetry    time.Duration
	zkHeap             string
	root, leaseholdBin string
	out                string
	timeout            time.Duration
	keep               bool
	note               string
	fsyncSamples       int
	scaleLocks         int
	scaleLocksPerLease int
	scaleFill          int
	scaleLocksClasses  string
	scaleHold          time.Duration
	scaleLeases        int
	scaleClients       int
	scaleLeaseTTL      time.Duration
	scaleWindow        time.Duration
	expiryLeases       int
	expiryConns        int
	expiryTTL          time.Duration
	expiryWindow       time.Duration
	expiryProbe        time.Duration
	profile            bool
	clientProfile      bool
	clientTrace        time.Duration
	startTimeout       time.Duration
	prefix             string
}

func main() {
	var f flags
	flag.StringVar(&f.systems, "systems", strings.Join(peers.Names, ","), "systems to compare, comma-separated; a leasehold system's name may end in "+peers.PerWorker+" (a client per worker instead of a Session per worker on one shared client), then in +tls, +auth or +tls+auth to run it secured (TLS on the API, fast lane and raft; a bearer token on every call), e.g. leasehold-efficiency,leasehold-efficiency-per-worker,leasehold-efficiency+tls+auth")
	flag.StringVar(&f.scenarios, "scenarios", defaultScenarios, "comma-separated: uncontended-W, contended-W, semaphore-W-N (W workers, one semaphore of N), lockset-W-K (W workers, K locks each at once), scale-locks, scale-leases, scale-expiry; or all (the default set plus the three scale runs)")
	flag.DurationVar(&f.duration, "duration", 10*time.Second, "measured time per scenario")
	flag.IntVar(&f.rounds, "rounds", 1, "run every system's scenarios this many times, the systems taking turns (A B C A B C ...); the report keeps each system and scenario's round of median pairs/s and lists all of them")
	flag.DurationVar(&f.warmup, "warmup", 2*time.Second, "warm-up per scenario, not measured")
	flag.DurationVar(&f.ttl, "ttl", 10*time.Second, "lock/session/lease TTL for every system")
	flag.DurationVar(&f.redisRetry, "redis-retry", time.Millisecond, "Redis recipe: sleep (±50%) before retrying a SET NX that found the lock taken")
	flag.StringVar(&f.zkHeap, "zk-heap", "1000m", "ZooKeeper JVM -Xmx (upstream zkServer.sh default)")
	flag.StringVar(&f.root, "root", "..", "root of the leasehold module, to build the server from")
	flag.StringVar(&f.leaseholdBin, "leasehold-bin", "", "use this leasehold binary instead of building one")
	flag.StringVar(&f.out, "out", "out", "directory for lockbench.md, lockbench.svg and lockbench.json")
	flag.StringVar(&f.prefix, "name", "lockbench", "base name of the output files")
	flag.DurationVar(&f.timeout, "timeout", 2*time.Hour, "stop everything and fail after this long")
	flag.BoolVar(&f.keep, "keep", false, "keep the temporary directory (server data and logs)")
	flag.StringVar(&f.note, "note", "", "a note to print at the top of the report")
	flag.IntVar(&f.fsyncSamples, "fsync-samples", 2000, "fsync probe: number of 4 KiB write+fdatasync (at most 10s)")
	flag.IntVar(&f.scaleLocks, "scale-locks", 1_000_000, "scale-locks: number of held locks")
	flag.IntVar(&f.scaleLocksPerLease, "scale-locks-per-lease", 10_000, "scale-locks: locks per lease (the server's default limit is 10000)")
	flag.IntVar(&f.scaleFill, "scale-fill", 256, "scale-locks: acquires in flight while filling (spread over the leases)")
	flag.StringVar(&f.scaleLocksClasses, "scale-locks-classes", "efficiency,correctness", "scale-locks: lock classes to run, each on a fresh server")
	flag.DurationVar(&f.scaleHold, "scale-hold", 10*time.Second, "scale-locks: how long to hold every lock before measuring")
	flag.IntVar(&f.scaleLeases, "scale-leases", 100_000, "scale-leases: number of live leases")
	flag.IntVar(&f.scaleClients, "scale-clients", 100, "scale-leases: number of clients (connections) the leases are spread over")
	flag.DurationVar(&f.scaleLeaseTTL, "scale-lease-ttl", 10*time.Second, "scale-leases: lease TTL (each lease gets TTL + k ms)")
	flag.DurationVar(&f.scaleWindow, "scale-window", 30*time.Second, "scale-leases: measured window")
	flag.IntVar(&f.expiryLeases, "scale-expiry-leases", 1_000_000, "scale-expiry: number of leases (one per simulated client, no locks)")
	flag.IntVar(&f.expiryConns, "scale-expiry-conns", 64, "scale-expiry: fast-lane connections the simulated clients share")
	flag.DurationVar(&f.expiryTTL, "scale-expiry-ttl", 30*time.Second, "scale-expiry: lease TTL (renewed every TTL/3, as the Go client does)")
	flag.DurationVar(&f.expiryWindow, "scale-expiry-window", 30*time.Second, "scale-expiry: measured window while every lease is kept alive, before all expire at once")
	flag.DurationVar(&f.expiryProbe, "scale-expiry-probe", 10*time.Millisecond, "scale-expiry: how often each probe client (one per class) acquires and releases a lock")
	flag.BoolVar(&f.profile, "profile", false, "run leasehold with --pprof and write its CPU profile over each measured window to OUT/NAME-SYSTEM-SCENARIO[-rROUND][-nNODE].cpu.pprof (every node's, in a cluster) and, for scale-leases, to OUT/NAME-scale-leases.cpu.pprof; with the server's heap profile after each scale run's window in OUT/NAME-scale-leases.heap.pprof and OUT/NAME-scale-locks-CLASS.heap.pprof")
	flag.DurationVar(&f.startTimeout, "start-timeout", 90*time.Second, "how long a server may take to start")
	flag.DurationVar(&f.clientTrace, "client-trace", 0, "write an execution trace of the benchmark process (where every system's clients run) over this long at the start of each measured window to OUT/NAME-SYSTEM-SCENARIO[-rROUND].client.trace (read it with go tool trace)")
	flag.BoolVar(&f.clientProfile, "client-profile", false, "write the benchmark process's CPU profile (where every system's clients run) over each measured window to OUT/NAME-SYSTEM-SCENARIO[-rROUND].client.cpu.pprof")
	fromJSON := flag.String("from-json", "", "render the report of an earlier run from its JSON file, without running anything")
	flag.Parse()
	if *fromJSON != "" {
		os.Exit(rerender(*fromJSON, f.out, f.prefix))
	}
	os.Exit(mainErr(f))
}

func mainErr(f flags) int {
	logw := os.Stderr
	fail := func(format string, a ...any) int {
		fmt.Fprintf(logw, "lockbench: "+format+"\n", a...)
		return 2
	}
	systems := split(f.systems)
	for _, s := range systems {
		if _, err := peers.New(s, peers.Options{}); err != nil {
			return fail("%v", err)
		}
	}
	var scenarios []run.Scenario
	var scaleLocks, scaleLeases, scaleExpiry bool
	names := split(f.scenarios)
	if slices.Contains(names, "all") {
		names = append(split(defaultScenarios), "scale-locks", "scale-leases", "scale-expiry")
	}
	for _, n := range names {
		switch n {
		case "scale-locks":
			scaleLocks = true
		case "scale-leases":
			scaleLeases = true
		case "scale-expiry":
			scaleExpiry = true
		default:
			sc, err := run.ParseScenario(n)
			if err != nil {
				return fail("%v", err)
			}
			scenarios = append(scenarios, sc)
		}
	}
	classes := split(f.scaleLocksClasses)
	for _, c := range classes {
		if c != "efficiency" && c != "correctness" {
			return fail("-scale-locks-classes: unknown class %q", c)
		}
	}
	if scaleExpiry {
		switch {
		case f.expiryLeases < 1:
			return fail("-scale-expiry-leases must be at least 1, got %d", f.expiryLeases)
		case f.expiryConns < 1:
			return fail("-scale-expiry-conns must be at least 1, got %d", f.expiryConns)
		case f.expiryTTL < 100*time.Millisecond:
			return fail("-scale-expiry-ttl must be at least the server's minimum TTL, 100ms, got %v", f.expiryTTL)
		case f.expiryWindow <= 0 || f.expiryProbe <= 0:
			return fail("-scale-expiry-window and -scale-expiry-probe must be positive")
		}
	}
	if f.duration <= 0 || f.warmup < 0 {
		return fail("-duration must be positive and -warmup not negative")
	}
	if f.rounds < 1 {
		return fail("-rounds must be at least 1, got %d", f.rounds)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()

	rep := &report.Report{Started: time.Now(), Machine: report.DescribeMachine(), Warmup: f.warmup, Duration: f.duration, Scenarios: scenarios}
	if f.note != "" {
		rep.Notes = append(rep.Notes, f.note)
	}
	noisy := false
	if load, ok := busy(rep.Machine.LoadBefore); ok {
		noisy = true
		rep.Notes = append(rep.Notes, fmt.Sprintf("**NOISY: the 1-minute load average was %.2f on %d CPUs when the run started — other work shared the machine. Do not publish these numbers.**", load, rep.Machine.NProc))
	}
	tmp, err := os.MkdirTemp("", "leasehold-bench-")
	if err != nil {
		return fail("%v", err)
	}
	failed := false
	defer func() {
		if f.keep || failed {
			fmt.Fprintf(logw, "lockbench: server data and logs kept in %s\n", tmp)
			return
		}
		_ = os.RemoveAll(tmp)
	}()
	fmt.Fprintf(logw, "lockbench: %d × %s, kernel %s, load %s; work dir %s\n", rep.Machine.NProc, rep.Machine.CPUModel, rep.Machine.Kernel, rep.Machine.LoadBefore, tmp)

	rep.Fsync = report.MeasureFsync(tmp, f.fsyncSamples, 10*time.Second)
	fmt.Fprintf(logw, "lockbench: fsync (4 KiB + fdatasync, %s): p50 %v p99 %v (%d samples) %s\n", rep.Fsync.FSType, rep.Fsync.P50, rep.Fsync.P99, rep.Fsync.Samples, rep.Fsync.Err)

	opts := peers.Options{TTL: f.ttl, RedisRetry: f.redisRetry, LeaseholdBin: f.leaseholdBin, ZooKeeperHeap: f.zkHeap, LeaseholdPprof: f.profile}
	needLeasehold := scaleLocks || scaleLeases || scaleExpiry || slices.ContainsFunc(systems, func(s string) bool { return strings.HasPrefix(s, "leasehold") })
	if needLeasehold && opts.LeaseholdBin == "" {
		opts.LeaseholdBin = filepath.Join(tmp, "leasehold")
		fmt.Fprintf(logw, "lockbench: building leasehold from %s\n", f.root)
		bctx, bcancel := context.WithTimeout(ctx, 10*time.Minute)
		err := peers.BuildLeasehold(bctx, f.root, opts.LeaseholdBin)
		bcancel()
		if err != nil {
			failed = true
			return fail("%v", err)
		}
	}

	if len(scenarios) > 0 {
		var results [][]run.Result // per round, in system then scenario order
		skipped := map[string]bool{}
		for round := range f.rounds {
			var got []run.Result
			for i, name := range systems {
				if ctx.Err() != nil || skipped[name] {
					continue
				}
				sys, _ := peers.New(name, opts)
				entry := report.System{Name: name, Setup: sys.Describe(), Baseline: strings.HasPrefix(name, "leasehold"), SharedClient: sys.SharedClient()}
				dir := filepath.Join(tmp, fmt.Sprintf("%d-%d-%s", round, i, name))
				if err := os.MkdirAll(dir, 0o755); err != nil {
					return fail("%v", err)
				}
				sctx, scancel := context.WithTimeout(ctx, f.startTimeout)
				err := sys.Start(sctx, dir)
				scancel()
				if err != nil {
					sys.Stop()
					skipped[name] = true
					entry.Skipped = err.Error()
					if !errors.Is(err, peers.ErrNotInstalled) {
						entry.Skipped = "failed to start: " + err.Error()
						failed = true
					}
					loud(logw, "SKIPPING %s: %s", name, entry.Skipped)
					if round == 0 {
						rep.Systems = append(rep.Systems, entry)
					}
					continue
				}
				entry.Version = sys.Version()
				entry.Setup = sys.Describe() // some systems know more once started
				if round == 0 {
					rep.Systems = append(rep.Systems, entry)
				}
				fmt.Fprintf(logw, "== %s %s (pids %v)%s\n", name, entry.Version, sys.PIDs(), roundLabel(round, f.rounds))
				for _, sc := range scenarios {
					if ctx.Err() != nil {
						break
					}
					cfg := run.Config{Warmup: f.warmup, Duration: f.duration, Prefix: "bench"}
					base := filepath.Join(f.out, fmt.Sprintf("%s-%s-%s%s", f.prefix, name, sc.Name, roundSuffix(round, f.rounds)))
					var during []func(context.Context, time.Duration)
					if l, ok := sys.(*peers.Leasehold); ok && f.profile {
						during = append(during, func(ctx context.Context, d time.Duration) {
							if err := l.FetchProfiles(ctx, d, base); err != nil {
								fmt.Fprintf(logw, "   %s: no profile: %v\n", sc.Name, err)
							}
						})
					}
					if f.clientProfile {
						during = append(during, func(ctx context.Context, d time.Duration) {
							if err := profileSelf(ctx, d, base+".client.cpu.pprof"); err != nil {
								fmt.Fprintf(logw, "   %s: no client profile: %v\n", sc.Name, err)
							}
						})
					}
					if f.clientTrace > 0 {
						during = append(during, func(ctx context.Context, d time.Duration) {
							if err := traceSelf(ctx, min(d, f.clientTrace), base+".client.trace"); err != nil {
								fmt.Fprintf(logw, "   %s: no client trace: %v\n", sc.Name, err)
							}
						})
					}
					cfg.DuringWindow = allDuring(during)
					res := run.Run(ctx, sys, sc, cfg)
					got = append(got, res)
					if res.Skipped != "" {
						fmt.Fprintf(logw, "   %-16s skipped: %s\n", sc.Name, res.Skipped)
						continue
					}
					if res.Failed != "" {
						failed = true
						loud(logw, "%s %s FAILED: %s", name, sc.Name, res.Failed)
						continue
					}
					fmt.Fprintf(logw, "   %-16s %9.0f pairs/s  acquire p50 %-9v p99 %-9v  release p50 %-9v  server RSS %.1f MiB CPU %.2f  errors %d %s\n",
						sc.Name, res.PairsPerSec, res.AcqP50.Round(time.Microsecond), res.AcqP99.Round(time.Microsecond), res.RelP50.Round(time.Microsecond),
						float64(res.ServerRSS)/(1<<20), res.ServerCPU, res.Errors, res.FirstError)
				}
				sys.Stop()
			}
			results = append(results, got)
		}
		var note string
		rep.Rounds = results
		rep.Results, note = medianRounds(results)
		if note != "" {
			rep.Notes = append(rep.Notes, note)
		}
	}

	if scaleLocks {
		for _, class := range classes {
			if ctx.Err() != nil {
				break
			}
			sys := peers.NewLeasehold(opts, class == "correctness")
			profile := ""
			if f.profile {
				profile = filepath.Join(f.out, f.prefix+"-scale-locks-"+class) // + ".heap.pprof"
			}
			err := withLeasehold(ctx, sys, tmp, "scale-locks-"+class, f.startTimeout, logw, func() {
				r := scale.Locks(ctx, sys, f.scaleLocks, f.scaleLocksPerLease, f.scaleFill, f.ttl, f.scaleHold, profile, logw)
				rep.Locks = append(rep.Locks, r)
				if r.Failed != "" {
					failed = true
					loud(logw, "scale-locks %s FAILED: %s", class, r.Failed)
				}
			})
			if err != nil {
				failed = true
				rep.Locks = append(rep.Locks, scale.LocksResult{System: sys.Name(), Locks: f.scaleLocks, Failed: err.Error()})
			}
		}
	}
	if scaleLeases && ctx.Err() == nil {
		sys := peers.NewLeasehold(opts, false)
		profile := ""
		if f.profile {
			profile = filepath.Join(f.out, f.prefix+"-scale-leases") // + ".cpu.pprof"
		}
		err := withLeasehold(ctx, sys, tmp, "scale-leases", f.startTimeout, logw, func() {
			r := scale.Leases(ctx, sys, f.scaleLeases, f.scaleClients, f.scaleLeaseTTL, f.scaleWindow, profile, logw)
			rep.Leases = append(rep.Leases, r)
			if r.Failed != "" {
				failed = true
				loud(logw, "scale-leases FAILED: %s", r.Failed)
			}
		})
		if err != nil {
			failed = true
			rep.Leases = append(rep.Leases, scale.LeasesResult{System: sys.Name(), Leases: f.scaleLeases, Failed: err.Error()})
		}
	}

	if scaleExpiry && ctx.Err() == nil {
		sys := peers.NewLeasehold(opts, false)
		profile := ""
		if f.profile {
			profile = filepath.Join(f.out, f.prefix+"-scale-expiry") // + ".cpu.pprof"
		}
		err := withLeasehold(ctx, sys, tmp, "scale-expiry", f.startTimeout, logw, func() {
			r := scale.Expiry(ctx, sys, f.expiryLeases, f.expiryConns, f.expiryTTL, f.expiryWindow, f.expiryProbe, profile, logw)
			rep.Expiry = append(rep.Expiry, r)
			if r.Failed != "" {
				failed = true
				loud(logw, "scale-expiry FAILED: %s", r.Failed)
			}
		})
		if err != nil {
			failed = true
			rep.Expiry = append(rep.Expiry, scale.ExpiryResult{System: sys.Name(), Leases: f.expiryLeases, Failed: err.Error()})
		}
	}

	if err := ctx.Err(); err != nil {
		failed = true
		loud(logw, "run cut short: %v (-timeout %v or a signal); the report holds what finished", context.Cause(ctx), f.timeout)
		rep.Notes = append(rep.Notes, fmt.Sprintf("**INCOMPLETE: the run was cut short (%v).**", context.Cause(ctx)))
	}
	for _, s := range rep.Systems {
		if s.Skipped != "" {
			loud(logw, "%s was SKIPPED: %s", s.Name, s.Skipped)
		}
	}
	rep.Machine.Finish()
	if load, ok := busy(rep.Machine.LoadAfter); ok && !noisy {
		rep.Notes = append(rep.Notes, fmt.Sprintf("**NOISY: the 1-minute load average was %.2f on %d CPUs when the run ended — other work shared the machine. Do not publish these numbers.**", load, rep.Machine.NProc))
	}
	rep.Elapsed = time.Since(rep.Started)
	if err := write(rep, f.out, f.prefix, logw); err != nil {
		failed = true
		fmt.Fprintf(logw, "lockbench: %v\n", err)
	}
	if failed {
		return 1
	}
	return 0
}

// busy reads a load average as the report keeps it ("0.42 0.30 0.25"): its 1-minute
// figure, and whether it is above 0.5, a machine doing other work.
func busy(loadavg string) (float64, bool) {
	load, err := strconv.ParseFloat(strings.Fields(loadavg + " x")[0], 64)
	return load, err == nil && load > 0.5
}

func roundLabel(round, rounds int) string {
	if rounds == 1 {
		return ""
	}
	return fmt.Sprintf(", round %d of %d", round+1, rounds)
}

// roundSuffix names a round in file names: "" for a single round, "-r2" for round 2.
func roundSuffix(round, rounds int) string {
	if rounds == 1 {
		return ""
	}
	return fmt.Sprintf("-r%d", round+1)
}

// medianRounds keeps, for every system and scenario, the round whose pairs/s is the
// median of those that did not fail (the lower middle one of an even count), so that
// one row's latencies, CPU and memory all come from the same window. With more than
// one round, note lists every round's pairs/s.
func medianRounds(rounds [][]run.Result) (kept []run.Result, note string) {
	type key struct{ system, scenario string }
	var order []key
	all := map[key][]run.Result{}
	for _, round := range rounds {
		for _, r := range round {
			k := key{r.System, r.Scenario}
			if _, seen := all[k]; !seen {
				order = append(order, k)
			}
			all[k] = append(all[k], r)
		}
	}
	var lines []string
	for _, k := range order {
		rs := all[k]
		ok := slices.DeleteFunc(slices.Clone(rs), func(r run.Result) bool { return r.Failed != "" })
		if len(ok) == 0 {
			kept = append(kept, rs[len(rs)-1])
			continue
		}
		slices.SortFunc(ok, func(a, b run.Result) int { return cmp.Compare(a.PairsPerSec, b.PairsPerSec) })
		kept = append(kept, ok[(len(ok)-1)/2])
		if len(rounds) > 1 {
			var each []string
			for _, r := range rs {
				if r.Failed != "" {
					each = append(each, "failed")
				} else {
					each = append(each, fmt.Sprintf("%.0f", r.PairsPerSec))
				}
			}
			lines = append(lines, fmt.Sprintf("%s %s: %s", k.system, k.scenario, strings.Join(each, ", ")))
		}
	}
	if len(lines) > 0 {
		note = fmt.Sprintf("Each system ran its scenarios %d times, the systems taking turns; every row shows the round of median pairs/s. Pairs/s per round: %s.", len(rounds), strings.Join(lines, "; "))
	}
	return kept, note
}

// rerender writes the markdown and the chart of a run from its JSON file.
func rerender(path, out, base string) int {
	fh, err := os.Open(path)
	if err != nil {
		fmt.Fprintf(os.Stderr, "lockbench: %v\n", err)
		return 2
	}
	rep, err := report.ReadJSON(fh)
	_ = fh.Close()
	if err == nil {
		err = write(rep, out, base, os.Stderr)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "lockbench: %v\n", err)
		return 1
	}
	return 0
}

// withLeasehold starts sys in its own directory, runs body, and stops it.
func withLeasehold(ctx context.Context, sys *peers.Leasehold, tmp, name string, startTimeout time.Duration, logw io.Writer, body func()) error {
	dir := filepath.Join(tmp, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	sctx, cancel := context.WithTimeout(ctx, startTimeout)
	err := sys.Start(sctx, dir)
	cancel()
	defer sys.Stop()
	if err != nil {
		loud(logw, "%s: leasehold failed to start: %v", name, err)
		return err
	}
	fmt.Fprintf(logw, "== %s: %s %s (pid %v)\n", name, sys.Name(), sys.Version(), sys.PIDs())
	body()
	return nil
}

func write(rep *report.Report, dir, base string, logw io.Writer) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var md strings.Builder
	if err := rep.Markdown(&md); err != nil {
		return err
	}
	fmt.Print(md.String())
	files := []struct {
		ext   string
		write func(io.Writer) error
	}{
		{".md", func(w io.Writer) error { _, err := io.WriteString(w, md.String()); return err }},
		{".svg", rep.SVG},
		{".json", rep.JSON},
	}
	for _, f := range files {
		path := filepath.Join(dir, base+f.ext)
		fh, err := os.Create(path)
		if err != nil {
			return err
		}
		err = f.write(fh)
		if cerr := fh.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		fmt.Fprintf(logw, "lockbench: wrote %s\n", path)
	}
	return nil
}

// loud prints a message nobody can miss in a scrolling log.
func loud(w io.Writer, format string, a ...any) {
	line := strings.Repeat("!", 78)
	fmt.Fprintf(w, "%s\n!! %s\n%s\n", line, fmt.Sprintf(format, a...), line)
}

func split(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// profileSelf writes this process's CPU profile over d (or until ctx ends) to path.
func profileSelf(ctx context.Context, d time.Duration, path string) error {
	return recordSelf(ctx, d, path, pprof.StartCPUProfile, pprof.StopCPUProfile)
}

// traceSelf writes this process's execution trace over d (or until ctx ends) to path.
func traceSelf(ctx context.Context, d time.Duration, path string) error {
	return recordSelf(ctx, d, path, trace.Start, trace.Stop)
}

// recordSelf runs start on a new file at path, waits d (or until ctx ends), then stop.
func recordSelf(ctx context.Context, d time.Duration, path string, start func(io.Writer) error, stop func()) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	out, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := start(out); err != nil {
		_ = out.Close()
		return err
	}
	select {
	case <-time.After(d):
	case <-ctx.Done():
	}
	stop()
	return out.Close()
}

// allDuring runs every fn at once over the measured window; nil when there is none.
func allDuring(fns []func(context.Context, time.Duration)) func(context.Context, time.Duration) {
	if len(fns) == 0 {
		return nil
	}
	return func(ctx context.Context, d time.Duration) {
		var wg sync.WaitGroup
		for _, fn := range fns {
			wg.Go(func() { fn(ctx, d) })
		}
		wg.Wait()
	}
}
