package client_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/internal/clustertest"
)

// partitionLog records what the handlers of a group's members did, and fails the test
// when two handlers run for one partition at once or an epoch does not grow.
type partitionLog struct {
	t       *testing.T
	mu      sync.Mutex
	running map[int]string // partition → member whose handler runs
	epoch   map[int]uint64
	owner   map[int]string // the last member to start on it
	causes  map[string]int
}

func newPartitionLog(t *testing.T) *partitionLog {
	return &partitionLog{t: t, running: map[int]string{}, epoch: map[int]uint64{}, owner: map[int]string{}, causes: map[string]int{}}
}

func (l *partitionLog) handler(member string) func(context.Context, client.Partition) {
	return func(ctx context.Context, p client.Partition) {
		l.mu.Lock()
		if other, ok := l.running[p.Number]; ok {
			l.t.Errorf("partition %d: %s starts at epoch %d while %s runs: two owners", p.Number, member, p.Epoch, other)
		}
		if p.Epoch <= l.epoch[p.Number] {
			l.t.Errorf("partition %d: epoch %d after %d", p.Number, p.Epoch, l.epoch[p.Number])
		}
		l.running[p.Number], l.epoch[p.Number], l.owner[p.Number] = member, p.Epoch, member
		l.mu.Unlock()
		<-ctx.Done()
		l.mu.Lock()
		delete(l.running, p.Number)
		cause := context.Cause(ctx)
		for _, c := range []error{client.ErrPartitionMoving, client.ErrPartitionMoved, client.ErrLeftGroup, client.ErrPartitionDeadline} {
			if errors.Is(cause, c) {
				l.causes[c.Error()]++
			}
		}
		l.mu.Unlock()
	}
}

// owners returns how many partitions each member runs now.
func (l *partitionLog) owners() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]int{}
	for _, m := range l.running {
		out[m]++
	}
	return out
}

func waitUntil(t *testing.T, what string, within time.Duration, ok func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !ok() {
		if time.Since(start) > within {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Since(start)
}

// TestJoinGroup: one member runs every partition; a second member's join moves some of
// them — each handler of the first stops (ErrPartitionMoving) before the second's
// starts, at a larger epoch —; when the first leaves (its JoinGroup's context ends, and
// it returns nil), the second runs them all. No partition ever runs twice at once.
func TestJoinGroup(t *testing.T) {
	addr, c, ctx := startClient(t)
	defer c.Close(ctx)
	const parts = 16
	if err := c.CreateGroup(ctx, "jobs", parts, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := c.CreateGroup(ctx, "jobs", parts, 2*time.Second); err != nil {
		t.Fatalf("a repeated create: %v", err)
	}
	log := newPartitionLog(t)
	actx, stopA := context.WithCancel(ctx)
	aDone := make(chan error, 1)
	go func() { aDone <- c.JoinGroup(actx, "jobs", "a", log.handler("a")) }()
	waitUntil(t, "a runs every partition", 5*time.Second, func() bool { return log.owners()["a"] == parts })

	c2, err := client.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close(ctx)
	bctx, stopB := context.WithCancel(ctx)
	defer stopB()
	bDone := make(chan error, 1)
	go func() { bDone <- c2.JoinGroup(bctx, "jobs", "b", log.handler("b"), client.WithWeight(2)) }()
	took := waitUntil(t, "b runs some partitions", 5*time.Second, func() bool {
		o := log.owners()
		return o["b"] > 0 && o["a"]+o["b"] == parts
	})
	t.Logf("planned move on join: b ran its partitions %v after joining", took)

	st, err := c.GroupStatus(ctx, "jobs")
	if err != nil || len(st.GetMembers()) != 2 {
		t.Fatalf("status: %v %v", st, err)
	}
	left := time.Now()
	stopA()
	if err := <-aDone; err != nil {
		t.Fatalf("JoinGroup of a returned %v", err)
	}
	waitUntil(t, "b runs every partition", 5*time.Second, func() bool { return log.owners()["b"] == parts })
	t.Logf("hand-over after a planned leave: %v", time.Since(left))
	log.mu.Lock()
	if log.causes[client.ErrPartitionMoving.Error()] == 0 || log.causes[client.ErrLeftGroup.Error()] == 0 {
		t.Errorf("causes: %v", log.causes)
	}
	log.mu.Unlock()
	if _, err := c.GroupStatus(ctx, "nope"); !errors.Is(err, client.ErrGroupUnknown) {
		t.Fatalf("status of an unknown group: %v", err)
	}
	if err := c.JoinGroup(ctx, "nope", "a", log.handler("a")); !errors.Is(err, client.ErrGroupUnknown) {
		t.Fatalf("join of an unknown group: %v", err)
	}
	stopB()
	if err := <-bDone; err != nil {
		t.Fatal(err)
	}
}

// TestJoinGroupAcrossLeaderChange: two members of a group on a three-node cluster keep
// running every partition through the leader's death (their leases, drains and streams
// move to the new leader) without ever running one partition twice at once, and a leave
// after the failover still hands the partitions over.
func TestJoinGroupAcrossLeaderChange(t *testing.T) {
	cl := clustertest.MakeCluster(t, 3, clustertest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dial := func() *client.Client {
		c, err := client.Dial(ctx, cl.Addrs(), client.WithTTL(3*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close(context.Background()) })
		return c
	}
	ca, cb := dial(), dial()
	const parts = 8
	if err := ca.CreateGroup(ctx, "lc", parts, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	log := newPartitionLog(t)
	actx, stopA := context.WithCancel(ctx)
	defer stopA()
	bctx, stopB := context.WithCancel(ctx)
	defer stopB()
	aDone, bDone := make(chan error, 1), make(chan error, 1)
	go func() { aDone <- ca.JoinGroup(actx, "lc", "a", log.handler("a")) }()
	go func() { bDone <- cb.JoinGroup(bctx, "lc", "b", log.handler("b")) }()
	running := func() bool {
		o := log.owners()
		return o["a"]+o["b"] == parts && o["a"] > 0 && o["b"] > 0
	}
	waitUntil(t, "both members run the partitions", 10*time.Second, running)

	cl.Kill(cl.Leader())
	cl.Leader(cl.Others()...)
	time.Sleep(3 * time.Second) // past a TTL and a drain deadline on the new leader
	waitUntil(t, "every partition runs after the failover", 10*time.Second, func() bool {
		o := log.owners()
		return o["a"]+o["b"] == parts
	})
	stopB()
	if err := <-bDone; err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "a runs every partition after b left", 10*time.Second, func() bool { return log.owners()["a"] == parts })
	log.mu.Lock()
	t.Logf("causes of stopped handlers: %v", log.causes)
	log.mu.Unlock()
}

// A partition that comes back to a member at a new epoch while the member's handler of
// its old epoch is still winding down (slower than the drain deadline) starts again only
// once that handler has returned: JoinGroup never runs two handlers of one partition at
// once. Here member b joins, the partitions drain away from a, and b leaves before the
// deadline: they return to a at new epochs while a's old handlers still run.
func TestJoinGroupWaitsForTheOldHandlerOfAPartition(t *testing.T) {
	addr, c, ctx := startClient(t)
	defer c.Close(ctx)
	const parts = 8
	const drain = 500 * time.Millisecond
	if err := c.CreateGroup(ctx, "slow", parts, drain); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	running := map[int]int{}
	overlaps, started, restarted := 0, 0, 0
	handler := func(hctx context.Context, p client.Partition) {
		mu.Lock()
		started++
		if started > parts {
			restarted++
		}
		running[p.Number]++
		if running[p.Number] > 1 {
			overlaps++
			t.Errorf("partition %d: a handler at epoch %d started while %d other(s) still run", p.Number, p.Epoch, running[p.Number]-1)
		}
		mu.Unlock()
		<-hctx.Done()
		time.Sleep(3 * drain) // winding down: longer than the drain deadline
		mu.Lock()
		running[p.Number]--
		mu.Unlock()
	}
	actx, stopA := context.WithCancel(ctx)
	aDone := make(chan error, 1)
	go func() { aDone <- c.JoinGroup(actx, "slow", "a", handler) }()
	defer func() {
		stopA()
		if err := <-aDone; err != nil {
			t.Errorf("JoinGroup of a: %v", err)
		}
	}()
	waitUntil(t, "a runs every partition", 5*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return started == parts
	})
	c2, err := client.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close(ctx)
	bctx, stopB := context.WithCancel(ctx)
	bDone := make(chan error, 1)
	go func() {
		bDone <- c2.JoinGroup(bctx, "slow", "b", func(ctx context.Context, p client.Partition) { <-ctx.Done() }, client.WithWeight(1000))
	}()
	waitUntil(t, "some partitions drain", 2*time.Second, func() bool {
		st, err := c.GroupStatus(ctx, "slow")
		if err != nil {
			return false
		}
		for _, p := range st.GetPartitions() {
			if p.GetDraining() {
				return true
			}
		}
		return false
	})
	stopB() // b leaves before the drain deadline: the hash names a again
	if err := <-bDone; err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "a runs its partitions again", 10*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return restarted > 0
	})
	time.Sleep(4 * drain) // the other partitions' returns
	mu.Lock()
	defer mu.Unlock()
	if overlaps > 0 {
		t.Errorf("%d times JoinGroup ran two handlers of one partition at once", overlaps)
	}
}
