package server_test

// Leader changes on an in-memory cluster (internal/clustertest): no root, no network
// namespaces. Requests go straight to one node's handlers, so the test decides which
// node answers.

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/internal/clustertest"
)

const (
	correctness = leaseholdv1.LockClass_LOCK_CLASS_CORRECTNESS
	efficiency  = leaseholdv1.LockClass_LOCK_CLASS_EFFICIENCY
)

// on is one node's handlers, with a bounded context per call.
type on struct {
	t *testing.T
	n *clustertest.Node
}

func at(t *testing.T, n *clustertest.Node) on { return on{t, n} }

func (o on) ctx(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d)
}

func (o on) grant(ttl time.Duration) string {
	o.t.Helper()
	ctx, cancel := o.ctx(10 * time.Second)
	defer cancel()
	resp, err := o.n.Server().Grant(ctx, &leaseholdv1.GrantRequest{TtlMs: ttl.Milliseconds()})
	if err != nil {
		o.t.Fatalf("grant through %s: %v", o.n.ID, err)
	}
	return resp.GetLeaseId()
}

func (o on) acquire(lease, name string, class leaseholdv1.LockClass) uint64 {
	o.t.Helper()
	ctx, cancel := o.ctx(10 * time.Second)
	defer cancel()
	resp, err := o.n.Server().Acquire(ctx, &leaseholdv1.AcquireRequest{Name: name, Class: class, LeaseId: lease})
	if err != nil {
		o.t.Fatalf("acquire %s through %s: %v", name, o.n.ID, err)
	}
	return resp.GetToken()
}

func (o on) keepAlive(lease string, d time.Duration) error {
	ctx, cancel := o.ctx(d)
	defer cancel()
	_, err := o.n.Server().KeepAlive(ctx, &leaseholdv1.KeepAliveRequest{LeaseId: lease})
	return err
}

// describe returns the lock as the node shows it (reads do not renew the lease).
func (o on) describe(name string) *leaseholdv1.LockInfo {
	o.t.Helper()
	ctx, cancel := o.ctx(5 * time.Second)
	defer cancel()
	resp, err := o.n.Server().Describe(ctx, &leaseholdv1.DescribeRequest{Name: name})
	if err != nil {
		o.t.Fatalf("describe %s through %s: %v", name, o.n.ID, err)
	}
	return resp.GetLock()
}

// heldUntil fails the test if name is not held under token at any moment until until.
func (o on) heldUntil(name string, token uint64, until time.Time, why string) {
	o.t.Helper()
	for {
		lk := o.describe(name)
		if !lk.GetHeld() || lk.GetToken() != token {
			o.t.Fatalf("%s: %s shows %s held=%v token=%d before it should end (%v left): %s",
				o.t.Name(), o.n.ID, name, lk.GetHeld(), lk.GetToken(), time.Until(until).Round(time.Millisecond), why)
		}
		if time.Now().After(until) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestKeepAliveToCutOffLeader is test/nemesis TestDeposedLeaderKeepAlive without root:
// a lease holds a lock through the leader L; L is cut off from the others until they
// elect N; all along, keepalives go to L. None may be acknowledged unless N honours it
// (G4: no lease expires sooner than its TTL after the last keepalive the service
// acknowledged). Two ways of being cut off:
//
//   - partitioned: L steps down by itself once its raft lease runs out;
//   - deposed: L goes on believing it leads — its followers' stale "yes" to a heartbeat
//     is what a leader woken from a pause reads (clustertest.Depose) — so only the
//     confirmation through the log after the keepalive arrived keeps L from answering.
//     Without that confirmation L acknowledges every keepalive and N, which restarted
//     the countdown when it took over, expires the lease TTL after that, before TTL
//     after L's acknowledgments.
//
// Each case runs with the keepalives through the server's handler and through the fast
// lane, whose reader renews and leaves the answer to the next confirmation round
// (Server.keepAliveThen).
func TestKeepAliveToCutOffLeader(t *testing.T) {
	for _, tc := range []struct {
		name     string
		depose   bool
		fastLane bool
	}{{"partitioned", false, false}, {"deposed", true, false}, {"partitioned/fast-lane", false, true}, {"deposed/fast-lane", true, true}} {
		t.Run(tc.name, func(t *testing.T) {
			c := clustertest.MakeCluster(t, 3, clustertest.Options{})
			L := c.Leader()
			const ttl = 2 * time.Second
			lease := at(t, L).grant(ttl)
			token := at(t, L).acquire(lease, "cutoff/lock", correctness)
			keepAlive := func() error { return at(t, L).keepAlive(lease, 200*time.Millisecond) }
			if tc.fastLane {
				ln := dialLane(t, L.FastLaneAddr())
				keepAlive = func() error { return ln.keepAlive(lease, 200*time.Millisecond) }
			}
			if tc.depose {
				c.Depose(L)
			} else {
				c.Partition(L)
			}
			// Keepalives go to L from the cut on, as a client that has not noticed sends
			// them, until well after N took over (a quarter of the TTL: N's countdown then
			// ends visibly sooner than TTL after an acknowledgment from L).
			var mu sync.Mutex
			var lastAck time.Time // when the last keepalive L acknowledged was sent
			acked, refused := 0, 0
			done := make(chan struct{})
			var elected time.Time
			var wg sync.WaitGroup
			wg.Go(func() {
				for {
					select {
					case <-done:
						return
					default:
					}
					sent := time.Now()
					err := keepAlive()
					mu.Lock()
					if err == nil {
						acked++
						lastAck = sent
					} else {
						refused++
					}
					mu.Unlock()
					time.Sleep(10 * time.Millisecond)
				}
			})
			N := c.Leader(c.Others(L)...)
			elected = time.Now()
			time.Sleep(ttl / 4)
			stillLeads := L.Leader().Active()
			close(done)
			wg.Wait()
			if tc.depose && !stillLeads {
				t.Fatalf("the deposed %s stopped serving as leader: the case is not exercised", L.ID)
			}
			mu.Lock()
			defer mu.Unlock()
			t.Logf("%s cut off; %s elected; %d keepalives to %s acknowledged, %d refused", L.ID, N.ID, acked, L.ID, refused)
			if acked == 0 {
				return
			}
			// L acknowledged keepalives: the service must honour the last one.
			at(t, N).heldUntil("cutoff/lock", token, lastAck.Add(ttl-50*time.Millisecond),
				fmt.Sprintf("G4 violated: %s acknowledged a keepalive sent %v after %s took over; the lease must live TTL (%v) after it",
					L.ID, lastAck.Sub(elected).Round(time.Millisecond), N.ID, ttl))
		})
	}
}

// TestNewLeaderRestartsCountdowns: a lease left without keepalives for half its TTL,
// when its leader dies, lives a full TTL from the moment the new leader takes over
// (G4), and then expires there.
func TestNewLeaderRestartsCountdowns(t *testing.T) {
	c := clustertest.MakeCluster(t, 3, clustertest.Options{})
	L := c.Leader()
	const ttl = 1500 * time.Millisecond
	granted := time.Now()
	lease := at(t, L).grant(ttl)
	token := at(t, L).acquire(lease, "countdown/lock", correctness)
	time.Sleep(ttl / 2)
	killed := time.Now()
	c.Kill(L)
	N := c.Leader(c.Others(L)...)
	// N took over after the kill, so its countdown ends TTL after that at the earliest,
	// well after the old leader's would have (granted + TTL).
	if left := time.Duration(at(t, N).describe("countdown/lock").GetTtlRemainingMs()) * time.Millisecond; left < ttl-time.Since(killed)-10*time.Millisecond {
		t.Fatalf("%s shows %v left just after taking over, want about the full TTL %v", N.ID, left, ttl)
	}
	at(t, N).heldUntil("countdown/lock", token, granted.Add(ttl+ttl/4), "a new leader restarts every countdown at full TTL")
	waitFor(t, func() bool { return !at(t, N).describe("countdown/lock").GetHeld() }, "the lease to expire on the new leader")
}

// TestLockKeepsItsTokenOnNewLeader: a correctness lock granted before its leader is cut
// off is held on the new leader under the same token, its lease is kept alive there,
// acquiring it again with the same lease returns the same grant, and a lock granted by
// the new leader gets a larger token.
func TestLockKeepsItsTokenOnNewLeader(t *testing.T) {
	c := clustertest.MakeCluster(t, 3, clustertest.Options{})
	L := c.Leader()
	lease := at(t, L).grant(5 * time.Second)
	token := at(t, L).acquire(lease, "keep/lock", correctness)
	c.Partition(L)
	N := c.Leader(c.Others(L)...)
	if lk := at(t, N).describe("keep/lock"); !lk.GetHeld() || lk.GetToken() != token {
		t.Fatalf("%s shows keep/lock as held=%v token %d, want held under %d", N.ID, lk.GetHeld(), lk.GetToken(), token)
	}
	if err := at(t, N).keepAlive(lease, 5*time.Second); err != nil {
		t.Fatalf("keepalive through the new leader %s: %v", N.ID, err)
	}
	if again := at(t, N).acquire(lease, "keep/lock", correctness); again != token {
		t.Fatalf("acquiring keep/lock again with its lease on %s: token %d, want the grant's %d", N.ID, again, token)
	}
	if other := at(t, N).acquire(lease, "keep/other", correctness); other <= token {
		t.Fatalf("a lock granted by the new leader got token %d, not above %d", other, token)
	}
	c.Heal()
}

// TestTokensRiseAcrossLeaderChanges: over several leader changes (a kill and restart,
// a partition and heal), every correctness and efficiency grant carries a larger token
// than every grant before it (G1).
func TestTokensRiseAcrossLeaderChanges(t *testing.T) {
	c := clustertest.MakeCluster(t, 3, clustertest.Options{})
	var last uint64
	for round := range 4 {
		L := c.Leader()
		lease := at(t, L).grant(10 * time.Second)
		for _, class := range []leaseholdv1.LockClass{correctness, efficiency, correctness} {
			name := fmt.Sprintf("rise/%d-%v-%d", round, class, last)
			tok := at(t, L).acquire(lease, name, class)
			if tok <= last {
				t.Fatalf("round %d on %s: %v grant of %s got token %d after %d", round, L.ID, class, name, tok, last)
			}
			last = tok
		}
		if round%2 == 0 {
			c.Kill(L)
			c.Leader(c.Others(L)...)
			c.Restart(L)
		} else {
			c.Partition(L)
			c.Leader(c.Others(L)...)
			c.Heal()
		}
	}
}
