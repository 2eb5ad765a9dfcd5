package nemesis

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/internal/clienttrace"
)

// TestFailoverTime measures how long correctness locks are unavailable when the leader
// is killed: a client acquires and releases a correctness lock in a loop; each round
// kills the leader with SIGKILL and takes the time from the kill to the first grant
// acknowledged after it, then restarts the killed node and waits until the cluster is
// healthy. It prints, for every round, when after the kill the client first saw an
// attempt fail, when a survivor stood for election, when raft made the new leader, when
// that leader served, and when the first grant came; then p50, p90, p99 and the maximum
// (nearest rank: over 30 rounds p99 is the slowest). Run it with `make failover-bench`
// (it is skipped unless LEASEHOLD_FAILOVER_BENCH=1); LEASEHOLD_FAILOVER_ROUNDS sets the
// number of kills (default 30); LEASEHOLD_FAILOVER_LOGS names a directory to keep the
// nodes' logs in.
func TestFailoverTime(t *testing.T) {
	if os.Getenv("LEASEHOLD_FAILOVER_BENCH") != "1" {
		t.Skip("set LEASEHOLD_FAILOVER_BENCH=1 to measure failover (make failover-bench)")
	}
	rounds := 30
	if v := os.Getenv("LEASEHOLD_FAILOVER_ROUNDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("LEASEHOLD_FAILOVER_ROUNDS=%q: want a positive number", v)
		}
		rounds = n
	}
	c := NewCluster(t, netnsUnavailable() == "")
	ctx := context.Background()
	var fmu sync.Mutex
	var failures []attemptFailure // the client's failed attempts
	defer clienttrace.Watch(func(ctx context.Context, node string, err error) {
		now := time.Now()
		lc, inLock := ctx.Value(lockCallKey{}).(*lockCall)
		if inLock {
			lc.failed.Store(now.UnixNano())
		}
		fmu.Lock()
		failures = append(failures, attemptFailure{at: now, node: node, lock: inLock, err: err})
		fmu.Unlock()
	})()
	cl, err := client.Dial(ctx, c.Addrs())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cl.Close(context.Background()) }()

	var mu sync.Mutex
	var grants []*lockCall // the Lock calls that were granted
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			call := &lockCall{start: time.Now()}
			lctx, cancel := context.WithTimeout(context.WithValue(ctx, lockCallKey{}, call), 10*time.Second)
			l, err := cl.Lock(lctx, "failover/bench", client.Correctness, client.WaitFor(2*time.Second), client.LockTTL(3*time.Second))
			cancel()
			if err != nil {
				if !errors.Is(err, client.ErrUnavailable) && !errors.Is(err, client.ErrNotAcquired) && !errors.Is(err, context.DeadlineExceeded) {
					t.Logf("lock: %v", err)
				}
				time.Sleep(5 * time.Millisecond)
				continue
			}
			call.end = time.Now()
			mu.Lock()
			grants = append(grants, call)
			mu.Unlock()
			uctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_ = l.Unlock(uctx)
			cancel()
		}
	})
	defer func() { close(stop); wg.Wait() }()

	// firstGrant is the end of the first Lock call served after t0: begun after it, or
	// failed over after it (a call the old leader granted just before it died may return
	// after t0, the moment the test saw the process gone: it does not count).
	firstGrant := func(t0 time.Time) (time.Time, bool) {
		mu.Lock()
		defer mu.Unlock()
		for _, g := range grants {
			if g.end.After(t0) && (g.start.After(t0) || g.failed.Load() > t0.UnixNano()) {
				return g.end, true
			}
		}
		return time.Time{}, false
	}
	// failuresIn returns the client's failed attempts in (from, to].
	failuresIn := func(from, to time.Time) []attemptFailure {
		fmu.Lock()
		defer fmu.Unlock()
		var out []attemptFailure
		for _, f := range failures {
			if f.at.After(from) && !f.at.After(to) {
				out = append(out, f)
			}
		}
		return out
	}
	var samples []time.Duration
	redone := 0 // rounds not counted (at most 10)
	for round := 0; round < rounds; round++ {
		hctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		leader, err := c.WaitHealthy(hctx)
		cancel()
		if err != nil {
			t.Fatalf("round %d: cluster not healthy: %v", round, err)
		}
		// Let the loop get going on the healthy cluster first.
		warm := time.Now()
		for {
			if _, ok := firstGrant(warm); ok {
				break
			}
			if time.Since(warm) > time.Minute {
				t.Fatalf("round %d: no grant on a healthy cluster for a minute", round)
			}
			time.Sleep(10 * time.Millisecond)
		}
		L := c.Nodes[leader]
		if err := L.Kill9(); err != nil {
			t.Fatal(err)
		}
		// From the moment the old leader is gone: a grant it acknowledged just before
		// the signal landed, and the loop recorded a moment later, is not a failover.
		killed := time.Now()
		var got time.Time
		for {
			if g, ok := firstGrant(killed); ok {
				got = g
				break
			}
			if time.Since(killed) > 2*time.Minute {
				t.Fatalf("round %d: no grant within 2 minutes of killing the leader %s", round, L.ID)
			}
			time.Sleep(2 * time.Millisecond)
		}
		d := got.Sub(killed)
		b := failoverSteps{total: d}
		failed := failuresIn(killed, got)
		if len(failed) > 0 {
			b.noticed = failed[0].at.Sub(killed)
		}
		nctx, cancel := context.WithTimeout(ctx, time.Minute)
		next, err := c.WaitNewLeader(nctx, leader)
		cancel()
		if err == nil {
			b.read(c, leader, next, killed)
		}
		if err == nil && b.elected == 0 && redone < 10 {
			// No node became leader after the kill: the killed node had lost the
			// leadership just before (a loaded machine). Not a failover: again.
			t.Logf("round %2d: %s was no longer the leader when it was killed; not counted, once more", round+1, L.ID)
			round--
			redone++
		} else {
			samples = append(samples, d)
			t.Logf("round %2d: killed leader %s; %s", round+1, L.ID, b)
		}
		if b.ready > 0 && b.total-b.ready > 200*time.Millisecond {
			// The client took long after the leader served: say what its attempts met.
			for _, f := range failed {
				t.Logf("    +%v on %s (lock call %v): %v", f.at.Sub(killed).Round(time.Millisecond), f.node, f.lock, f.err)
			}
		}
		if err := L.Start(); err != nil {
			t.Fatal(err)
		}
	}
	if dir := os.Getenv("LEASEHOLD_FAILOVER_LOGS"); dir != "" {
		// Keep the nodes' logs (the cluster's directory goes when the test passes).
		for _, n := range c.Nodes {
			if b, err := os.ReadFile(n.Log); err == nil {
				_ = os.WriteFile(filepath.Join(dir, n.ID+".log"), b, 0o644)
			}
		}
	}
	sorted := slices.Clone(samples)
	slices.Sort(sorted)
	var parts []string
	for _, s := range samples {
		parts = append(parts, s.Round(time.Millisecond).String())
	}
	ms := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
	t.Logf("failover (kill -9 of the leader → first correctness grant), %d rounds: p50 %v, p90 %v, p99 %v, max %v, min %v\n  samples: %s",
		len(samples), ms(nearestRank(sorted, 50)), ms(nearestRank(sorted, 90)), ms(nearestRank(sorted, 99)),
		ms(sorted[len(sorted)-1]), ms(sorted[0]), strings.Join(parts, " "))
}

// lockCall is one Lock call of TestFailoverTime's loop: when it began and returned, and
// when an attempt of it last failed (Unix nanoseconds, 0: none), set by the client's
// trace through the call's context.
type lockCall struct {
	start, end time.Time
	failed     atomic.Int64
}

type lockCallKey struct{}

// attemptFailure is one failed attempt of TestFailoverTime's client: when, on which
// node, whether a Lock call of the loop made it (else the Unlock or a keepalive), why.
type attemptFailure struct {
	at   time.Time
	node string
	lock bool
	err  error
}

// nearestRank returns the p-th percentile of sorted (ascending, not empty) by nearest
// rank: the smallest sample with at least p% of the samples at or below it.
func nearestRank(sorted []time.Duration, p int) time.Duration {
	i := (p*len(sorted)+99)/100 - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// failoverSteps is one round of TestFailoverTime, each step as the time since the kill
// (0: not seen). noticed is the client's first failed attempt; candidate the first
// survivor to stand for election (its log); elected and ready the new leader's log lines
// (raft made it leader; it served); total the first grant.
type failoverSteps struct {
	noticed, candidate, elected, ready, total time.Duration
}

// Log lines of a node that mark the steps (substrings of the line).
const (
	logTimedOut = "heartbeat timeout reached, starting election" // raft's
	logStanding = "standing for election now"                    // replication's leaderWatch
	logElected  = "raft made this node leader"
	logReady    = "serving as leader"
)

// read takes the steps the servers logged after killed: the candidate from the
// survivors' logs, elected and ready from the new leader's.
func (b *failoverSteps) read(c *Cluster, dead, next int, killed time.Time) {
	for i, n := range c.Nodes {
		if i == dead {
			continue
		}
		for _, what := range []string{logTimedOut, logStanding} {
			if at, ok := logTimeAfter(n.Log, what, killed); ok && (b.candidate == 0 || at < b.candidate) {
				b.candidate = at
			}
		}
	}
	b.elected, _ = logTimeAfter(c.Nodes[next].Log, logElected, killed)
	b.ready, _ = logTimeAfter(c.Nodes[next].Log, logReady, killed)
}

func (b failoverSteps) String() string {
	f := func(d time.Duration) string {
		if d == 0 {
			return "?"
		}
		return d.Round(time.Millisecond).String()
	}
	return fmt.Sprintf("client noticed %s, candidate %s, elected %s, leader ready %s, first grant %s",
		f(b.noticed), f(b.candidate), f(b.elected), f(b.ready), f(b.total))
}

// logTimeAfter returns how long after t the first line of the log at path that contains
// what was written (by its slog time= field, which has milliseconds: t is truncated to
// them, so a line of the same millisecond counts, as 1 ms).
func logTimeAfter(path, what string, t time.Time) (time.Duration, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	from := t.Truncate(time.Millisecond)
	for line := range strings.Lines(string(b)) {
		if !strings.Contains(line, what) || !strings.HasPrefix(line, "time=") {
			continue
		}
		stamp, _, _ := strings.Cut(strings.TrimPrefix(line, "time="), " ")
		at, err := time.Parse(time.RFC3339Nano, stamp)
		if err != nil || at.Before(from) {
			continue
		}
		return max(at.Sub(t), time.Millisecond), true
	}
	return 0, false
}
