// Package leader holds what only the leader does: it counts every lease down on the
// monotonic clock and proposes the expiry through the log when one runs out, keeps the
// efficiency locks in memory, wakes queued acquires when their grant is applied, and
// ends lock-delays.
//
// Followers keep no countdowns; a leader that is deposed stops counting at once, and a
// new leader restarts every lease's countdown at its full TTL (guarantee G4: no lease ever
// expires sooner than its TTL after the last keepalive the server acknowledged). Expiry
// is a replicated command, so a deposed leader that has not noticed yet cannot expire
// anything: its proposal fails.
//
// Lock order: Leader.mu may be held while reading the replicated state (Log.Read); it is
// never held while proposing (Log.Apply), because applying a command calls OnEffects,
// which takes Leader.mu.
package leader

import (
	"context"
	"log/slog"
	"sync"

	"github.com/leasehold/leasehold/core"
)

// Log is the replicated log the leader proposes to. replication.Node implements it.
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
}

// Config configures a Leader.
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
}

// Leader is the leader-side runtime. Its methods fail with ErrNotLeader unless Promote
// has completed and Demote has not been called since.
type Leader struct {
	log Log
	cfg Config
	lg  *slog.Logger

	mu     sync.Mutex
	active bool
	// askName and askHeld are effAdmitLocked's question to the replicated state and its
	// answer, asked through askHas, which is made once so that asking allocates nothing
	// on the efficiency fast path. Guarded by mu.
	askName string
	askHeld bool
	askHas  func(*core.State)
	epoch   string
	stop    chan struct{} // closed by Demote
	kick    chan struct{} // wakes the expiry loop
	leases  map[core.LeaseID]*countdown
	queue   countdownHeap
	eff     *core.Locks
	effSeq  block
	refill  bool           // a reservation is in flight
	pending map[string]int // correctness acquires being proposed, by name
	lost    map[core.LeaseID][]LostLock
	waits   map[core.LeaseID]map[string][]chan outcome
	delays  map[string]*delay
}

// SetLog sets the log when it could not be given to New (the log's apply callback needs
// the Leader first). Call it before Run.
func (l *Leader) SetLog(log Log) { l.log = log }

// New returns a Leader that is not serving until Promote. log may be nil if SetLog is
// called before Run.
func New(log Log, cfg Config) *Leader {
	if cfg.ReserveBlock == 0 {
		cfg.ReserveBlock = 1 << 20
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	l := &Leader{
		log:     log,
		cfg:     cfg,
		lg:      cfg.Logger,
		leases:  make(map[core.LeaseID]*countdown),
		pending: make(map[string]int),
		lost:    make(map[core.LeaseID][]LostLock),
		waits:   make(map[core.LeaseID]map[string][]chan outcome),
		delays:  make(map[string]*delay),
		eff:     core.NewLocks(cfg.Limits),
	}
	l.askHas = func(s *core.State) { l.askHeld = s.Locks().Has(l.askName) }
	return l
}
