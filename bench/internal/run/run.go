// Package run drives the lock scenarios against a started peers.System: W workers, each
// with its own session, loop acquire → release for a warm-up and then for a measured
// window; only pairs that start and finish inside the window count.
package run

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasehold/leasehold/bench/internal/peers"
	"github.com/leasehold/leasehold/internal/proc"
)

// Scenario is one workload.
type Scenario struct {
	// Name is how the scenario is selected and reported ("uncontended-64").
	Name string
	// Workers is the number of concurrent workers, each with its own session.
	Workers int
	// Shared makes every worker use one lock (contended); otherwise each worker has its
	// own lock (uncontended).
	Shared bool
	// Semaphore, when > 0, makes every worker take one slot of one semaphore of this
	// limit (systems without a semaphore are skipped).
	Semaphore int
	// SetSize, when > 0, makes every worker take this many locks of its own at once: a
	// lock set where the system has them, else one lock per name in sorted order.
	SetSize int
}

// Title is the scenario's heading in the report.
func (s Scenario) Title() string {
	switch {
	case s.Semaphore > 0:
		return fmt.Sprintf("semaphore: %d workers on one semaphore of %d", s.Workers, s.Semaphore)
	case s.SetSize > 0:
		workers := fmt.Sprintf("%d workers, each its own set", s.Workers)
		if s.Workers == 1 {
			workers = "1 worker"
		}
		return fmt.Sprintf("lock set of %d names: %s (leasehold: one LockSet; peers: one lock per name, in sorted order)", s.SetSize, workers)
	case s.Shared:
		return fmt.Sprintf("contended: %d workers on one lock", s.Workers)
	case s.Workers == 1:
		return "uncontended: 1 worker"
	}
	return fmt.Sprintf("uncontended: %d workers, each its own lock", s.Workers)
}

// ParseScenario reads "uncontended-W", "contended-W", "semaphore-W-N" (W workers on one
// semaphore of N) or "lockset-W-K" (W workers, each taking its own K locks at once).
func ParseScenario(name string) (Scenario, error) {
	bad := fmt.Errorf("run: bad scenario %q (want uncontended-W, contended-W, semaphore-W-N or lockset-W-K, 1 ≤ W ≤ 1024, 1 ≤ N ≤ 10000, 1 ≤ K ≤ 64)", name)
	parts := strings.Split(name, "-")
	nums := make([]int, len(parts)-1)
	for i, p := range parts[1:] {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 {
			return Scenario{}, bad
		}
		nums[i] = n
	}
	sc := Scenario{Name: name}
	switch kind := parts[0]; {
	case (kind == "uncontended" || kind == "contended") && len(nums) == 1:
		sc.Workers, sc.Shared = nums[0], kind == "contended"
	case kind == "semaphore" && len(nums) == 2 && nums[1] <= 10000:
		sc.Workers, sc.Semaphore, sc.Shared = nums[0], nums[1], true
	case kind == "lockset" && len(nums) == 2 && nums[1] <= 64:
		sc.Workers, sc.SetSize = nums[0], nums[1]
	default:
		return Scenario{}, bad
	}
	if sc.Workers > 1024 {
		return Scenario{}, bad
	}
	return sc, nil
}

// ErrNoEquivalent is returned when a system has no equivalent of a scenario's
// primitive (a semaphore) in its Go client.
var ErrNoEquivalent = errors.New("no equivalent in its Go client")

// acquirer returns how worker w takes what scenario sc asks for, one name (or, for a
// lock set, the first of its names) given.
func acquirer(w peers.Worker, sc Scenario) (func(ctx context.Context, name string) (peers.Held, error), error) {
	switch {
	case sc.Semaphore > 0:
		sw, ok := w.(peers.SemaphoreWorker)
		if !ok {
			return nil, ErrNoEquivalent
		}
		return func(ctx context.Context, name string) (peers.Held, error) {
			return sw.AcquireSemaphore(ctx, name, sc.Semaphore)
		}, nil
	case sc.SetSize > 0:
		return func(ctx context.Context, name string) (peers.Held, error) {
			names := make([]string, sc.SetSize)
			for i := range names {
				names[i] = fmt.Sprintf("%s/%02d", name, i)
			}
			if sw, ok := w.(peers.SetWorker); ok {
				return sw.AcquireSet(ctx, names)
			}
			return peers.AcquireInOrder(ctx, w, names)
		}, nil
	}
	return w.Acquire, nil
}

// Result is what one scenario measured on one system.
type Result struct {
	System   string
	Scenario string
	Workers  int
	Shared   bool

	Window      time.Duration // measured window
	Pairs       int           // acquire+release pairs inside the window
	PairsPerSec float64

	AcqP50, AcqP99, AcqP999 time.Duration
	RelP50, RelP99          time.Duration

	// Contended only: acquisitions per worker in the window, and max/min of them
	// (+Inf when some worker got none).
	MinPerWorker, MaxPerWorker int
	Fairness                   float64 `json:"-"` // +Inf has no JSON form; Min and Max say it

	ServerRSS    int64         // bytes, summed over the system's processes, end of window
	ServerRSSMax int64         // the largest sample during the window
	ServerCPU    float64       // cores busy in the server processes during the window
	CPUPerPair   time.Duration // server CPU time per pair
	BenchCPU     float64       // cores busy in this benchmark process (the clients)
	// ClientCPUPerPair is this benchmark process's CPU time (the clients') per pair:
	// on a small machine the clients and the server share the CPUs, so both count.
	ClientCPUPerPair time.Duration `json:",omitempty"`

	Errors     int
	FirstError string
	// Failed is set when the scenario could not run or finish; the numbers are then
	// not meaningful.
	Failed string
	// Skipped is set when the system has nothing to run the scenario with (no
	// semaphore); nothing was measured.
	Skipped string `json:",omitempty"`
}

// Config bounds a run.
type Config struct {
	Warmup, Duration time.Duration
	// Prefix makes lock names unique per run.
	Prefix string
	// DuringWindow, if set, runs on its own goroutine from the start of the measured
	// window (fetching a server profile over it, say); Run returns only after it has.
	DuringWindow func(ctx context.Context, window time.Duration)
}

// Run measures scenario sc on sys. It always returns a Result; Failed says whether the
// numbers can be used. It returns within Warmup + Duration + about a minute.
func Run(ctx context.Context, sys peers.System, sc Scenario, cfg Config) Result {
	res := Result{System: sys.Name(), Scenario: sc.Name, Workers: sc.Workers, Shared: sc.Shared}

	setup, cancelSetup := context.WithTimeout(ctx, 60*time.Second)
	defer cancelSetup()
	workers := make([]peers.Worker, 0, sc.Workers)
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
		defer cancel()
		var wg sync.WaitGroup
		for _, w := range workers {
			wg.Go(func() { _ = w.Close(cctx) })
		}
		wg.Wait()
	}()
	acquire := make([]func(context.Context, string) (peers.Held, error), 0, sc.Workers)
	for range sc.Workers {
		w, err := sys.NewWorker(setup)
		if err != nil {
			res.Failed = fmt.Sprintf("opening worker %d: %v", len(workers), err)
			return res
		}
		workers = append(workers, w)
		a, err := acquirer(w, sc)
		if err != nil {
			res.Skipped = err.Error()
			return res
		}
		acquire = append(acquire, a)
	}

	const (
		warming = iota
		measuring
		stopped
	)
	var phase atomic.Int32
	runCtx, cancelRun := context.WithCancel(ctx)
	defer cancelRun()
	type sample struct{ acq, rel time.Duration }
	samples := make([][]sample, sc.Workers)
	var errCount atomic.Int64
	var firstErr atomic.Value
	noteErr := func(err error) {
		if errCount.Add(1) == 1 {
			firstErr.Store(err.Error())
		}
	}
	var wg sync.WaitGroup
	for i := range workers {
		name := fmt.Sprintf("%s/%s/%d", cfg.Prefix, sc.Name, i)
		if sc.Shared {
			name = fmt.Sprintf("%s/%s/shared", cfg.Prefix, sc.Name)
		}
		wg.Go(func() {
			buf := make([]sample, 0, 1<<14)
			defer func() { samples[i] = buf }()
			for phase.Load() != stopped {
				p0 := phase.Load()
				t0 := time.Now()
				h, err := acquire[i](runCtx, name)
				t1 := time.Now()
				if err != nil {
					if runCtx.Err() != nil {
						return
					}
					noteErr(fmt.Errorf("acquire: %w", err))
					time.Sleep(10 * time.Millisecond) // no hot loop on a failing server
					continue
				}
				rctx, cancel := context.WithTimeout(context.WithoutCancel(runCtx), 10*time.Second)
				err = h.Release(rctx)
				cancel()
				t2 := time.Now()
				if err != nil {
					noteErr(fmt.Errorf("release: %w", err))
					continue
				}
				if p0 == measuring && phase.Load() == measuring {
					buf = append(buf, sample{t1.Sub(t0), t2.Sub(t1)})
				}
			}
		})
	}

	pids := sys.PIDs()
	select {
	case <-time.After(cfg.Warmup):
	case <-ctx.Done():
	}
	cpu0, _ := proc.SumCPU(pids)
	self0, _ := proc.CPU(selfPID)
	start := time.Now()
	phase.Store(measuring)
	var during sync.WaitGroup
	defer during.Wait()
	if cfg.DuringWindow != nil {
		during.Go(func() { cfg.DuringWindow(ctx, cfg.Duration) })
	}
	tick := time.NewTicker(250 * time.Millisecond)
	end := time.NewTimer(cfg.Duration)
	for waiting := true; waiting; {
		select {
		case <-tick.C:
			if rss, err := proc.SumRSS(pids); err == nil {
				res.ServerRSSMax = max(res.ServerRSSMax, rss)
			}
		case <-end.C:
			waiting = false
		case <-ctx.Done():
			waiting = false
		}
	}
	tick.Stop()
	end.Stop()
	phase.Store(stopped)
	res.Window = time.Since(start)
	if ctx.Err() != nil {
		res.Failed = fmt.Sprintf("cut short after %v of the window: %v", res.Window.Round(time.Millisecond), context.Cause(ctx))
	}
	cpu1, cerr := proc.SumCPU(pids)
	self1, _ := proc.CPU(selfPID)
	res.ServerRSS, _ = proc.SumRSS(pids)
	res.ServerRSSMax = max(res.ServerRSSMax, res.ServerRSS)

	// Let every worker finish its pair (waiters are granted as holders release), then
	// cancel what still waits.
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		cancelRun()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			res.Failed = "workers did not stop within 30s of the end of the window"
			return res // their samples are still being written
		}
	}

	var acq, rel []time.Duration
	counts := make([]int, sc.Workers)
	for i, s := range samples {
		counts[i] = len(s)
		for _, x := range s {
			acq = append(acq, x.acq)
			rel = append(rel, x.rel)
		}
	}
	res.Pairs = len(acq)
	res.PairsPerSec = float64(res.Pairs) / res.Window.Seconds()
	res.AcqP50, res.AcqP99, res.AcqP999 = Percentile(acq, 0.50), Percentile(acq, 0.99), Percentile(acq, 0.999)
	res.RelP50, res.RelP99 = Percentile(rel, 0.50), Percentile(rel, 0.99)
	res.MinPerWorker, res.MaxPerWorker = slices.Min(counts), slices.Max(counts)
	res.Fairness = Ratio(float64(res.MaxPerWorker), float64(res.MinPerWorker))
	if cerr == nil {
		busy := cpu1 - cpu0
		res.ServerCPU = busy.Seconds() / res.Window.Seconds()
		if res.Pairs > 0 {
			res.CPUPerPair = busy / time.Duration(res.Pairs)
		}
	}
	res.BenchCPU = (self1 - self0).Seconds() / res.Window.Seconds()
	if res.Pairs > 0 {
		res.ClientCPUPerPair = (self1 - self0) / time.Duration(res.Pairs)
	}
	res.Errors = int(errCount.Load())
	if s, ok := firstErr.Load().(string); ok {
		res.FirstError = s
	}
	if res.Failed != "" {
		return res
	}
	if res.Pairs == 0 {
		res.Failed = "no pair completed in the window"
		if res.FirstError != "" {
			res.Failed += ": " + res.FirstError
		}
	}
	return res
}
