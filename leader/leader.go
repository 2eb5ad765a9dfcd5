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
	"container/heap"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

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

// Grant is a lock grant.
type Grant struct {
	Token uint64
	Class core.Class
	// Epoch is set for efficiency grants: the in-memory state that holds them.
	Epoch string
}

// LostLock is a lock a lease lost while it was alive (force release), reported on its
// next keepalive.
type LostLock struct {
	Name   string
	Token  uint64
	Reason string
}

// LockView is what anyone may see about a lock. Token, Holder, TTLRemaining and
// DelayMillis describe the exclusive holder, or the oldest of several (shared, or a
// semaphore's); Holders lists every holder.
type LockView struct {
	Name           string
	Class          core.Class
	Mode           core.Mode // as core.Lock.Mode
	Limit          uint32    // a semaphore's limit
	Held           bool
	Token          uint64
	Holder         core.Holder
	TTLRemaining   time.Duration // -1 when unknown
	Holders        []HolderView
	Waiters        int
	DelayRemaining time.Duration
	DelayMillis    int64
}

// HolderView is one holder of a lock.
type HolderView struct {
	Token        uint64
	Holder       core.Holder
	TTLRemaining time.Duration // -1 when unknown
	DelayMillis  int64
}

type outcome struct {
	token uint64
	err   error
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

// Run follows leadership changes until ctx ends: true promotes, false demotes.
func (l *Leader) Run(ctx context.Context, changes <-chan bool) {
	defer l.Demote()
	for {
		select {
		case <-ctx.Done():
			return
		case isLeader := <-changes:
			if !isLeader {
				l.Demote()
				continue
			}
			if err := l.Promote(ctx); err != nil {
				l.lg.Warn("could not take over as leader", "err", err)
			}
		}
	}
}

// Promote starts serving as leader: it waits until every committed entry is applied,
// starts a full-TTL countdown for every lease and a full lock-delay for every delayed
// lock, and opens a new efficiency epoch (with no tokens reserved yet).
func (l *Leader) Promote(ctx context.Context) error {
	if err := l.log.Barrier(ctx); err != nil {
		return fmt.Errorf("leader: barrier: %w", err)
	}
	l.mu.Lock()
	if l.active {
		l.mu.Unlock()
		return nil
	}
	var e [8]byte
	_, _ = rand.Read(e[:])
	l.epoch = hex.EncodeToString(e[:])
	l.stop = make(chan struct{})
	l.kick = make(chan struct{}, 1)
	l.eff = core.NewLocks(l.cfg.Limits)
	l.effSeq = block{}
	now := time.Now()
	var delayed []*core.Lock
	l.log.Read(func(s *core.State) {
		s.Leases(func(ls *core.Lease) { l.addCountdownLocked(ls.ID, ls.TTLMillis, now) })
		delayed = append(delayed, s.Locks().DelayedLocks()...)
	})
	l.active = true
	for _, lk := range delayed {
		l.startDelayLocked(lk.Name, core.Correctness, lk.DelayMillis)
	}
	stop, kick, epoch, counting := l.stop, l.kick, l.epoch, len(l.leases)
	l.mu.Unlock()
	go l.expiryLoop(stop, kick)
	if l.cfg.OnPromote != nil {
		pctx, cancel := context.WithCancel(context.Background())
		go func() {
			defer cancel()
			select {
			case <-stop:
			case <-pctx.Done():
			}
		}()
		go func() {
			defer cancel()
			l.cfg.OnPromote(pctx)
		}()
	}
	l.lg.Info("serving as leader", "epoch", epoch, "leases", counting)
	return nil
}

// Demote stops serving: countdowns stop, efficiency locks are dropped (their holders
// learn it from the epoch in keepalive answers), and every waiting Acquire fails with
// ErrNotLeader.
func (l *Leader) Demote() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.active {
		return
	}
	l.active = false
	close(l.stop)
	clear(l.leases)
	l.queue = nil
	l.eff = core.NewLocks(l.cfg.Limits)
	clear(l.lost)
	for _, d := range l.delays {
		d.timer.Stop()
	}
	clear(l.delays)
	for lease := range l.waits {
		l.notifyLeaseLocked(lease, ErrNotLeader)
	}
	l.lg.Info("stopped serving as leader")
}

// Epoch returns the current efficiency epoch ("" when not serving).
func (l *Leader) Epoch() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.active {
		return ""
	}
	return l.epoch
}

// Active reports whether this node is serving as leader.
func (l *Leader) Active() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.active
}

// ServesInMemory reports whether name is an efficiency lock this node holds in memory
// while it leads: releasing it touches no disk and never waits. The answer may be stale
// by the time the caller acts on it; it is a hint for scheduling, never for safety.
func (l *Leader) ServesInMemory(name string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.active && l.eff.Has(name)
}

// OnEffects acts on the effects of an applied command. replication calls it from its
// apply goroutine on every node, in log order.
func (l *Leader) OnEffects(effects []core.Effect) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range effects {
		switch e.Kind {
		case core.EffectGranted:
			l.notifyLocked(e.Lease, e.Name, outcome{token: e.Token})
		case core.EffectWaitEnded:
			// Nothing to do here: EffectLeaseEnded follows in the same batch and tells
			// the waiter, with the reason its lease ended (expired or revoked).
		case core.EffectLeaseGranted:
			if l.active {
				l.addCountdownLocked(e.Lease, e.TTLMillis, time.Now())
			}
		case core.EffectLeaseEnded:
			if c := l.leases[e.Lease]; c != nil {
				heap.Remove(&l.queue, c.index)
				delete(l.leases, e.Lease)
			}
			delete(l.lost, e.Lease)
			if l.active {
				var r core.Result
				l.eff.DropLease(e.Lease, e.Reason == core.EndExpired, &l.effSeq, &r)
				l.effEffectsLocked(r.Effects)
			}
			l.notifyLeaseLocked(e.Lease, &LeaseGoneError{Lease: e.Lease, Reason: e.Reason})
		case core.EffectDelayed:
			if l.active {
				l.startDelayLocked(e.Name, core.Correctness, e.DelayMillis)
			}
		case core.EffectRevokedHold:
			if l.active {
				l.lost[e.Lease] = append(l.lost[e.Lease], LostLock{Name: e.Name, Token: e.Token, Reason: e.Note})
			}
		}
	}
}

// effEffectsLocked acts on effects of the efficiency table.
func (l *Leader) effEffectsLocked(effects []core.Effect) {
	for _, e := range effects {
		switch e.Kind {
		case core.EffectGranted:
			l.notifyLocked(e.Lease, e.Name, outcome{token: e.Token})
		case core.EffectWaitEnded:
			// Only DropLease reports it, and OnEffects tells the lease's waiters right
			// after, with the reason the lease ended.
		case core.EffectDelayed:
			l.startDelayLocked(e.Name, core.Efficiency, e.DelayMillis)
		case core.EffectRevokedHold:
			l.lost[e.Lease] = append(l.lost[e.Lease], LostLock{Name: e.Name, Token: e.Token, Reason: e.Note})
		}
	}
	l.refillLocked()
}

// refillLocked starts a background reservation when the block is half used, so that the
// acquire path rarely waits for one.
func (l *Leader) refillLocked() {
	if l.effSeq.end != 0 && l.effSeq.remaining() < l.cfg.ReserveBlock/2 && !l.refill {
		l.refill = true
		go func() { _ = l.reserve(context.Background()) }()
	}
}

// Grant creates a lease with the given TTL. The lease is durable when Grant returns.
func (l *Leader) Grant(ctx context.Context, ttl time.Duration) (core.LeaseID, error) {
	if !l.Active() {
		return core.LeaseID{}, ErrNotLeader
	}
	var id core.LeaseID
	if _, err := rand.Read(id[:]); err != nil {
		return id, fmt.Errorf("leader: lease id: %w", err)
	}
	res, err := l.log.Apply(ctx, core.Command{Op: core.OpGrant, Lease: id, TTLMillis: ttl.Milliseconds()})
	if err == nil {
		err = res.Err
	}
	return id, err
}

// KeepAlive restarts lease's countdown at full TTL from now. It returns the TTL, the
// efficiency epoch, and locks the lease lost to a force release since the last call.
// A lease whose expiry is already being proposed is reported gone: the keepalive came
// too late and is not acknowledged.
func (l *Leader) KeepAlive(lease core.LeaseID) (time.Duration, string, []LostLock, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.active {
		return 0, "", nil, ErrNotLeader
	}
	c := l.leases[lease]
	if c == nil || c.expiring {
		return 0, "", nil, l.goneLocked(lease, c != nil)
	}
	c.deadline = time.Now().Add(c.ttl) // later than its place in the queue: see countdownHeap
	lost := l.lost[lease]
	delete(l.lost, lease)
	return c.ttl, l.epoch, lost, nil
}

// Revoke ends lease now and releases its locks.
func (l *Leader) Revoke(ctx context.Context, lease core.LeaseID) error {
	if !l.Active() {
		return ErrNotLeader
	}
	res, err := l.log.Apply(ctx, core.Command{Op: core.OpRevoke, Lease: lease})
	if err != nil {
		return err
	}
	if errors.Is(res.Err, core.ErrLeaseNotFound) {
		return l.gone(lease)
	}
	return res.Err
}

func (l *Leader) gone(lease core.LeaseID) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.goneLocked(lease, false)
}

func (l *Leader) goneLocked(lease core.LeaseID, expiring bool) error {
	reason := core.EndExpired
	if !expiring {
		l.log.Read(func(s *core.State) { reason = s.EndedReason(lease) })
	}
	return &LeaseGoneError{Lease: lease, Reason: reason}
}

// AcquireArgs are the arguments of Acquire.
type AcquireArgs struct {
	core.AcquireArgs
	// WaitFor is how long to wait in the queue; 0 tries once. Ignored when Forever.
	WaitFor time.Duration
	Forever bool
}

// Acquire takes a lock for a lease (in a.Mode; or a lock set, a.Names, all at once
// under one token), or queues and waits for it. See the API's LockService.Acquire for
// the contract. Errors: *LeaseGoneError (lease unknown), *LockHeldError (held — for a
// set, naming the first lock that was; after a wait it also matches ErrWaitTimeout),
// core.ErrClassConflict, core.ErrModeConflict, core.ErrSetConflict, core limits,
// ErrNotLeader, and for correctness locks the replication errors (outcome unknown) and
// ctx's error.
func (l *Leader) Acquire(ctx context.Context, a AcquireArgs) (Grant, error) {
	a.Wait = a.Forever || a.WaitFor > 0
	if a.Class == core.Efficiency {
		return l.acquireEfficiency(ctx, a)
	}
	return l.acquireCorrectness(ctx, a)
}

func (l *Leader) acquireCorrectness(ctx context.Context, a AcquireArgs) (Grant, error) {
	ch, err := l.beginCorrectness(a)
	if err != nil {
		return Grant{}, err
	}
	res, err := l.log.Apply(ctx, acquireCommand(a))
	if g, err, done := l.endCorrectness(a, ch, res, err); done {
		return g, err
	}
	return l.await(ctx, a, ch, res)
}

// AcquireThen is Acquire without waiting for a correctness lock's commit: it proposes
// the acquire and returns at once; then gets what Acquire would have returned. then runs
// once, on the goroutine that hands out commit results (Log.ApplyThen), so it must not
// block. An acquire that the commit queues waits for its grant on a goroutine of its
// own, ended by ctx as Acquire's wait is; ctx does not cancel the commit itself. An
// efficiency acquire runs as Acquire on a goroutine of its own.
func (l *Leader) AcquireThen(ctx context.Context, a AcquireArgs, then func(Grant, error)) {
	a.Wait = a.Forever || a.WaitFor > 0
	if a.Class == core.Efficiency {
		go func() { then(l.acquireEfficiency(ctx, a)) }()
		return
	}
	ch, err := l.beginCorrectness(a)
	if err != nil {
		then(Grant{}, err)
		return
	}
	l.log.ApplyThen(acquireCommand(a), func(res core.Result, err error) {
		if g, err, done := l.endCorrectness(a, ch, res, err); done {
			then(g, err)
			return
		}
		go func() { then(l.await(ctx, a, ch, res)) }()
	})
}

// beginCorrectness checks that a correctness acquire may be proposed and registers for
// the grant of a queued one.
func (l *Leader) beginCorrectness(a AcquireArgs) (chan outcome, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.active {
		return nil, ErrNotLeader
	}
	names := a.LockNames()
	for _, name := range names {
		if l.eff.Has(name) {
			return nil, fmt.Errorf("%w: %q is in use as efficiency", core.ErrClassConflict, name)
		}
	}
	for _, name := range names {
		l.pending[name]++
	}
	return l.registerLocked(a.Lease, a.Key()), nil
}

func acquireCommand(a AcquireArgs) core.Command {
	return core.Command{
		Op: core.OpAcquire, Lease: a.Lease, Name: a.Name, Names: a.Names, Class: core.Correctness,
		Mode: a.Mode, Limit: a.Limit, Holder: a.Holder, Wait: a.Wait, DelayMillis: a.DelayMillis,
	}
}

// endCorrectness takes the commit's outcome of a correctness acquire. It reports done
// with the grant or error unless the acquire was queued, which then awaits its grant on
// ch.
func (l *Leader) endCorrectness(a AcquireArgs, ch chan outcome, res core.Result, err error) (Grant, error, bool) {
	l.mu.Lock()
	for _, name := range a.LockNames() {
		if l.pending[name]--; l.pending[name] == 0 {
			delete(l.pending, name)
		}
	}
	l.mu.Unlock()
	if err == nil {
		err = l.acquireErr(a, res)
	}
	if err != nil || !res.Queued {
		l.unregister(a.Lease, a.Key(), ch)
		return Grant{Token: res.Token, Class: core.Correctness}, err, true
	}
	return Grant{}, nil, false
}

func (l *Leader) acquireEfficiency(ctx context.Context, a AcquireArgs) (Grant, error) {
	for {
		l.mu.Lock()
		if !l.active {
			l.mu.Unlock()
			return Grant{}, ErrNotLeader
		}
		// One token for a grant now, one for a place in a queue, and one for every
		// waiter already queued (see tokensNeededLocked).
		need := l.tokensNeededLocked(2)
		if l.effSeq.remaining() >= need {
			break
		}
		l.mu.Unlock()
		if err := l.reserveAtLeast(ctx, need); err != nil {
			return Grant{}, err
		}
	}
	defer l.mu.Unlock()
	if err := l.effAdmitLocked(a); err != nil {
		return Grant{}, err
	}
	res := l.eff.Acquire(a.AcquireArgs, &l.effSeq)
	l.refillLocked()
	g := Grant{Token: res.Token, Class: core.Efficiency, Epoch: l.epoch}
	if err := l.acquireErr(a, res); err != nil || !res.Queued {
		return g, err
	}
	ch := l.registerLocked(a.Lease, a.Key())
	l.mu.Unlock()
	g, err := l.await(ctx, a, ch, res)
	l.mu.Lock()
	return g, err
}

// effAdmitLocked checks that an efficiency acquire may go ahead: its lease is live and
// not expiring, and no name it asks for is in use as a correctness lock.
func (l *Leader) effAdmitLocked(a AcquireArgs) error {
	if c := l.leases[a.Lease]; c == nil || c.expiring {
		return l.goneLocked(a.Lease, c != nil)
	}
	for _, name := range a.LockNames() {
		conflict := l.pending[name] > 0
		if !conflict {
			l.askName = name
			l.log.Read(l.askHas)
			conflict, l.askName = l.askHeld, ""
		}
		if conflict {
			return fmt.Errorf("%w: %q is in use as correctness", core.ErrClassConflict, name)
		}
	}
	return nil
}

// AcquireNow grants an efficiency lock when that takes neither a place in its queue nor
// a write to the log: the lock is free (or already held by the lease), and tokens are
// reserved. In every other case (held, delayed, the lease unknown or expiring, a class
// conflict, a limit, tokens to reserve, this node not leading) it changes nothing and
// reports false; Acquire then gives the full answer, waiting if asked to. The fast
// lane's reader uses it to answer an acquire that may wait without handing it to a
// goroutine, since it never blocks.
func (l *Leader) AcquireNow(a AcquireArgs) (Grant, bool) {
	if a.Class != core.Efficiency {
		return Grant{}, false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.active || l.effSeq.remaining() < l.tokensNeededLocked(2) || l.effAdmitLocked(a) != nil {
		return Grant{}, false
	}
	try := a.AcquireArgs
	try.Wait = false
	res := l.eff.Acquire(try, &l.effSeq)
	if res.Err != nil || res.Queued {
		return Grant{}, false
	}
	l.refillLocked()
	return Grant{Token: res.Token, Class: core.Efficiency, Epoch: l.epoch}, true
}

func (l *Leader) acquireErr(a AcquireArgs, res core.Result) error {
	switch {
	case res.Err == nil:
		return nil
	case errors.Is(res.Err, core.ErrLockHeld):
		return &LockHeldError{Name: heldName(a, res), HolderToken: res.HolderToken, Holder: res.Holder}
	case errors.Is(res.Err, core.ErrLeaseNotFound):
		return l.gone(a.Lease)
	default:
		return res.Err
	}
}

// heldName is the lock an acquire found held: its one lock, or the first of a lock
// set's that was.
func heldName(a AcquireArgs, res core.Result) string {
	if res.Blocker != "" {
		return res.Blocker
	}
	return a.Key()
}

// await waits for a queued acquire's grant, the end of its wait, or ctx. A lock set
// waits under its first name (the grant of that name stands for the set's).
func (l *Leader) await(ctx context.Context, a AcquireArgs, ch chan outcome, queued core.Result) (Grant, error) {
	defer l.unregister(a.Lease, a.Key(), ch)
	g := Grant{Class: a.Class}
	if a.Class == core.Efficiency {
		g.Epoch = l.Epoch()
	}
	var timeout <-chan time.Time
	if !a.Forever {
		t := time.NewTimer(a.WaitFor)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case o := <-ch:
		g.Token = o.token
		return g, o.err
	case <-timeout:
		tok, err := l.cancelWait(context.WithoutCancel(ctx), a, ch)
		if err != nil || tok != 0 {
			g.Token = tok
			return g, err
		}
		return g, &LockHeldError{Name: heldName(a, queued), HolderToken: queued.HolderToken, Holder: queued.Holder, Waited: true}
	case <-ctx.Done():
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		// The caller is gone: leave the queue, and give back a grant that raced us.
		if tok, err := l.cancelWait(cctx, a, ch); err == nil && tok != 0 {
			_ = l.Release(cctx, a.Lease, a.Key(), tok)
		}
		return g, ctx.Err()
	}
}

// cancelWait takes the lease out of the queue (every queue of a lock set). It returns
// the token when the grant won the race.
func (l *Leader) cancelWait(ctx context.Context, a AcquireArgs, ch chan outcome) (uint64, error) {
	var res core.Result
	if a.Class == core.Efficiency {
		l.mu.Lock()
		if !l.active {
			l.mu.Unlock()
			return 0, ErrNotLeader
		}
		// Leaving a queue may let others through (readers behind a writer, a lock set's
		// free names): their grants are woken here.
		res = l.eff.CancelWait(a.Lease, a.Key(), &l.effSeq)
		l.effEffectsLocked(res.Effects)
		l.mu.Unlock()
	} else {
		var err error
		res, err = l.log.Apply(ctx, core.Command{Op: core.OpCancelWait, Lease: a.Lease, Name: a.Key()})
		if err != nil {
			return 0, err
		}
	}
	if res.Err != nil {
		select {
		case o := <-ch: // the outcome arrived meanwhile
			return o.token, o.err
		default:
		}
		if errors.Is(res.Err, core.ErrLeaseNotFound) {
			return 0, l.gone(a.Lease)
		}
		return 0, nil // not waiting any more: report the timeout
	}
	return res.Token, nil
}

// Release gives up a lock held by lease under token; for a lock held as one of a lock
// set, the whole set.
func (l *Leader) Release(ctx context.Context, lease core.LeaseID, name string, token uint64) error {
	if done, err := l.releaseInMemory(lease, name, token); done {
		return err
	}
	res, err := l.log.Apply(ctx, releaseCommand(lease, name, token))
	return l.releaseResult(lease, res, err)
}

// ReleaseThen is Release without waiting for a correctness lock's commit: it proposes
// the release and returns; then gets what Release would have returned, on the
// goroutine that hands out commit results (so it must not block), or on the caller's
// for an efficiency lock or a leader that is not active.
func (l *Leader) ReleaseThen(lease core.LeaseID, name string, token uint64, then func(error)) {
	if done, err := l.releaseInMemory(lease, name, token); done {
		then(err)
		return
	}
	l.log.ApplyThen(releaseCommand(lease, name, token), func(res core.Result, err error) {
		then(l.releaseResult(lease, res, err))
	})
}

// releaseInMemory releases an efficiency lock, reporting done; for any other it reports
// not done and changes nothing (unless this node does not lead: done, ErrNotLeader).
func (l *Leader) releaseInMemory(lease core.LeaseID, name string, token uint64) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.active {
		return true, ErrNotLeader
	}
	if !l.eff.Has(name) {
		return false, nil
	}
	if c := l.leases[lease]; c == nil || c.expiring {
		return true, l.goneLocked(lease, c != nil)
	}
	r := l.eff.Release(lease, name, token, &l.effSeq)
	l.effEffectsLocked(r.Effects)
	return true, r.Err
}

func releaseCommand(lease core.LeaseID, name string, token uint64) core.Command {
	return core.Command{Op: core.OpRelease, Lease: lease, Name: name, Token: token}
}

// releaseResult is Release's answer from the commit's outcome.
func (l *Leader) releaseResult(lease core.LeaseID, res core.Result, err error) error {
	if err != nil {
		return err
	}
	if errors.Is(res.Err, core.ErrLeaseNotFound) {
		return l.gone(lease)
	}
	return res.Err
}

// ForceRelease releases a lock whoever holds it and consumes a token so every later
// grant is larger. It returns the released token (0 if none) and the consumed token.
func (l *Leader) ForceRelease(ctx context.Context, name, reason string) (released, fence uint64, err error) {
	l.mu.Lock()
	if !l.active {
		l.mu.Unlock()
		return 0, 0, ErrNotLeader
	}
	if l.eff.Has(name) && l.effSeq.remaining() >= l.tokensNeededLocked(1) {
		defer l.mu.Unlock()
		r := core.Result{Token: l.effSeq.Next()}
		l.eff.ForceRelease(name, reason, &l.effSeq, &r)
		l.effEffectsLocked(r.Effects)
		l.lg.Warn("lock force-released", "name", name, "class", "efficiency", "released_token", r.Released, "fence_token", r.Token, "reason", reason)
		return r.Released, r.Token, nil
	}
	l.mu.Unlock()
	res, err := l.log.Apply(ctx, core.Command{Op: core.OpForceRelease, Name: name, Reason: reason})
	if err == nil {
		err = res.Err
	}
	if err == nil {
		l.lg.Warn("lock force-released", "name", name, "class", "correctness", "released_token", res.Released, "fence_token", res.Token, "reason", reason)
		// Every later grant must be above the fence token, efficiency grants too: replace
		// a block reserved before it. The force release stands even if this fails (then
		// leadership is being lost, and the next leader reserves afresh).
		l.mu.Lock()
		stale := l.active && l.effSeq.end != 0 && l.effSeq.next <= res.Token
		l.mu.Unlock()
		if stale {
			if rerr := l.reserve(ctx); rerr != nil {
				l.lg.Warn("could not reserve efficiency tokens above a force release's fence", "err", rerr)
			}
		}
	}
	return res.Released, res.Token, err
}

// Describe returns the view of one lock (Held false when nobody holds or waits).
func (l *Leader) Describe(name string) (LockView, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.active {
		return LockView{}, ErrNotLeader
	}
	if lk := l.eff.Get(name); lk != nil {
		return l.viewLocked(lk), nil
	}
	v := LockView{Name: name, TTLRemaining: -1}
	l.log.Read(func(s *core.State) {
		if lk := s.Locks().Get(name); lk != nil {
			v = l.viewLocked(lk)
		}
	})
	return v, nil
}

// List returns up to limit locks of both classes under prefix in name order, and
// whether more matched.
func (l *Leader) List(prefix string, limit int) ([]LockView, bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.active {
		return nil, false, ErrNotLeader
	}
	effLocks, t1 := l.eff.List(prefix, limit)
	var corr []LockView
	var t2 bool
	l.log.Read(func(s *core.State) {
		locks, truncated := s.Locks().List(prefix, limit)
		t2 = truncated
		// Views are built under the read lock: the state's locks change after it.
		for _, lk := range locks {
			corr = append(corr, l.viewLocked(lk))
		}
	})
	merged := make([]LockView, 0, min(limit, len(effLocks)+len(corr)))
	i, j := 0, 0
	for len(merged) < limit && (i < len(effLocks) || j < len(corr)) {
		if j >= len(corr) || (i < len(effLocks) && effLocks[i].Name < corr[j].Name) {
			merged = append(merged, l.viewLocked(effLocks[i]))
			i++
		} else {
			merged = append(merged, corr[j])
			j++
		}
	}
	return merged, t1 || t2 || i < len(effLocks) || j < len(corr), nil
}

func (l *Leader) viewLocked(lk *core.Lock) LockView {
	v := LockView{Name: lk.Name, Class: lk.Class, Mode: lk.Mode(), Limit: lk.Limit, Waiters: len(lk.Waiters), TTLRemaining: -1}
	holds := lk.Holds
	if lk.Hold != nil {
		holds = []core.Hold{*lk.Hold}
	}
	for _, h := range holds {
		hv := HolderView{Token: h.Token, Holder: h.Holder, TTLRemaining: -1, DelayMillis: h.DelayMillis}
		if c := l.leases[h.Lease]; c != nil {
			hv.TTLRemaining = max(0, time.Until(c.deadline))
		}
		v.Holders = append(v.Holders, hv)
	}
	if len(v.Holders) > 0 {
		first := v.Holders[0]
		v.Held, v.Token, v.Holder, v.DelayMillis, v.TTLRemaining = true, first.Token, first.Holder, first.DelayMillis, first.TTLRemaining
	}
	if d := l.delays[lk.Name]; d != nil && lk.Delayed {
		v.DelayRemaining = max(0, time.Until(d.deadline))
	}
	return v
}

// CheckToken reports whether token is the token of a current holder of name (any of
// them, for a lock held shared or a semaphore), and the holder's token (the exclusive
// holder's, or the oldest one's).
func (l *Leader) CheckToken(name string, token uint64) (current bool, holderToken uint64, err error) {
	v, err := l.Describe(name)
	for _, h := range v.Holders {
		current = current || h.Token == token
	}
	return current, v.Token, err
}

// Stats are counts for status and metrics.
type Stats struct {
	Leases, Locks, EfficiencyLocks int
	Epoch                          string
	LastToken                      uint64
}

// Stats returns current counts.
func (l *Leader) Stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := Stats{EfficiencyLocks: l.eff.Len()}
	if l.active {
		st.Epoch = l.epoch
	}
	l.log.Read(func(s *core.State) {
		st.Leases = s.NumLeases()
		st.Locks = s.Locks().Len() + st.EfficiencyLocks
		st.LastToken = s.LastToken()
	})
	return st
}

// ---- waiting acquires -------------------------------------------------------------

func (l *Leader) registerLocked(lease core.LeaseID, name string) chan outcome {
	ch := make(chan outcome, 1)
	m := l.waits[lease]
	if m == nil {
		m = make(map[string][]chan outcome)
		l.waits[lease] = m
	}
	m[name] = append(m[name], ch)
	return ch
}

func (l *Leader) unregister(lease core.LeaseID, name string, ch chan outcome) {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := l.waits[lease]
	chans := m[name]
	for i, c := range chans {
		if c == ch {
			chans = append(chans[:i], chans[i+1:]...)
			break
		}
	}
	if len(chans) == 0 {
		delete(m, name)
	} else {
		m[name] = chans
	}
	if len(m) == 0 {
		delete(l.waits, lease)
	}
}

func (l *Leader) notifyLocked(lease core.LeaseID, name string, o outcome) {
	for _, ch := range l.waits[lease][name] {
		select {
		case ch <- o:
		default:
		}
	}
}

func (l *Leader) notifyLeaseLocked(lease core.LeaseID, err error) {
	for name := range l.waits[lease] {
		l.notifyLocked(lease, name, outcome{err: err})
	}
}

// ---- efficiency token blocks --------------------------------------------------------

// block is a range of tokens reserved through the log for efficiency grants.
type block struct{ next, end uint64 } // [next, end)

func (b *block) remaining() uint64 {
	if b.next >= b.end {
		return 0
	}
	return b.end - b.next
}

// Next implements core.Sequence. It never runs dry: see tokensNeededLocked.
func (b *block) Next() uint64 {
	v := b.next
	b.next++
	return v
}

// tokensNeededLocked is how many tokens the efficiency block must still hold before an
// operation that may itself consume extra tokens. The table consumes tokens without an
// Acquire only by granting queued waiters (on a release, an expiry, a force release or
// the end of a lock-delay), at most one per waiter; so if every operation that adds a
// grant or a waiter first makes sure the block covers all waiters plus its own needs,
// the block can never run dry inside OnEffects, where nothing can wait for a commit.
func (l *Leader) tokensNeededLocked(extra int) uint64 {
	return uint64(l.eff.Waiting() + extra)
}

func (l *Leader) reserve(ctx context.Context) error { return l.reserveAtLeast(ctx, 0) }

// reserveAtLeast reserves a new block of ReserveBlock tokens, or of 2×need when that is
// larger, and installs it in place of the current one (whose unused tokens are skipped).
func (l *Leader) reserveAtLeast(ctx context.Context, need uint64) error {
	count := max(l.cfg.ReserveBlock, 2*need)
	res, err := l.log.Apply(ctx, core.Command{Op: core.OpReserve, Count: count})
	if err == nil {
		err = res.Err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.refill = false
	if err != nil {
		return fmt.Errorf("leader: reserve tokens: %w", err)
	}
	// Reservations that complete out of order must not move tokens backwards: keep the
	// current block when this one starts below its next token (it was reserved earlier).
	if l.active && res.Token >= l.effSeq.next {
		l.effSeq = block{next: res.Token, end: res.Token + count}
	}
	return nil
}

// ---- lock-delays ---------------------------------------------------------------------

type delay struct {
	deadline time.Time
	timer    *time.Timer
}

func (l *Leader) startDelayLocked(name string, class core.Class, millis int64) {
	if d := l.delays[name]; d != nil {
		d.timer.Stop()
	}
	d := &delay{deadline: time.Now().Add(time.Duration(millis) * time.Millisecond)}
	stop := l.stop
	d.timer = time.AfterFunc(time.Duration(millis)*time.Millisecond, func() {
		select {
		case <-stop:
			return
		default:
		}
		if class == core.Efficiency {
			l.mu.Lock()
			defer l.mu.Unlock()
			if l.delays[name] == d {
				delete(l.delays, name)
				var r core.Result
				l.eff.EndDelay(name, &l.effSeq, &r)
				l.effEffectsLocked(r.Effects)
			}
			return
		}
		if _, err := l.log.Apply(context.Background(), core.Command{Op: core.OpEndDelay, Name: name}); err != nil {
			l.lg.Warn("could not end lock-delay", "name", name, "err", err)
		}
		l.mu.Lock()
		if l.delays[name] == d {
			delete(l.delays, name)
		}
		l.mu.Unlock()
	})
	l.delays[name] = d
}
