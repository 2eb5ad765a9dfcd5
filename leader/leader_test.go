package leader_test

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leasehold/leasehold/core"
	"github.com/leasehold/leasehold/leader"
)

// Every test here runs in a synctest bubble: time is fake and only moves when every
// goroutine of the bubble is blocked, so "at t=1.899s" means exactly that, and no test
// sleeps for real.

// ---- fake log -------------------------------------------------------------------------

// fakeLog is a Log that applies commands to a real core.State at once, the way
// replication does it: apply under the mutex, release it, then hand the effects to the
// observer (Leader.OnEffects). It records every proposal and can hold back one kind of
// command (gate) to freeze the moment between proposal and application.
type fakeLog struct {
	mu       sync.Mutex
	state    *core.State
	proposed []proposal // in order of proposal
	applied  []core.Command
	gates    map[core.Op]chan struct{}
	holds    map[core.Op]chan struct{}
	fails    map[core.Op]error // the next proposal of op fails with this, unapplied
	observe  func([]core.Effect)
	// holdEnds gets each command's ended holds (recorded into ended), after observe.
	holdEnds func([]core.EndedHold)
	ended    []core.EndedHold
	// deposed makes VerifyLeader fail, as on a leader that another has replaced.
	deposed  bool
	onVerify func() // if set, runs in VerifyLeader (without f.mu)
	verifies int    // VerifyLeader calls
	thens    int    // proposals made with ApplyThen
	// forgetful keeps no record of proposals (benchmarks: the records would grow).
	forgetful bool
}

type proposal struct {
	cmd core.Command
	at  time.Time
}

func newFakeLog(limits core.Limits) *fakeLog {
	f := &fakeLog{state: core.NewState(limits), gates: make(map[core.Op]chan struct{}), holds: make(map[core.Op]chan struct{}), fails: make(map[core.Op]error)}
	f.state.OnHoldEnd(func(h core.EndedHold) { f.ended = append(f.ended, h) }) // under f.mu, in Apply
	return f
}

// stamped sets the wall clock on the commands that can start or end a hold, as
// replication does (the ledger's times).
func stamped(cmd core.Command) core.Command {
	switch cmd.Op {
	case core.OpAcquire, core.OpRelease, core.OpCancelWait, core.OpRevoke, core.OpExpire, core.OpForceRelease, core.OpEndDelay, core.OpDisconnect:
		if cmd.WallMillis == 0 {
			cmd.WallMillis = time.Now().UnixMilli()
		}
	}
	return cmd
}

func (f *fakeLog) Apply(ctx context.Context, cmd core.Command) (core.Result, error) {
	f.mu.Lock()
	if !f.forgetful {
		f.proposed = append(f.proposed, proposal{cmd: cmd, at: time.Now()})
	}
	gate := f.gates[cmd.Op]
	f.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return core.Result{}, ctx.Err()
		}
	}
	f.mu.Lock()
	if err := f.fails[cmd.Op]; err != nil {
		delete(f.fails, cmd.Op)
		f.mu.Unlock()
		return core.Result{}, err
	}
	res := f.state.Apply(stamped(cmd))
	if !f.forgetful {
		f.applied = append(f.applied, cmd)
	}
	hold := f.holds[cmd.Op]
	delete(f.holds, cmd.Op)
	observe, holdEnds, ended := f.observe, f.holdEnds, f.ended
	f.ended = nil
	f.mu.Unlock()
	if len(res.Effects) > 0 && observe != nil {
		observe(res.Effects)
	}
	if len(ended) > 0 && holdEnds != nil {
		holdEnds(ended)
	}
	if hold != nil {
		<-hold // applied, but the proposer hears of it only later
	}
	return res, nil
}

// ApplyThen applies like Apply, on a goroutine of its own (the proposer does not wait).
func (f *fakeLog) ApplyThen(cmd core.Command, then func(core.Result, error)) {
	f.mu.Lock()
	f.thens++
	f.mu.Unlock()
	go func() { then(f.Apply(context.Background(), cmd)) }()
}

// errFakeDeposed is the fake log's answer to VerifyLeader on a deposed leader.
var errFakeDeposed = errors.New("fake log: another leader was elected")

func (f *fakeLog) VerifyLeader(ctx context.Context) error {
	f.mu.Lock()
	hook := f.onVerify
	f.mu.Unlock()
	if hook != nil {
		hook()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.verifies++
	if err := ctx.Err(); err != nil {
		return err
	}
	if f.deposed {
		return errFakeDeposed
	}
	return nil
}

// VerifyLeaderThen answers like VerifyLeader, on a goroutine of its own.
func (f *fakeLog) VerifyLeaderThen(then func(error)) {
	go func() { then(f.VerifyLeader(context.Background())) }()
}

// setDeposed makes VerifyLeader fail (true) or succeed.
func (f *fakeLog) setDeposed(d bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.deposed = d
}

// verifications returns how many times VerifyLeader was called.
func (f *fakeLog) verifications() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.verifies
}

// failNext makes the next proposal of op fail with err without being applied.
func (f *fakeLog) failNext(op core.Op, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fails[op] = err
}

func (f *fakeLog) Read(fn func(*core.State)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f.state)
}

func (f *fakeLog) Barrier(context.Context) error { return nil }

// gate makes every later proposal of op wait until the returned function is called.
func (f *fakeLog) gate(op core.Op) (open func()) {
	ch := make(chan struct{})
	f.mu.Lock()
	f.gates[op] = ch
	f.mu.Unlock()
	return func() {
		f.mu.Lock()
		delete(f.gates, op)
		f.mu.Unlock()
		close(ch)
	}
}

// holdNext makes the next proposal of op apply at once but return to its proposer only
// when the returned function is called, as when raft wakes waiting proposers in another
// order than it applied their entries.
func (f *fakeLog) holdNext(op core.Op) (release func()) {
	ch := make(chan struct{})
	f.mu.Lock()
	f.holds[op] = ch
	f.mu.Unlock()
	return func() { close(ch) }
}

// proposals returns how many commands were proposed (op 0: all of them).
func (f *fakeLog) proposals(op core.Op) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, p := range f.proposed {
		if op == 0 || p.cmd.Op == op {
			n++
		}
	}
	return n
}

// proposedSince returns the commands proposed after the first n.
func (f *fakeLog) proposedSince(n int) []core.Command {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []core.Command
	for _, p := range f.proposed[n:] {
		out = append(out, p.cmd)
	}
	return out
}

// firstProposal returns the time op was first proposed for lease (any lease when zero).
func (f *fakeLog) firstProposal(op core.Op, lease core.LeaseID) (time.Time, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, p := range f.proposed {
		if p.cmd.Op == op && (lease.IsZero() || p.cmd.Lease == lease) {
			return p.at, true
		}
	}
	return time.Time{}, false
}

// leaseAlive reports whether the replicated state still has the lease.
func (f *fakeLog) leaseAlive(id core.LeaseID) bool {
	alive := false
	f.Read(func(s *core.State) { alive = s.Lease(id) != nil })
	return alive
}

// waiters returns the leases queued for correctness lock name, in order.
func (f *fakeLog) waiters(name string) []core.LeaseID {
	var out []core.LeaseID
	f.Read(func(s *core.State) {
		if lk := s.Locks().Get(name); lk != nil {
			for _, w := range lk.Waiters {
				out = append(out, w.Lease)
			}
		}
	})
	return out
}

// holder returns the lease and token holding correctness lock name.
func (f *fakeLog) holder(name string) (core.LeaseID, uint64) {
	var id core.LeaseID
	var tok uint64
	f.Read(func(s *core.State) {
		if lk := s.Locks().Get(name); lk != nil && lk.Hold != nil {
			id, tok = lk.Hold.Lease, lk.Hold.Token
		}
	})
	return id, tok
}

// ---- helpers --------------------------------------------------------------------------

// newLeader returns a Leader on a fake log. It is demoted when the test ends, which stops
// its goroutines so the bubble can exit.
func newLeader(t testing.TB, cfg leader.Config) (*leader.Leader, *fakeLog) {
	t.Helper()
	fl := newFakeLog(cfg.Limits)
	return newLeaderOn(t, fl, cfg), fl
}

// newLeaderOn returns a Leader on fl, which from now on tells it (and only it) the
// effects of what it applies: as after a failover, when the runtime of another node
// leads over the same replicated state.
func newLeaderOn(t testing.TB, fl *fakeLog, cfg leader.Config) *leader.Leader {
	t.Helper()
	cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	l := leader.New(fl, cfg)
	fl.mu.Lock()
	fl.observe, fl.holdEnds = l.OnEffects, l.OnHoldEnds
	fl.mu.Unlock()
	t.Cleanup(l.Demote)
	return l
}

func promote(t *testing.T, l *leader.Leader) {
	t.Helper()
	if err := l.Promote(context.Background()); err != nil {
		t.Fatalf("Promote: %v", err)
	}
	if !l.Active() {
		t.Fatal("not active after Promote")
	}
}

func grant(t *testing.T, l *leader.Leader, ttl time.Duration) core.LeaseID {
	t.Helper()
	id, err := l.Grant(context.Background(), ttl)
	if err != nil {
		t.Fatalf("Grant(%v): %v", ttl, err)
	}
	return id
}

type acquireOpts struct {
	waitFor time.Duration
	forever bool
	delay   time.Duration
}

func args(lease core.LeaseID, name string, class core.Class, o acquireOpts) leader.AcquireArgs {
	return leader.AcquireArgs{
		AcquireArgs: core.AcquireArgs{Lease: lease, Name: name, Class: class, DelayMillis: o.delay.Milliseconds(),
			Holder: core.Holder{Host: "host-" + lease.String()[:6], PID: 42, Note: "test"}},
		WaitFor: o.waitFor,
		Forever: o.forever,
	}
}

// acquire takes name at once (try-once unless o says otherwise) and fails the test on
// error.
func acquire(t *testing.T, l *leader.Leader, lease core.LeaseID, name string, class core.Class, o acquireOpts) leader.Grant {
	t.Helper()
	g, err := l.Acquire(context.Background(), args(lease, name, class, o))
	if err != nil {
		t.Fatalf("Acquire(%s, %v): %v", name, class, err)
	}
	if g.Token == 0 || g.Class != class {
		t.Fatalf("Acquire(%s, %v) = %+v, want a token and the class", name, class, g)
	}
	return g
}

type acqResult struct {
	g   leader.Grant
	err error
}

// acquireAsync runs Acquire in its own goroutine and lets it reach its waiting point.
func acquireAsync(ctx context.Context, l *leader.Leader, a leader.AcquireArgs) <-chan acqResult {
	ch := make(chan acqResult, 1)
	go func() {
		g, err := l.Acquire(ctx, a)
		ch <- acqResult{g, err}
	}()
	synctest.Wait()
	return ch
}

// noResult fails if ch already has a result (after letting every goroutine settle).
func noResult(t *testing.T, ch <-chan acqResult, what string) {
	t.Helper()
	synctest.Wait()
	select {
	case r := <-ch:
		t.Fatalf("%s: Acquire returned early: %+v, %v", what, r.g, r.err)
	default:
	}
}

// result returns ch's result, failing if there is none yet.
func result(t *testing.T, ch <-chan acqResult, what string) acqResult {
	t.Helper()
	synctest.Wait()
	select {
	case r := <-ch:
		return r
	default:
		t.Fatalf("%s: Acquire has not returned", what)
		return acqResult{}
	}
}

// sleepUntil advances the bubble's clock to start+d.
func sleepUntil(start time.Time, d time.Duration) {
	time.Sleep(time.Until(start.Add(d)))
	synctest.Wait()
}

func wantGone(t *testing.T, err error, reason core.EndReason, what string) {
	t.Helper()
	var lg *leader.LeaseGoneError
	if !errors.As(err, &lg) {
		t.Fatalf("%s: err = %v, want *LeaseGoneError", what, err)
	}
	if lg.Reason != reason {
		t.Fatalf("%s: LeaseGoneError reason = %v, want %v", what, lg.Reason, reason)
	}
	if !errors.Is(err, core.ErrLeaseNotFound) {
		t.Fatalf("%s: %v does not match core.ErrLeaseNotFound", what, err)
	}
}

var classes = []core.Class{core.Correctness, core.Efficiency}

// ---- G4: lease countdowns -------------------------------------------------------------

// TestNoEarlyExpiry checks G4: a lease expires no sooner than its TTL after the last
// acknowledged keepalive, is expired (proposed and applied) promptly after that, and a
// keepalive that arrives once the expiry is proposed is refused.
func TestNoEarlyExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, fl := newLeader(t, leader.Config{})
		promote(t, l)
		start := time.Now()
		id := grant(t, l, time.Second)

		sleepUntil(start, 900*time.Millisecond)
		ka, err := l.KeepAlive(t.Context(), id)
		if err != nil || ka.TTL != time.Second || ka.Epoch == "" || len(ka.Lost) != 0 {
			t.Fatalf("KeepAlive at 0.9s = %+v, %v; want 1s, the epoch, nothing lost", ka, err)
		}
		// A neighbour that expires at 1.88s wakes the expiry loop just before id is due.
		other := grant(t, l, 980*time.Millisecond)

		// The countdown restarted at 0.9s: nothing may happen before 1.9s, and
		// certainly not at the original deadline of 1s.
		sleepUntil(start, 1899*time.Millisecond)
		if at, ok := fl.firstProposal(core.OpExpire, id); ok {
			t.Fatalf("expiry proposed at %v, before 1.9s (TTL after the keepalive at 0.9s)", at.Sub(start))
		}
		if !fl.leaseAlive(id) {
			t.Fatal("lease gone before 1.9s")
		}
		if fl.leaseAlive(other) {
			t.Fatal("neighbour lease not expired at 1.899s")
		}

		// Hold the expiry between proposal and application.
		open := fl.gate(core.OpExpire)
		sleepUntil(start, 1950*time.Millisecond)
		at, ok := fl.firstProposal(core.OpExpire, id)
		if !ok {
			t.Fatal("no expiry proposed by 1.95s")
		}
		if d := at.Sub(start); d < 1900*time.Millisecond || d > 1910*time.Millisecond {
			t.Fatalf("expiry proposed at %v, want right after 1.9s", d)
		}
		// The expiry is proposed but not applied: a keepalive now came too late and must
		// not be acknowledged.
		_, err = l.KeepAlive(t.Context(), id)
		wantGone(t, err, core.EndExpired, "KeepAlive while the expiry is in flight")
		if !fl.leaseAlive(id) {
			t.Fatal("lease gone before the expiry was applied")
		}

		open()
		synctest.Wait()
		if fl.leaseAlive(id) {
			t.Fatal("lease still alive after the expiry was applied")
		}
		_, err = l.KeepAlive(t.Context(), id)
		wantGone(t, err, core.EndExpired, "KeepAlive after the expiry")
		if n := fl.proposals(core.OpExpire); n != 2 {
			t.Fatalf("%d expiries proposed, want 2 (one per lease)", n)
		}
		// An expired lease cannot take locks.
		_, err = l.Acquire(context.Background(), args(id, "after/expiry", core.Correctness, acquireOpts{}))
		wantGone(t, err, core.EndExpired, "Acquire(correctness) by an expired lease")
		_, err = l.Acquire(context.Background(), args(id, "after/expiry2", core.Efficiency, acquireOpts{}))
		wantGone(t, err, core.EndExpired, "Acquire(efficiency) by an expired lease")
	})
}

// TestKeepAliveUnknownAndRevoked checks that a keepalive for a lease that never existed is
// reported gone without a reason, and one after Revoke says revoked.
func TestKeepAliveUnknownAndRevoked(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, _ := newLeader(t, leader.Config{})
		promote(t, l)
		_, err := l.KeepAlive(t.Context(), core.LeaseID{1, 2, 3})
		wantGone(t, err, core.EndUnknown, "KeepAlive(unknown)")
		id := grant(t, l, time.Minute)
		if err := l.Revoke(context.Background(), id); err != nil {
			t.Fatalf("Revoke: %v", err)
		}
		_, err = l.KeepAlive(t.Context(), id)
		wantGone(t, err, core.EndRevoked, "KeepAlive after Revoke")
		wantGone(t, l.Revoke(context.Background(), id), core.EndRevoked, "second Revoke")
	})
}

// TestPromoteRestartsCountdowns checks G4 across leader changes: a new leader counts
// every lease from full TTL no matter how long the lease existed before, a demoted
// leader expires nothing, and the next Promote starts from full TTL again.
func TestPromoteRestartsCountdowns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, fl := newLeader(t, leader.Config{})
		// Leases granted under an earlier leader, long ago: applied straight to the
		// state (under the log's lock), as a follower would have applied them.
		a, b := core.LeaseID{0xa}, core.LeaseID{0xb}
		fl.Read(func(s *core.State) {
			for _, id := range []core.LeaseID{a, b} {
				if r := s.Apply(core.Command{Op: core.OpGrant, Lease: id, TTLMillis: 1000}); r.Err != nil {
					t.Fatal(r.Err)
				}
			}
		})
		time.Sleep(10 * time.Second)

		promote(t, l)
		start := time.Now()
		sleepUntil(start, 990*time.Millisecond)
		if n := fl.proposals(core.OpExpire); n != 0 {
			t.Fatalf("%d expiries proposed 0.99s after Promote, want 0 (full TTL from Promote)", n)
		}

		l.Demote()
		if l.Active() || l.Epoch() != "" {
			t.Fatal("still active after Demote")
		}
		if _, err := l.KeepAlive(t.Context(), a); !errors.Is(err, leader.ErrNotLeader) {
			t.Fatalf("KeepAlive while demoted: %v, want ErrNotLeader", err)
		}
		if _, err := l.Grant(context.Background(), time.Second); !errors.Is(err, leader.ErrNotLeader) {
			t.Fatalf("Grant while demoted: %v, want ErrNotLeader", err)
		}
		if _, err := l.Acquire(context.Background(), args(a, "x", core.Correctness, acquireOpts{})); !errors.Is(err, leader.ErrNotLeader) {
			t.Fatalf("Acquire while demoted: %v, want ErrNotLeader", err)
		}
		sleepUntil(start, 10*time.Second)
		if n := fl.proposals(core.OpExpire); n != 0 {
			t.Fatalf("a demoted leader proposed %d expiries", n)
		}

		promote(t, l)
		start = time.Now()
		sleepUntil(start, 990*time.Millisecond)
		if n := fl.proposals(core.OpExpire); n != 0 {
			t.Fatalf("%d expiries proposed 0.99s after the second Promote, want 0", n)
		}
		sleepUntil(start, 1010*time.Millisecond)
		if n := fl.proposals(core.OpExpire); n != 2 {
			t.Fatalf("%d expiries proposed 1.01s after the second Promote, want 2", n)
		}
		if fl.leaseAlive(a) || fl.leaseAlive(b) {
			t.Fatal("leases alive after their expiry")
		}
	})
}

// TestGrantedLeaseCountsFromGrant checks that a lease granted while serving is counted
// down from its grant.
func TestGrantedLeaseCountsFromGrant(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, fl := newLeader(t, leader.Config{})
		promote(t, l)
		time.Sleep(5 * time.Second)
		start := time.Now()
		id := grant(t, l, 300*time.Millisecond)
		sleepUntil(start, 299*time.Millisecond)
		if !fl.leaseAlive(id) || fl.proposals(core.OpExpire) != 0 {
			t.Fatal("lease expired before its TTL")
		}
		sleepUntil(start, 310*time.Millisecond)
		if fl.leaseAlive(id) {
			t.Fatal("lease alive 10ms after its TTL ran out")
		}
	})
}

// ---- waiters ----------------------------------------------------------------------------

// TestWaitersFIFO checks that correctness waiters queue in arrival order and are woken
// one by one as the holder releases, each with a larger token.
func TestWaitersFIFO(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, fl := newLeader(t, leader.Config{})
		promote(t, l)
		const name = "jobs/fifo"
		h := grant(t, l, time.Minute)
		last := acquire(t, l, h, name, core.Correctness, acquireOpts{}).Token

		var ws []core.LeaseID
		var chs []<-chan acqResult
		for range 3 {
			w := grant(t, l, time.Minute)
			ws = append(ws, w)
			chs = append(chs, acquireAsync(t.Context(), l, args(w, name, core.Correctness, acquireOpts{waitFor: 30 * time.Second})))
		}
		if got := fl.waiters(name); !slices.Equal(got, ws) {
			t.Fatalf("queue = %v, want %v (arrival order)", got, ws)
		}
		if v, err := l.Describe(name); err != nil || !v.Held || v.Token != last || v.Waiters != 3 {
			t.Fatalf("Describe = %+v, %v; want held under %d with 3 waiters", v, err, last)
		}

		holder := h
		for i, w := range ws {
			if err := l.Release(context.Background(), holder, name, last); err != nil {
				t.Fatalf("Release by %d: %v", i, err)
			}
			r := result(t, chs[i], "waiter")
			if r.err != nil || r.g.Token <= last || r.g.Class != core.Correctness {
				t.Fatalf("waiter %d: %+v, %v; want a grant with a token above %d", i, r.g, r.err, last)
			}
			for j := i + 1; j < len(chs); j++ {
				noResult(t, chs[j], "later waiter")
			}
			if id, tok := fl.holder(name); id != w || tok != r.g.Token {
				t.Fatalf("state holder = %v/%d, want waiter %d with %d", id, tok, i, r.g.Token)
			}
			holder, last = w, r.g.Token
		}
		if err := l.Release(context.Background(), holder, name, last); err != nil {
			t.Fatal(err)
		}
		fl.Read(func(s *core.State) {
			if s.Locks().Get(name) != nil {
				t.Error("lock still in the table after the last release")
			}
		})
	})
}

// queueLen returns how many leases wait for name in either class.
func queueLen(t *testing.T, l *leader.Leader, name string) int {
	t.Helper()
	v, err := l.Describe(name)
	if err != nil {
		t.Fatalf("Describe(%s): %v", name, err)
	}
	return v.Waiters
}

// TestWaitTimeout checks that a wait that runs out fails with ErrWaitTimeout (and
// core.ErrLockHeld, with the holder) and takes the lease out of the queue.
func TestWaitTimeout(t *testing.T) {
	for _, class := range classes {
		t.Run(class.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l, fl := newLeader(t, leader.Config{})
				promote(t, l)
				const name = "jobs/timeout"
				h, w := grant(t, l, time.Minute), grant(t, l, time.Minute)
				held := acquire(t, l, h, name, class, acquireOpts{}).Token
				start := time.Now()
				ch := acquireAsync(t.Context(), l, args(w, name, class, acquireOpts{waitFor: 500 * time.Millisecond}))
				if n := queueLen(t, l, name); n != 1 {
					t.Fatalf("%d waiters, want 1", n)
				}
				sleepUntil(start, 499*time.Millisecond)
				noResult(t, ch, "before the wait ran out")
				sleepUntil(start, 501*time.Millisecond)
				r := result(t, ch, "after the wait ran out")
				if !errors.Is(r.err, leader.ErrWaitTimeout) || !errors.Is(r.err, core.ErrLockHeld) {
					t.Fatalf("err = %v, want ErrWaitTimeout and core.ErrLockHeld", r.err)
				}
				var lh *leader.LockHeldError
				if !errors.As(r.err, &lh) || lh.HolderToken != held || !lh.Waited || lh.Name != name || lh.Holder.PID != 42 {
					t.Fatalf("err = %#v, want a LockHeldError naming holder token %d", r.err, held)
				}
				if n := queueLen(t, l, name); n != 0 {
					t.Fatalf("%d waiters after the timeout, want 0", n)
				}
				if class == core.Correctness {
					if q := fl.waiters(name); len(q) != 0 {
						t.Fatalf("replicated queue %v after the timeout, want empty", q)
					}
				}
				// The holder's release now frees the lock: nobody is granted it.
				if err := l.Release(context.Background(), h, name, held); err != nil {
					t.Fatal(err)
				}
				if v, _ := l.Describe(name); v.Held {
					t.Fatalf("lock held after release with no waiters: %+v", v)
				}
			})
		})
	}
}

// TestTryOnceHeld checks a try-once acquire on a held lock.
func TestTryOnceHeld(t *testing.T) {
	for _, class := range classes {
		t.Run(class.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l, _ := newLeader(t, leader.Config{})
				promote(t, l)
				h, w := grant(t, l, time.Minute), grant(t, l, time.Minute)
				held := acquire(t, l, h, "x", class, acquireOpts{}).Token
				_, err := l.Acquire(context.Background(), args(w, "x", class, acquireOpts{}))
				var lh *leader.LockHeldError
				if !errors.As(err, &lh) || lh.HolderToken != held || lh.Waited || errors.Is(err, leader.ErrWaitTimeout) || !errors.Is(err, core.ErrLockHeld) {
					t.Fatalf("try-once: %v, want LockHeldError{HolderToken: %d, Waited: false}", err, held)
				}
				if n := queueLen(t, l, "x"); n != 0 {
					t.Fatalf("try-once queued: %d waiters", n)
				}
				// Idempotent: the holder asking again gets the same token.
				if g := acquire(t, l, h, "x", class, acquireOpts{}); g.Token != held {
					t.Fatalf("repeated acquire by the holder: token %d, want %d", g.Token, held)
				}
			})
		})
	}
}

// TestWaitCancel checks that cancelling a waiting acquire returns the context's error
// and leaves the queue.
func TestWaitCancel(t *testing.T) {
	for _, class := range classes {
		t.Run(class.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l, fl := newLeader(t, leader.Config{})
				promote(t, l)
				const name = "jobs/cancel"
				h, w := grant(t, l, time.Minute), grant(t, l, time.Minute)
				held := acquire(t, l, h, name, class, acquireOpts{}).Token
				ctx, cancel := context.WithCancel(t.Context())
				ch := acquireAsync(ctx, l, args(w, name, class, acquireOpts{waitFor: 30 * time.Second}))
				if n := queueLen(t, l, name); n != 1 {
					t.Fatalf("%d waiters, want 1", n)
				}
				cancel()
				r := result(t, ch, "after cancel")
				if !errors.Is(r.err, context.Canceled) {
					t.Fatalf("err = %v, want context.Canceled", r.err)
				}
				if n := queueLen(t, l, name); n != 0 {
					t.Fatalf("%d waiters after cancel, want 0", n)
				}
				if class == core.Correctness {
					if q := fl.waiters(name); len(q) != 0 {
						t.Fatalf("replicated queue %v after cancel, want empty", q)
					}
				}
				if err := l.Release(context.Background(), h, name, held); err != nil {
					t.Fatal(err)
				}
				if v, _ := l.Describe(name); v.Held {
					t.Fatalf("cancelled waiter was granted the lock: %+v", v)
				}
			})
		})
	}
}

// TestWaitForever checks that a forever wait is granted when the holder's lease
// expires, and not before.
func TestWaitForever(t *testing.T) {
	for _, class := range classes {
		t.Run(class.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l, _ := newLeader(t, leader.Config{})
				promote(t, l)
				const name = "jobs/forever"
				start := time.Now()
				h, w := grant(t, l, time.Second), grant(t, l, time.Hour)
				held := acquire(t, l, h, name, class, acquireOpts{}).Token
				ch := acquireAsync(t.Context(), l, args(w, name, class, acquireOpts{forever: true}))
				sleepUntil(start, 999*time.Millisecond)
				noResult(t, ch, "before the holder's lease expired")
				sleepUntil(start, 1001*time.Millisecond)
				r := result(t, ch, "after the holder's lease expired")
				if r.err != nil || r.g.Token <= held {
					t.Fatalf("forever wait: %+v, %v; want a grant above %d", r.g, r.err, held)
				}
				if v, err := l.Describe(name); err != nil || !v.Held || v.Token != r.g.Token || v.Waiters != 0 {
					t.Fatalf("Describe = %+v, %v", v, err)
				}
			})
		})
	}
}

// TestWaiterLeaseEnds checks that a waiter whose own lease ends is told so, with the
// reason its lease ended.
func TestWaiterLeaseEnds(t *testing.T) {
	for _, class := range classes {
		for _, how := range []core.EndReason{core.EndRevoked, core.EndExpired} {
			t.Run(class.String()+"/"+how.String(), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					l, _ := newLeader(t, leader.Config{})
					promote(t, l)
					h, w := grant(t, l, time.Hour), grant(t, l, time.Second)
					acquire(t, l, h, "q", class, acquireOpts{})
					ch := acquireAsync(t.Context(), l, args(w, "q", class, acquireOpts{forever: true}))
					if how == core.EndRevoked {
						if err := l.Revoke(context.Background(), w); err != nil {
							t.Fatal(err)
						}
					} else {
						time.Sleep(1100 * time.Millisecond)
					}
					r := result(t, ch, "after the waiter's lease ended")
					wantGone(t, r.err, how, "waiting Acquire")
					if n := queueLen(t, l, "q"); n != 0 {
						t.Fatalf("%d waiters, want 0", n)
					}
				})
			})
		}
	}
}

// ---- efficiency locks -----------------------------------------------------------------

// TestEfficiency checks efficiency locks: granted in memory from a reserved block above
// every earlier token, class conflicts both ways, dropped on Demote (waiters fail with
// ErrNotLeader) and served under a new epoch after the next Promote.
func TestEfficiency(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const block = 1000
		l, fl := newLeader(t, leader.Config{ReserveBlock: block})
		promote(t, l)
		epoch1 := l.Epoch()
		a, b := grant(t, l, time.Hour), grant(t, l, time.Hour)
		tc := acquire(t, l, a, "corr/1", core.Correctness, acquireOpts{}).Token

		// The first efficiency grant of the epoch reserves one block (one commit).
		n := fl.proposals(0)
		ge := acquire(t, l, a, "eff/1", core.Efficiency, acquireOpts{})
		cmds := fl.proposedSince(n)
		if len(cmds) != 1 || cmds[0].Op != core.OpReserve || cmds[0].Count != block {
			t.Fatalf("first efficiency grant proposed %+v, want one OpReserve of %d", cmds, block)
		}
		if ge.Token <= tc || ge.Epoch != epoch1 || ge.Epoch == "" {
			t.Fatalf("efficiency grant %+v: want a token above %d and epoch %q", ge, tc, epoch1)
		}
		// Later grants are in memory: nothing proposed.
		n = fl.proposals(0)
		ge2 := acquire(t, l, b, "eff/2", core.Efficiency, acquireOpts{})
		if again := acquire(t, l, a, "eff/1", core.Efficiency, acquireOpts{}); again.Token != ge.Token {
			t.Fatalf("idempotent efficiency acquire: token %d, want %d", again.Token, ge.Token)
		}
		if cmds := fl.proposedSince(n); len(cmds) != 0 {
			t.Fatalf("in-memory efficiency grant proposed %+v", cmds)
		}
		if ge2.Token <= ge.Token || ge2.Token >= ge.Token+block {
			t.Fatalf("second efficiency token %d, want in (%d, %d)", ge2.Token, ge.Token, ge.Token+block)
		}
		if fl.proposals(core.OpAcquire) != 1 {
			t.Fatalf("%d OpAcquire proposed, want 1 (the correctness lock only)", fl.proposals(core.OpAcquire))
		}
		fl.Read(func(s *core.State) {
			if s.Locks().Get("eff/1") != nil {
				t.Error("efficiency lock in the replicated state")
			}
		})

		// A correctness grant after the reservation is above the whole block.
		tc2 := acquire(t, l, b, "corr/2", core.Correctness, acquireOpts{}).Token
		if tc2 < ge.Token+block {
			t.Fatalf("correctness token %d after a reservation of [%d, %d)", tc2, ge.Token, ge.Token+block)
		}

		// Class conflicts, both ways, also for a lease that would otherwise wait.
		for _, c := range []struct {
			name  string
			class core.Class
			wait  time.Duration
		}{{"eff/1", core.Correctness, 0}, {"eff/1", core.Correctness, time.Second}, {"corr/1", core.Efficiency, 0}, {"corr/1", core.Efficiency, time.Second}} {
			_, err := l.Acquire(context.Background(), args(b, c.name, c.class, acquireOpts{waitFor: c.wait}))
			if !errors.Is(err, core.ErrClassConflict) {
				t.Fatalf("Acquire(%s as %v): %v, want ErrClassConflict", c.name, c.class, err)
			}
		}

		// When the leader is demoted, a waiting efficiency acquire fails with
		// ErrEpochLost (its queue is gone), a correctness one with ErrNotLeader (its place
		// in the replicated queue stays for the next leader).
		ch := acquireAsync(t.Context(), l, args(b, "eff/1", core.Efficiency, acquireOpts{waitFor: time.Minute}))
		if n := queueLen(t, l, "eff/1"); n != 1 {
			t.Fatalf("%d waiters, want 1", n)
		}
		chc := acquireAsync(t.Context(), l, args(a, "corr/2", core.Correctness, acquireOpts{waitFor: time.Minute}))
		if w := fl.waiters("corr/2"); len(w) != 1 {
			t.Fatalf("correctness waiters %v, want one", w)
		}
		l.Demote()
		r := result(t, ch, "after Demote")
		if !errors.Is(r.err, leader.ErrEpochLost) || errors.Is(r.err, leader.ErrNotLeader) {
			t.Fatalf("waiting efficiency acquire after Demote: %v, want ErrEpochLost", r.err)
		}
		if r := result(t, chc, "after Demote"); !errors.Is(r.err, leader.ErrNotLeader) {
			t.Fatalf("waiting correctness acquire after Demote: %v, want ErrNotLeader", r.err)
		}

		promote(t, l)
		epoch2 := l.Epoch()
		if epoch2 == "" || epoch2 == epoch1 {
			t.Fatalf("epoch after re-Promote %q, before %q: want a new one", epoch2, epoch1)
		}
		if ka, err := l.KeepAlive(t.Context(), a); err != nil || ka.Epoch != epoch2 {
			t.Fatalf("KeepAlive epoch %q, %v; want %q", ka.Epoch, err, epoch2)
		}
		for _, name := range []string{"eff/1", "eff/2"} {
			if v, err := l.Describe(name); err != nil || v.Held || v.Waiters != 0 {
				t.Fatalf("efficiency lock %s survived Demote: %+v, %v", name, v, err)
			}
		}
		if v, err := l.Describe("corr/1"); err != nil || !v.Held || v.Token != tc || v.Class != core.Correctness {
			t.Fatalf("correctness lock after re-Promote: %+v, %v", v, err)
		}
		// The old efficiency token no longer releases anything.
		if err := l.Release(context.Background(), a, "eff/1", ge.Token); !errors.Is(err, core.ErrNotHolder) {
			t.Fatalf("release of a lost efficiency lock: %v, want ErrNotHolder", err)
		}
		g := acquire(t, l, b, "eff/1", core.Efficiency, acquireOpts{})
		if g.Token <= tc2 || g.Epoch != epoch2 {
			t.Fatalf("efficiency grant in the new epoch %+v: want a token above %d and epoch %q", g, tc2, epoch2)
		}
	})
}

// ---- lock-delay -------------------------------------------------------------------------

// TestLockDelay checks that a lock whose holder's lease expires is granted to nobody until
// its lock-delay has passed, while a clean Release or Revoke hands it on at once.
func TestLockDelay(t *testing.T) {
	for _, class := range classes {
		for _, end := range []string{"expire", "release", "revoke"} {
			t.Run(class.String()+"/"+end, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					l, _ := newLeader(t, leader.Config{})
					promote(t, l)
					const name = "res/delay"
					start := time.Now()
					h, w := grant(t, l, time.Second), grant(t, l, time.Hour)
					held := acquire(t, l, h, name, class, acquireOpts{delay: 2 * time.Second})
					if v, _ := l.Describe(name); v.DelayMillis != 2000 {
						t.Fatalf("Describe lock_delay = %d, want 2000", v.DelayMillis)
					}
					ch := acquireAsync(t.Context(), l, args(w, name, class, acquireOpts{forever: true}))
					switch end {
					case "release":
						if err := l.Release(context.Background(), h, name, held.Token); err != nil {
							t.Fatal(err)
						}
					case "revoke":
						if err := l.Revoke(context.Background(), h); err != nil {
							t.Fatal(err)
						}
					case "expire":
						// The lease expires at 1s; the lock is delayed until 3s.
						sleepUntil(start, 1500*time.Millisecond)
						noResult(t, ch, "in the lock-delay")
						v, err := l.Describe(name)
						if err != nil || v.Held || v.DelayRemaining <= 0 || v.DelayRemaining > 1500*time.Millisecond {
							t.Fatalf("Describe in the lock-delay = %+v, %v", v, err)
						}
						sleepUntil(start, 2999*time.Millisecond)
						noResult(t, ch, "just before the lock-delay ends")
						sleepUntil(start, 3010*time.Millisecond)
					}
					r := result(t, ch, "after "+end)
					if r.err != nil || r.g.Token <= held.Token {
						t.Fatalf("waiter: %+v, %v; want a grant above %d", r.g, r.err, held.Token)
					}
					if end != "expire" && time.Since(start) != 0 {
						t.Fatalf("clean %s delayed the grant by %v", end, time.Since(start))
					}
				})
			})
		}
	}
}

// TestLockDelayRestartsOnPromote checks that a new leader restarts a correctness lock's
// delay at full length and that a demoted leader ends none.
func TestLockDelayRestartsOnPromote(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, fl := newLeader(t, leader.Config{})
		promote(t, l)
		start := time.Now()
		h := grant(t, l, time.Second)
		acquire(t, l, h, "res/d", core.Correctness, acquireOpts{delay: 2 * time.Second})
		sleepUntil(start, 2*time.Second) // expired at 1s; delayed until 3s
		l.Demote()
		sleepUntil(start, 10*time.Second)
		if n := fl.proposals(core.OpEndDelay); n != 0 {
			t.Fatalf("a demoted leader proposed %d OpEndDelay", n)
		}
		promote(t, l)
		start = time.Now()
		w := grant(t, l, time.Hour)
		ch := acquireAsync(t.Context(), l, args(w, "res/d", core.Correctness, acquireOpts{forever: true}))
		sleepUntil(start, 1999*time.Millisecond)
		noResult(t, ch, "in the restarted lock-delay")
		sleepUntil(start, 2010*time.Millisecond)
		if r := result(t, ch, "after the restarted lock-delay"); r.err != nil {
			t.Fatal(r.err)
		}
	})
}

// ---- force release ----------------------------------------------------------------------

// TestForceRelease checks that a force release tells the old holder on its next
// keepalive (with the reason), fences it out, and that the next grant is above the
// consumed fence token.
func TestForceRelease(t *testing.T) {
	for _, class := range classes {
		t.Run(class.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l, _ := newLeader(t, leader.Config{})
				promote(t, l)
				const name, reason = "res/force", "operator alice: stuck job"
				h, w := grant(t, l, time.Minute), grant(t, l, time.Minute)
				held := acquire(t, l, h, name, class, acquireOpts{}).Token
				ch := acquireAsync(t.Context(), l, args(w, name, class, acquireOpts{forever: true}))
				released, fence, err := l.ForceRelease(context.Background(), name, reason)
				if err != nil || released != held || fence <= held {
					t.Fatalf("ForceRelease = %d, %d, %v; want released %d and a larger fence", released, fence, err, held)
				}
				r := result(t, ch, "after the force release")
				if r.err != nil || r.g.Token <= fence {
					t.Fatalf("next grant %+v, %v; want a token above the fence %d", r.g, r.err, fence)
				}
				want := []core.LostLock{{Name: name, Token: held, Reason: reason}}
				for i := range 2 { // every answer repeats it, until the lease ends
					ka, err := l.KeepAlive(t.Context(), h)
					if err != nil {
						t.Fatal(err)
					}
					if !slices.Equal(ka.Lost, want) {
						t.Fatalf("KeepAlive %d: lost = %+v, want %+v", i+1, ka.Lost, want)
					}
				}
				if ka, _ := l.KeepAlive(t.Context(), w); len(ka.Lost) != 0 {
					t.Fatalf("the new holder's KeepAlive reports lost locks: %+v", ka.Lost)
				}
				if err := l.Release(context.Background(), h, name, held); !errors.Is(err, core.ErrNotHolder) {
					t.Fatalf("old holder's Release: %v, want ErrNotHolder", err)
				}
				if v, _ := l.Describe(name); !v.Held || v.Token != r.g.Token {
					t.Fatalf("Describe after force release = %+v", v)
				}
				// A force release of a free lock still consumes a token.
				if err := l.Release(context.Background(), w, name, r.g.Token); err != nil {
					t.Fatal(err)
				}
				released, fence2, err := l.ForceRelease(context.Background(), name, "again")
				if err != nil || released != 0 || fence2 <= r.g.Token {
					t.Fatalf("ForceRelease of a free lock = %d, %d, %v", released, fence2, err)
				}
				if g := acquire(t, l, h, name, class, acquireOpts{}); g.Token <= fence2 {
					t.Fatalf("grant after a force release of a free lock: %d, want above %d", g.Token, fence2)
				}
			})
		})
	}
}

// TestReleaseChecksOwner checks that Release by a non-holder or with a wrong token is
// an error and changes nothing.
func TestReleaseChecksOwner(t *testing.T) {
	for _, class := range classes {
		t.Run(class.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l, _ := newLeader(t, leader.Config{})
				promote(t, l)
				h, o := grant(t, l, time.Minute), grant(t, l, time.Minute)
				tok := acquire(t, l, h, "own", class, acquireOpts{}).Token
				if err := l.Release(context.Background(), h, "own", tok+1); !errors.Is(err, core.ErrNotHolder) {
					t.Fatalf("wrong token: %v", err)
				}
				if err := l.Release(context.Background(), o, "own", tok); !errors.Is(err, core.ErrNotHolder) {
					t.Fatalf("other lease: %v", err)
				}
				if v, _ := l.Describe("own"); !v.Held || v.Token != tok {
					t.Fatalf("lock changed by a refused release: %+v", v)
				}
			})
		})
	}
}

// TestOldTermReservationNotUsed checks G1 across terms: a token reservation proposed
// while this node led, whose answer reaches it only after it was deposed, another
// leader served and it leads again, must not feed the new term's grants. The other
// leader reserved later, larger blocks and granted from them; the old block's tokens
// would take a lock's token backwards.
func TestOldTermReservationNotUsed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := leader.Config{ReserveBlock: 100}
		l, fl := newLeader(t, cfg)
		promote(t, l)
		a := grant(t, l, time.Hour)
		release := fl.holdNext(core.OpReserve) // applied; the answer is held back
		first := acquireAsync(t.Context(), l, args(a, "eff/a", core.Efficiency, acquireOpts{}))
		l.Demote()

		other := newLeaderOn(t, fl, cfg)
		promote(t, other)
		g2 := acquire(t, other, a, "eff/a", core.Efficiency, acquireOpts{})
		other.Demote()

		fl.mu.Lock()
		fl.observe, fl.holdEnds = l.OnEffects, l.OnHoldEnds
		fl.mu.Unlock()
		promote(t, l)
		release() // the first term's reservation is answered only now
		if r := result(t, first, "the acquire of the first term"); r.err == nil && r.g.Token <= g2.Token {
			t.Fatalf("eff/a granted token %d after the other leader granted it %d: a reservation of an older term was used", r.g.Token, g2.Token)
		}
		g3 := acquire(t, l, a, "eff/b", core.Efficiency, acquireOpts{})
		if g3.Token <= g2.Token {
			t.Fatalf("eff/b granted token %d after the other leader granted %d: a reservation of an older term was used", g3.Token, g2.Token)
		}
	})
}

// TestEfficiencyTokensGrowWithOutOfOrderReservations checks G1 for efficiency tokens
// ("they grow while one leader serves") when two reservations complete out of order: two
// first efficiency acquires of an epoch both reserve a block; the proposer of the earlier
// block hears of its commit last. Its block must not replace the later one.
func TestEfficiencyTokensGrowWithOutOfOrderReservations(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, fl := newLeader(t, leader.Config{ReserveBlock: 100})
		promote(t, l)
		a, b := grant(t, l, time.Hour), grant(t, l, time.Hour)
		release := fl.holdNext(core.OpReserve)
		first := acquireAsync(t.Context(), l, args(a, "eff/a", core.Efficiency, acquireOpts{}))
		if fl.proposals(core.OpReserve) != 1 {
			t.Fatal("first efficiency acquire did not reserve")
		}
		gb := acquire(t, l, b, "eff/b", core.Efficiency, acquireOpts{})
		release()
		ra := result(t, first, "first acquire")
		if ra.err != nil {
			t.Fatal(ra.err)
		}
		gc := acquire(t, l, b, "eff/c", core.Efficiency, acquireOpts{})
		if gc.Token <= gb.Token || gc.Token <= ra.g.Token {
			t.Fatalf("efficiency tokens went backwards: eff/b %d, then eff/a %d, then eff/c %d", gb.Token, ra.g.Token, gc.Token)
		}
	})
}

// TestEfficiencyBlockRunsDry checks that an efficiency grant to a waiter, made after the
// reserved block's tokens were used by other grants, never takes a token that was not
// reserved — which would be the same token a correctness grant gets next (G1: tokens are
// never reused). With a tiny block this used to happen; the leader now keeps the block
// covering every queued waiter.
func TestEfficiencyBlockRunsDry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, _ := newLeader(t, leader.Config{ReserveBlock: 2})
		promote(t, l)
		a, b, c := grant(t, l, time.Hour), grant(t, l, time.Hour), grant(t, l, time.Hour)
		ga := acquire(t, l, a, "eff/1", core.Efficiency, acquireOpts{}) // token 1
		ch := acquireAsync(t.Context(), l, args(c, "eff/1", core.Efficiency, acquireOpts{forever: true}))
		acquire(t, l, b, "eff/2", core.Efficiency, acquireOpts{}) // uses up the original block
		if err := l.Release(context.Background(), a, "eff/1", ga.Token); err != nil {
			t.Fatal(err)
		}
		rc := result(t, ch, "waiter")
		if rc.err != nil {
			t.Fatal(rc.err)
		}
		gd := acquire(t, l, b, "corr/1", core.Correctness, acquireOpts{})
		ge := acquire(t, l, b, "eff/3", core.Efficiency, acquireOpts{})
		seen := map[uint64]string{}
		for name, tok := range map[string]uint64{"eff/1 (waiter)": rc.g.Token, "corr/1": gd.Token, "eff/3": ge.Token} {
			if other, dup := seen[tok]; dup {
				t.Errorf("token %d handed out twice: %s and %s", tok, other, name)
			}
			seen[tok] = name
		}
		if ge.Token <= rc.g.Token {
			t.Errorf("efficiency tokens went backwards: %d then %d", rc.g.Token, ge.Token)
		}
	})
}

// TestClassConflictWithCorrectnessInFlight checks G2 across classes: while a correctness
// acquire of a name is being committed, an efficiency acquire of the same name must fail
// with a class conflict, or both classes would hold the name at once.
func TestClassConflictWithCorrectnessInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, fl := newLeader(t, leader.Config{})
		promote(t, l)
		a, b := grant(t, l, time.Hour), grant(t, l, time.Hour)
		acquire(t, l, b, "warm/up", core.Efficiency, acquireOpts{}) // reserve a block first
		open := fl.gate(core.OpAcquire)
		corr := acquireAsync(t.Context(), l, args(a, "both", core.Correctness, acquireOpts{}))
		_, err := l.Acquire(context.Background(), args(b, "both", core.Efficiency, acquireOpts{}))
		open()
		if r := result(t, corr, "correctness acquire"); r.err != nil {
			t.Fatal(r.err)
		}
		if !errors.Is(err, core.ErrClassConflict) {
			t.Fatalf("efficiency acquire while a correctness acquire is in flight: %v, want ErrClassConflict", err)
		}
		if v, _ := l.Describe("both"); v.Class != core.Correctness || !v.Held {
			t.Fatalf("Describe = %+v, want held as correctness", v)
		}
	})
}

// TestAcquireNow: AcquireNow grants a free efficiency lock from memory, answers a
// repeated acquire with the same grant, and in every case where a grant would need a
// wait or the log it reports false and changes nothing: no place in a queue, no token
// spent, no proposal.
func TestAcquireNow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, fl := newLeader(t, leader.Config{ReserveBlock: 1000})
		a0 := args(core.LeaseID{9}, "eff/x", core.Efficiency, acquireOpts{forever: true})
		if _, ok := l.AcquireNow(a0); ok {
			t.Fatal("AcquireNow granted on a node that does not lead")
		}
		promote(t, l)
		a, b := grant(t, l, time.Hour), grant(t, l, time.Hour)
		acquire(t, l, a, "corr/1", core.Correctness, acquireOpts{})
		if _, ok := l.AcquireNow(args(a, "eff/x", core.Efficiency, acquireOpts{forever: true})); ok {
			t.Fatal("AcquireNow granted before any tokens were reserved")
		}
		first := acquire(t, l, a, "eff/first", core.Efficiency, acquireOpts{}) // reserves a block

		n := fl.proposals(0)
		g, ok := l.AcquireNow(args(a, "eff/x", core.Efficiency, acquireOpts{forever: true}))
		if !ok || g.Token <= first.Token || g.Class != core.Efficiency || g.Epoch != l.Epoch() {
			t.Fatalf("AcquireNow of a free lock = %+v, %v; want a grant above token %d", g, ok, first.Token)
		}
		if again, ok := l.AcquireNow(args(a, "eff/x", core.Efficiency, acquireOpts{})); !ok || again.Token != g.Token {
			t.Fatalf("repeated AcquireNow = %+v, %v; want the same grant %d", again, ok, g.Token)
		}
		for _, c := range []struct {
			what string
			a    leader.AcquireArgs
		}{
			{"held by another lease", args(b, "eff/x", core.Efficiency, acquireOpts{forever: true})},
			{"a correctness lock's name", args(b, "corr/1", core.Efficiency, acquireOpts{forever: true})},
			{"the correctness class", args(b, "corr/2", core.Correctness, acquireOpts{})},
			{"an unknown lease", args(core.LeaseID{7}, "eff/y", core.Efficiency, acquireOpts{})},
		} {
			if got, ok := l.AcquireNow(c.a); ok {
				t.Fatalf("AcquireNow, %s: granted %+v", c.what, got)
			}
		}
		if q := queueLen(t, l, "eff/x"); q != 0 {
			t.Fatalf("AcquireNow of a held lock queued %d waiters", q)
		}
		if cmds := fl.proposedSince(n); len(cmds) != 0 {
			t.Fatalf("AcquireNow proposed %+v", cmds)
		}
		// Tokens spent only on the grant: the next grant follows it directly.
		if next := acquire(t, l, b, "eff/z", core.Efficiency, acquireOpts{}); next.Token != g.Token+1 {
			t.Fatalf("next grant's token %d, want %d: a refused AcquireNow spent tokens", next.Token, g.Token+1)
		}
		l.Demote()
		if _, ok := l.AcquireNow(args(a, "eff/w", core.Efficiency, acquireOpts{})); ok {
			t.Fatal("AcquireNow granted after Demote")
		}
	})
}

// TestAcquireThenReleaseThen: the variants that do not wait for the commit give the
// same answers as Acquire and Release — a grant, a queued acquire's later grant (with
// a larger token) once the holder releases, the owner check, the class conflict and
// ErrNotLeader — each exactly once.
func TestAcquireThenReleaseThen(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, _ := newLeader(t, leader.Config{})
		promote(t, l)
		acquireThen := func(a leader.AcquireArgs) <-chan acqResult {
			ch := make(chan acqResult, 2) // room for a wrong second call, caught below
			l.AcquireThen(t.Context(), a, func(g leader.Grant, err error) { ch <- acqResult{g, err} })
			synctest.Wait()
			return ch
		}
		releaseThen := func(lease core.LeaseID, name string, token uint64) error {
			ch := make(chan error, 2)
			l.ReleaseThen(lease, name, token, func(err error) { ch <- err })
			synctest.Wait()
			if len(ch) != 1 {
				t.Fatalf("ReleaseThen(%s) answered %d times", name, len(ch))
			}
			return <-ch
		}
		h, w := grant(t, l, time.Minute), grant(t, l, time.Minute)
		const name = "then/x"
		held := result(t, acquireThen(args(h, name, core.Correctness, acquireOpts{})), "grant")
		if held.err != nil || held.g.Token == 0 || held.g.Class != core.Correctness {
			t.Fatalf("AcquireThen of a free lock: %+v, %v", held.g, held.err)
		}
		waiting := acquireThen(args(w, name, core.Correctness, acquireOpts{forever: true}))
		noResult(t, waiting, "a queued AcquireThen")
		if err := releaseThen(w, name, held.g.Token); !errors.Is(err, core.ErrNotHolder) {
			t.Fatalf("ReleaseThen by a lease that does not hold it: %v, want core.ErrNotHolder", err)
		}
		if err := releaseThen(h, name, held.g.Token); err != nil {
			t.Fatalf("ReleaseThen by the holder: %v", err)
		}
		got := result(t, waiting, "the queued grant")
		if got.err != nil || got.g.Token <= held.g.Token {
			t.Fatalf("queued AcquireThen: %+v, %v; want a token above %d", got.g, got.err, held.g.Token)
		}
		noResult(t, waiting, "a second answer")

		acquire(t, l, h, "then/eff", core.Efficiency, acquireOpts{})
		if r := result(t, acquireThen(args(w, "then/eff", core.Correctness, acquireOpts{})), "conflict"); !errors.Is(r.err, core.ErrClassConflict) {
			t.Fatalf("AcquireThen of an efficiency lock as correctness: %v, want core.ErrClassConflict", r.err)
		}
		l.Demote()
		if r := result(t, acquireThen(args(w, "then/y", core.Correctness, acquireOpts{})), "not leader"); !errors.Is(r.err, leader.ErrNotLeader) {
			t.Fatalf("AcquireThen after Demote: %v, want ErrNotLeader", r.err)
		}
		if err := releaseThen(w, name, got.g.Token); !errors.Is(err, leader.ErrNotLeader) {
			t.Fatalf("ReleaseThen after Demote: %v, want ErrNotLeader", err)
		}
	})
}

// BenchmarkKeepAlive renews leases in a random order among 100,000 live ones: the cost
// of a keepalive in the leader (countdown bookkeeping under its mutex).
func BenchmarkKeepAlive(b *testing.B) {
	l, _ := newLeader(b, leader.Config{})
	if err := l.Promote(context.Background()); err != nil {
		b.Fatal(err)
	}
	defer l.Demote()
	ids := make([]core.LeaseID, 100_000)
	for i := range ids {
		id, err := l.Grant(context.Background(), time.Minute)
		if err != nil {
			b.Fatal(err)
		}
		ids[i] = id
	}
	r := rand.New(rand.NewPCG(1, 2))
	ctx := context.Background()
	b.ResetTimer()
	for b.Loop() {
		if _, err := l.KeepAlive(ctx, ids[r.IntN(len(ids))]); err != nil {
			b.Fatal(err)
		}
	}
}

// TestRevokedLeasesLeaveTheQueue: a lease that ends before it is due leaves its entry in
// the countdown queue behind, stale; once stale entries are most of the queue it is
// rebuilt without them, and neither kind of entry makes the expiry loop propose anything
// for an ended lease or anything early for a live one (G4).
func TestRevokedLeasesLeaveTheQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, fl := newLeader(t, leader.Config{})
		promote(t, l)
		start := time.Now()
		const n, kept = 3000, 500
		ids := make([]core.LeaseID, n)
		for i := range ids {
			ids[i] = grant(t, l, 10*time.Second)
		}
		for _, id := range ids[kept:] {
			if err := l.Revoke(t.Context(), id); err != nil {
				t.Fatalf("Revoke: %v", err)
			}
		}
		// 2,500 ended: the queue was rebuilt when stale entries passed half of it, and
		// holds at most the live leases plus the stale entries since.
		if got := l.QueueLen(); got > kept+1100 || got < kept {
			t.Fatalf("queue holds %d entries for %d live leases after %d revocations", got, kept, n-kept)
		}
		// Keepalives at 5 s move the kept leases' deadlines to 15 s.
		sleepUntil(start, 5*time.Second)
		for _, id := range ids[:kept] {
			if _, err := l.KeepAlive(t.Context(), id); err != nil {
				t.Fatalf("KeepAlive: %v", err)
			}
		}
		sleepUntil(start, 14900*time.Millisecond)
		if at, ok := fl.firstProposal(core.OpExpire, core.LeaseID{}); ok {
			t.Fatalf("an expiry proposed at %v, before any lease was due (15 s)", at.Sub(start))
		}
		sleepUntil(start, 16*time.Second)
		for i, id := range ids {
			_, proposed := fl.firstProposal(core.OpExpire, id)
			if live := i < kept; proposed != live || fl.leaseAlive(id) {
				t.Fatalf("lease %d (kept: %v): expiry proposed %v, alive %v at 16 s", i, live, proposed, fl.leaseAlive(id))
			}
		}
		if got := l.QueueLen(); got != 0 {
			t.Fatalf("queue holds %d entries once every lease has ended", got)
		}
	})
}
