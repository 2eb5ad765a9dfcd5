package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/internal/reason"
)

// ElectOption configures one Elect call.
type ElectOption func(*electOptions)

type electOptions struct {
	ttl   time.Duration
	bound bool
	note  string
}

// ElectTTL sets the TTL of the lease the candidacy hangs on (default: the client's
// TTL). A leader whose process dies leaves the election to the next candidate after
// this long at the most — or at once, with ElectReleaseOnDisconnect.
func ElectTTL(d time.Duration) ElectOption { return func(o *electOptions) { o.ttl = d } }

// ElectReleaseOnDisconnect binds the candidacy's lease to the client's fast-lane
// connection, as ReleaseOnDisconnect does a lock's (G7): a leader that dies, or is
// cut off, hands over at once rather than after the TTL.
func ElectReleaseOnDisconnect(o *electOptions) { o.bound = true }

// ElectNote adds free text to the holder description Leader shows.
func ElectNote(note string) ElectOption { return func(o *electOptions) { o.note = note } }

// Leadership is one term of leadership of an election, handed to the function Elect
// runs while it lasts.
type Leadership interface {
	// Name is the election's name.
	Name() string
	// Epoch is the leadership's epoch: a token of the sequence, larger than every
	// earlier leadership's of this election (G8). Fence the leader's writes with it.
	Epoch() uint64
	// Context is cancelled the moment the leadership is known lost, or at the lease's
	// cautious local deadline, as a lock's Context (G4b); context.Cause says why.
	Context() context.Context
	// Proclaim changes the value the election shows (Leader). It fails wrapping
	// ErrLockLost when the leadership has ended, ErrUnavailable when no server
	// confirmed it.
	Proclaim(ctx context.Context, value []byte) error
}

// leadership is a Leadership: its lease membership is a Lock on the candidacy's lease
// (never released as a lock), so that the lease's end, its deadline and its keepalive
// notices cancel it as they do a lock.
type leadership struct{ l *Lock }

func (ld leadership) Name() string             { return ld.l.name }
func (ld leadership) Epoch() uint64            { return ld.l.token }
func (ld leadership) Context() context.Context { return ld.l.Context() }

func (ld leadership) Proclaim(ctx context.Context, value []byte) error {
	if lost, cause := ld.l.Lost(); lost {
		return fmt.Errorf("%w: %w", ErrLockLost, cause)
	}
	l := ld.l
	req := &leaseholdv1.ProclaimRequest{Name: l.name, LeaseId: l.s.id, Epoch: l.token, Value: value}
	_, err := call(ctx, l.c, repeatable, func(ctx context.Context) (*leaseholdv1.ProclaimResponse, error) {
		return rpc(ctx, l.c, l.c.elect.Proclaim, req)
	})
	if detailReason(err) == reason.NotHolder || errIsLeaseGone(err) {
		return fmt.Errorf("%w: %w", ErrLockLost, err)
	}
	return err
}

// ErrResigned is the cause of a Leadership's Context once Elect has resigned it,
// after its function returned.
var ErrResigned = errors.New("client: resigned")

// Elect campaigns for election name with value and, each time this client leads, runs
// fn with the Leadership; it waits, FIFO behind the other candidates, until it leads.
// fn must stop when its ctx (the Leadership's Context) is cancelled: the leadership is
// then lost — its lease ended, or could not be kept alive — and another candidate may
// lead. Elect then campaigns again, with a fresh lease, and runs fn again when it
// leads again, with a higher epoch; that goes on until ctx ends. When fn returns while
// it still leads, Elect resigns — the next candidate leads at once — and returns fn's
// error (nil: the work is done).
//
// The candidacy hangs on a lease of its own (ElectTTL, ElectReleaseOnDisconnect),
// revoked when Elect returns: a candidate that gave up never leads later, with nobody
// to run fn.
//
// Errors: fn's; ctx's error when ctx ended (while campaigning or leading: fn's ctx is
// cancelled then too); ErrUnavailable wrapping the last failure when no server could be
// reached until ctx ended; the server's InvalidArgument for a bad name or value.
func (c *Client) Elect(ctx context.Context, name string, value []byte, fn func(ctx context.Context, l Leadership) error, opts ...ElectOption) error {
	o := electOptions{ttl: c.opts.ttl}
	for _, opt := range opts {
		opt(&o)
	}
	h := c.opts.holder
	h.Note = o.note
	sess := c.NewSession()
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), o.ttl)
		defer cancel()
		_ = sess.Close(cctx)
	}()
	req := &leaseholdv1.CampaignRequest{Name: name, Value: value, Holder: &leaseholdv1.Holder{Host: h.Host, Pid: h.PID, Note: h.Note}}
	for {
		s, err := c.leaseFor(ctx, &sess.set, leaseKind{ttl: o.ttl, bound: o.bound})
		if err != nil {
			return err
		}
		req.LeaseId = s.id
		resp, err := call(ctx, c, policy{repeatable: true, wait: -1}, func(ctx context.Context) (*leaseholdv1.CampaignResponse, error) {
			return rpc(ctx, c, c.elect.Campaign, req)
		})
		switch {
		case errIsLeaseGone(err):
			s.end(leaseGoneCause(err))
			continue // a fresh lease
		case err != nil && ctx.Err() != nil:
			return ctx.Err() // the deferred Close revokes the lease: the candidacy with it
		case err != nil:
			return err
		}
		l := &Lock{c: c, s: s, name: name, token: resp.GetEpoch(), class: leaseholdv1.LockClass_LOCK_CLASS_CORRECTNESS}
		l.ctx, l.cancel = context.WithCancelCause(context.Background())
		if err := s.add(l); err != nil {
			l.lost(err)
			continue // lost as soon as won: campaign again
		}
		lctx, stop := context.WithCancelCause(l.Context())
		unwatch := context.AfterFunc(ctx, func() { stop(context.Cause(ctx)) })
		ferr := fn(lctx, leadership{l})
		unwatch()
		stop(nil)
		if lost, _ := l.Lost(); lost {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			continue // campaign again
		}
		c.resign(ctx, l)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return ferr
	}
}

// resign ends leadership l (its Context first, with ErrResigned), trying for at most
// the lease's TTL; the deferred revoke of Elect ends it anyway.
func (c *Client) resign(ctx context.Context, l *Lock) {
	l.s.remove(l)
	l.lost(ErrResigned)
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.s.ttl)
	defer cancel()
	_, _ = call(rctx, c, repeatable, func(ctx context.Context) (*leaseholdv1.ResignResponse, error) {
		return rpc(ctx, c, c.elect.Resign, &leaseholdv1.ResignRequest{Name: l.name, LeaseId: l.s.id, Epoch: l.token})
	})
}

// ElectionLeader is who leads an election, or, from Observe, one change of it.
type ElectionLeader struct {
	Epoch  uint64
	Value  []byte
	Holder Holder
	// Set by Observe only. Revision is the change's place in the election history:
	// pass it to ObserveAfter to resume after this change. Ended is how the leadership
	// before it ended, for a change that ended one (TENURE_END_RELEASED: it resigned;
	// EXPIRED, REVOKED, DISCONNECTED: its lease ended so). Time is when the change was
	// proposed, on the proposing leader's wall clock (zero: unknown, and for the first
	// "who leads now" of an Observe without ObserveAfter).
	Revision uint64
	Ended    leaseholdv1.TenureEnd
	Time     time.Time
}

// Leader returns who leads election name, and false when nobody does. It reads from
// the cluster's leader (linearizable).
func (c *Client) Leader(ctx context.Context, name string) (ElectionLeader, bool, error) {
	resp, err := call(ctx, c, repeatable, func(ctx context.Context) (*leaseholdv1.LeaderResponse, error) {
		return rpc(ctx, c, c.elect.Leader, &leaseholdv1.LeaderRequest{Name: name})
	})
	if err != nil || !resp.GetHasLeader() {
		return ElectionLeader{}, false, err
	}
	h := resp.GetHolder()
	return ElectionLeader{Epoch: resp.GetEpoch(), Value: resp.GetValue(), Holder: Holder{Host: h.GetHost(), PID: h.GetPid(), Note: h.GetNote()}}, true, nil
}

// ObserveOption configures Observe.
type ObserveOption func(*observeOptions)

type observeOptions struct {
	after  uint64
	resume bool
}

// ObserveAfter makes Observe start after the change with revision rev (an
// ElectionLeader.Revision an earlier Observe showed, kept by the caller — across
// restarts of its own, say): it shows every change after it, then goes on, and does
// not show "who leads now" first. 0 starts from the oldest change the history holds
// (compacted once any was dropped).
func ObserveAfter(rev uint64) ObserveOption {
	return func(o *observeOptions) { o.after, o.resume = rev, true }
}

// CompactedError is returned by Observe when the changes after the last one it showed
// (or after ObserveAfter's revision) are no longer held by the cluster: some were
// dropped before it could show them. It matches ErrCompacted. Observe again with
// ObserveAfter(Oldest) to go on from the oldest change held, knowing that the changes
// between After and Oldest are lost to it, or without ObserveAfter to start from who
// leads now.
type CompactedError struct {
	Name string
	// After is the revision Observe asked to resume after; Oldest the lowest one the
	// history still answers (0 from a server that did not say).
	After, Oldest uint64
	Err           error // the server's answer
}

func (e *CompactedError) Error() string {
	return fmt.Sprintf("%v: election %q after revision %d, the oldest point held is %d", ErrCompacted, e.Name, e.After, e.Oldest)
}

func (e *CompactedError) Unwrap() []error { return []error{ErrCompacted, e.Err} }

// Observe calls fn with who leads election name now (ok false: nobody), then with each
// change as the cluster applies it — a new leader (a higher epoch), a new value the
// leader proclaimed (the same epoch), nobody leading any more (ok false, the epoch of
// the leadership that ended) — until ctx ends or fn returns an error (which Observe
// returns). Every change comes once and in order (G8), across broken streams too: when
// a stream breaks (its node failed or restarted, the leader changed), Observe opens a
// new one on the next node, resumed after the last change it showed, from the
// cluster's replicated history of each election. No change is skipped and none is
// shown twice.
//
// The history is bounded (64 changes per election, 10,000 in all by default): when the
// changes to resume from were dropped while no stream was open — or fn was so slow
// that the stream fell that far behind — Observe returns a *CompactedError (matching
// ErrCompacted) rather than skip them. Other errors: ctx's; the server's
// InvalidArgument or PermissionDenied.
func (c *Client) Observe(ctx context.Context, name string, fn func(l ElectionLeader, ok bool) error, opts ...ObserveOption) error {
	var o observeOptions
	for _, opt := range opts {
		opt(&o)
	}
	b := newBackoff()
	for {
		node := c.nodes.current()
		req := &leaseholdv1.ObserveRequest{Name: name}
		if o.resume {
			req.AfterRevision = &o.after
		}
		st, err := c.elect.Observe(ctx, req)
		if err == nil {
			for st.Receive() {
				b = newBackoff()
				m := st.Msg()
				if ferr := fn(observed(m), m.GetHasLeader()); ferr != nil {
					_ = st.Close()
					return ferr
				}
				o.after, o.resume = m.GetRevision(), true
			}
			err = st.Err()
			_ = st.Close()
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if _, d := detail(err); d.GetReason() == reason.Compacted {
			return &CompactedError{Name: name, After: o.after, Oldest: d.GetOldestRevision(), Err: err}
		}
		if v := c.judge(ctx, node, err, false); v == final && err != nil && detailReason(err) != reason.ObserverLagging && connect.CodeOf(err) != connect.CodeUnavailable {
			return err
		}
		if b.sleep(ctx) != nil {
			return ctx.Err()
		}
	}
}

// observed is the ElectionLeader of an Observe message.
func observed(m *leaseholdv1.ObserveResponse) ElectionLeader {
	h := m.GetHolder()
	l := ElectionLeader{Epoch: m.GetEpoch(), Value: m.GetValue(), Holder: Holder{Host: h.GetHost(), PID: h.GetPid(), Note: h.GetNote()},
		Revision: m.GetRevision(), Ended: m.GetEnded()}
	if ms := m.GetUnixMs(); ms != 0 {
		l.Time = time.UnixMilli(ms)
	}
	return l
}
