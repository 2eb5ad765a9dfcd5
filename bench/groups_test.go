package bench

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/internal/clustertest"
)

// The simulation of docs/SCALING.md: several Raft groups in one process, lock names
// routed to groups by a hash of the name. Its defaults are a short smoke run (what
// `make test` runs); the numbers in docs/SCALING.md come from
//
//	cd bench && go test -count=1 -run TestGroupsSimulation -groups.g 1,2,4,8 -groups.window 3s
//
// (run without a package argument so the table reaches stdout).
var (
	simGroups  = flag.String("groups.g", "1,2", "TestGroupsSimulation: the numbers of groups to run, comma separated")
	simNodes   = flag.Int("groups.nodes", 1, "TestGroupsSimulation: nodes per group (1 or 3)")
	simWorkers = flag.Int("groups.workers", 8, "TestGroupsSimulation: workers, each doing acquire+release pairs")
	simLocks   = flag.Int("groups.locks", 256, "TestGroupsSimulation: lock names the workers pick from at random")
	simRounds  = flag.Int("groups.rounds", 1, "TestGroupsSimulation: how many times to run the whole sequence of -groups.g (the numbers of groups take turns)")
	simWindow  = flag.Duration("groups.window", 300*time.Millisecond, "TestGroupsSimulation: measured window per number of groups (after a warm-up of a third of it)")
)

// router maps a lock name to the group that owns it: each group owns one contiguous
// range of a 64-bit hash of the name, so splitting a group means moving a
// range, and every name lives in exactly one group. It is what a client would do with
// a cached group map (docs/SCALING.md), minus the map's version.
type router struct {
	// starts[i] is the first hash group i owns; group i owns up to starts[i+1]-1 (the
	// last group up to the top of the space). starts[0] is 0.
	starts []uint64
}

// newRouter splits the hash space into g equal ranges.
func newRouter(g int) router {
	r := router{starts: make([]uint64, g)}
	step := ^uint64(0)/uint64(g) + 1
	for i := range g {
		r.starts[i] = uint64(i) * step
	}
	return r
}

// nameHash is the first 8 bytes of the name's SHA-256: any well-mixed hash does (FNV-1a
// alone will not: it leaves the high bits of short names that differ in their last
// bytes, "sim/1" and "sim/2", nearly equal, and a range router reads the high bits).
func nameHash(name string) uint64 {
	sum := sha256.Sum256([]byte(name))
	return binary.BigEndian.Uint64(sum[:8])
}

// group returns the group that owns name.
func (r router) group(name string) int {
	h := nameHash(name)
	return sort.Search(len(r.starts), func(i int) bool { return r.starts[i] > h }) - 1
}

// TestRouter: every name maps to one group in range, the split of 4,096 names over
// equal ranges is roughly even, and splitting a range moves names only from the group
// that owned it, into the new group.
func TestRouter(t *testing.T) {
	for _, g := range []int{1, 2, 4, 8} {
		r := newRouter(g)
		count := make([]int, g)
		for i := range 4096 {
			gi := r.group(simName(i))
			if gi < 0 || gi >= g {
				t.Fatalf("G=%d: sim/%d → group %d", g, i, gi)
			}
			count[gi]++
		}
		for gi, n := range count {
			if n < 4096/g/2 || n > 4096/g*3/2 {
				t.Errorf("G=%d: group %d owns %d of 4,096 names, want about %d", g, gi, n, 4096/g)
			}
		}
	}
	// Split group 1 of 2 at the middle of its range into a new group 2.
	old := newRouter(2)
	split := router{starts: []uint64{old.starts[0], old.starts[1], old.starts[1] + (^uint64(0)-old.starts[1])/2}}
	for i := range 4096 {
		name := simName(i)
		before, after := old.group(name), split.group(name)
		if before != after && (before != 1 || after != 2) {
			t.Fatalf("%s moved from group %d to %d; a split of group 1 may move names only to group 2", name, before, after)
		}
	}
}

func simName(i int) string { return fmt.Sprintf("sim/%d", i) }

// simResult is one run of the simulation at one number of groups.
type simResult struct {
	groups, nodes, workers int
	pairs                  int64
	window                 time.Duration
	acquireP50, acquireP99 time.Duration
	// entries is how many raft log entries the groups committed in the window, all
	// groups together: pairs*2/entries is how many commands share an entry.
	entries uint64
	cpu     time.Duration
	// collisions counts token values handed out by more than one group in the run:
	// tokens of different groups are not comparable, only those of one lock are.
	collisions int
	// errors counts acquires and releases that failed (overload), over the whole run.
	errors     int64
	round      int
	loadBefore string
	loadAfter  string
}

// TestGroupsSimulation runs G groups (each a cluster of -groups.nodes nodes on the
// in-memory harness, each node with its own log on disk) for each G of -groups.g,
// routes lock names to groups by router, and drives -groups.workers workers doing
// correctness acquire+release pairs on names picked at random from -groups.locks. Each
// worker holds a lease in every group. It fails if any lock's token does not grow from
// one grant to the next (G1 per lock, which the router must not weaken), and prints
// pairs/s, acquire latency, commands per log entry and CPU per pair for every G.
func TestGroupsSimulation(t *testing.T) {
	var gs []int
	for _, s := range strings.Split(*simGroups, ",") {
		g, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || g < 1 {
			t.Fatalf("-groups.g: %q is not a number of groups", s)
		}
		gs = append(gs, g)
	}
	var results []simResult
	for round := range *simRounds {
		for _, g := range gs {
			t.Run(fmt.Sprintf("round=%d/G=%d", round+1, g), func(t *testing.T) {
				r := simulate(t, g, *simNodes, *simWorkers, *simLocks, *simWindow)
				r.round = round + 1
				results = append(results, r)
			})
		}
	}
	printSim(results)
}

// lockState is what the simulation remembers of one lock: the last token granted.
type lockState struct {
	mu   sync.Mutex
	last uint64
}

// granted records a grant of the lock under token, and fails if the token is not larger
// than the lock's last one (G1 per lock: the grants of one lock are serial, each
// acquire called after the release of the one before it returned).
func (st *lockState) granted(token uint64) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	if token <= st.last {
		return fmt.Errorf("token %d after %d; G1 wants it larger", token, st.last)
	}
	st.last = token
	return nil
}

// TestLockStateCatchesABackwardToken: the simulation's check fails on a token that does
// not grow, equal or smaller.
func TestLockStateCatchesABackwardToken(t *testing.T) {
	var st lockState
	for _, tok := range []uint64{1, 2, 7} {
		if err := st.granted(tok); err != nil {
			t.Fatalf("token %d: %v", tok, err)
		}
	}
	for _, tok := range []uint64{7, 3} {
		if st.granted(tok) == nil {
			t.Errorf("token %d after 7 passed the check", tok)
		}
	}
}

func simulate(t *testing.T, groups, nodes, workers, locks int, window time.Duration) simResult {
	res := simResult{groups: groups, nodes: nodes, workers: workers, window: window, loadBefore: loadAvg()}
	clusters := make([]*clustertest.Cluster, groups)
	leaders := make([]*clustertest.Node, groups)
	for g := range clusters {
		clusters[g] = clustertest.MakeCluster(t, nodes, clustertest.Options{})
		leaders[g] = clusters[g].Leader()
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// A lease per worker in every group: a lease lives in one group, like its locks.
	leases := make([][]string, workers)
	for w := range leases {
		for g := range groups {
			resp, err := leaders[g].Server().Grant(ctx, &leaseholdv1.GrantRequest{TtlMs: 60_000})
			if err != nil {
				t.Fatal(err)
			}
			leases[w] = append(leases[w], resp.GetLeaseId())
		}
	}
	r := newRouter(groups)
	names := make([]string, locks)
	state := make([]lockState, locks)
	for i := range names {
		names[i] = simName(i)
	}
	var (
		measuring atomic.Bool
		pairs     atomic.Int64
		failed    atomic.Bool
		wg        sync.WaitGroup
		tokensMu  sync.Mutex
		tokenOf   = map[uint64]int{} // token → group that granted it (or -1: several)
		perGroup  = make([]atomic.Int64, groups)
		errs      atomic.Int64
	)
	lat := make([][]time.Duration, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for ctx.Err() == nil && !failed.Load() {
				i := rng.IntN(locks)
				g := r.group(names[i])
				srv := leaders[g].Server()
				t0 := time.Now()
				acq, err := srv.Acquire(ctx, &leaseholdv1.AcquireRequest{
					Name: names[i], Class: leaseholdv1.LockClass_LOCK_CLASS_CORRECTNESS,
					LeaseId: leases[w][g], WaitMs: 10_000,
				})
				if ctx.Err() != nil {
					return
				}
				if err != nil {
					// Overload (raft's enqueue timeout, a wait that ran out) is counted,
					// not fatal: on a shared 2-core machine it happens.
					errs.Add(1)
					continue
				}
				d := time.Since(t0)
				if err := state[i].granted(acq.GetToken()); err != nil {
					t.Errorf("%s (group %d): %v", names[i], g, err)
					failed.Store(true)
				}
				tokensMu.Lock()
				if prev, ok := tokenOf[acq.GetToken()]; !ok {
					tokenOf[acq.GetToken()] = g
				} else if prev != g {
					tokenOf[acq.GetToken()] = -1
				}
				tokensMu.Unlock()
				perGroup[g].Add(1)
				// Release even after the window ends, so no lock stays held by a
				// worker that stopped.
				if !release(srv, &leaseholdv1.ReleaseRequest{Name: names[i], LeaseId: leases[w][g], Token: acq.GetToken()}) {
					errs.Add(1)
					continue
				}
				if measuring.Load() {
					pairs.Add(1)
					lat[w] = append(lat[w], d)
				}
			}
		}()
	}
	commits := func() (n uint64) {
		for _, l := range leaders {
			n += l.Raft().Status().CommitIndex
		}
		return n
	}
	time.Sleep(window / 3)
	c0, cpu0, t0 := commits(), cpuTime(), time.Now()
	measuring.Store(true)
	time.Sleep(window)
	measuring.Store(false)
	res.entries, res.cpu, res.window = commits()-c0, cpuTime()-cpu0, time.Since(t0)
	cancel()
	wg.Wait()
	res.pairs, res.errors = pairs.Load(), errs.Load()
	all := slices.Concat(lat...)
	slices.Sort(all)
	if len(all) > 0 {
		res.acquireP50 = all[len(all)/2]
		res.acquireP99 = all[min(len(all)-1, len(all)*99/100)]
	}
	for _, g := range tokenOf {
		if g == -1 {
			res.collisions++
		}
	}
	for g := range perGroup {
		if perGroup[g].Load() == 0 && !failed.Load() {
			t.Errorf("G=%d: group %d granted nothing; the router sends it no names", groups, g)
		}
	}
	res.loadAfter = loadAvg()
	return res
}

// release releases a grant, trying up to three times (an attempt can time out in
// raft's queue on an overloaded machine), and reports whether it succeeded.
func release(srv interface {
	Release(context.Context, *leaseholdv1.ReleaseRequest) (*leaseholdv1.ReleaseResponse, error)
}, req *leaseholdv1.ReleaseRequest) bool {
	for range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := srv.Release(ctx, req)
		cancel()
		if err == nil {
			return true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return false
}

// loadAvg returns the 1-minute load average.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Fields(string(b))[0]
}

func printSim(results []simResult) {
	if len(results) == 0 {
		return
	}
	fmt.Printf("\n%d workers, %d-node groups, correctness pairs on %d names, %v window per G\n\n", results[0].workers, results[0].nodes, *simLocks, results[0].window.Round(time.Millisecond))
	fmt.Println("| round | groups | pairs/s | acquire p50 | acquire p99 | commands per log entry | CPU per pair | tokens in >1 group | errors | load before → after |")
	fmt.Println("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
	for _, r := range results {
		perEntry, cpuPer := 0.0, time.Duration(0)
		if r.entries > 0 {
			perEntry = float64(2*r.pairs) / float64(r.entries)
		}
		if r.pairs > 0 {
			cpuPer = r.cpu / time.Duration(r.pairs)
		}
		fmt.Printf("| %d | %d | %.0f | %v | %v | %.1f | %v | %d | %d | %s → %s |\n", r.round, r.groups, float64(r.pairs)/r.window.Seconds(),
			r.acquireP50.Round(time.Microsecond), r.acquireP99.Round(time.Microsecond), perEntry, cpuPer.Round(time.Microsecond),
			r.collisions, r.errors, r.loadBefore, r.loadAfter)
	}
}
