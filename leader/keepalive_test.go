package leader_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leasehold/leasehold/core"
	"github.com/leasehold/leasehold/leader"
)

// TestKeepAliveConfirmsLeadership checks G4's confirmation in the leader itself, so
// that no caller of KeepAlive can skip it: every keepalive asks the log to confirm
// leadership, after the countdown restarted; a leader that cannot confirm answers
// ErrNotLeader (wrapping the log's error), for a live lease and also for one it counts
// as gone (a deposed leader must not declare a lease gone that the new leader keeps);
// CheckToken confirms the same way; a context's error passes through unchanged.
func TestKeepAliveConfirmsLeadership(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, fl := newLeader(t, leader.Config{})
		promote(t, l)
		const ttl = time.Second
		id := grant(t, l, ttl)
		held := acquire(t, l, id, "confirm/x", core.Correctness, acquireOpts{}).Token
		time.Sleep(600 * time.Millisecond)

		// When the confirmation starts, the countdown already runs from the keepalive.
		var remaining time.Duration
		fl.onVerify = func() {
			v, err := l.Describe("confirm/x")
			if err != nil {
				t.Errorf("Describe during the confirmation: %v", err)
			}
			remaining = v.TTLRemaining
		}
		n := fl.verifications()
		ka, err := l.KeepAlive(t.Context(), id)
		if err != nil || ka.TTL != ttl {
			t.Fatalf("KeepAlive = %+v, %v", ka, err)
		}
		if fl.verifications() != n+1 {
			t.Fatalf("KeepAlive asked for %d confirmations, want 1", fl.verifications()-n)
		}
		if remaining != ttl {
			t.Fatalf("countdown during the confirmation: %v left, want the full %v (restarted before confirming)", remaining, ttl)
		}
		fl.onVerify = nil

		fl.setDeposed(true)
		for _, lease := range []core.LeaseID{id, {0x99}} {
			_, err := l.KeepAlive(t.Context(), lease)
			if !errors.Is(err, leader.ErrNotLeader) || !errors.Is(err, errFakeDeposed) || errors.Is(err, core.ErrLeaseNotFound) {
				t.Fatalf("KeepAlive(%s) on a deposed leader: %v; want ErrNotLeader wrapping the log's error", lease, err)
			}
		}
		if _, _, err := l.CheckToken(t.Context(), "confirm/x", held); !errors.Is(err, leader.ErrNotLeader) {
			t.Fatalf("CheckToken on a deposed leader: %v, want ErrNotLeader", err)
		}
		fl.setDeposed(false)

		if cur, tok, err := l.CheckToken(t.Context(), "confirm/x", held); err != nil || tok != held || !cur {
			t.Fatalf("CheckToken = %v, %d, %v; want current, %d", cur, tok, err, held)
		}
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		for what, err := range map[string]error{
			"KeepAlive":  second(l.KeepAlive(ctx, id)),
			"CheckToken": third(l.CheckToken(ctx, "confirm/x", held)),
		} {
			if !errors.Is(err, context.Canceled) || errors.Is(err, leader.ErrNotLeader) {
				t.Fatalf("%s with a cancelled context: %v, want context.Canceled", what, err)
			}
		}
	})
}

func second[T any](_ T, err error) error { return err }

func third[T, U any](_ T, _ U, err error) error { return err }

// TestLostLockSurvivesNewLeader checks G4b across a failover: a correctness lock
// force-released under one leader is reported, with the operator's reason, in the
// keepalive answers of the next leader (it is in the replicated state), until the lease
// ends. An efficiency lock's notice goes with the old leader's memory; its holder learns
// of the loss from the new epoch instead.
func TestLostLockSurvivesNewLeader(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		old, fl := newLeader(t, leader.Config{})
		promote(t, old)
		epoch := old.Epoch()
		h := grant(t, old, time.Minute)
		corr := acquire(t, old, h, "failover/corr", core.Correctness, acquireOpts{}).Token
		acquire(t, old, h, "failover/eff", core.Efficiency, acquireOpts{})
		for _, name := range []string{"failover/corr", "failover/eff"} {
			if released, _, err := old.ForceRelease(t.Context(), name, "operator bob: "+name); err != nil || released == 0 {
				t.Fatalf("ForceRelease(%s) = %d, %v", name, released, err)
			}
		}
		if ka, err := old.KeepAlive(t.Context(), h); err != nil || len(ka.Lost) != 2 {
			t.Fatalf("the old leader's KeepAlive = %+v, %v; want both locks lost", ka, err)
		}
		old.Demote()

		next := newLeaderOn(t, fl, leader.Config{})
		promote(t, next)
		want := []core.LostLock{{Name: "failover/corr", Token: corr, Reason: "operator bob: failover/corr"}}
		for i := range 2 {
			ka, err := next.KeepAlive(t.Context(), h)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(ka.Lost, want) || ka.Epoch == epoch {
				t.Fatalf("the new leader's KeepAlive %d = %+v; want lost %+v and a new epoch (was %q)", i+1, ka, want, epoch)
			}
		}
		if err := next.Revoke(t.Context(), h); err != nil {
			t.Fatal(err)
		}
		fl.Read(func(s *core.State) {
			if lost := s.Locks().Lost(h); lost != nil {
				t.Errorf("the state keeps the lost locks of an ended lease: %+v", lost)
			}
		})
	})
}

// TestForceReleaseEfficiencyShortOfTokens: a force release of an efficiency lock when
// the reserved block cannot cover its fence token and the grants it may make reserves
// more and then releases the lock. It used to fall through to the replicated table,
// which does not have the lock: the holder kept it, the operator was told nothing was
// held, and the waiter stayed queued.
func TestForceReleaseEfficiencyShortOfTokens(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, _ := newLeader(t, leader.Config{ReserveBlock: 2})
		promote(t, l)
		a, b, c, d := grant(t, l, time.Hour), grant(t, l, time.Hour), grant(t, l, time.Hour), grant(t, l, time.Hour)
		ta := acquire(t, l, a, "eff/1", core.Efficiency, acquireOpts{}).Token
		wb := acquireAsync(t.Context(), l, args(b, "eff/1", core.Efficiency, acquireOpts{forever: true}))
		tc := acquire(t, l, c, "eff/2", core.Efficiency, acquireOpts{}).Token
		wd := acquireAsync(t.Context(), l, args(d, "eff/2", core.Efficiency, acquireOpts{forever: true}))
		// Use the block down to one token more than the two waiters need.
		for _, name := range []string{"eff/3", "eff/4", "eff/5"} {
			acquire(t, l, a, name, core.Efficiency, acquireOpts{})
		}
		if released, _, err := l.ForceRelease(t.Context(), "eff/1", "first"); err != nil || released != ta {
			t.Fatalf("ForceRelease(eff/1) = %d, %v; want %d", released, err, ta)
		}
		if r := result(t, wb, "eff/1's waiter"); r.err != nil {
			t.Fatal(r.err)
		}
		released, fence, err := l.ForceRelease(t.Context(), "eff/2", "second")
		if err != nil || released != tc {
			t.Fatalf("ForceRelease(eff/2) = %d, %d, %v; want released %d", released, fence, err, tc)
		}
		r := result(t, wd, "eff/2's waiter")
		if r.err != nil || r.g.Token <= fence {
			t.Fatalf("eff/2's waiter: %+v, %v; want a grant above the fence %d", r.g, r.err, fence)
		}
		if v, _ := l.Describe("eff/2"); v.Class != core.Efficiency || v.Token != r.g.Token {
			t.Fatalf("Describe(eff/2) = %+v", v)
		}
	})
}

// TestExpiryRetried: an expiry whose proposal fails (outcome unknown) is proposed again
// shortly, and the lease refuses keepalives meanwhile; expiries are proposed without a
// goroutine waiting for each (Log.ApplyThen).
func TestExpiryRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, fl := newLeader(t, leader.Config{})
		promote(t, l)
		start := time.Now()
		id := grant(t, l, time.Second)
		fl.failNext(core.OpExpire, errors.New("fake log: outcome unknown"))
		sleepUntil(start, 1050*time.Millisecond)
		if n := fl.proposals(core.OpExpire); n != 1 || !fl.leaseAlive(id) {
			t.Fatalf("at 1.05s: %d expiries proposed, lease alive %v; want 1 (failed), alive", n, fl.leaseAlive(id))
		}
		_, err := l.KeepAlive(t.Context(), id)
		wantGone(t, err, core.EndExpired, "KeepAlive after a failed expiry")
		sleepUntil(start, 1200*time.Millisecond)
		if n := fl.proposals(core.OpExpire); n != 2 || fl.leaseAlive(id) {
			t.Fatalf("at 1.2s: %d expiries proposed, lease alive %v; want the retry applied", n, fl.leaseAlive(id))
		}
		fl.mu.Lock()
		thens := fl.thens
		fl.mu.Unlock()
		if thens != 2 {
			t.Fatalf("%d proposals through ApplyThen, want the 2 expiries", thens)
		}
	})
}

// TestKeepAliveThenConfirmsLeadership: KeepAliveThen, the fast lane's keepalive,
// restarts the countdown at once and answers only after a confirmation, as KeepAlive
// does: a leader that cannot confirm answers ErrNotLeader for a live lease and for one
// it counts as gone.
func TestKeepAliveThenConfirmsLeadership(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, fl := newLeader(t, leader.Config{})
		promote(t, l)
		const ttl = time.Second
		id := grant(t, l, ttl)
		acquire(t, l, id, "confirm/then", core.Correctness, acquireOpts{})
		time.Sleep(600 * time.Millisecond)
		keepAlive := func(lease core.LeaseID) (leader.KeepAliveResult, error) {
			type answer struct {
				ka  leader.KeepAliveResult
				err error
			}
			got := make(chan answer, 1)
			l.KeepAliveThen(lease, func(ka leader.KeepAliveResult, err error) { got <- answer{ka, err} })
			a := <-got
			return a.ka, a.err
		}
		n := fl.verifications()
		if ka, err := keepAlive(id); err != nil || ka.TTL != ttl {
			t.Fatalf("KeepAliveThen = %+v, %v", ka, err)
		}
		if fl.verifications() != n+1 {
			t.Fatalf("KeepAliveThen asked for %d confirmations, want 1", fl.verifications()-n)
		}
		if v, err := l.Describe("confirm/then"); err != nil || v.TTLRemaining != ttl {
			t.Fatalf("after KeepAliveThen: %v left (%v), want the full %v", v.TTLRemaining, err, ttl)
		}
		fl.setDeposed(true)
		for _, lease := range []core.LeaseID{id, {0x99}} {
			if _, err := keepAlive(lease); !errors.Is(err, leader.ErrNotLeader) || !errors.Is(err, errFakeDeposed) || errors.Is(err, core.ErrLeaseNotFound) {
				t.Fatalf("KeepAliveThen(%s) on a deposed leader: %v; want ErrNotLeader wrapping the log's error", lease, err)
			}
		}
	})
}
