package client

import (
	"context"
	"errors"
	"iter"

	"connectrpc.com/connect"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
)

// WatchOption configures Watch.
type WatchOption func(*watchOptions)

type watchOptions struct {
	start *leaseholdv1.Revision
}

// WatchFrom starts the watch at rev (inclusive): the `next` of an earlier watch's last
// answer (WatchEvent.Revision plus one offset: see NextRevision), to miss nothing in
// between. Without it the watch starts at the next event.
func WatchFrom(rev *leaseholdv1.Revision) WatchOption {
	return func(o *watchOptions) { o.start = rev }
}

// NextRevision returns the revision right after rev: where a watch that has seen the
// event at rev resumes.
func NextRevision(rev *leaseholdv1.Revision) *leaseholdv1.Revision {
	return &leaseholdv1.Revision{Index: rev.GetIndex(), Offset: rev.GetOffset() + 1}
}

// Watch streams the events of the locks under prefix (G10), in revision order, each
// once, until ctx ends or the watch fails for good. It resumes by itself: when the
// stream breaks — the leader changed or failed, the connection dropped — it opens it
// again on the node the client moves to (after a backoff, as every RPC retries), from
// the revision after the last event it yielded, so the sequence it yields has no gap
// and no repeat across leader changes.
//
// The sequence ends after yielding a non-nil error: ctx's error (wrapped with
// ErrUnavailable when it ended between attempts), or an answer that resuming cannot
// mend — FailedPrecondition "compacted" when the start (or the watcher, fallen behind)
// is below what the server still holds (the message names the oldest revision held;
// start again without WatchFrom, or from there, accepting the gap), PermissionDenied,
// InvalidArgument. Breaking out of the loop closes the stream.
//
// What it does not promise: efficiency locks' events come from the leader that served
// them and are lost with it; an EVENT_KIND_EPOCH event (before the new leader's first
// efficiency event) says that every efficiency lock of earlier epochs is gone.
func (c *Client) Watch(ctx context.Context, prefix string, opts ...WatchOption) iter.Seq2[*leaseholdv1.WatchEvent, error] {
	var o watchOptions
	for _, opt := range opts {
		opt(&o)
	}
	return func(yield func(*leaseholdv1.WatchEvent, error) bool) {
		next := o.start
		b := newBackoff()
		for {
			node := c.nodes.current()
			err := c.watchOnce(ctx, prefix, &next, &b, yield)
			if errors.Is(err, errStopped) {
				return
			}
			if c.judge(ctx, node, err, false) == final && err != nil {
				yield(nil, err)
				return
			}
			if werr := b.sleep(ctx); werr != nil {
				yield(nil, errors.Join(ErrUnavailable, werr, err))
				return
			}
		}
	}
}

// errStopped: the caller broke out of the loop.
var errStopped = errors.New("client: watch stopped by its caller")

// watchOnce runs one stream from *next, moving *next past every answer; it returns how
// the stream ended (errStopped when yield asked to stop). A stream that delivered
// something resets the backoff.
func (c *Client) watchOnce(ctx context.Context, prefix string, next **leaseholdv1.Revision, b *backoff,
	yield func(*leaseholdv1.WatchEvent, error) bool) error {
	st, err := c.locks.Watch(ctx, &leaseholdv1.WatchRequest{Prefix: prefix, Start: *next})
	if err != nil {
		return err
	}
	defer st.Close()
	for st.Receive() {
		msg := st.Msg()
		*b = newBackoff()
		for _, e := range msg.GetEvents() {
			*next = NextRevision(e.GetRevision())
			if !yield(e, nil) {
				return errStopped
			}
		}
		if n := msg.GetNext(); n != nil {
			*next = n
		}
	}
	if err := st.Err(); err != nil {
		return err
	}
	return connect.NewError(connect.CodeUnavailable, errors.New("client: the watch stream ended")) // the server never ends one cleanly: resume
}

// History returns the ledger of lock name: its last tenures, oldest first (how each
// ended: released, expired, revoked, force-released with who asked and why,
// disconnected), then its holds still open (End unspecified), each with its class. It
// is bounded on the server (16 tenures per lock and 100,000 in all by default). The
// correctness tenures come first and survive leader changes and restores. Efficiency
// tenures are the current leader's only (its memory): they follow one
// TENURE_END_LEADER_LOST entry, which says that what came before that leader began
// serving (EndUnixMs, Epoch) is unknown. See LockService.History.
func (c *Client) History(ctx context.Context, name string) ([]*leaseholdv1.Tenure, error) {
	resp, err := call(ctx, c, repeatable, func(ctx context.Context) (*leaseholdv1.HistoryResponse, error) {
		return rpc(ctx, c, c.locks.History, &leaseholdv1.HistoryRequest{Name: name})
	})
	return resp.GetTenures(), err
}
