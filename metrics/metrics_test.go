package metrics_test

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/api/leasehold/v1/leaseholdv1connect"
	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/core"
	"github.com/leasehold/leasehold/internal/clustertest"
	"github.com/leasehold/leasehold/internal/testnode"
	"github.com/leasehold/leasehold/leader"
	"github.com/leasehold/leasehold/metrics"
)

// ---- scraping -----------------------------------------------------------------------------

// scrape is one read of a node's /metrics.
type scrape map[string]*dto.MetricFamily

func scrapeOf(t *testing.T, addr string) scrape {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// value is the series of name whose labels include want ("k=v" each): a counter's or
// gauge's value, a histogram's count; -1 when there is no such series.
func (s scrape) value(name string, want ...string) float64 {
	f := s[name]
	if f == nil {
		return -1
	}
	for _, m := range f.GetMetric() {
		var have []string
		for _, lp := range m.GetLabel() {
			have = append(have, lp.GetName()+"="+lp.GetValue())
		}
		if !containsAll(have, want) {
			continue
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue()
		case m.Gauge != nil:
			return m.GetGauge().GetValue()
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount())
		}
	}
	return -1
}

func containsAll(have, want []string) bool {
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}

// series names one series: a metric and some of its labels.
type series struct {
	name   string
	labels []string
}

func (s series) String() string { return s.name + "{" + strings.Join(s.labels, ",") + "}" }

func (s series) in(sc scrape) float64 { return sc.value(s.name, s.labels...) }

// moved checks that every series grew from before to after.
func moved(t *testing.T, before, after scrape, what string, ss ...series) {
	t.Helper()
	for _, s := range ss {
		if b, a := s.in(before), s.in(after); a <= b || a < 0 {
			t.Errorf("%s: %v went from %v to %v, want it to grow", what, s, b, a)
		}
	}
}

// eventually waits until s in a fresh scrape of addr satisfies ok.
func eventually(t *testing.T, addr string, s series, ok func(float64) bool, what string) scrape {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		sc := scrapeOf(t, addr)
		if ok(s.in(sc)) {
			return sc
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v is %v after 10s", what, s, s.in(sc))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func positive(v float64) bool { return v > 0 }

// ---- the node's calls ---------------------------------------------------------------------

// api is a node's Connect API, as a client sees it (every call goes through the method
// table: metrics, error mapping).
type api struct {
	t      *testing.T
	leases leaseholdv1connect.LeaseServiceClient
	locks  leaseholdv1connect.LockServiceClient
}

func apiOf(t *testing.T, addr string) api {
	return api{t: t,
		leases: leaseholdv1connect.NewLeaseServiceClient(http.DefaultClient, "http://"+addr),
		locks:  leaseholdv1connect.NewLockServiceClient(http.DefaultClient, "http://"+addr),
	}
}

func (a api) grant(ttl time.Duration) string {
	a.t.Helper()
	resp, err := a.leases.Grant(context.Background(), &leaseholdv1.GrantRequest{TtlMs: ttl.Milliseconds()})
	if err != nil {
		a.t.Fatal(err)
	}
	return resp.GetLeaseId()
}

var (
	efficiency  = leaseholdv1.LockClass_LOCK_CLASS_EFFICIENCY
	correctness = leaseholdv1.LockClass_LOCK_CLASS_CORRECTNESS
)

func (a api) acquire(ctx context.Context, lease, name string, class leaseholdv1.LockClass, wait time.Duration) (uint64, error) {
	resp, err := a.locks.Acquire(ctx, &leaseholdv1.AcquireRequest{LeaseId: lease, Name: name, Class: class, WaitMs: wait.Milliseconds()})
	if err != nil {
		return 0, err
	}
	return resp.GetToken(), nil
}

func (a api) mustAcquire(lease, name string, class leaseholdv1.LockClass) uint64 {
	a.t.Helper()
	tok, err := a.acquire(context.Background(), lease, name, class, 0)
	if err != nil {
		a.t.Fatalf("acquire %s: %v", name, err)
	}
	return tok
}

func (a api) release(lease, name string, token uint64) {
	a.t.Helper()
	if _, err := a.locks.Release(context.Background(), &leaseholdv1.ReleaseRequest{LeaseId: lease, Name: name, Token: token}); err != nil {
		a.t.Fatalf("release %s: %v", name, err)
	}
}

// ---- the test -----------------------------------------------------------------------------

// TestEveryMetricMoves causes each event that a metric of OPERATIONS.md's table counts
// or times, and checks in /metrics that the metric moved: on one real node (raft log on
// disk, both transports), then, for leadership, on an in-memory three-node cluster whose
// leader is cut off.
func TestEveryMetricMoves(t *testing.T) {
	t.Run("node", func(t *testing.T) {
		n := testnode.Start(t)
		addr := n.Addr()
		a := apiOf(t, addr)
		before := scrapeOf(t, addr)
		if s := (series{"leasehold_lease_ends_total", []string{"reason=disconnected"}}); s.in(before) != 0 {
			// Release on disconnect feeds it (G7): shown from the start.
			t.Errorf("%v = %v, want it shown at 0", s, s.in(before))
		}

		holder, other := a.grant(time.Minute), a.grant(time.Minute)

		// A free lock of each class, granted and released.
		for _, class := range []leaseholdv1.LockClass{efficiency, correctness} {
			name := "m/free-" + className(class)
			a.release(holder, name, a.mustAcquire(holder, name, class))
		}
		// Held: a try-once refused, a wait that runs out, a wait the caller gives up,
		// and a wait granted when the holder releases — each while the waiters gauge
		// shows it.
		midWait := make(map[string]scrape) // by class
		for _, class := range []leaseholdv1.LockClass{efficiency, correctness} {
			name := "m/held-" + className(class)
			tok := a.mustAcquire(holder, name, class)
			if _, err := a.acquire(context.Background(), other, name, class, 0); connect.CodeOf(err) != connect.CodeDeadlineExceeded {
				t.Fatalf("try-once of a held lock: %v, want lock_held", err)
			}
			if _, err := a.acquire(context.Background(), other, name, class, 50*time.Millisecond); connect.CodeOf(err) != connect.CodeDeadlineExceeded {
				t.Fatalf("a wait for a held lock: %v, want lock_held", err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			gaveUp := make(chan error, 1)
			go func() { _, err := a.acquire(ctx, other, name, class, time.Minute); gaveUp <- err }()
			waiters := series{"leasehold_waiters", []string{"class=" + className(class)}}
			eventually(t, addr, waiters, positive, "a waiter queued")
			cancel()
			if err := <-gaveUp; !errors.Is(err, context.Canceled) {
				t.Fatalf("a cancelled wait: %v", err)
			}
			eventually(t, addr, waiters, func(v float64) bool { return v == 0 }, "the cancelled waiter gone")
			granted := make(chan uint64, 1)
			go func() {
				tok, err := a.acquire(context.Background(), other, name, class, time.Minute)
				if err != nil {
					t.Errorf("a wait for a lock its holder releases: %v", err)
				}
				granted <- tok
			}()
			midWait[className(class)] = eventually(t, addr, waiters, positive, "a waiter queued")
			a.release(holder, name, tok)
			a.release(other, name, <-granted)
		}
		// Force released, from a holder.
		for _, class := range []leaseholdv1.LockClass{efficiency, correctness} {
			name := "m/forced-" + className(class)
			a.mustAcquire(holder, name, class)
			if _, err := n.Server.ForceRelease(context.Background(), &leaseholdv1.ForceReleaseRequest{Name: name, Reason: "metrics test"}); err != nil {
				t.Fatal(err)
			}
		}
		// Revoked by its client, holding a lock.
		revoked := a.grant(time.Minute)
		a.mustAcquire(revoked, "m/revoked", correctness)
		if _, err := a.leases.Revoke(context.Background(), &leaseholdv1.RevokeRequest{LeaseId: revoked}); err != nil {
			t.Fatal(err)
		}
		// Expired, holding a lock of each class, and kept alive too late.
		expiring := a.grant(200 * time.Millisecond)
		a.mustAcquire(expiring, "m/expired-e", efficiency)
		a.mustAcquire(expiring, "m/expired-c", correctness)
		expired := series{"leasehold_lease_ends_total", []string{"reason=expired"}}
		eventually(t, addr, expired, func(v float64) bool { return v > expired.in(before) }, "the lease expired")
		if _, err := a.leases.KeepAlive(context.Background(), &leaseholdv1.KeepAliveRequest{LeaseId: expiring}); connect.CodeOf(err) != connect.CodeNotFound {
			t.Fatalf("a keepalive of an expired lease: %v, want NotFound", err)
		}
		// Disconnected (G7), holding a lock: bound to a Bind stream whose caller goes.
		bound := a.grant(time.Minute)
		a.mustAcquire(bound, "m/disconnected", correctness)
		bctx, unbind := context.WithCancel(context.Background())
		st, err := a.leases.Bind(bctx, &leaseholdv1.BindRequest{LeaseId: bound})
		if err != nil || !st.Receive() {
			t.Fatalf("Bind: %v %v", err, st.Err())
		}
		unbind()
		disconnected := series{"leasehold_lease_ends_total", []string{"reason=disconnected"}}
		eventually(t, addr, disconnected, func(v float64) bool { return v > disconnected.in(before) }, "the bound lease was revoked")
		// The fast lane, through the Go client.
		cl, err := client.Dial(context.Background(), addr)
		if err != nil {
			t.Fatal(err)
		}
		lk, err := cl.Lock(context.Background(), "m/fast", client.Efficiency)
		if err != nil {
			t.Fatal(err)
		}
		fastOpen := scrapeOf(t, addr)
		_ = lk.Unlock(context.Background())
		_ = cl.Close(context.Background())

		after := scrapeOf(t, addr)
		for _, class := range []string{"efficiency", "correctness"} {
			moved(t, before, after, class,
				series{"leasehold_wait_seconds", []string{"class=" + class, "outcome=granted"}},
				series{"leasehold_wait_seconds", []string{"class=" + class, "outcome=refused"}},
				series{"leasehold_wait_seconds", []string{"class=" + class, "outcome=timeout"}},
				series{"leasehold_wait_seconds", []string{"class=" + class, "outcome=cancelled"}},
				series{"leasehold_hold_seconds", []string{"class=" + class}},
				series{"leasehold_releases_total", []string{"class=" + class}},
				series{"leasehold_force_releases_total", []string{"class=" + class}},
			)
			moved(t, before, midWait[class], "while an acquire waits", series{"leasehold_waiters", []string{"class=" + class}})
		}
		moved(t, before, after, "node",
			series{"leasehold_lease_ends_total", []string{"reason=expired"}},
			series{"leasehold_lease_ends_total", []string{"reason=revoked"}},
			series{"leasehold_lease_ends_total", []string{"reason=disconnected"}},
			series{"leasehold_expiry_lateness_seconds", nil},
			series{"leasehold_keepalive_failures_total", []string{"reason=lease_expired"}},
			series{"leasehold_raft_commit_seconds", nil},
			series{"leasehold_wal_fsync_seconds", nil},
			series{"leasehold_requests_total", []string{"procedure=/leasehold.v1.LockService/Acquire", "code=ok"}},
			series{"leasehold_requests_total", []string{"procedure=/leasehold.v1.LockService/Acquire", "code=deadline_exceeded"}},
		)
		moved(t, before, fastOpen, "with the Go client connected", series{"leasehold_fast_lane_connections", nil})
		eventually(t, addr, series{"leasehold_fast_lane_connections", nil}, func(v float64) bool { return v == 0 }, "the client closed")
	})

	t.Run("leader change", func(t *testing.T) {
		c := clustertest.MakeCluster(t, 3, clustertest.Options{})
		L := c.Leader()
		others := c.Others(L)
		before := make(map[string]scrape)
		for _, o := range others {
			before[o.ID] = scrapeOf(t, o.Addr())
		}
		c.Partition(L)
		N := c.Leader(others...)
		moved(t, before[N.ID], scrapeOf(t, N.Addr()), "the new leader "+N.ID,
			series{"leasehold_leader_changes_total", nil},
			series{"leasehold_raft_term", nil},
		)
	})
}

func className(c leaseholdv1.LockClass) string {
	if c == efficiency {
		return core.Efficiency.String()
	}
	return core.Correctness.String()
}

// ---- cost ---------------------------------------------------------------------------------

// BenchmarkObserve is what metrics add to one acquire+release pair: the wait, the hold
// and the release.
func BenchmarkObserve(b *testing.B) {
	m := metrics.New()
	b.ReportAllocs()
	for b.Loop() {
		m.Waited(core.Efficiency, leader.WaitGranted, 30*time.Microsecond)
		m.Held(core.Efficiency, 2*time.Millisecond)
		m.Released(core.Efficiency)
	}
}

// TestObservations checks each observation lands in its series, and that none
// allocates.
func TestObservations(t *testing.T) {
	m := metrics.New()
	if n := testing.AllocsPerRun(100, func() {
		m.Waited(core.Correctness, leader.WaitTimedOut, time.Second)
		m.Held(core.Correctness, time.Second)
		m.Released(core.Correctness)
		m.ForceReleased(core.Efficiency)
		m.LeaseEnded(core.EndExpired)
		m.ExpiredLate(time.Millisecond)
		m.Commit(time.Millisecond)
		m.Fsync(time.Millisecond)
		m.Promoted()
	}); n != 0 {
		t.Errorf("observations allocate %v times", n)
	}
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	sc := make(scrape)
	for _, f := range fams {
		sc[f.GetName()] = f
	}
	for _, s := range []series{
		{"leasehold_wait_seconds", []string{"class=correctness", "outcome=timeout"}},
		{"leasehold_hold_seconds", []string{"class=correctness"}},
		{"leasehold_releases_total", []string{"class=correctness"}},
		{"leasehold_force_releases_total", []string{"class=efficiency"}},
		{"leasehold_lease_ends_total", []string{"reason=expired"}},
		{"leasehold_expiry_lateness_seconds", nil},
		{"leasehold_raft_commit_seconds", nil},
		{"leasehold_wal_fsync_seconds", nil},
		{"leasehold_leader_changes_total", nil},
	} {
		if got := s.in(sc); got != 101 { // AllocsPerRun runs once more to warm up
			t.Errorf("%v = %v, want 101", s, got)
		}
	}
	if s := (series{"leasehold_wait_seconds", []string{"class=correctness", "outcome=granted"}}); s.in(sc) != 0 {
		t.Errorf("%v = %v, want 0", s, s.in(sc))
	}
}
