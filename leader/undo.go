package leader

import (
	"context"
	"errors"
	"sync"

	"github.com/leasehold/leasehold/core"
)

// Taking back what a request did for a caller that left. A correctness acquire or a
// campaign whose caller leaves before the answer (its deadline passed, it cancelled,
// its connection closed) may still commit: raft cannot call a proposal back. Left
// alone, its grant or its place in a queue would belong to a lease that lives on — its
// client is fine, only this call was given up — and nobody would ever release it; the
// client's next acquire of the name would even be answered with the old grant, an old
// token. So the leader waits for the outcome anyway and, when the caller is gone, takes
// back what that very request made (not a grant or place an earlier attempt made:
// Result.Again), through the log.
//
// A lease has one place, or one grant, per name: every attempt of the request (the
// client's retries, each registered in waits) shares it, so taking it back takes it
// from all. Attempts can reach the leader in any order (a first attempt forwarded by a
// slow follower registers after the retry the client sent to the leader itself), so
// their order of arrival does not say which one the client still waits on. The rules
// (waits.claimUndo): nothing is taken back once a grant was handed to any attempt — its
// caller may hold it; a commit whose caller left leaves what it made to any other
// attempt; a wait whose caller left leaves it to a later-registered attempt, and
// otherwise takes it back and ends the earlier-registered attempts with ErrUndoing,
// which a client still there sends again. While the take-back commits, the same request
// is refused with ErrUndoing rather than answered with what is going away.
//
// Left open: an answer sent to a caller that is still there but never arrives (the
// connection broke after the server wrote it). The client's retry is answered the same;
// a client that stops retrying leaves it to its lease's end.

// takeBack says how to take back what one request did for a lease.
type takeBack struct {
	lease core.LeaseID
	key   string // its key in waits
	what  string // "lock" or "election", for the log
	name  string
	leave core.Command                    // leaves the queue (OpCancelWait, OpWithdraw)
	end   func(token uint64) core.Command // ends a grant (OpRelease, OpResign)
}

// commitWait hands a commit's outcome to the goroutine waiting for it, unless that
// goroutine left first (its caller's context ended): then the outcome's callback knows
// it and takes the outcome back. An outcome that came before the leaving is answered.
type commitWait struct {
	mu   sync.Mutex
	res  core.Result
	err  error
	got  bool
	left bool
	done chan struct{}
}

func newCommitWait() *commitWait { return &commitWait{done: make(chan struct{})} }

// arrived records the outcome and reports whether the waiter had left.
func (c *commitWait) arrived(res core.Result, err error) (left bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.res, c.err, c.got = res, err, true
	close(c.done)
	return c.left
}

// leave marks the waiter gone and reports whether the outcome had arrived (then it is
// the waiter's to answer: a retry of the same request may already have been answered
// with that grant, and taking it back would lose it).
func (c *commitWait) leave() (got bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.left = true
	return c.got
}

// applyUnlessLeft proposes cmd and waits for its outcome or the end of ctx. Left (ctx
// ended first) it reports left and hands the outcome, when it comes, to abandoned, on
// the goroutine that hands out commit results: the command may commit all the same.
// An outcome that came as ctx ended is returned as if it had come first.
func (l *Leader) applyUnlessLeft(ctx context.Context, cmd core.Command, abandoned func(core.Result, error)) (res core.Result, err error, left bool) {
	c := newCommitWait()
	l.log.ApplyThen(cmd, func(res core.Result, err error) {
		if c.arrived(res, err) {
			abandoned(res, err)
		}
	})
	select {
	case <-c.done:
	case <-ctx.Done():
		if !c.leave() {
			return core.Result{}, ctx.Err(), true
		}
	}
	return c.res, c.err, false
}

// abandonedCommit takes the outcome of a request whose caller left: a grant or place it
// made itself is taken back (undo); anything else only unregisters ch.
func (l *Leader) abandonedCommit(tb takeBack, ch chan outcome, res core.Result, err error) {
	if err != nil || res.Err != nil || res.Again {
		l.waits.remove(tb.lease, tb.key, ch)
		return
	}
	if res.Queued {
		l.undo(tb, ch, 0, false)
	} else {
		l.undo(tb, ch, res.Token, false)
	}
}

// undo takes back the grant of token (0: the place in the queue, and a grant that
// raced the leaving), unless another wait of the same lease and key owns it (claimUndo;
// leaving for an attempt whose wait ended, false for a commit whose caller left). Until
// the undo is committed, the same request fails with ErrUndoing (retried by the client
// after a pause). An undo that fails (this node stopped leading) leaves the grant or
// place to the lease's end, as a new leader cannot tell it from any other.
func (l *Leader) undo(tb takeBack, ch chan outcome, token uint64, leaving bool) {
	if !l.waits.claimUndo(tb.lease, tb.key, ch, leaving) {
		return
	}
	l.obs.Undone()
	finish := func(err error) {
		l.waits.undone(tb.lease, tb.key)
		if err != nil {
			l.lg.Warn("could not take back what a request did for a caller that left; its lease keeps it until it ends",
				tb.what, tb.name, "err", err)
		}
	}
	end := func(token uint64) {
		l.log.ApplyThen(tb.end(token), func(res core.Result, err error) {
			finish(errors.Join(err, ignore(res.Err, core.ErrNotHolder)))
		})
	}
	// On a goroutine of its own: this may run on the goroutine that hands out commit
	// results, and proposing may wait for raft's queue.
	go func() {
		if token != 0 {
			end(token)
			return
		}
		l.log.ApplyThen(tb.leave, func(res core.Result, err error) {
			if err == nil && res.Err == nil && res.Token != 0 {
				end(res.Token) // the grant won the race with the leaving
				return
			}
			finish(errors.Join(err, ignore(res.Err, core.ErrNotWaiting)))
		})
	}()
}

// ignore is err unless it is target or says the lease is gone: then there was nothing
// to take back.
func ignore(err, target error) error {
	if errors.Is(err, target) || errors.Is(err, core.ErrLeaseNotFound) {
		return nil
	}
	return err
}
