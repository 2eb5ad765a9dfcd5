// Package scale holds leasehold's scale scenarios, run against one leasehold server
// process through the public Go client:
//
//   - Locks: a million held locks (spread over leases of at most the server's
//     per-lease limit) and what they cost in server memory.
//   - Leases: a hundred thousand live leases kept alive by the client's normal schedule
//     (a keepalive about every TTL/3) and what that costs in server CPU.
//
// The peers are not run here: their recipes keep one session per lock holder, so a
// comparable million-holder setup is a different benchmark.
package scale

import (
	"context"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasehold/leasehold/bench/internal/peers"
	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/internal/proc"
)

// LocksResult is what Locks measured.
type LocksResult struct {
	System        string
	Version       string
	Locks, Leases int
	Fill          time.Duration // time to acquire every lock
	FillRate      float64       // grants per second while filling
	RSSBefore     int64         // server RSS with the leases open and no lock held
	RSSAfter      int64         // server RSS with every lock held
	BytesPerLock  float64
	ServerLocks   uint32  // locks the server reports holding
	HoldCPU       float64 // server cores busy while holding (keepalives only)
	Lost          int     // locks whose context ended while held
	Release       time.Duration
	Fillers       int // acquires in flight while filling
	Failed        string
	Errors        int
	FirstError    string
	ClientTTL     time.Duration
	LocksPerLease int
}

// Locks acquires n locks on sys (a started leasehold system), perLease locks on each of
// ceil(n/perLease) leases (one client each) with about fill acquires in flight at a
// time, holds them for hold, and releases them by closing the clients (which revokes
// the leases). Progress goes to logw. With profile set (a base name; the server must run
// with --pprof), the server's heap profile while it holds every lock is written to
// profile+".heap.pprof".
func Locks(ctx context.Context, sys *peers.Leasehold, n, perLease, fill int, ttl, hold time.Duration, profile string, logw io.Writer) LocksResult {
	res := LocksResult{System: sys.Name(), Version: sys.Version(), Locks: n, ClientTTL: ttl, LocksPerLease: perLease}
	pid := sys.PIDs()[0]
	leases := (n + perLease - 1) / perLease
	res.Leases = leases
	clients, err := dialAll(ctx, sys.Addr(), leases, ttl)
	defer closeAll(clients)
	if err != nil {
		res.Failed = err.Error()
		return res
	}
	// Open each client's lease with one lock taken and given back.
	var errs errNote
	if err := forEach(ctx, clients, func(i int, c *client.Client) error {
		l, err := c.Lock(ctx, fmt.Sprintf("scale-locks/warm/%d", i), sys.Class(), client.TryOnce)
		if err != nil {
			return err
		}
		return l.Unlock(ctx)
	}); err != nil {
		res.Failed = "opening leases: " + err.Error()
		return res
	}
	time.Sleep(time.Second)
	res.RSSBefore, _ = proc.RSS(pid)

	// Each client's locks are split among its fillers; a Client is safe for concurrent
	// use and all of them share its one lease.
	fillers := max(1, (fill+leases-1)/leases)
	res.Fillers = fillers * leases
	held := make([][]*client.Lock, leases*fillers)
	var count atomic.Int64
	start := time.Now()
	stopProgress := progress(logw, "scale-locks "+sys.Name(), &count, int64(n), start)
	err = forEach(ctx, clients, func(i int, c *client.Client) error {
		k := min(perLease, n-i*perLease)
		var wg sync.WaitGroup
		errc := make(chan error, fillers)
		for f := range fillers {
			wg.Go(func() {
				slot := i*fillers + f
				for j := f; j < k; j += fillers {
					l, err := c.Lock(ctx, fmt.Sprintf("scale-locks/%d/%d", i, j), sys.Class(), client.TryOnce)
					if err != nil {
						if ctx.Err() != nil {
							errc <- ctx.Err()
							return
						}
						errs.note(err)
						continue
					}
					held[slot] = append(held[slot], l)
					count.Add(1)
				}
			})
		}
		wg.Wait()
		close(errc)
		return <-errc
	})
	stopProgress()
	res.Fill = time.Since(start)
	res.FillRate = float64(count.Load()) / res.Fill.Seconds()
	res.Errors, res.FirstError = errs.get()
	if err != nil {
		res.Failed = "filling: " + err.Error()
		return res
	}
	if st, err := clients[0].Status(ctx); err == nil {
		res.ServerLocks = st.GetLocks()
	}
	cpu0, _ := proc.CPU(pid)
	t0 := time.Now()
	sleep(ctx, hold)
	cpu1, _ := proc.CPU(pid)
	res.HoldCPU = (cpu1 - cpu0).Seconds() / time.Since(t0).Seconds()
	res.RSSAfter, _ = proc.RSS(pid)
	if profile != "" {
		if err := sys.FetchHeapProfile(ctx, profile+".heap.pprof"); err != nil {
			fmt.Fprintf(logw, "scale-locks: no heap profile: %v\n", err)
		}
	}
	if got := count.Load(); got > 0 {
		res.BytesPerLock = float64(res.RSSAfter-res.RSSBefore) / float64(got)
	}
	for _, ls := range held {
		for _, l := range ls {
			if l.Context().Err() != nil {
				res.Lost++
			}
		}
	}
	t1 := time.Now()
	closeAll(clients) // the deferred closeAll finds them closed
	res.Release = time.Since(t1)
	if int(count.Load()) < n && res.Failed == "" {
		res.Failed = fmt.Sprintf("only %d of %d locks acquired (first error: %s)", count.Load(), n, res.FirstError)
	}
	return res
}

// LeasesResult is what Leases measured.
type LeasesResult struct {
	System  string
	Version string
	Leases  int
	Clients int
	TTL     time.Duration
	Setup   time.Duration
	Window  time.Duration
	// KeepalivesPerSec is the rate the client's schedule produces: one keepalive per
	// lease about every TTL/3.
	KeepalivesPerSec float64
	ServerCPU        float64       // cores busy in the server during the window
	CPUPerKeepalive  time.Duration // server CPU per keepalive
	BenchCPU         float64       // cores busy in the benchmark (the clients)
	RSS              int64
	ServerLeases     uint32
	Lost             int // leases lost (their lock's context ended) by the end
	Errors           int
	FirstError       string
	Failed           string
}

// Leases opens n leases through clients clients (n/clients each, distinct TTLs of
// ttl + k ms, each holding one efficiency lock: a Client keeps one lease per TTL),
// waits one keepalive period, then measures the server for window.
//
// With profile set (a base name; the server must run with --pprof), the server's CPU
// profile over the measured window is written to profile+".cpu.pprof"
// (peers.Leasehold.FetchProfiles) and its heap profile at the end of the window to
// profile+".heap.pprof".
func Leases(ctx context.Context, sys *peers.Leasehold, n, nclients int, ttl, window time.Duration, profile string, logw io.Writer) LeasesResult {
	res := LeasesResult{System: sys.Name(), Version: sys.Version(), Leases: n, Clients: nclients, TTL: ttl, Window: window}
	pid := sys.PIDs()[0]
	clients, err := dialAll(ctx, sys.Addr(), nclients, ttl)
	defer closeAll(clients)
	if err != nil {
		res.Failed = err.Error()
		return res
	}
	per := (n + nclients - 1) / nclients
	held := make([][]*client.Lock, nclients)
	var count atomic.Int64
	var rate atomic.Uint64 // keepalives per second × 1e6, summed
	var errs errNote
	start := time.Now()
	stopProgress := progress(logw, "scale-leases", &count, int64(n), start)
	err = forEach(ctx, clients, func(i int, c *client.Client) error {
		k := min(per, n-i*per)
		for j := range k {
			d := ttl + time.Duration(j)*time.Millisecond
			l, err := c.Lock(ctx, fmt.Sprintf("scale-leases/%d/%d", i, j), client.Efficiency, client.TryOnce, client.LockTTL(d))
			if err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				errs.note(err)
				continue
			}
			held[i] = append(held[i], l)
			count.Add(1)
			rate.Add(uint64(3e6 / d.Seconds()))
		}
		return nil
	})
	stopProgress()
	res.Setup = time.Since(start)
	res.Errors, res.FirstError = errs.get()
	if err != nil {
		res.Failed = "opening leases: " + err.Error()
		return res
	}
	res.KeepalivesPerSec = float64(rate.Load()) / 1e6
	if st, err := clients[0].Status(ctx); err == nil {
		res.ServerLeases = st.GetLeases()
	}
	// One full keepalive period, so every lease is on its steady schedule.
	fmt.Fprintf(logw, "scale-leases: %d leases open in %v; settling for %v\n", count.Load(), res.Setup.Round(time.Second), ttl/3+time.Second)
	sleep(ctx, ttl/3+time.Second)
	cpu0, _ := proc.CPU(pid)
	self0, _ := proc.CPU(selfPID)
	t0 := time.Now()
	profiled := make(chan error, 1)
	if profile != "" {
		go func() { profiled <- sys.FetchProfiles(ctx, window, profile) }()
	} else {
		profiled <- nil
	}
	sleep(ctx, window)
	if err := <-profiled; err != nil {
		fmt.Fprintf(logw, "scale-leases: no profile: %v\n", err)
	}
	if profile != "" {
		if err := sys.FetchHeapProfile(ctx, profile+".heap.pprof"); err != nil {
			fmt.Fprintf(logw, "scale-leases: no heap profile: %v\n", err)
		}
	}
	cpu1, _ := proc.CPU(pid)
	self1, _ := proc.CPU(selfPID)
	res.Window = time.Since(t0)
	busy := cpu1 - cpu0
	res.ServerCPU = busy.Seconds() / res.Window.Seconds()
	res.BenchCPU = (self1 - self0).Seconds() / res.Window.Seconds()
	if kas := res.KeepalivesPerSec * res.Window.Seconds(); kas > 0 {
		res.CPUPerKeepalive = time.Duration(float64(busy) / kas)
	}
	res.RSS, _ = proc.RSS(pid)
	for _, ls := range held {
		for _, l := range ls {
			if l.Context().Err() != nil {
				res.Lost++
			}
		}
	}
	if int(count.Load()) < n && res.Failed == "" {
		res.Failed = fmt.Sprintf("only %d of %d leases opened (first error: %s)", count.Load(), n, res.FirstError)
	}
	return res
}

var selfPID = os.Getpid()

func dialAll(ctx context.Context, addr string, n int, ttl time.Duration) ([]*client.Client, error) {
	clients := make([]*client.Client, 0, n)
	for range n {
		c, err := client.Dial(ctx, addr, client.WithTTL(ttl))
		if err != nil {
			return clients, fmt.Errorf("dial: %w", err)
		}
		clients = append(clients, c)
	}
	return clients, nil
}

func closeAll(clients []*client.Client) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for _, c := range clients {
		wg.Go(func() { _ = c.Close(ctx) })
	}
	wg.Wait()
}

// forEach runs f for every client concurrently and returns the first error.
func forEach(ctx context.Context, clients []*client.Client, f func(int, *client.Client) error) error {
	var wg sync.WaitGroup
	errc := make(chan error, len(clients))
	for i, c := range clients {
		wg.Go(func() {
			if err := f(i, c); err != nil {
				errc <- err
			}
		})
	}
	wg.Wait()
	close(errc)
	return <-errc
}

// progress prints count every 5 s until the returned func is called.
func progress(w io.Writer, what string, count *atomic.Int64, total int64, start time.Time) func() {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(5 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				n := count.Load()
				fmt.Fprintf(w, "%s: %d/%d (%.0f/s)\n", what, n, total, float64(n)/time.Since(start).Seconds())
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

type errNote struct {
	mu    sync.Mutex
	n     int
	first string
}

func (e *errNote) note(err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.n == 0 {
		e.first = err.Error()
	}
	e.n++
}

func (e *errNote) get() (int, string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.n, e.first
}
