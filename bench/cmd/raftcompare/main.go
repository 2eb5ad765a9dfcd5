// Command raftcompare measures the commit path of package replication (hashicorp/raft)
// against the go.etcd.io/raft/v3 prototype (internal/etcdraft) in one process and one
// run, alternating: every round runs each engine on one node and on three (loopback
// TCP), each on replication/wal logs in -dir with a real fdatasync per write, the same
// core commands and the same state machine (core.State). Per engine and size it runs one proposer
// (latency of each commit) and then -workers proposers (commits/s, process CPU per
// commit from getrusage). Each proposer alternates a correctness acquire and a release
// of its own lock; one commit is one Apply. Each round rotates the order of the engines
// at each size. Engines: hashicorp (package replication, as the server runs it), etcd
// (the prototype), etcd-direct (the prototype writing messages from its loop,
// Transport.Direct).
//
//	go run ./cmd/raftcompare -rounds 8 -duration 3s
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/leasehold/leasehold/bench/internal/etcdraft"
	"github.com/leasehold/leasehold/core"
	"github.com/leasehold/leasehold/replication"
)

// engine is what both implementations offer the benchmark.
type engine interface {
	Apply(ctx context.Context, cmd core.Command) (core.Result, error)
}

// member is one node of either implementation.
type member interface {
	engine
	IsLeader() bool
}

// cluster sends each command to the node that leads: on a machine this loaded either
// engine's leader is sometimes deposed in a run, and the run goes on with the next
// (the command that failed counts as failed).
type cluster[M member] struct {
	nodes  []M
	leader atomic.Int32
}

func (c *cluster[M]) Apply(ctx context.Context, cmd core.Command) (core.Result, error) {
	l := c.nodes[c.leader.Load()]
	res, err := l.Apply(ctx, cmd)
	if err != nil && !l.IsLeader() {
		for i, n := range c.nodes {
			if n.IsLeader() {
				c.leader.Store(int32(i))
			}
		}
	}
	return res, err
}

// setup is one engine at one cluster size.
type setup struct {
	name  string
	nodes int
	start func(dir string, nodes int) (engine, func(), error)
}

func main() {
	rounds := flag.Int("rounds", 5, "rounds; each runs every engine and size once, alternating")
	duration := flag.Duration("duration", 3*time.Second, "measured window of each run")
	warmup := flag.Duration("warmup", 500*time.Millisecond, "unmeasured load before each window")
	workers := flag.Int("workers", 64, "proposers of the throughput run")
	dir := flag.String("dir", "", "data directory (default: a temporary one, removed at the end)")
	engines := flag.String("engines", "hashicorp,etcd", "engines to run, comma-separated: hashicorp, etcd, etcd-direct")
	sizes := flag.String("nodes", "1,3", "cluster sizes to run, comma-separated: 1, 3")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the whole run here")
	flag.Parse()
	if err := run(*rounds, *duration, *warmup, *workers, *dir, strings.Split(*engines, ","), strings.Split(*sizes, ","), *cpuprofile); err != nil {
		fmt.Fprintln(os.Stderr, "raftcompare:", err)
		os.Exit(1)
	}
}

func run(rounds int, duration, warmup time.Duration, workers int, dir string, engines, sizes []string, cpuprofile string) error {
	if dir == "" {
		d, err := os.MkdirTemp("", "raftcompare-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		dir = d
	}
	if cpuprofile != "" {
		f, err := os.Create(cpuprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	var setups []setup
	for _, nodes := range []int{1, 3} {
		for _, s := range []setup{{name: "hashicorp", start: startHashicorp}, {name: "etcd", start: startEtcd(false)}, {name: "etcd-direct", start: startEtcd(true)}} {
			s.nodes = nodes
			if slices.Contains(engines, s.name) && slices.Contains(sizes, fmt.Sprint(nodes)) {
				setups = append(setups, s)
			}
		}
	}
	if len(setups) == 0 {
		return fmt.Errorf("no engine of %q at sizes %q", engines, sizes)
	}
	fmt.Printf("%d rounds, %v windows after %v warm-up, %d proposers for throughput, data in %s\n\n", rounds, duration, warmup, workers, dir)
	fmt.Println("| round | engine | nodes | 1 proposer p50 µs | p99 µs | commits/s | 64 proposers commits/s | CPU µs/commit | failed | load avg |")
	fmt.Println("|--:|---|--:|--:|--:|--:|--:|--:|--:|---|")
	results := map[string][]result{}
	for r := 1; r <= rounds; r++ {
		for i, s := range rotated(setups, r) {
			res, err := measure(s, filepath.Join(dir, fmt.Sprintf("r%d-%d", r, i)), duration, warmup, workers)
			if err != nil {
				return fmt.Errorf("round %d, %s/%d: %w", r, s.name, s.nodes, err)
			}
			key := fmt.Sprintf("%s/%d", s.name, s.nodes)
			results[key] = append(results[key], res)
			fmt.Printf("| %d | %s | %d | %.0f | %.0f | %.0f | %.0f | %.1f | %d | %s |\n", r, s.name, s.nodes, res.p50, res.p99, res.oneRate, res.rate, res.cpu, res.errors, loadavg())
		}
	}
	fmt.Println("\nmedians over the rounds:")
	fmt.Println("| engine | nodes | 1 proposer p50 µs | p99 µs | 64 proposers commits/s | CPU µs/commit |")
	fmt.Println("|---|--:|--:|--:|--:|--:|")
	for _, s := range setups {
		rs := results[fmt.Sprintf("%s/%d", s.name, s.nodes)]
		fmt.Printf("| %s | %d | %.0f | %.0f | %.0f | %.1f |\n", s.name, s.nodes,
			median(rs, func(r result) float64 { return r.p50 }), median(rs, func(r result) float64 { return r.p99 }),
			median(rs, func(r result) float64 { return r.rate }), median(rs, func(r result) float64 { return r.cpu }))
	}
	fmt.Println("\nper round, each engine ÷ hashicorp at the same size (median of the rounds in brackets):")
	for _, s := range setups {
		if s.name == "hashicorp" {
			continue
		}
		base := results[fmt.Sprintf("hashicorp/%d", s.nodes)]
		rs := results[fmt.Sprintf("%s/%d", s.name, s.nodes)]
		if len(base) != len(rs) {
			continue
		}
		for _, m := range []struct {
			name string
			f    func(result) float64
		}{
			{"1 proposer p50", func(r result) float64 { return r.p50 }},
			{"64 proposers commits/s", func(r result) float64 { return r.rate }},
			{"CPU µs/commit", func(r result) float64 { return r.cpu }},
		} {
			ratios := make([]result, len(rs))
			var line []string
			for i := range rs {
				ratios[i].p50 = m.f(rs[i]) / m.f(base[i])
				line = append(line, fmt.Sprintf("%.2f", ratios[i].p50))
			}
			fmt.Printf("- %s/%d %s: %s (%.2f)\n", s.name, s.nodes, m.name, strings.Join(line, ", "), median(ratios, func(r result) float64 { return r.p50 }))
		}
	}
	return nil
}

// rotated returns the setups of round r: those of each size rotated by r, so that no
// engine always runs first or after the same one.
func rotated(setups []setup, r int) []setup {
	var out []setup
	for start := 0; start < len(setups); {
		end := start
		for end < len(setups) && setups[end].nodes == setups[start].nodes {
			end++
		}
		group := setups[start:end]
		for i := range group {
			out = append(out, group[(i+r-1)%len(group)])
		}
		start = end
	}
	return out
}

type result struct {
	p50, p99, oneRate float64 // one proposer: µs, µs, commits/s
	rate, cpu         float64 // many proposers: commits/s, CPU µs per commit
	errors            int64   // failed commits (both loads)
}

func median(rs []result, f func(result) float64) float64 {
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = f(r)
	}
	slices.Sort(v)
	return v[len(v)/2]
}

// measure starts s in dir, runs the one-proposer and the many-proposer loads on it and
// stops it.
func measure(s setup, dir string, duration, warmup time.Duration, workers int) (result, error) {
	e, stop, err := s.start(dir, s.nodes)
	if err != nil {
		return result{}, err
	}
	defer func() {
		stop()
		_ = os.RemoveAll(dir)
	}()
	lease := core.LeaseID{1}
	if _, err := e.Apply(context.Background(), core.Command{Op: core.OpGrant, Lease: lease, TTLMillis: 3600_000}); err != nil {
		return result{}, err
	}
	var res result
	lat, n, _, errs1, err := load(e, lease, 1, duration, warmup, true)
	if err != nil {
		return result{}, err
	}
	slices.Sort(lat)
	res.p50 = float64(lat[len(lat)/2].Microseconds())
	res.p99 = float64(lat[len(lat)*99/100].Microseconds())
	res.oneRate = float64(n) / duration.Seconds()
	_, n, cpu, errs64, err := load(e, lease, workers, duration, warmup, false)
	if err != nil {
		return result{}, err
	}
	res.errors = errs1 + errs64
	res.rate = float64(n) / duration.Seconds()
	res.cpu = float64(cpu.Microseconds()) / float64(n)
	return res, nil
}

// maxErrors is how many failed commits a run tolerates before it gives up.
const maxErrors = 100000

// load runs workers proposers for warmup and then duration, and returns the latencies
// (if asked), the commits and the process CPU of the measured window, and the failed
// commits of the whole run.
func load(e engine, lease core.LeaseID, workers int, duration, warmup time.Duration, latencies bool) ([]time.Duration, int64, time.Duration, int64, error) {
	var measuring, stopping atomic.Bool
	var commits, errs atomic.Int64
	var mu sync.Mutex
	var lat []time.Duration
	var firstErr error
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			name := fmt.Sprintf("bench/%d", w)
			var mine []time.Duration
			var token uint64
			retries := 0
			for !stopping.Load() {
				cmd := core.Command{Op: core.OpAcquire, Lease: lease, Name: name, Class: core.Correctness}
				if token != 0 {
					cmd = core.Command{Op: core.OpRelease, Lease: lease, Name: name, Token: token}
				}
				t0 := time.Now()
				res, err := e.Apply(context.Background(), cmd)
				d := time.Since(t0)
				if err == nil {
					err = res.Err
				}
				if err != nil {
					// A loaded machine makes either engine time out now and then
					// (hashicorp/raft's enqueue timeout, an election): count it and go
					// on with a fresh lock, since the failed command may have committed.
					if errs.Add(1) > maxErrors {
						mu.Lock()
						firstErr = cmp(firstErr, fmt.Errorf("%v %s: %w (and %d errors before)", cmd.Op, name, err, maxErrors))
						mu.Unlock()
						stopping.Store(true)
						return
					}
					retries++
					name, token = fmt.Sprintf("bench/%d/%d", w, retries), 0
					time.Sleep(time.Millisecond)
					continue
				}
				if cmd.Op == core.OpAcquire {
					token = res.Token
				} else {
					token = 0
				}
				if measuring.Load() {
					commits.Add(1)
					if latencies {
						mine = append(mine, d)
					}
				}
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		})
	}
	time.Sleep(warmup)
	cpu0 := cpuTime()
	measuring.Store(true)
	time.Sleep(duration)
	measuring.Store(false)
	cpu := cpuTime() - cpu0
	stopping.Store(true)
	wg.Wait()
	if firstErr != nil {
		return nil, 0, 0, 0, firstErr
	}
	if latencies && len(lat) == 0 {
		return nil, 0, 0, 0, fmt.Errorf("no commit in %v", duration)
	}
	return lat, commits.Load(), cpu, errs.Load(), nil
}

func cmp(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// cpuTime is the CPU time (user and system) the process has used so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// startEtcd starts the prototype: nodes voters, each on its own replication/wal log;
// direct sets the transports' Direct.
func startEtcd(direct bool) func(dir string, nodes int) (engine, func(), error) {
	return func(dir string, nodes int) (engine, func(), error) {
		return startEtcdCluster(dir, nodes, direct)
	}
}

func startEtcdCluster(dir string, nodes int, direct bool) (engine, func(), error) {
	ns, err := etcdraft.StartCluster(etcdraft.ClusterConfig{Dir: dir, Nodes: nodes, DirectSend: direct})
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := etcdraft.WaitLeader(ctx, ns)
	if err != nil {
		return nil, nil, err
	}
	c := &cluster[*etcdraft.Node]{nodes: ns}
	c.leader.Store(int32(slices.Index(ns, l)))
	return c, func() {
		for _, n := range ns {
			_ = n.Close()
		}
	}, nil
}

// startHashicorp starts package replication as the server runs it (LogStoreWAL, TCP
// transport on loopback): node 1 bootstraps alone and adds the others as voters.
func startHashicorp(dir string, nodes int) (engine, func(), error) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	var ns []*replication.Node
	stop := func() {
		for _, n := range slices.Backward(ns) {
			_ = n.Close()
		}
	}
	for i := range nodes {
		n, err := replication.Open(replication.Config{
			NodeID: fmt.Sprintf("n%d", i+1), DataDir: filepath.Join(dir, fmt.Sprintf("node%d", i+1)),
			LogStore: replication.LogStoreWAL, RaftAddr: "127.0.0.1:0", Bootstrap: i == 0, Logger: quiet,
		})
		if err != nil {
			stop()
			return nil, nil, err
		}
		ns = append(ns, n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l := ns[0]
	for !l.IsLeader() {
		if ctx.Err() != nil {
			stop()
			return nil, nil, fmt.Errorf("no leader: %w", ctx.Err())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := l.Barrier(ctx); err != nil {
		stop()
		return nil, nil, err
	}
	for _, n := range ns[1:] {
		if err := l.AddVoter(ctx, n.NodeID(), n.RaftAddr()); err != nil {
			stop()
			return nil, nil, err
		}
	}
	return &cluster[*replication.Node]{nodes: ns}, stop, nil
}

// Both engines' nodes have these methods.
var (
	_ member = (*replication.Node)(nil)
	_ member = (*etcdraft.Node)(nil)
)
