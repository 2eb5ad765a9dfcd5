package fence

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"strings"
	"time"

	"connectrpc.com/connect"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/internal/reason"
)

// Floorer is a guard whose floor for a resource can be raised without a write: after
// Floor(ctx, r, ended) returns nil, every token <= ended is stale for r (Admit returns
// a *StaleError for it), and every higher token is admitted as before. Follow raises
// floors with it. *Memory satisfies it, and so does what (*SQL).Floors returns.
//
// A floor is stored as the resource's highest token, set to ended+1 unless it is
// already higher: the *StaleError of a token rejected by a floor names ended+1 as the
// highest, a token that may never have been admitted. The next holder of the lock is
// never affected, since its token is higher than ended (G1).
type Floorer interface {
	// Floor makes every token <= ended stale for resource, at once, creating the
	// resource if the guard has not seen it. It never lowers a floor.
	Floor(ctx context.Context, resource string, ended uint64) error
	// Resources returns the resources the guard has stored whose name starts with
	// prefix ("" for all), in any order.
	Resources(ctx context.Context, prefix string) ([]string, error)
}

// Watcher is what Follow needs from the lock service: *client.Client satisfies it.
type Watcher interface {
	Watch(ctx context.Context, prefix string, opts ...client.WatchOption) iter.Seq2[*leaseholdv1.WatchEvent, error]
	List(ctx context.Context, prefix string, limit int) (*leaseholdv1.ListResponse, error)
	Describe(ctx context.Context, name string) (*leaseholdv1.LockInfo, error)
	Status(ctx context.Context) (*leaseholdv1.StatusResponse, error)
}

// Raised describes one floor Follow has put in place: from the moment the hook gets
// it, tokens <= Ended are stale for Resource.
type Raised struct {
	Resource string
	// Ended is the highest token the floor rejects.
	Ended uint64
	// Kind is the event that raised it: RELEASED, EXPIRED, REVOKED, FORCE_RELEASED or
	// ACQUIRED (the new holder's token minus one); UNSPECIFIED for a floor raised by
	// re-reading the lock state (at start and after "compacted").
	Kind leaseholdv1.EventKind
}

// FollowOption configures Follow.
type FollowOption func(*followOptions)

type followOptions struct {
	logger  *slog.Logger
	onFloor func(Raised)
	onReady func()
}

// FollowLogger sets where Follow logs floors it fails to raise (it retries them) and
// its re-reads of the lock state. The default is slog.Default(); nil keeps it.
func FollowLogger(l *slog.Logger) FollowOption {
	return func(o *followOptions) {
		if l != nil {
			o.logger = l
		}
	}
}

// OnFloor makes Follow call f after each floor it has raised, from Follow's goroutine
// (f must not block for long: events wait for it).
func OnFloor(f func(Raised)) FollowOption { return func(o *followOptions) { o.onFloor = f } }

// OnReady makes Follow call f once, when it has read the lock state and raised the
// floors it implies: from then on, the end of every hold under the prefix raises its
// floor as soon as its event is delivered.
func OnReady(f func()) FollowOption { return func(o *followOptions) { o.onReady = f } }

// Follow makes guard follow the lock service's Watch (G10) for the correctness locks
// under prefix, so that a holder that lost its lock is fenced at once: when an exclusive
// hold ends — released, its lease expired or was revoked, its holder disconnected
// (ReleaseOnDisconnect), or force-released — Follow raises the floor of the resource named like the lock to the
// ended holder's token, and when an exclusive hold is granted, to just below the new
// holder's token. A paused former holder's write is then rejected even if the next
// holder has not written yet (G5). The next holder is never affected: its token is
// higher (G1).
//
// The guard's resources under prefix must be the lock names (the default of Middleware
// and ServerInterceptor): Follow floors the resource named like the lock, and on a
// re-read it floors every resource under prefix that no lock holds. A guard whose keys
// are mapped otherwise (WithResource) must not be given to Follow with a prefix that
// covers them.
//
// Follow blocks until ctx ends or the watch fails for good, and always returns a
// non-nil error: ctx's error, or the watch's final error (PermissionDenied,
// InvalidArgument: see client.Watch). Run it in its own goroutine, one per guard and
// prefix, for as long as the resource takes writes.
//
// How it misses nothing: it starts by reading the lock state (Status, then List, and
// Describe when the list is truncated) and raising the floors it implies — a held lock:
// below its oldest holder's token; a lock that no lease holds: up to the last token the
// service had issued — and then watches from the revision the state was read at, so
// that every later change comes as an event. A broken stream resumes from its last
// revision (client.Watch does that). When the watch answers "compacted" (Follow fell
// behind the service's retained history), it reads the state again the same way and
// goes on; events seen twice do no harm, floors only go up.
//
// What it does not close:
//   - The window between the end of a hold at the service and the delivery of its
//     event to Follow: one stream hop (Watch coalesces 2 ms of events per answer) plus
//     the guard's write; longer while the stream is broken or the leader changes. A
//     write in that window is admitted, as without Follow.
//   - Shared and semaphore holds raise no floor when they end, because the other
//     holders' tokens may be lower; fence them per holder, or with CheckToken.
//   - Efficiency locks are not followed: their events are lost with their leader, and
//     their tokens come from blocks reserved ahead, so they may be lower than the last
//     token issued. Do not fence them through a followed guard under the prefix: a
//     re-read would floor a free one above its next holder's token.
//   - After a re-read, a lock that is free and that the guard has never stored gets no
//     floor: a holder that ended while Follow was not watching and never wrote is
//     admitted once, as without Follow.
//   - A floor the guard fails to store (its database is down) is retried with backoff
//     until it is stored or ctx ends; later events wait for it.
//
// Floors are written in rounds: the events that arrived while one round was being
// written make the next (per resource the highest floor; for the SQL guard one
// transaction), so a slow guard falls behind by rounds, not by events. OnFloor hears of
// each floor after its round is stored.
func Follow(ctx context.Context, w Watcher, prefix string, guard Floorer, opts ...FollowOption) error {
	o := followOptions{logger: slog.Default()}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	f := &follower{w: w, prefix: prefix, guard: guard, o: o}
	return f.run(ctx)
}

type follower struct {
	w      Watcher
	prefix string
	guard  Floorer
	o      followOptions
}

func (f *follower) run(ctx context.Context) error {
	ready := f.o.onReady
	var b time.Duration // between re-reads that delivered nothing
	for {
		start, err := f.resync(ctx)
		if err != nil {
			return err
		}
		if ready != nil {
			ready()
			ready = nil
		}
		n, err := f.watch(ctx, start)
		if !isCompacted(err) {
			return err
		}
		f.o.logger.Warn("fence: Follow fell behind the watch history; reading the lock state again",
			"prefix", f.prefix, "err", err)
		if b = nextBackoff(b); n > 0 {
			b = 0
		}
		if err := sleepCtx(ctx, b); err != nil {
			return err
		}
	}
}

// watched is one item of a watch: an event, or the error that ended it.
type watched struct {
	e   *leaseholdv1.WatchEvent
	err error
}

// maxBatch bounds how many floors Follow raises in one round: events that arrive while
// a round is being written are folded into the next one (per resource, the highest).
const maxBatch = 1024

// watch applies the events from start until the watch fails, and says how many it got.
// A goroutine of its own reads the stream, so that events arriving while floors are
// being written wait in a buffer and are written together (one transaction for the SQL
// guard) instead of one round trip each.
func (f *follower) watch(ctx context.Context, start *leaseholdv1.Revision) (int, error) {
	wctx, cancel := context.WithCancel(ctx)
	items := make(chan watched, maxBatch)
	done := make(chan struct{})
	go func() { // ends when the watch fails or wctx ends; watch waits for it
		defer close(done)
		defer close(items)
		for e, err := range f.w.Watch(wctx, f.prefix, client.WatchFrom(start)) {
			select {
			case items <- watched{e: e, err: err}:
			case <-wctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	defer func() {
		cancel()
		<-done
	}()
	n := 0
	for {
		// One round: wait for an item, then take what else is already waiting.
		var it watched
		var open bool
		select {
		case it, open = <-items:
		case <-ctx.Done():
			return n, ctx.Err()
		}
		var round round
		var end error
		for {
			if !open {
				if end = ctx.Err(); end == nil {
					end = errors.New("fence: the watch ended without an error")
				}
				break
			}
			if it.err != nil {
				end = it.err
				break
			}
			n++
			if resource, ended, ok := floorOf(it.e); ok {
				round.add(Raised{Resource: resource, Ended: ended, Kind: it.e.GetKind()})
			}
			if len(round.floors) >= maxBatch {
				break
			}
			select {
			case it, open = <-items:
				continue
			default:
			}
			break
		}
		if err := f.raise(ctx, round.floors); err != nil {
			return n, err
		}
		if end != nil {
			return n, end
		}
	}
}

// round is the floors of one round, the highest per resource, in first-seen order.
type round struct {
	floors []Raised
	at     map[string]int // resource -> index in floors
}

func (r *round) add(f Raised) {
	if i, ok := r.at[f.Resource]; ok {
		if f.Ended > r.floors[i].Ended {
			r.floors[i] = f
		}
		return
	}
	if r.at == nil {
		r.at = make(map[string]int)
	}
	r.at[f.Resource] = len(r.floors)
	r.floors = append(r.floors, f)
}

// floorOf returns the floor event e implies: an exclusive hold that ended floors its
// own token, an exclusive grant the token below its own.
func floorOf(e *leaseholdv1.WatchEvent) (resource string, ended uint64, ok bool) {
	if e.GetMode() != leaseholdv1.LockMode_LOCK_MODE_EXCLUSIVE || e.GetToken() == 0 ||
		e.GetClass() != leaseholdv1.LockClass_LOCK_CLASS_CORRECTNESS {
		return "", 0, false
	}
	switch e.GetKind() {
	case leaseholdv1.EventKind_EVENT_KIND_RELEASED, leaseholdv1.EventKind_EVENT_KIND_EXPIRED,
		leaseholdv1.EventKind_EVENT_KIND_REVOKED, leaseholdv1.EventKind_EVENT_KIND_FORCE_RELEASED,
		leaseholdv1.EventKind_EVENT_KIND_DISCONNECTED:
		return e.GetName(), e.GetToken(), true
	case leaseholdv1.EventKind_EVENT_KIND_ACQUIRED:
		return e.GetName(), e.GetToken() - 1, e.GetToken() > 1
	}
	return "", 0, false
}

// resync reads the lock state, raises the floors it implies, and returns the revision
// to watch from: the node's applied index before the state was read, so that every
// change the state does not show comes as an event (some are seen twice: floors are
// idempotent).
func (f *follower) resync(ctx context.Context) (*leaseholdv1.Revision, error) {
	for b := time.Duration(0); ; b = nextBackoff(b) {
		if b > 0 {
			if err := sleepCtx(ctx, b); err != nil {
				return nil, err
			}
		}
		start, err := f.resyncOnce(ctx)
		if err == nil {
			return start, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if permanent(err) {
			return nil, err
		}
		f.o.logger.Warn("fence: Follow could not read the lock state; retrying", "prefix", f.prefix, "err", err)
	}
}

func (f *follower) resyncOnce(ctx context.Context) (*leaseholdv1.Revision, error) {
	st, err := f.w.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("fence: read the service's status: %w", err)
	}
	list, err := f.w.List(ctx, f.prefix, 10000)
	if err != nil {
		return nil, fmt.Errorf("fence: list the locks under %q: %w", f.prefix, err)
	}
	floors := make(map[string]uint64) // resource -> ended
	seen := make(map[string]bool)
	for _, l := range list.GetLocks() {
		seen[l.GetName()] = true
		if l.GetClass() != leaseholdv1.LockClass_LOCK_CLASS_CORRECTNESS {
			continue
		}
		if ended, ok := stateFloor(l, st.GetLastToken()); ok {
			floors[l.GetName()] = ended
		}
	}
	known, err := f.guard.Resources(ctx, f.prefix)
	if err != nil {
		return nil, fmt.Errorf("fence: list the guard's resources under %q: %w", f.prefix, err)
	}
	for _, r := range known {
		if seen[r] {
			continue
		}
		if !list.GetTruncated() {
			floors[r] = st.GetLastToken() // not in the state: free, every token issued so far has ended
			continue
		}
		l, err := f.w.Describe(ctx, r)
		if connect.CodeOf(err) == connect.CodeInvalidArgument {
			continue // not a lock name: no lock fences it
		}
		if err != nil {
			return nil, fmt.Errorf("fence: describe %q: %w", r, err)
		}
		if l.GetHeld() && l.GetClass() != leaseholdv1.LockClass_LOCK_CLASS_CORRECTNESS {
			continue
		}
		if ended, ok := stateFloor(l, st.GetLastToken()); ok {
			floors[r] = ended
		}
	}
	raised := make([]Raised, 0, len(floors))
	for r, ended := range floors {
		raised = append(raised, Raised{Resource: r, Ended: ended})
	}
	for len(raised) > 0 {
		k := min(len(raised), maxBatch)
		if err := f.raise(ctx, raised[:k]); err != nil {
			return nil, err
		}
		raised = raised[k:]
	}
	return &leaseholdv1.Revision{Index: st.GetAppliedIndex()}, nil
}

// stateFloor is the floor a lock's listed state implies, given the last token issued
// before it was read: held, below its oldest holder's token; not held, last.
func stateFloor(l *leaseholdv1.LockInfo, last uint64) (uint64, bool) {
	if !l.GetHeld() {
		return last, last > 0
	}
	low := l.GetToken()
	for _, h := range l.GetHolders() {
		low = min(low, h.GetToken())
	}
	return low - 1, low > 1
}

// batchFloorer is a Floorer that raises several floors in one write (the SQL guard: one
// transaction).
type batchFloorer interface {
	floorBatch(ctx context.Context, floors []Raised) error
}

// raise puts floors in place, retrying while the guard fails, and tells the hook about
// each.
func (f *follower) raise(ctx context.Context, floors []Raised) error {
	if len(floors) == 0 {
		return nil
	}
	write := func() error {
		if bf, ok := f.guard.(batchFloorer); ok && len(floors) > 1 {
			return bf.floorBatch(ctx, floors)
		}
		for _, r := range floors {
			if err := f.guard.Floor(ctx, r.Resource, r.Ended); err != nil {
				return err
			}
		}
		return nil
	}
	for b := time.Duration(0); ; b = nextBackoff(b) {
		if b > 0 {
			if err := sleepCtx(ctx, b); err != nil {
				return err
			}
		}
		err := write()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		f.o.logger.Error("fence: Follow could not raise floors; retrying",
			"floors", len(floors), "first", floors[0].Resource, "err", err)
	}
	if f.o.onFloor != nil {
		for _, r := range floors {
			f.o.onFloor(r)
		}
	}
	return nil
}

// isCompacted reports whether err is the watch's FailedPrecondition "compacted".
func isCompacted(err error) bool {
	var ce *connect.Error
	if !errors.As(err, &ce) || ce.Code() != connect.CodeFailedPrecondition {
		return false
	}
	for _, d := range ce.Details() {
		if v, derr := d.Value(); derr == nil {
			if ed, ok := v.(*leaseholdv1.ErrorDetail); ok && ed.GetReason() == reason.Compacted {
				return true
			}
		}
	}
	return strings.Contains(ce.Message(), "oldest revision held")
}

// permanent reports whether a failed re-read cannot succeed by retrying.
func permanent(err error) bool {
	switch connect.CodeOf(err) {
	case connect.CodePermissionDenied, connect.CodeUnauthenticated, connect.CodeInvalidArgument:
		return true
	}
	return false
}

func nextBackoff(b time.Duration) time.Duration {
	if b == 0 {
		return 50 * time.Millisecond
	}
	return min(2*b, 5*time.Second)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
