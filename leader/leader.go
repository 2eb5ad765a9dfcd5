// Package leader holds what only the leader does: it counts every lease down on the
// monotonic clock and proposes the expiry through the log when one runs out, confirms
// with a quorum that it still leads before it acknowledges a keepalive (G4), keeps the
// efficiency locks in memory, decides which class a name is in use as, wakes queued
// acquires when their grant is applied, and ends lock-delays.
//
// Followers keep no countdowns; a leader that is deposed stops counting at once, and a
// new leader restarts every lease's countdown at its full TTL (guarantee G4: no lease ever
// expires sooner than its TTL after the last keepalive the server acknowledged). Expiry
// is a replicated command, so a deposed leader that has not noticed yet cannot expire
// anything: its proposal fails.
//
// One concern per file: lifecycle.go (Run, Promote, Demote), effects.go (acting on
// applied commands), leases.go (Grant, KeepAlive and its leadership confirmation,
// Revoke), countdown.go (lease countdowns, the expiry loop), acquire.go, class.go (the
// one place that decides a name's class), efficiency.go (the in-memory table),
// tokens.go (its token blocks), ledger.go (its ledger), waits.go (queued acquires), undo.go (what a caller that left is owed back), release.go (Release,
// ForceRelease), delay.go (lock-delays), groups.go (partition drains), views.go (Describe, List, CheckToken, Stats),
// observe.go (what it measures for metrics: waits, holds, expiry lateness).
//
// Lock order: Leader.mu guards everything except the registry of waiting acquires
// (waits.mu), a leaf: it may be taken with Leader.mu held, and nothing is taken under
// it. Leader.mu may be held while reading the replicated state (Log.Read); it is never
// held while proposing (Log.Apply, Log.ApplyThen) or confirming leadership
// (Log.VerifyLeader), because applying a command calls OnEffects, which takes Leader.mu,
// and an ApplyThen callback may run on the proposer's goroutine.
package leader

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/leasehold/leasehold/core"
	"github.com/leasehold/leasehold/watch"
)

// Log is the replicated log the leader proposes to. replication.Node implements it.
//
// The leader needs no error of the log's package. Errors of Apply and ApplyThen pass
// through to the callers of Leader (wrapped at most), and a failed VerifyLeader becomes
// ErrNotLeader wrapping the log's error: a node that cannot confirm it leads must not
// answer as leader, whatever the reason. Context errors pass through unchanged.
type Log interface {
	// Apply proposes cmd and returns its result once committed and applied.
	Apply(ctx context.Context, cmd core.Command) (core.Result, error)
	// ApplyThen proposes cmd and returns; then gets what Apply would have returned
	// (without a context's error), once, and must not block.
	ApplyThen(cmd core.Command, then func(core.Result, error))
	// Read calls fn with the applied state under a read lock.
	Read(fn func(*core.State))
	// Barrier waits until every committed entry has been applied.
	Barrier(ctx context.Context) error
	// VerifyLeader returns nil only when a quorum confirmed, in a round that began after
	// the call, that this node still leads: no newer leader had been elected by then.
	// Otherwise it returns an error (ctx's own when ctx ended first).
	VerifyLeader(ctx context.Context) error
	// VerifyLeaderThen is VerifyLeader without the wait (and without a context): then
	// gets its answer once, possibly on the caller's goroutine, and must not block.
	VerifyLeaderThen(then func(error))
}

// Config configures a Leader. Every zero field stands for its default (DefaultConfig).
type Config struct {
	// Limits bound the efficiency lock table (same meaning as in core).
	Limits core.Limits
	// ReserveBlock is how many tokens one OpReserve takes for efficiency locks. The
	// first efficiency acquire of an epoch reserves a block (one commit); later blocks
	// are reserved in the background when half is used. Default 1<<20.
	ReserveBlock uint64
	// Logger, default slog.Default().
	Logger *slog.Logger
	// OnPromote, if set, runs in its own goroutine each time this node starts serving as
	// leader (e.g. to register the node's API address).
	OnPromote func(ctx context.Context)
	// Observer, if set, receives what the leader measures, for metrics (observe.go).
	Observer Observer
	// Events, if set, receives the events of the efficiency locks while this node
	// leads, with its epoch, and an EventEpoch when it starts to (watch.go).
	Events *watch.Hub
}

// DefaultConfig returns the configuration that a zero Config stands for.
func DefaultConfig() Config {
	return Config{ReserveBlock: 1 << 20, Logger: slog.Default()}
}

// WithDefaults returns c with every zero field that has a default set to it.
func (c Config) WithDefaults() Config {
	d := DefaultConfig()
	if c.ReserveBlock == 0 {
		c.ReserveBlock = d.ReserveBlock
	}
	if c.Logger == nil {
		c.Logger = d.Logger
	}
	return c
}

// Leader is the leader-side runtime. Its methods fail with ErrNotLeader unless Promote
// has completed and Demote has not been called since.
type Leader struct {
	log   Log
	cfg   Config
	lg    *slog.Logger
	waits waits // acquires waiting for a grant; its own mutex, a leaf (waits.go)
	// observers are the Observe streams of each election (election.go); under mu.
	observers map[string]map[*observer]struct{}
	obs       Observer
	base      time.Time // what hold starts are offsets from (observe.go)

	mu sync.Mutex
	// Serving (lifecycle.go).
	active bool
	epoch  string
	stop   chan struct{} // closed by Demote
	kick   chan struct{} // wakes the expiry loop
	// Lease countdowns (countdown.go).
	leases      map[core.LeaseID]countdown
	queue       countdownHeap
	queueSeq    uint64 // numbers the queue's entries (countdownHeap)
	staleQueued int    // entries in queue whose lease has ended
	// Efficiency locks (efficiency.go) and their tokens (tokens.go).
	eff    *core.Locks
	effSeq block
	refill bool // a reservation is in flight
	// The efficiency table's ledger this epoch, when the epoch began, and whether any
	// token had been issued before it (ledger.go).
	effLedger core.Ledger
	since     time.Time
	lostSome  bool
	// Which class a name is in use as (class.go).
	names classes
	// Lock-delays (delay.go).
	delays map[string]*delay
	// Partition drains and the Assignments streams' wake-up (groups.go).
	drains        map[drainKey]*time.Timer
	groupsChanged chan struct{}
}

// SetLog sets the log when it could not be given to New (the log's apply callback needs
// the Leader first). Call it before Run.
func (l *Leader) SetLog(log Log) { l.log = log }

// New returns a Leader that is not serving until Promote. log may be nil if SetLog is
// called before Run.
func New(log Log, cfg Config) *Leader {
	cfg = cfg.WithDefaults()
	var obs Observer = nopObserver{}
	if cfg.Observer != nil {
		obs = cfg.Observer
	}
	l := &Leader{
		log:    log,
		cfg:    cfg,
		lg:     cfg.Logger,
		obs:    obs,
		base:   time.Now(),
		waits:  waits{m: make(map[core.LeaseID]map[string]*waitList)},
		leases: make(map[core.LeaseID]countdown),
		delays: make(map[string]*delay),
		drains: make(map[drainKey]*time.Timer),
		eff:    core.NewLocks(cfg.Limits),
	}
	l.effLedger = core.NewLedger(cfg.Limits)
	l.groupsChanged = make(chan struct{})
	l.names.init(l)
	return l
}
