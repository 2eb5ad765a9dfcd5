package scale

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/leasehold/leasehold/bench/internal/peers"
	"github.com/leasehold/leasehold/bench/internal/run"
	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/internal/proc"
)

// ExpiryResult is what Expiry measured: a million live leases kept alive, then the
// same leases left to expire at once.
type ExpiryResult struct {
	System, Version string
	Leases, Conns   int
	TTL             time.Duration
	Failed          string
	Errors          int
	FirstError      string

	// Granting every lease.
	Grant     time.Duration
	GrantRate float64

	// Keeping them alive, over Window.
	Window           time.Duration
	KeepalivesPerSec float64 // renewals acknowledged per second
	ServerCPU        float64 // cores
	CPUPerKeepalive  time.Duration
	GenCPU           float64 // cores of this process (the generator and the probes)
	RSS              int64
	ServerLeases     uint32
	Lost             int // renewals refused (the server no longer had the lease) before the kill

	// Expiring them: every connection closed at once, nothing renewed any more.
	Live      int           // leases alive at the kill
	InFlight  int           // of those, how many had a renewal in flight (their deadline may be a renewal interval later)
	AllGone   time.Duration // from the kill until the server reported none of them left
	Early     int           // most leases gone before any could have been (must be 0)
	Remaining int           // leases still there when the run gave up waiting
	// Lateness from the lease's deadline. The server's own histogram
	// (leasehold_expiry_lateness_seconds, every expiry, from the deadline on its clock)
	// gives the p99 interpolated inside its bucket, as Prometheus' histogram_quantile
	// does, and the bucket's upper bound; the outside view matches the leases' deadlines
	// (from the send time of each one's last acknowledged renewal, so never earlier than
	// the server's) in order with the drops of the server's lease count, sampled every
	// 50 ms.
	ServerExpired             float64
	ServerLateP99             time.Duration
	ServerLateP99Bucket       time.Duration
	OutsideP50, OutsideP99    time.Duration
	OutsideMax                time.Duration
	ExpireCPU                 float64 // server cores from the kill until all were gone
	Probes                    []ProbeResult
	ProbeEvery                time.Duration
	ServerLatenessUnavailable string
}

// ProbeResult is the acquire latency another client saw while the run went on.
type ProbeResult struct {
	Class, Phase  string
	N, Errors     int
	P50, P99, Max time.Duration
	FirstError    string
}

// Expiry grants n leases of ttl through the fast lane (laneGen, conns connections),
// keeps them alive on the Go client's schedule for window (measuring the server's CPU
// and memory), then closes every connection at once and waits until the server has
// expired them all, measuring how late each expiry was. Throughout, two other clients
// (one per lock class) acquire and release a lock every probeEvery and record how long
// each acquire took. With profile set (the server must run with --pprof), the server's
// CPU profile over the window goes to profile+".cpu.pprof", its heap profile at the
// end of the window to profile+".heap.pprof", and its CPU profile over the first
// seconds of the expiry to profile+"-expiry.cpu.pprof".
func Expiry(ctx context.Context, sys *peers.Leasehold, n, conns int, ttl, window, probeEvery time.Duration, profile string, logw io.Writer) ExpiryResult {
	res := ExpiryResult{System: sys.Name(), Version: sys.Version(), Leases: n, Conns: conns, TTL: ttl, ProbeEvery: probeEvery}
	pid := sys.PIDs()[0]
	status, err := client.Dial(ctx, sys.Addr())
	if err != nil {
		res.Failed = err.Error()
		return res
	}
	defer closeAll([]*client.Client{status})
	st, err := status.Status(ctx)
	if err != nil {
		res.Failed = "status: " + err.Error()
		return res
	}
	if st.GetFastLaneAddr() == "" {
		res.Failed = "the server has no fast lane"
		return res
	}

	// The probes run from before the grants until the end; each sample says when.
	pctx, stopProbes := context.WithCancel(ctx)
	probes := []*prober{{class: client.Efficiency, name: "efficiency"}, {class: client.Correctness, name: "correctness"}}
	var probeWG sync.WaitGroup
	for _, p := range probes {
		c, err := client.Dial(ctx, sys.Addr())
		if err != nil {
			stopProbes()
			res.Failed = err.Error()
			return res
		}
		defer closeAll([]*client.Client{c})
		if err := p.once(ctx, c); err != nil { // opens its lease
			stopProbes()
			res.Failed = "probe: " + err.Error()
			return res
		}
		probeWG.Go(func() { p.run(pctx, c, probeEvery) })
	}
	defer func() { stopProbes(); probeWG.Wait() }()
	st, err = status.Status(ctx)
	if err != nil {
		res.Failed = "status: " + err.Error()
		return res
	}
	others := int(st.GetLeases()) // the probes' leases, which stay

	gen, err := newLaneGen(ctx, st.GetFastLaneAddr(), st.GetClusterId(), n, conns, ttl)
	if err != nil {
		res.Failed = err.Error()
		return res
	}
	res.Conns = len(gen.conns)
	gctx, kill := context.WithCancel(ctx)
	defer kill()
	genDone := make(chan struct{})
	go func() { gen.run(gctx); close(genDone) }()

	// Grant every lease.
	start := time.Now()
	stopProgress := progress(logw, "scale-expiry grants", &gen.granted, int64(n), start)
	grantDeadline := time.Now().Add(3 * time.Minute) // each lease is renewed from its own grant on, so a slow fill loses none
	for gen.granted.Load() < int64(n) && time.Now().Before(grantDeadline) && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	stopProgress()
	res.Grant = time.Since(start)
	res.GrantRate = float64(gen.granted.Load()) / res.Grant.Seconds()
	if got := gen.granted.Load(); got < int64(n) {
		res.Errors, res.FirstError = gen.errs.get()
		res.Failed = fmt.Sprintf("granted %d of %d leases in %v (first error: %s)", got, n, res.Grant.Round(time.Second), res.FirstError)
		return res
	}

	// One renewal interval, so every lease is on its steady schedule; then the window.
	fmt.Fprintf(logw, "scale-expiry: %d leases granted in %v (%.0f/s); settling for %v\n", n, res.Grant.Round(time.Second), res.GrantRate, gen.every+time.Second)
	if !sleep(ctx, gen.every+time.Second) {
		res.Failed = ctx.Err().Error()
		return res
	}
	cpu0, _ := proc.CPU(pid)
	self0, _ := proc.CPU(selfPID)
	ka0 := gen.renewals.Load()
	t0 := time.Now()
	probeWindow := probePhase(probes, "keepalive")
	profiled := make(chan error, 1)
	if profile != "" {
		go func() { profiled <- sys.FetchProfiles(ctx, window, profile) }()
	} else {
		profiled <- nil
	}
	sleep(ctx, window)
	if err := <-profiled; err != nil {
		fmt.Fprintf(logw, "scale-expiry: no profile: %v\n", err)
	}
	cpu1, _ := proc.CPU(pid)
	self1, _ := proc.CPU(selfPID)
	ka1 := gen.renewals.Load()
	res.Window = time.Since(t0)
	probeWindow()
	res.RSS, _ = proc.RSS(pid)
	res.ServerCPU = (cpu1 - cpu0).Seconds() / res.Window.Seconds()
	res.GenCPU = (self1 - self0).Seconds() / res.Window.Seconds()
	res.KeepalivesPerSec = float64(ka1-ka0) / res.Window.Seconds()
	if ka1 > ka0 {
		res.CPUPerKeepalive = (cpu1 - cpu0) / time.Duration(ka1-ka0)
	}
	if profile != "" {
		if err := sys.FetchHeapProfile(ctx, profile+".heap.pprof"); err != nil {
			fmt.Fprintf(logw, "scale-expiry: no heap profile: %v\n", err)
		}
	}
	if st, err := status.Status(ctx); err == nil {
		res.ServerLeases = st.GetLeases()
	}
	res.Lost = int(gen.refused.Load())
	fmt.Fprintf(logw, "scale-expiry: %d leases kept alive, %.0f renewals/s, server %.2f core, %v per renewal, RSS %d MiB, %d lost\n",
		res.ServerLeases, res.KeepalivesPerSec, res.ServerCPU, res.CPUPerKeepalive, res.RSS>>20, res.Lost)

	// The kill: every connection closed, nothing renewed any more.
	before, lerr := sys.FetchMetrics(ctx)
	cpuKill, _ := proc.CPU(pid)
	killed := time.Now()
	kill()
	<-genDone
	closed := gen.now()
	probeExpiry := probePhase(probes, "expiry")
	if profile != "" {
		go func() { _ = sys.FetchProfiles(ctx, min(ttl, 30*time.Second), profile+"-expiry") }()
	}
	due, inFlight := deadlines(gen)
	res.Live, res.InFlight = len(due), inFlight
	if res.Live == 0 {
		res.Failed = "no lease was alive at the kill"
		return res
	}
	fmt.Fprintf(logw, "scale-expiry: closed the connections of %d live leases (%d with a renewal in flight); they fall due %v to %v after that\n",
		res.Live, inFlight, time.Duration(due[0]-closed).Round(time.Millisecond), time.Duration(due[len(due)-1]-closed).Round(time.Millisecond))
	var samples []countSample
	giveUp := time.Now().Add(ttl + 2*time.Minute)
	for time.Now().Before(giveUp) && ctx.Err() == nil {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		st, err := status.Status(sctx)
		cancel()
		at := gen.now()
		if err == nil {
			left := max(0, int(st.GetLeases())-others)
			samples = append(samples, countSample{at: at, left: left})
			if left == 0 {
				break
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	res.AllGone = time.Since(killed)
	cpuGone, _ := proc.CPU(pid)
	res.ExpireCPU = (cpuGone - cpuKill).Seconds() / res.AllGone.Seconds()
	probeExpiry()
	stopProbes()
	probeWG.Wait()
	if len(samples) > 0 {
		res.Remaining = samples[len(samples)-1].left
	}
	res.Early, res.OutsideP50, res.OutsideP99, res.OutsideMax = outsideLateness(samples, due)
	if after, err := sys.FetchMetrics(ctx); err == nil && lerr == nil {
		res.ServerExpired, res.ServerLateP99, res.ServerLateP99Bucket = latenessQuantile(before, after, 0.99)
	} else {
		res.ServerLatenessUnavailable = fmt.Sprint(cmp.Or(lerr, err))
	}
	for _, p := range probes {
		res.Probes = append(res.Probes, p.results()...)
	}
	res.Errors, res.FirstError = gen.errs.get()
	switch {
	case res.Remaining > 0:
		res.Failed = fmt.Sprintf("%d of %d leases were still there %v after the kill", res.Remaining, res.Live, res.AllGone.Round(time.Second))
	case res.Early > 0:
		res.Failed = fmt.Sprintf("%d leases were gone before their TTL had passed", res.Early)
	}
	fmt.Fprintf(logw, "scale-expiry: all %d gone %v after the kill; lateness p99 %v (server, bucket ≤ %v), outside p99 %v max %v; server %.2f core while expiring\n",
		res.Live, res.AllGone.Round(time.Millisecond), res.ServerLateP99.Round(time.Millisecond), res.ServerLateP99Bucket, res.OutsideP99.Round(time.Millisecond), res.OutsideMax.Round(time.Millisecond), res.ExpireCPU)
	return res
}

// sleep waits d or until ctx ends, and says whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	select {
	case <-time.After(d):
		return true
	case <-ctx.Done():
		return false
	}
}

// deadlines returns, for every lease alive at the kill, the earliest its server
// deadline can be (offsets from gen.start, sorted): TTL after its last acknowledged
// request was sent (the server restarted the countdown after that), and how many had a
// renewal in flight at the kill (the server may have taken it, which moves the
// deadline on by up to a renewal interval).
func deadlines(gen *laneGen) (earliest []int64, inFlight int) {
	ttl := int64(gen.ttl)
	for i := range gen.leases {
		l := &gen.leases[i]
		if l.gone || l.payload == nil {
			continue
		}
		earliest = append(earliest, l.ackSent+ttl)
		if l.sent > l.ackSent {
			inFlight++
		}
	}
	slices.Sort(earliest)
	return earliest, inFlight
}

type countSample struct {
	at   int64 // when the answer arrived, since gen.start
	left int   // of the killed leases, how many the server still had
}

// outsideLateness matches the sorted earliest deadlines with the lease count's drops:
// the k-th lease gone (in deadline order) went by the first sample with at most
// live−k−1 left; its lateness is measured from the earliest its deadline can be, so
// never less than the server's. It also counts, as early, the most leases gone at any
// sample beyond those whose earliest deadline had passed (G4: none may be).
func outsideLateness(samples []countSample, earliest []int64) (early int, p50, p99, maxLate time.Duration) {
	live := len(earliest)
	var late []time.Duration
	k, passed := 0, 0
	for _, s := range samples {
		gone := live - s.left
		for passed < live && earliest[passed] <= s.at {
			passed++
		}
		early = max(early, gone-passed)
		for ; k < gone && k < live; k++ {
			late = append(late, time.Duration(max(0, s.at-earliest[k])))
		}
	}
	if len(late) == 0 {
		return early, 0, 0, 0
	}
	slices.Sort(late)
	return early, run.Percentile(late, 0.5), run.Percentile(late, 0.99), late[len(late)-1]
}

// latenessQuantile reads the server's expiry-lateness histogram before and after and
// returns how many expiries it counted in between and their q-quantile, interpolated
// linearly inside its bucket (as histogram_quantile does), with that bucket's bound.
func latenessQuantile(before, after string, q float64) (count float64, quant, bound time.Duration) {
	b0, b1 := histogram(before), histogram(after)
	les := make([]float64, 0, len(b1))
	for le := range b1 {
		les = append(les, le)
	}
	slices.Sort(les)
	if len(les) == 0 {
		return 0, 0, 0
	}
	total := b1[les[len(les)-1]] - b0[les[len(les)-1]]
	if total <= 0 {
		return 0, 0, 0
	}
	rank := q * total
	prevLE, prevN := 0.0, 0.0
	for _, le := range les {
		n := b1[le] - b0[le]
		if n >= rank {
			if math.IsInf(le, 1) {
				return total, time.Duration(prevLE * float64(time.Second)), 0
			}
			f := prevLE + (le-prevLE)*(rank-prevN)/max(n-prevN, 1)
			return total, time.Duration(f * float64(time.Second)), time.Duration(le * float64(time.Second))
		}
		prevLE, prevN = le, n
	}
	return total, 0, 0
}

// histogram returns the cumulative buckets of leasehold_expiry_lateness_seconds, by
// upper bound (+Inf holding every sample), from a Prometheus text exposition; none when
// the text has no such histogram.
func histogram(text string) map[float64]float64 {
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(strings.NewReader(text))
	out := map[float64]float64{}
	mf := families["leasehold_expiry_lateness_seconds"]
	if err != nil || mf == nil || len(mf.GetMetric()) == 0 {
		return out
	}
	h := mf.GetMetric()[0].GetHistogram()
	for _, b := range h.GetBucket() {
		out[b.GetUpperBound()] = float64(b.GetCumulativeCount())
	}
	out[math.Inf(1)] = float64(h.GetSampleCount())
	return out
}

// prober acquires and releases one lock of its class again and again, recording each
// acquire's latency and the phase it fell in.
type prober struct {
	class client.LockOption
	name  string
	mu    sync.Mutex
	phase string
	got   map[string][]time.Duration
	errs  map[string]int
	first map[string]string
	seq   int
}

func (p *prober) once(ctx context.Context, c *client.Client) error {
	p.seq++
	l, err := c.Lock(ctx, fmt.Sprintf("scale-expiry/probe/%s/%d", p.name, p.seq), p.class, client.TryOnce)
	if err != nil {
		return err
	}
	return l.Unlock(ctx)
}

func (p *prober) run(ctx context.Context, c *client.Client, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		start := time.Now()
		err := p.once(ctx, c)
		d := time.Since(start)
		if ctx.Err() != nil {
			return
		}
		p.mu.Lock()
		if p.phase != "" {
			if p.got == nil {
				p.got, p.errs, p.first = map[string][]time.Duration{}, map[string]int{}, map[string]string{}
			}
			if err != nil {
				if p.errs[p.phase] == 0 {
					p.first[p.phase] = err.Error()
				}
				p.errs[p.phase]++
			} else {
				p.got[p.phase] = append(p.got[p.phase], d)
			}
		}
		p.mu.Unlock()
	}
}

// probePhase starts recording the probes' samples under phase; the returned func
// stops it.
func probePhase(probes []*prober, phase string) func() {
	for _, p := range probes {
		p.mu.Lock()
		p.phase = phase
		p.mu.Unlock()
	}
	return func() {
		for _, p := range probes {
			p.mu.Lock()
			p.phase = ""
			p.mu.Unlock()
		}
	}
}

func (p *prober) results() []ProbeResult {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []ProbeResult
	for _, phase := range []string{"keepalive", "expiry"} {
		d := slices.Clone(p.got[phase])
		slices.Sort(d)
		r := ProbeResult{Class: p.name, Phase: phase, N: len(d), Errors: p.errs[phase], FirstError: p.first[phase]}
		if len(d) > 0 {
			r.P50, r.P99, r.Max = run.Percentile(d, 0.5), run.Percentile(d, 0.99), d[len(d)-1]
		}
		out = append(out, r)
	}
	return out
}
