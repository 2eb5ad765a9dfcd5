package client

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/leasehold/leasehold/internal/clienttrace"
	"github.com/leasehold/leasehold/internal/reason"
)

// How the client retries. Every retry of the client — call (which every RPC but the
// keepalives goes through), the keepalive loop, Lock's fresh leases — waits by one
// backoff and decides by one judge, which also moves the client to another node.
//
// Silence is a failure like any other; slowness is not. Over Connect, an attempt of an
// RPC that is safe to repeat is abandoned once its node has sent nothing for the
// attempt timeout (WithAttemptTimeout; see cutIfSilent): the node is suspect, and the RPC
// goes to the next node. Over the fast lane, a connection on which calls wait while the
// node sends nothing is checked instead (fastLanes.watch), and fails when the path to
// the node is cut, in about the same time and at no cost per call. A keepalive is always
// cut so, after a fraction of its TTL. An RPC that is not safe to repeat (Put, Delete, ForceRelease, membership changes) is sent again only
// when it was certainly not carried out — the connection was refused, or the node
// answered that it is not the leader or does not know it — and otherwise ends with its
// outcome unknown, so no deadline of its own would give it another chance; its caller's
// context and the connections' liveness checks (HTTP/2 pings, the fast lane's watch)
// bound it.

// retryFirst and retryMax bound the backoff between attempts. Retries are cheap — a node
// without a leader fails them at once — and the cap bounds how long a caller sleeps after
// a new leader is ready: at 1 s, failover samples clustered at 1.3 s and 2.3 s; at 250 ms
// the first call after a partition of the leader came up to 0.4 s after the election.
// etcd's client retries every 25 ms.
const (
	retryFirst = 20 * time.Millisecond
	retryMax   = 100 * time.Millisecond
)

// defaultAttemptTimeout is how long one attempt of a repeatable RPC may go unanswered:
// well inside a 5 s lease (which has about 2.3 s left when its keepalive is due), and
// far above a healthy commit (milliseconds).
const defaultAttemptTimeout = time.Second

// WithAttemptTimeout sets how long a node may stay silent before the client treats it as
// failed (default 1s). Over Connect, an attempt of a call that is safe to repeat (reads,
// Lock, Unlock) is abandoned, and sent to the next node, when this long after it began
// (plus an Acquire's wait in a queue; never for one that waits for ever) the node has
// answered nothing in the last half of it, this call or another: a node that is slow but
// answers is waited for. Over the fast lane, a connection on which calls wait and nothing
// arrives for half this time is checked (see fastLanes.watch) and fails when the node
// cannot be reached for the other half. Keepalives are cut so after at most this, and at
// most a fifth of the lease's TTL. 0 turns both off (keepalives keep a fifth of the
// TTL): only ctx and the connections' own liveness checks bound a call.
func WithAttemptTimeout(d time.Duration) Option { return func(o *options) { o.attempt = max(0, d) } }

// backoff is the wait between attempts: retryFirst, doubling up to retryMax, each
// jittered by ±10% so that clients that failed together do not retry together.
type backoff struct{ next time.Duration }

func newBackoff() backoff { return backoff{next: retryFirst} }

// delay returns the next wait and doubles the one after.
func (b *backoff) delay() time.Duration {
	d := jitter(b.next)
	b.next = min(2*b.next, retryMax)
	return d
}

// sleep waits the next delay, or until ctx ends (then it returns ctx's error).
func (b *backoff) sleep(ctx context.Context) error {
	t := time.NewTimer(b.delay())
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// verdict is what an attempt's outcome means for the call.
type verdict uint8

const (
	// final: a success, or an answer of the service to return as it is.
	final verdict = iota
	// resend: the request was certainly not carried out; it is safe to send again, to
	// any node.
	resend
	// unknown: the request may have taken effect; send it again only if repeating it
	// is harmless.
	unknown
)

// judge tells what err, from an attempt on node, means for the call, and moves the
// client as the failure suggests (see failover): to the leader a not-leader answer
// names; off a node that stayed silent (cutIfSilent abandoned the attempt), refused, or
// knows no leader or could not reach it — and then not to that leader. Once ctx has
// ended every outcome is final.
func (c *Client) judge(ctx context.Context, node string, err error, silent bool) verdict {
	if err == nil {
		c.nodes.served(node)
		return final
	}
	clienttrace.AttemptFailed(ctx, node, err)
	if ctx.Err() != nil {
		return final
	}
	if silent {
		c.nodes.distrust(node)
		return unknown
	}
	code, d := detail(err)
	if d.GetReason() != "" {
		c.nodes.answered(node)
	}
	switch d.GetReason() {
	case reason.NotLeader:
		c.nodes.follow(node, d.GetLeaderApiAddr())
		return resend
	case reason.LeaderUnknown:
		c.nodes.leave(node)
		return resend
	case reason.Busy:
		// The leader's log was full for a moment: nothing was written. Stay with the
		// node; the caller's backoff spaces the next try.
		return resend
	case reason.ShuttingDown:
		// The node refused the request before starting it, and will be gone soon.
		c.nodes.distrust(node)
		return resend
	case reason.LeaderUnreachable:
		// This node answers; the leader it forwards to does not. Try another node, but
		// not that leader: the node could not reach it, most likely nobody can.
		if h := d.GetLeaderApiAddr(); h != "" && h != node {
			c.nodes.distrustOnly(h)
		}
		c.nodes.leave(node)
		return unknown
	case reason.OutcomeUnknown, reason.EpochLost, reason.DeadlineExceeded, reason.Canceled:
		// A leader that lost its office mid-request, or a node too slow for the deadline.
		c.nodes.leave(node)
		return unknown
	case "":
	default:
		return final
	}
	// No reason: the failure is the transport's, not an answer of the service.
	if ce := new(connect.Error); !errors.As(err, &ce) {
		return final
	}
	if errors.Is(err, errFastLaneLeft) {
		return unknown // the client had left the node: not the node's failure
	}
	switch code {
	case connect.CodeUnavailable:
		c.nodes.distrust(node)
		if notSent(err) {
			return resend
		}
		return unknown
	case connect.CodeUnknown, connect.CodeInternal, connect.CodeCanceled, connect.CodeDeadlineExceeded:
		c.nodes.leave(node)
		return unknown
	}
	return final
}

// notSent reports whether a transport failure happened before the request left: the
// connection could not be made, or the fast lane found it closed.
func notSent(err error) bool {
	if errors.Is(err, errFastLaneClosed) {
		return true
	}
	op := new(net.OpError)
	return errors.As(err, &op) && op.Op == "dial"
}

// policy says how call may repeat an RPC.
type policy struct {
	// repeatable: the RPC may be sent again after an attempt whose outcome is unknown,
	// because it changes nothing (a read) or a repeat changes nothing more (KeepAlive,
	// Revoke, Release, an Acquire by the same lease, a Grant whose extra lease expires
	// unused).
	repeatable bool
	// wait is how long the RPC itself may wait on the server (an Acquire's place in a
	// queue), added to the attempt timeout; negative: for ever, and attempts are never
	// abandoned for silence (the connections' liveness checks still end them).
	wait time.Duration
	// tries bounds the attempts; 0: until ctx ends.
	tries int
}

// call runs rpc until it succeeds, fails for good, or ctx ends: attempts that fail
// because no node could serve them are repeated on the next node (chosen by judge), as p
// allows — at once on a node not tried since the last backoff (a dead node refuses at
// once, and a not-leader answer names the leader: waiting would only delay the answer of
// the next node), after a backoff once every node the client moved to was tried (or
// when judge keeps it on the node, as for a busy leader); an attempt of a repeatable RPC
// over Connect is abandoned when its node falls silent (cutIfSilent). When ctx ends
// between attempts, the error wraps
// ErrUnavailable, ctx's error and the last failure; a repeatable RPC out of tries, or a
// non-repeatable one whose outcome is unknown, wraps ErrUnavailable and the failure.
func call[T any](ctx context.Context, c *Client, p policy, rpc func(context.Context) (T, error)) (T, error) {
	res, _, err := callUnsure(ctx, c, p, rpc)
	return res, err
}

// callUnsure is call, also reporting whether an attempt before the last had an unknown
// outcome — so that an answer like "not the holder" may be that attempt's doing.
func callUnsure[T any](ctx context.Context, c *Client, p policy, rpc func(context.Context) (T, error)) (res T, unsure bool, err error) {
	var zero T
	b := newBackoff()
	var tried []string // the nodes tried since the last wait
	for try := 1; ; try++ {
		node := c.nodes.current()
		actx, done := c.attemptContext(ctx, node, p)
		res, err := rpc(actx)
		silent := done() && err != nil && ctx.Err() == nil
		switch c.judge(ctx, node, err, silent) {
		case final:
			return res, unsure, err
		case unknown:
			if !p.repeatable {
				return zero, true, fmt.Errorf("%w: outcome unknown: %w", ErrUnavailable, err)
			}
			unsure = true
		}
		if p.tries > 0 && try >= p.tries {
			return zero, unsure, fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		tried = append(tried, node)
		if !slices.Contains(tried, c.nodes.current()) {
			continue // judge moved the client to a node not tried since the last wait
		}
		tried = tried[:0]
		if b.sleep(ctx) != nil {
			return zero, unsure, fmt.Errorf("%w: %w (last error: %w)", ErrUnavailable, ctx.Err(), err)
		}
	}
}

// attemptContext returns the context of one attempt of an RPC on node, and done, to call
// when the attempt has returned, which reports whether it was abandoned for silence.
// For a repeatable RPC that does not wait for ever, over Connect, that is cutIfSilent
// after the attempt timeout plus the RPC's wait; over the fast lane the connection's
// silence watch does it instead, with no timer per call.
func (c *Client) attemptContext(ctx context.Context, node string, p policy) (context.Context, func() bool) {
	limit := c.opts.attempt
	if !p.repeatable || p.wait < 0 || limit <= 0 || c.fast.serves(node) {
		return ctx, notCut
	}
	actx, cancel := context.WithCancel(ctx)
	cut := c.cutIfSilent(node, limit+p.wait, cancel)
	return actx, func() bool {
		silent := cut.stop()
		cancel()
		return silent
	}
}

func notCut() bool { return false }

// silenceCut abandons an attempt whose node has fallen silent; see cutIfSilent.
type silenceCut struct {
	c      *Client
	node   string
	cancel context.CancelFunc

	mu      sync.Mutex
	t       *time.Timer
	stopped bool
	silent  bool
}

// cutIfSilent calls cancel, after, if by then node has answered nothing — this call
// or any other, over Connect or its fast lane — in the last half of the time the
// attempt waited; while it does answer, it looks again every half of that, so an
// attempt is abandoned when its node falls silent, never because it is slow.
func (c *Client) cutIfSilent(node string, after time.Duration, cancel context.CancelFunc) *silenceCut {
	sc := &silenceCut{c: c, node: node, cancel: cancel}
	sc.mu.Lock()
	defer sc.mu.Unlock()
	sc.t = time.AfterFunc(after, func() { sc.check(after / 2) })
	return sc
}

func (sc *silenceCut) check(half time.Duration) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.stopped {
		return
	}
	since := time.Now().Add(-half)
	if sc.c.nodes.heardSince(sc.node, since) || sc.c.fast.heardSince(sc.node, since) {
		sc.t.Reset(half)
		return
	}
	sc.silent = true
	sc.cancel()
}

// stop ends the watch and reports whether it abandoned the attempt.
func (sc *silenceCut) stop() bool {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	sc.stopped = true
	sc.t.Stop()
	return sc.silent
}

// repeatable is the policy of RPCs that are safe to repeat and do not wait.
var repeatable = policy{repeatable: true}

// once is the policy of RPCs that must not be carried out twice.
var once = policy{}
