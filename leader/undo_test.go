package leader_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/leasehold/leasehold/core"
	"github.com/leasehold/leasehold/leader"
)

// A correctness acquire whose caller leaves while its command commits must not leave
// the lease holding, or queued for, a lock its owner never heard of: that grant would
// block every other holder for as long as the lease lives, and a later Lock of the name
// by the same lease would be answered with it, an old token. These tests freeze the
// commit (gate), end the caller's context, let the commit through, and look at the
// replicated state.

// eventually fails the test unless cond holds within a few seconds.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after 5 s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// leftDuring starts a request (start, which proposes op) with a context that ends
// while its commit is held back, and returns once the request has answered ctx's error;
// the commit is let through before that answer when answerAfterCommit (AcquireThen
// answers only then), after it otherwise.
func leftDuring(t *testing.T, fl *fakeLog, op core.Op, answerAfterCommit bool, start func(ctx context.Context, errc chan<- error)) {
	t.Helper()
	before := fl.proposals(op)
	open := fl.gate(op)
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	start(ctx, errc)
	eventually(t, "the request is proposed", func() bool { return fl.proposals(op) > before })
	cancel()
	if answerAfterCommit {
		open()
	}
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("answer to a caller who left = %v, want context.Canceled", err)
	}
	if !answerAfterCommit {
		open()
	}
}

// leftDuringCommit runs an Acquire (AcquireThen when then) of a through leftDuring.
func leftDuringCommit(t *testing.T, l *leader.Leader, fl *fakeLog, a leader.AcquireArgs, then bool) {
	t.Helper()
	leftDuring(t, fl, core.OpAcquire, then, func(ctx context.Context, errc chan<- error) {
		if then {
			l.AcquireThen(ctx, a, func(_ leader.Grant, err error) { errc <- err })
			return
		}
		go func() {
			_, err := l.Acquire(ctx, a)
			errc <- err
		}()
	})
}

func TestAcquireGrantForACallerWhoLeftIsReleased(t *testing.T) {
	for _, then := range []bool{false, true} {
		t.Run(map[bool]string{false: "Acquire", true: "AcquireThen"}[then], func(t *testing.T) {
			l, fl := newLeader(t, leader.Config{})
			promote(t, l)
			lease := grant(t, l, time.Minute)
			leftDuringCommit(t, l, fl, args(lease, "orders", core.Correctness, acquireOpts{}), then)
			eventually(t, "the grant is released", func() bool {
				holder, _ := fl.holder("orders")
				return holder.IsZero() && fl.proposals(core.OpRelease) == 1
			})
			// The lease is free to take it again, with a new token.
			g := acquire(t, l, lease, "orders", core.Correctness, acquireOpts{})
			if _, tok := fl.holder("orders"); tok != g.Token {
				t.Fatalf("held with token %d, the new grant says %d", tok, g.Token)
			}
		})
	}
}

func TestAcquirePlaceForACallerWhoLeftIsCancelled(t *testing.T) {
	for _, then := range []bool{false, true} {
		t.Run(map[bool]string{false: "Acquire", true: "AcquireThen"}[then], func(t *testing.T) {
			l, fl, holder, waiter, g := heldWithWaiter(t)
			leftDuringCommit(t, l, fl, args(waiter, "orders", core.Correctness, acquireOpts{forever: true}), then)
			eventually(t, "the place is cancelled", func() bool {
				return len(fl.waiters("orders")) == 0 && fl.proposals(core.OpCancelWait) == 1
			})
			if err := l.Release(t.Context(), holder, "orders", g.Token); err != nil {
				t.Fatalf("Release: %v", err)
			}
			if h, _ := fl.holder("orders"); !h.IsZero() {
				t.Fatalf("after the holder's release, %s holds the lock: the place of a caller who left was granted", h)
			}
		})
	}
}

// An acquire that finds the grant made by an earlier attempt (Result.Again) leaves it:
// the attempt that made it answered its caller.
func TestAcquireThatFoundAnEarlierGrantUndoesNothing(t *testing.T) {
	l, fl := newLeader(t, leader.Config{})
	promote(t, l)
	lease := grant(t, l, time.Minute)
	g := acquire(t, l, lease, "orders", core.Correctness, acquireOpts{})
	leftDuringCommit(t, l, fl, args(lease, "orders", core.Correctness, acquireOpts{}), false)
	// Nothing to wait for: check that no undo comes.
	time.Sleep(50 * time.Millisecond)
	if h, tok := fl.holder("orders"); h != lease || tok != g.Token {
		t.Fatalf("held by %s with token %d, want %s with %d", h, tok, lease, g.Token)
	}
	if n := fl.proposals(core.OpRelease) + fl.proposals(core.OpCancelWait); n != 0 {
		t.Fatalf("%d releases or cancellations proposed, want none", n)
	}
}

// attempt runs an Acquire of a with ctx on a goroutine of its own; its answer comes on
// the channel.
func attempt(l *leader.Leader, ctx context.Context, a leader.AcquireArgs) <-chan error {
	errc := make(chan error, 1)
	go func() {
		_, err := l.Acquire(ctx, a)
		errc <- err
	}()
	return errc
}

// ending is the acquire of "orders" by lease for an attempt whose wait ends as how says:
// "wait ran out" waits for wait, "caller left" for ever (the test ends its context).
func ending(how string, lease core.LeaseID, wait time.Duration) leader.AcquireArgs {
	if how == "wait ran out" {
		return args(lease, "orders", core.Correctness, acquireOpts{waitFor: wait})
	}
	return args(lease, "orders", core.Correctness, acquireOpts{forever: true})
}

// heldWithWaiter returns a leader on which one lease holds "orders" (g) and another,
// waiter, has yet to ask for it.
func heldWithWaiter(t *testing.T) (l *leader.Leader, fl *fakeLog, holder, waiter core.LeaseID, g leader.Grant) {
	t.Helper()
	l, fl = newLeader(t, leader.Config{})
	promote(t, l)
	holder, waiter = grant(t, l, time.Minute), grant(t, l, time.Minute)
	return l, fl, holder, waiter, acquire(t, l, holder, "orders", core.Correctness, acquireOpts{})
}

// Two attempts of one acquire wait for the same place (the client gave the first up and
// retried): the first one's end, by its caller leaving or by its wait running out,
// leaves the place to the second.
func TestAcquireAttemptLeavesThePlaceToAnother(t *testing.T) {
	for _, how := range []string{"caller left", "wait ran out"} {
		t.Run(how, func(t *testing.T) {
			l, fl, holder, waiter, g := heldWithWaiter(t)
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			firstErr := attempt(l, ctx, ending(how, waiter, 100*time.Millisecond))
			eventually(t, "the first attempt is queued", func() bool { return len(fl.waiters("orders")) == 1 })
			type answer struct {
				g   leader.Grant
				err error
			}
			second := make(chan answer, 1)
			sctx, scancel := context.WithCancel(t.Context())
			defer func() {
				scancel()
				<-second
			}()
			go func() {
				g, err := l.Acquire(sctx, args(waiter, "orders", core.Correctness, acquireOpts{forever: true}))
				second <- answer{g, err}
			}()
			eventually(t, "the second attempt is proposed", func() bool { return fl.proposals(core.OpAcquire) == 3 })
			time.Sleep(10 * time.Millisecond) // its commit found the place (fake log: at once)
			cancel()
			if err := <-firstErr; err == nil {
				t.Fatal("the first attempt was granted")
			}
			time.Sleep(50 * time.Millisecond)
			if w := fl.waiters("orders"); len(w) != 1 || w[0] != waiter {
				t.Fatalf("queue %v after the first attempt ended, want the second's place", w)
			}
			if err := l.Release(t.Context(), holder, "orders", g.Token); err != nil {
				t.Fatalf("Release: %v", err)
			}
			select {
			case a := <-second:
				second <- a // for the deferred drain
				if a.err != nil {
					t.Fatalf("second attempt: %v", a.err)
				}
				if h, tok := fl.holder("orders"); h != waiter || tok != a.g.Token {
					t.Fatalf("held by %s with %d, the second attempt got %d", h, tok, a.g.Token)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the second attempt was never granted")
			}
		})
	}
}

// While the grant of a caller who left is being released, the same lease's acquire of
// the name is refused with ErrUndoing (the client retries after a pause) rather than
// answered with the grant that is going away.
func TestAcquireDuringAnUndoIsRefused(t *testing.T) {
	l, fl := newLeader(t, leader.Config{})
	promote(t, l)
	lease := grant(t, l, time.Minute)
	openRelease := fl.gate(core.OpRelease)
	leftDuringCommit(t, l, fl, args(lease, "orders", core.Correctness, acquireOpts{}), false)
	eventually(t, "the release is proposed", func() bool { return fl.proposals(core.OpRelease) == 1 })
	if _, err := l.Acquire(t.Context(), args(lease, "orders", core.Correctness, acquireOpts{})); !errors.Is(err, leader.ErrUndoing) {
		t.Fatalf("Acquire during the undo = %v, want ErrUndoing", err)
	}
	openRelease()
	eventually(t, "the acquire is taken again after the undo", func() bool {
		_, err := l.Acquire(t.Context(), args(lease, "orders", core.Correctness, acquireOpts{}))
		return err == nil
	})
}

// leftDuringCampaign runs a Campaign of lease for name through leftDuring.
func leftDuringCampaign(t *testing.T, l *leader.Leader, fl *fakeLog, lease core.LeaseID, name string) {
	t.Helper()
	leftDuring(t, fl, core.OpCampaign, false, func(ctx context.Context, errc chan<- error) {
		go func() {
			_, err := l.Campaign(ctx, lease, name, []byte("v"), core.Holder{Host: "h"})
			errc <- err
		}()
	})
}

// A Campaign whose caller left while it committed does not leave its lease leading, or
// queued to lead, an election nobody runs for it.
func TestCampaignForACallerWhoLeftIsTakenBack(t *testing.T) {
	t.Run("elected", func(t *testing.T) {
		l, fl := newLeader(t, leader.Config{})
		promote(t, l)
		lease := grant(t, l, time.Minute)
		leftDuringCampaign(t, l, fl, lease, "writer")
		eventually(t, "the leadership is resigned", func() bool {
			_, leads := l.LeaderOf("writer")
			return !leads && fl.proposals(core.OpResign) == 1
		})
	})
	t.Run("queued", func(t *testing.T) {
		l, fl := newLeader(t, leader.Config{})
		promote(t, l)
		first, second := grant(t, l, time.Minute), grant(t, l, time.Minute)
		epoch, err := l.Campaign(t.Context(), first, "writer", []byte("v"), core.Holder{Host: "h"})
		if err != nil {
			t.Fatalf("Campaign: %v", err)
		}
		leftDuringCampaign(t, l, fl, second, "writer")
		eventually(t, "the candidacy is withdrawn", func() bool { return fl.proposals(core.OpWithdraw) == 1 })
		if err := l.Resign(t.Context(), first, "writer", epoch); err != nil {
			t.Fatalf("Resign: %v", err)
		}
		if ld, leads := l.LeaderOf("writer"); leads {
			t.Fatalf("after the leader resigned, %s leads: the candidacy of a caller who left was seated", ld.Lease)
		}
	})
}

// The other way round: a later attempt whose wait ends (its caller left, or its wait ran
// out) does not leave the place to an earlier attempt that still waits. The client gave
// that one up before it retried; it may be waiting on a connection whose loss the node
// has not seen yet, and a grant to it would be answered to nobody. The earlier attempt
// is ended with ErrUndoing: were its client still there (the attempts reached the
// leader in the other order), it sends the acquire again.
func TestAcquireAttemptDoesNotLeaveThePlaceToAnEarlierOne(t *testing.T) {
	for _, how := range []string{"caller left", "wait ran out"} {
		t.Run(how, func(t *testing.T) {
			l, fl, holder, waiter, g := heldWithWaiter(t)
			zctx, zcancel := context.WithCancel(t.Context())
			defer zcancel()
			zombie := attempt(l, zctx, args(waiter, "orders", core.Correctness, acquireOpts{forever: true}))
			eventually(t, "the earlier attempt is queued", func() bool { return len(fl.waiters("orders")) == 1 })
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			laterErr := attempt(l, ctx, ending(how, waiter, 50*time.Millisecond))
			eventually(t, "the later attempt is proposed", func() bool { return fl.proposals(core.OpAcquire) == 3 })
			time.Sleep(10 * time.Millisecond)
			if how == "caller left" {
				cancel()
			}
			if err := <-laterErr; err == nil {
				t.Fatal("the later attempt was granted")
			}
			eventually(t, "the place is cancelled", func() bool { return len(fl.waiters("orders")) == 0 })
			select {
			case err := <-zombie:
				if !errors.Is(err, leader.ErrUndoing) {
					t.Fatalf("the earlier attempt = %v, want ErrUndoing", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the earlier attempt still waits for a place that is gone")
			}
			if err := l.Release(t.Context(), holder, "orders", g.Token); err != nil {
				t.Fatalf("Release: %v", err)
			}
			if h, _ := fl.holder("orders"); !h.IsZero() {
				t.Fatalf("after the holder's release, %s holds the lock: granted to an attempt the client had given up", h)
			}
		})
	}
}

// Two attempts of one acquire can reach the leader in either order: a first attempt
// forwarded by a slow follower registers after the client's retry sent to the leader
// itself. When the later-registered one's caller leaves and its undo takes the shared
// place back, the earlier one — here the live retry — is neither answered with the grant
// being released nor left waiting for a place that is gone: it is ended with
// ErrUndoing, which its client sends again after a pause.
func TestAcquireUndoOfALaterAttemptEndsTheEarlierOne(t *testing.T) {
	for _, granted := range []bool{true, false} {
		t.Run(map[bool]string{true: "granted during the undo", false: "not granted"}[granted], func(t *testing.T) {
			l, fl, holder, waiter, g := heldWithWaiter(t)
			early := make(chan acqResult, 1)
			go func() {
				g, err := l.Acquire(t.Context(), args(waiter, "orders", core.Correctness, acquireOpts{forever: true}))
				early <- acqResult{g, err}
			}()
			eventually(t, "the early attempt is queued", func() bool { return len(fl.waiters("orders")) == 1 })
			lctx, lcancel := context.WithCancel(t.Context())
			lateErr := attempt(l, lctx, args(waiter, "orders", core.Correctness, acquireOpts{forever: true}))
			eventually(t, "the late attempt is proposed", func() bool { return fl.proposals(core.OpAcquire) == 3 })
			time.Sleep(20 * time.Millisecond) // its commit found the place (fake log: at once)
			openCancel := fl.gate(core.OpCancelWait)
			lcancel()
			if err := <-lateErr; !errors.Is(err, context.Canceled) {
				t.Fatalf("late attempt: %v", err)
			}
			eventually(t, "the undo's CancelWait is proposed", func() bool { return fl.proposals(core.OpCancelWait) == 1 })
			if granted {
				if err := l.Release(t.Context(), holder, "orders", g.Token); err != nil {
					t.Fatalf("Release: %v", err)
				}
			}
			var r acqResult
			select {
			case r = <-early:
			case <-time.After(5 * time.Second):
				t.Fatal("the early attempt is still waiting: left without a place")
			}
			if !errors.Is(r.err, leader.ErrUndoing) {
				t.Fatalf("early attempt = %+v, %v; want ErrUndoing", r.g, r.err)
			}
			openCancel()
			if !granted {
				eventually(t, "the place is cancelled", func() bool { return len(fl.waiters("orders")) == 0 })
				if err := l.Release(t.Context(), holder, "orders", g.Token); err != nil {
					t.Fatalf("Release: %v", err)
				}
			}
			eventually(t, "the undo is done", func() bool {
				h, _ := fl.holder("orders")
				return h.IsZero() && len(fl.waiters("orders")) == 0
			})
			// The client's resend is served as a new acquire.
			eventually(t, "the resend is granted", func() bool {
				g, err := l.Acquire(t.Context(), args(waiter, "orders", core.Correctness, acquireOpts{}))
				h, tok := fl.holder("orders")
				return err == nil && h == waiter && tok == g.Token
			})
		})
	}
}

// The same for elections: a Campaign attempt registered later whose caller leaves does
// not resign a leadership an earlier, live attempt was answered with.
func TestCampaignUndoOfALaterAttemptEndsTheEarlierOne(t *testing.T) {
	l, fl := newLeader(t, leader.Config{})
	promote(t, l)
	first, w := grant(t, l, time.Minute), grant(t, l, time.Minute)
	epoch, err := l.Campaign(t.Context(), first, "writer", []byte("v"), core.Holder{Host: "h"})
	if err != nil {
		t.Fatal(err)
	}
	type answer struct {
		epoch uint64
		err   error
	}
	early := make(chan answer, 1)
	go func() {
		e, err := l.Campaign(t.Context(), w, "writer", []byte("v"), core.Holder{Host: "w"})
		early <- answer{e, err}
	}()
	eventually(t, "the early campaign is proposed", func() bool { return fl.proposals(core.OpCampaign) == 2 })
	time.Sleep(20 * time.Millisecond)
	lctx, lcancel := context.WithCancel(t.Context())
	late := make(chan error, 1)
	go func() {
		_, err := l.Campaign(lctx, w, "writer", []byte("v"), core.Holder{Host: "w"})
		late <- err
	}()
	eventually(t, "the late campaign is proposed", func() bool { return fl.proposals(core.OpCampaign) == 3 })
	time.Sleep(20 * time.Millisecond)
	openWithdraw := fl.gate(core.OpWithdraw)
	lcancel()
	if err := <-late; !errors.Is(err, context.Canceled) {
		t.Fatalf("late campaign: %v", err)
	}
	eventually(t, "the undo's Withdraw is proposed", func() bool { return fl.proposals(core.OpWithdraw) == 1 })
	if err := l.Resign(t.Context(), first, "writer", epoch); err != nil {
		t.Fatal(err)
	}
	var a answer
	select {
	case a = <-early:
	case <-time.After(5 * time.Second):
		t.Fatal("the early campaign is still waiting")
	}
	openWithdraw()
	if !errors.Is(a.err, leader.ErrUndoing) {
		t.Fatalf("early campaign = epoch %d, %v; want ErrUndoing", a.epoch, a.err)
	}
	eventually(t, "the raced leadership is resigned", func() bool {
		_, leads := l.LeaderOf("writer")
		return !leads && fl.proposals(core.OpResign) >= 2
	})
}

// A grant answered to one attempt is never taken back by another attempt's undo, even
// when the other's commit callback comes later than the answered one's (the fake log
// holds it back; package replication calls back in log order, but the undo does not
// rest on it).
func TestAcquireUndoKeepsAGrantAnsweredToAnotherAttempt(t *testing.T) {
	l, fl := newLeader(t, leader.Config{})
	promote(t, l)
	lease := grant(t, l, time.Minute)
	release := fl.holdNext(core.OpAcquire)
	ctx, cancel := context.WithCancel(t.Context())
	first := attempt(l, ctx, args(lease, "orders", core.Correctness, acquireOpts{}))
	eventually(t, "the first attempt is applied", func() bool { _, tok := fl.holder("orders"); return tok != 0 })
	cancel()
	if err := <-first; !errors.Is(err, context.Canceled) {
		t.Fatalf("first: %v", err)
	}
	g, err := l.Acquire(t.Context(), args(lease, "orders", core.Correctness, acquireOpts{}))
	if err != nil {
		t.Fatalf("retry: %v", err)
	}
	release() // the first attempt's callback, after the retry's answer
	time.Sleep(50 * time.Millisecond)
	if h, tok := fl.holder("orders"); h != lease || tok != g.Token {
		t.Fatalf("the retry was answered token %d; the state shows holder %v token %d", g.Token, h, tok)
	}
}
