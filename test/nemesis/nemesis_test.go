package nemesis

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The named faults. One runs at a time; the cluster is healed and healthy (three voters,
// an agreed leader, followers caught up) before the next one.
const (
	faultKillLeader      = "kill -9 leader"
	faultKillFollower    = "kill -9 follower"
	faultPauseLeader     = "SIGSTOP leader"
	faultPartitionLeader = "partition leader"
	faultRollingRestart  = "rolling restart"
)

var allFaults = []string{faultKillLeader, faultKillFollower, faultPauseLeader, faultPartitionLeader, faultRollingRestart}

// TestNemesisShort runs the workload against a three-node cluster for about 90 seconds
// while every fault kind strikes at least once, in a seeded order, then checks the
// history: linearizability of the KV store (porcupine) and the lock invariants.
func TestNemesisShort(t *testing.T) {
	if testing.Short() {
		t.Skip("the nemesis suite starts a real cluster and takes about two minutes; skipped with -short")
	}
	runNemesis(t, 90*time.Second)
}

// TestNemesisLong is `make nemesis`: the same for NEMESIS_DURATION (e.g. 10m).
func TestNemesisLong(t *testing.T) {
	d := os.Getenv("NEMESIS_DURATION")
	if d == "" {
		t.Skip("set NEMESIS_DURATION (e.g. 10m) to run the long nemesis run; make nemesis does")
	}
	dur, err := time.ParseDuration(d)
	if err != nil || dur <= 0 {
		t.Fatalf("NEMESIS_DURATION=%q: want a positive duration such as 10m", d)
	}
	runNemesis(t, dur)
}

// TestPartitionSupport says plainly whether partitions can be injected here: it skips
// (or, in CI, fails) when network namespaces are not usable, since then the nemesis runs
// lack their partition fault.
func TestPartitionSupport(t *testing.T) {
	if testing.Short() {
		t.Skip("skipped with -short")
	}
	if why := netnsUnavailable(); why != "" {
		if os.Getenv("CI") != "" {
			t.Fatalf("partition faults cannot run in CI: %s", why)
		}
		t.Skipf("partition faults are not possible here: %s (run as root with iproute2)", why)
	}
	lab, err := newNetLab(1)
	if err != nil {
		t.Fatalf("network namespaces look usable but building a lab failed: %v", err)
	}
	lab.Close()
}

// nemesisSeed returns NEMESIS_SEED, or a fresh seed from the clock.
func nemesisSeed(t *testing.T) uint64 {
	if s := os.Getenv("NEMESIS_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("NEMESIS_SEED=%q: %v", s, err)
		}
		return v
	}
	return uint64(time.Now().UnixNano())
}

type nemesis struct {
	t      *testing.T
	c      *Cluster
	h      *History
	rng    *rand.Rand
	faults map[string]int
	// problems are defects seen while injecting faults (a node that does not shut
	// down on SIGTERM); they fail the test after the checks.
	problems []string
}

func runNemesis(t *testing.T, duration time.Duration) {
	seed := nemesisSeed(t)
	repro := fmt.Sprintf("NEMESIS_SEED=%d go test -count=1 -v -run '^%s$' ./test/nemesis/", seed, t.Name())
	if t.Name() == "TestNemesisLong" {
		repro = fmt.Sprintf("NEMESIS_DURATION=%v %s", duration, repro)
	}
	t.Logf("nemesis seed %d — reproduce the fault schedule with:\n  %s", seed, repro)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("FAILED with nemesis seed %d — reproduce with:\n  %s", seed, repro)
		}
	})

	kinds := append([]string(nil), allFaults...)
	why := netnsUnavailable()
	if why != "" {
		if os.Getenv("CI") != "" {
			t.Fatalf("the partition fault needs network namespaces, which are unusable here: %s", why)
		}
		t.Logf("WARNING: no partition faults in this run: %s (see TestPartitionSupport)", why)
		kinds = kinds[:3]
		kinds = append(kinds, faultRollingRestart)
	}
	c := NewCluster(t, why == "")
	h := newHistory()
	n := &nemesis{t: t, c: c, h: h, rng: rand.New(rand.NewPCG(seed, 0x6e656d65)), faults: map[string]int{}}

	ctx := context.Background()
	wl, err := StartWorkload(ctx, strings.Split(c.Addrs(), ","), h, WorkloadConfig{Seed: seed})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := bounded("stopping the workload", 3*time.Minute, func() { wl.Stop(); wl.closeClients() }); err != nil {
			t.Error(err)
		}
	})
	h.event("workload started (%d clients)", len(wl.workers))

	// The schedule: every kind once in a seeded order, then seeded picks (each round a
	// fresh permutation) until the duration is used up.
	deadline := time.Now().Add(duration)
	var schedule []string
	for round := 0; ; round++ {
		perm := append([]string(nil), kinds...)
		n.rng.Shuffle(len(perm), func(i, j int) { perm[i], perm[j] = perm[j], perm[i] })
		for _, k := range perm {
			if round > 0 && time.Now().After(deadline) {
				break
			}
			schedule = append(schedule, k)
			n.steady()
			if err := n.inject(k); err != nil {
				t.Fatalf("fault %q: %v", k, err)
			}
		}
		if time.Now().After(deadline) {
			break
		}
	}
	n.steady()
	if err := bounded("stopping the workload", 3*time.Minute, wl.Stop); err != nil {
		t.Fatal(err)
	}
	h.event("workload stopped")
	hctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if _, err := c.WaitHealthy(hctx); err != nil {
		t.Fatalf("cluster not healthy at the end: %v", err)
	}
	var ferr error
	if err := bounded("the final reads", 5*time.Minute, func() { ferr = wl.Finish(hctx, c.Addrs()) }); err != nil {
		t.Fatal(err)
	}
	if ferr != nil {
		t.Fatal(ferr)
	}
	t.Logf("schedule: %s", strings.Join(schedule, ", "))

	dir := keepDir()
	r := Check(h, dir, 5*time.Minute)
	summary := Summary(h, r, seed, n.faults)
	t.Log("\n" + summary)
	if dir != "" {
		_ = os.WriteFile(dir+"/summary.txt", []byte(summary), 0o644)
	}
	for _, k := range kinds {
		if n.faults[k] == 0 {
			t.Errorf("fault %q never ran", k)
		}
	}
	for _, p := range n.problems {
		t.Errorf("during the faults: %s", p)
	}
	if len(r.Violations) > 0 {
		t.Errorf("%d violations (details above; artifacts in %s)", len(r.Violations), dir)
	} else if dir != "" {
		_ = os.RemoveAll(dir)
	}
}

// steady lets the workload run undisturbed for a few seconds.
func (n *nemesis) steady() {
	time.Sleep(time.Duration(2000+n.rng.IntN(2000)) * time.Millisecond)
}

// pause sleeps for a fault's own length (between lo and hi): this is the fault, not a
// wait for a condition.
func (n *nemesis) pause(lo, hi time.Duration) {
	time.Sleep(lo + time.Duration(n.rng.Int64N(int64(hi-lo)+1)))
}

func (n *nemesis) healthy() (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	t0 := time.Now()
	l, err := n.c.WaitHealthy(ctx)
	if err != nil {
		return -1, fmt.Errorf("cluster did not heal: %w", err)
	}
	n.h.event("healthy: leader %s (%v to heal)", n.c.Nodes[l].ID, time.Since(t0).Round(time.Millisecond))
	return l, nil
}

func (n *nemesis) newLeader(old int) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	t0 := time.Now()
	if l, err := n.c.WaitNewLeader(ctx, old); err == nil {
		n.h.event("  new leader %s (%v after the fault)", n.c.Nodes[l].ID, time.Since(t0).Round(time.Millisecond))
	} else {
		n.h.event("  no new leader within 30s: %v", err)
	}
}

// inject runs one fault and waits until the cluster is healthy again.
func (n *nemesis) inject(kind string) error {
	leader, err := n.healthy()
	if err != nil {
		return err
	}
	n.faults[kind]++
	L := n.c.Nodes[leader]
	switch kind {
	case faultKillLeader:
		n.h.event("kill -9 %s (leader)", L.ID)
		if err := L.Kill9(); err != nil {
			return err
		}
		n.newLeader(leader)
		n.pause(500*time.Millisecond, 3*time.Second)
		n.h.event("restart %s", L.ID)
		if err := L.Start(); err != nil {
			return err
		}
	case faultKillFollower:
		f := n.c.Nodes[(leader+1+n.rng.IntN(2))%3]
		n.h.event("kill -9 %s (follower)", f.ID)
		if err := f.Kill9(); err != nil {
			return err
		}
		n.pause(time.Second, 3*time.Second)
		n.h.event("restart %s", f.ID)
		if err := f.Start(); err != nil {
			return err
		}
	case faultPauseLeader:
		n.h.event("SIGSTOP %s (leader)", L.ID)
		if err := L.Stop(); err != nil {
			return err
		}
		n.pause(2500*time.Millisecond, 4*time.Second)
		n.h.event("SIGCONT %s", L.ID)
		if err := L.Cont(); err != nil {
			return err
		}
	case faultPartitionLeader:
		full := !n.c.lab.nft || n.rng.IntN(2) == 0
		how := "from its peers only (clients still reach it)"
		if full {
			how = "from everyone"
		}
		n.h.event("isolate %s (leader) %s", L.ID, how)
		if err := n.c.Isolate(leader, full); err != nil {
			return err
		}
		n.newLeader(leader)
		n.pause(time.Second, 3*time.Second)
		n.h.event("heal %s", L.ID)
		if err := n.c.Heal(leader); err != nil {
			return err
		}
	case faultRollingRestart:
		for _, i := range n.rng.Perm(3) {
			nd := n.c.Nodes[i]
			n.h.event("rolling restart: SIGTERM %s", nd.ID)
			if err := nd.Term(); err != nil {
				if !errors.Is(err, errShutdownHang) {
					return err
				}
				// A product defect, not a harness failure: record it and carry on.
				n.h.event("  %v", err)
				n.problems = append(n.problems, err.Error())
			}
			_, exitErr := nd.current().Exited()
			n.h.event("  %s exited (%v); restart", nd.ID, exitErr)
			if err := nd.Start(); err != nil {
				return err
			}
			if _, err := n.healthy(); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("unknown fault %q", kind)
	}
	_, err = n.healthy()
	return err
}
