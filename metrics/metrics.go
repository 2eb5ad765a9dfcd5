// Package metrics holds a node's Prometheus registry, the one /metrics serves, and the
// series that the leader runtime and the replicated log feed: wait and hold times by
// class, expiry lateness, lease ends, releases and force releases, leadership changes,
// raft commit and fsync latency. Package server registers its own series (requests,
// keepalive failures, gauges) in the same registry. docs/OPERATIONS.md lists them all.
//
// Every series a request touches is looked up once, in New: an observation is a few
// atomic adds, with no label lookup and no allocation (BenchmarkObserve).
package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/leasehold/leasehold/core"
	"github.com/leasehold/leasehold/leader"
)

// Metrics are one node's metrics. It implements leader.Observer; Commit and Fsync are
// replication's hooks. The zero value is not usable: call New.
type Metrics struct {
	registry *prometheus.Registry

	// By core.Class (only Efficiency and Correctness are set), then leader.WaitOutcome.
	wait          [3][]prometheus.Observer
	hold          [3]prometheus.Observer
	released      [3]prometheus.Counter
	forceReleased [3]prometheus.Counter
	// leaseEnds by reason; leaseEnd caches its series by core.EndReason.
	leaseEnds *prometheus.CounterVec
	leaseEnd  [4]prometheus.Counter // by core.EndReason: unknown, expired, revoked, disconnected
	lateness  prometheus.Observer
	promoted  prometheus.Counter
	undone    prometheus.Counter
	commit    prometheus.Observer
	fsync     prometheus.Observer
}

var _ leader.Observer = (*Metrics)(nil)

// Bucket layouts. Wait times run from a free lock's grant (tens of µs) to an hour's
// wait; hold times from a millisecond to days (a forgotten lock is the case to see);
// lateness, commits and fsyncs from well under a millisecond to seconds.
var (
	waitBuckets    = prometheus.ExponentialBuckets(50e-6, 4, 14)  // 50 µs … 56 min
	holdBuckets    = prometheus.ExponentialBuckets(1e-3, 4, 16)   // 1 ms … 12 days
	latenessBucket = prometheus.ExponentialBuckets(250e-6, 2, 16) // 250 µs … 8 s
	diskBuckets    = prometheus.ExponentialBuckets(50e-6, 2, 16)  // 50 µs … 1.6 s
)

// classes are the classes series are kept for.
var classes = []core.Class{core.Efficiency, core.Correctness}

// leaseEndReasons are shown from the start, at zero until the first such end.
// "disconnected" is release on disconnect (G7).
var leaseEndReasons = []string{"expired", "revoked", "disconnected"}

// New returns a node's metrics, registered in a new registry (Registry).
func New() *Metrics {
	m := &Metrics{registry: prometheus.NewRegistry()}
	wait := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "leasehold_wait_seconds",
		Help:    "Acquires served by this leader, by class and outcome (granted, refused, timeout, cancelled, failed): time from the acquire's arrival at the leader to its grant or its end.",
		Buckets: waitBuckets,
	}, []string{"class", "outcome"})
	hold := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "leasehold_hold_seconds",
		Help:    "Holds that ended while this node led, by class: time from the grant to the release, force release or lease end, by the ledger's times (wall clock, milliseconds).",
		Buckets: holdBuckets,
	}, []string{"class"})
	released := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "leasehold_releases_total",
		Help: "Locks released by their holder while this node led, by class.",
	}, []string{"class"})
	forced := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "leasehold_force_releases_total",
		Help: "Locks taken from their holder by a force release while this node led, by class.",
	}, []string{"class"})
	m.leaseEnds = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "leasehold_lease_ends_total",
		Help: "Leases ended while this node led, by reason: expired, revoked (by the client), disconnected (release on disconnect).",
	}, []string{"reason"})
	lateness := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "leasehold_expiry_lateness_seconds",
		Help:    "Expiries this leader proposed: time from the lease's deadline to the apply of its Expire, on the leader's clock.",
		Buckets: latenessBucket,
	})
	promoted := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "leasehold_leader_changes_total",
		Help: "Times this node started serving as leader (summed over the nodes: the cluster's leader changes).",
	})
	undone := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "leasehold_acquires_undone_total",
		Help: "Correctness acquires and campaigns whose caller left before the answer (its deadline passed, its connection closed) and whose place in a queue, grant or leadership this leader took back.",
	})
	commit := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "leasehold_raft_commit_seconds",
		Help:    "Log entries this node proposed: time from handing the entry (one command or a batch) to raft to its apply.",
		Buckets: diskBuckets,
	})
	fsync := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "leasehold_wal_fsync_seconds",
		Help:    "fdatasync of the raft log's segment for each write (the wal log store only).",
		Buckets: diskBuckets,
	})
	for _, c := range classes {
		for _, o := range leader.WaitOutcomes {
			m.wait[c] = append(m.wait[c], wait.WithLabelValues(c.String(), o.String()))
		}
		m.hold[c] = hold.WithLabelValues(c.String())
		m.released[c] = released.WithLabelValues(c.String())
		m.forceReleased[c] = forced.WithLabelValues(c.String())
	}
	for _, r := range leaseEndReasons {
		m.leaseEnds.WithLabelValues(r)
	}
	for r := range m.leaseEnd {
		if name := core.EndReason(r).String(); name != core.EndUnknown.String() {
			m.leaseEnd[r] = m.leaseEnds.WithLabelValues(name)
		}
	}
	m.lateness, m.promoted, m.undone, m.commit, m.fsync = lateness, promoted, undone, commit, fsync
	m.registry.MustRegister(wait, hold, released, forced, m.leaseEnds, lateness, promoted, undone, commit, fsync)
	return m
}

// Registry returns the registry that holds every series; /metrics serves it.
func (m *Metrics) Registry() *prometheus.Registry { return m.registry }

// Waited implements leader.Observer.
func (m *Metrics) Waited(class core.Class, outcome leader.WaitOutcome, d time.Duration) {
	if int(class) < len(m.wait) && int(outcome) < len(m.wait[class]) {
		m.wait[class][outcome].Observe(d.Seconds())
	}
}

// Held implements leader.Observer.
func (m *Metrics) Held(class core.Class, d time.Duration) {
	if int(class) < len(m.hold) && m.hold[class] != nil {
		m.hold[class].Observe(d.Seconds())
	}
}

// Released implements leader.Observer.
func (m *Metrics) Released(class core.Class) { inc(m.released[:], class) }

// ForceReleased implements leader.Observer.
func (m *Metrics) ForceReleased(class core.Class) { inc(m.forceReleased[:], class) }

func inc(byClass []prometheus.Counter, class core.Class) {
	if int(class) < len(byClass) && byClass[class] != nil {
		byClass[class].Inc()
	}
}

// LeaseEnded implements leader.Observer.
func (m *Metrics) LeaseEnded(reason core.EndReason) {
	if int(reason) < len(m.leaseEnd) && m.leaseEnd[reason] != nil {
		m.leaseEnd[reason].Inc()
		return
	}
	m.leaseEnds.WithLabelValues(reason.String()).Inc()
}

// ExpiredLate implements leader.Observer.
func (m *Metrics) ExpiredLate(d time.Duration) { m.lateness.Observe(d.Seconds()) }

// Promoted implements leader.Observer.
func (m *Metrics) Promoted() { m.promoted.Inc() }

// Undone implements leader.Observer.
func (m *Metrics) Undone() { m.undone.Inc() }

// Commit observes one log entry's commit, from its hand-off to raft to its apply
// (replication.Config.ObserveCommit).
func (m *Metrics) Commit(d time.Duration) { m.commit.Observe(d.Seconds()) }

// Fsync observes one sync of the raft log (replication.Config.ObserveSync).
func (m *Metrics) Fsync(d time.Duration) { m.fsync.Observe(d.Seconds()) }
