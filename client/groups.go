package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/internal/reason"
)

// Causes of a partition's context (context.Cause), besides the lease's own
// (ErrLeaseExpired, ErrLeaseRevoked, ErrLeaseDeadline).
var (
	// ErrPartitionMoving: the partition is to move to another member. Stop working on
	// it; JoinGroup releases it once the handler has returned.
	ErrPartitionMoving = errors.New("client: the partition is moving to another member")
	// ErrPartitionMoved: the service no longer shows this member owning the partition
	// at this epoch (its drain deadline passed, or the membership ended).
	ErrPartitionMoved = errors.New("client: the partition moved to another member")
	// ErrPartitionDeadline: no answer of the service confirmed, in time, that the
	// partition was not draining, so the client gave it up before its drain deadline
	// could pass on the server.
	ErrPartitionDeadline = errors.New("client: ownership not confirmed before the local deadline")
	// ErrLeftGroup: JoinGroup is returning (its context ended); the member leaves.
	ErrLeftGroup = errors.New("client: left the group")
	// ErrGroupUnknown is returned by JoinGroup and GroupStatus for a group that does
	// not exist (create it with CreateGroup).
	ErrGroupUnknown = errors.New("client: no such group")
)

// Partition is one partition a member owns, as its handler gets it.
type Partition struct {
	Group  string
	Number int
	// Epoch is the partition's fencing token: larger than that of every earlier owner
	// of the partition (G8). Pass it to every resource the handler writes to and have
	// the resource check it per partition (package fence, with one key per partition).
	Epoch uint64
}

// GroupOption configures JoinGroup.
type GroupOption func(*groupOptions)

type groupOptions struct {
	weight uint32
}

// WithWeight sets the member's weight, 1 to 1000 (default 1): its share of the
// partitions relative to the other members'.
func WithWeight(w uint32) GroupOption { return func(o *groupOptions) { o.weight = w } }

// CreateGroup creates group with partitions partitions (1 to 4096) and a drain deadline
// (0: the server's default, 10 s): how long a moving partition may stay with its
// owner before the service takes it. Creating a group that exists with the same
// settings succeeds.
func (c *Client) CreateGroup(ctx context.Context, group string, partitions int, drain time.Duration) error {
	if partitions <= 0 || partitions > 1<<32-1 {
		return fmt.Errorf("client: a group has 1 to 4096 partitions, not %d", partitions)
	}
	_, err := call(ctx, c, repeatable, func(ctx context.Context) (*leaseholdv1.GroupServiceCreateResponse, error) {
		return c.groups.Create(ctx, &leaseholdv1.GroupServiceCreateRequest{Group: group, Partitions: uint32(partitions), DrainMs: drain.Milliseconds()})
	})
	return err
}

// GroupStatus reads group, linearizably: its members and every partition's owner,
// epoch and whether it drains. ErrGroupUnknown when it does not exist.
func (c *Client) GroupStatus(ctx context.Context, group string) (*leaseholdv1.GroupServiceStatusResponse, error) {
	resp, err := call(ctx, c, repeatable, func(ctx context.Context) (*leaseholdv1.GroupServiceStatusResponse, error) {
		return c.groups.Status(ctx, &leaseholdv1.GroupServiceStatusRequest{Group: group})
	})
	if _, d := detail(err); d.GetReason() == reason.GroupUnknown {
		return nil, fmt.Errorf("%w: %q: %w", ErrGroupUnknown, group, err)
	}
	return resp, err
}

// JoinGroup makes this process member `member` of group and runs handler, in a
// goroutine of its own, for every partition the service assigns to it, until ctx ends.
// It then stops every handler, waits for them, leaves the group (the partitions move to
// the other members at once) and returns nil; it returns an error only when it cannot
// go on: ErrGroupUnknown, the server's InvalidArgument for a bad name or weight, or
// ErrClosed.
//
// The membership hangs on a lease of its own (the Client's TTL), kept alive like a
// Session's. Each handler gets a context that is cancelled before the partition can
// move to another member (G2 as the member sees it):
//
//   - at once when the service says the partition is to move (cause
//     ErrPartitionMoving); JoinGroup releases the partition when the handler returns,
//     and the new owner gets it then, at a new epoch;
//   - at the lease's cautious local deadline, or when the lease is known lost
//     (ErrLeaseDeadline, ErrLeaseExpired, ErrLeaseRevoked), as a held lock's (G4b);
//   - at the partition's own cautious deadline: the send time of the last read that
//     showed the partition not draining, plus the group's drain deadline, minus a
//     margin (ErrPartitionDeadline). The service cannot take a partition sooner than
//     its drain deadline after the drain began, and the drain began after that read;
//     the member reads its assignments four times per drain deadline.
//
// Its Err checks both deadlines against the clock, so a process resumed after a pause
// sees the loss at once. What is NOT promised: that the handler has stopped when the
// partition moves — a handler that ignores its context keeps running. Fence every
// write with the partition's Epoch; the resource is what stops a late writer.
//
// A handler that returns while its context is live leaves the partition idle (owned,
// with nothing running) until it moves. After a lost lease, JoinGroup joins again with
// a new lease as soon as the service lets it (the member name stays taken until the
// old lease has ended on the server too), once every handler of the old membership has
// returned: JoinGroup never runs two handlers for one partition at once. Two JoinGroup
// calls with the same member name do not share a membership: the second waits until
// the first has left.
func (c *Client) JoinGroup(ctx context.Context, group, member string, handler func(ctx context.Context, p Partition), opts ...GroupOption) error {
	o := groupOptions{weight: 1}
	for _, opt := range opts {
		opt(&o)
	}
	m := &groupMember{c: c, group: group, name: member, weight: o.weight, handler: handler,
		sess: c.NewSession(), owned: make(map[int]*owned), stopping: make(map[int]*owned), wake: make(chan struct{}, 1)}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.opts.ttl)
		_ = m.sess.Close(closeCtx)
		cancel()
	}()
	return m.run(ctx)
}

// groupMember is one JoinGroup: one goroutine (run) owns the membership and owned.
type groupMember struct {
	c       *Client
	group   string
	name    string
	weight  uint32
	handler func(context.Context, Partition)
	sess    *Session
	wake    chan struct{} // a change is known: read the assignments now

	owned map[int]*owned // by partition number; only run's goroutine touches it
	// stopping holds, by partition number, a handler stopped because its partition moved
	// (or came back at a new epoch) until it has returned: the partition's next handler
	// starts only then. Only run's goroutine touches it.
	stopping map[int]*owned
	handlers sync.WaitGroup
}

// owned is one partition this member owns and runs a handler for.
type owned struct {
	p      Partition
	lock   *Lock           // registered on the lease: the lease's end cancels it
	ctx    context.Context // the handler's: a partitionContext over inner
	inner  context.Context
	cancel context.CancelCauseFunc
	done   chan struct{} // closed when the handler returned

	mu       sync.Mutex
	deadline time.Time // cautious local deadline of the ownership, monotonic
	timer    *time.Timer
	draining bool
}

func (m *groupMember) run(ctx context.Context) error {
	for {
		s, err := m.join(ctx)
		if err != nil {
			m.stopAll(ErrLeftGroup)
			return unlessEnded(ctx, err)
		}
		err = m.follow(ctx, s) // nil: ctx or the lease ended
		if err != nil || ctx.Err() != nil {
			m.stopAll(ErrLeftGroup)
			m.leave(ctx, s)
			return err
		}
		// The lease ended: its partitions' contexts are cancelled; join again (join
		// waits while the old lease still has the member name on the server).
		m.stopAll(ErrPartitionMoved)
	}
}

// unlessEnded returns err, or nil once ctx has ended (JoinGroup's normal return).
func unlessEnded(ctx context.Context, err error) error {
	if ctx.Err() == nil {
		return err
	}
	return nil
}

// join takes a live lease and joins the group with it, waiting (with a backoff) while
// the member name is still taken by a previous lease.
func (m *groupMember) join(ctx context.Context) (*lease, error) {
	c := m.c
	b := newBackoff()
	for {
		s, err := c.leaseFor(ctx, &m.sess.set, leaseKind{ttl: c.opts.ttl})
		if err != nil {
			return nil, err
		}
		req := &leaseholdv1.JoinRequest{Group: m.group, Member: m.name, LeaseId: s.id, Weight: m.weight}
		_, err = call(ctx, c, repeatable, func(ctx context.Context) (*leaseholdv1.JoinResponse, error) {
			return c.groups.Join(ctx, req)
		})
		_, d := detail(err)
		switch {
		case err == nil:
			return s, nil
		case d.GetReason() == reason.GroupUnknown:
			return nil, fmt.Errorf("%w: %q: %w", ErrGroupUnknown, m.group, err)
		case d.GetReason() == reason.MemberExists:
		case errIsLeaseGone(err):
			s.end(leaseGoneCause(err))
			continue
		default:
			return nil, err
		}
		if b.sleep(ctx) != nil {
			return nil, ctx.Err()
		}
	}
}

// follow reads the member's assignments — four times per drain deadline, and at once
// when woken — and acts on them, until ctx ends, the lease ends (nil), or the group
// is gone.
func (m *groupMember) follow(ctx context.Context, s *lease) error {
	c := m.c
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go m.watch(wctx, s)
	for {
		sent := time.Now()
		pctx, cancel := context.WithTimeout(ctx, s.ttl)
		resp, err := call(pctx, c, repeatable, func(ctx context.Context) (*leaseholdv1.GroupServiceStatusResponse, error) {
			return c.groups.Status(ctx, &leaseholdv1.GroupServiceStatusRequest{Group: m.group})
		})
		cancel()
		every := time.Second
		if _, d := detail(err); d.GetReason() == reason.GroupUnknown {
			return fmt.Errorf("%w: %q: %w", ErrGroupUnknown, m.group, err)
		}
		if err == nil && s.alive() {
			drain := time.Duration(resp.GetDrainMs()) * time.Millisecond
			m.apply(s, sent, drain, resp)
			every = max(drain/4, time.Millisecond)
		}
		t := time.NewTimer(every)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-s.stop:
			t.Stop()
			return nil
		case <-m.wake:
		case <-t.C:
		}
		t.Stop()
	}
}

// watch follows the member's Assignments stream until ctx ends and wakes follow at
// each message, so that a partition starts, drains or moves in a round trip instead of
// at the next periodic read; the reads stay what the deadlines rest on. A broken
// stream is opened again after a backoff.
func (m *groupMember) watch(ctx context.Context, s *lease) {
	b := newBackoff()
	req := &leaseholdv1.AssignmentsRequest{Group: m.group, Member: m.name, LeaseId: s.id}
	for ctx.Err() == nil {
		st, err := m.c.groups.Assignments(ctx, req)
		if err == nil {
			for st.Receive() {
				b = newBackoff()
				select {
				case m.wake <- struct{}{}:
				default:
				}
			}
			_ = st.Close()
		}
		if b.sleep(ctx) != nil {
			return
		}
	}
}

// apply acts on a read of the group sent at sent: it starts a handler for each new
// partition, extends the deadline of each one that is not draining, stops (and then
// releases) each that drains, and stops each the member no longer owns.
func (m *groupMember) apply(s *lease, sent time.Time, drain time.Duration, resp *leaseholdv1.GroupServiceStatusResponse) {
	mine := make(map[int]*leaseholdv1.PartitionOwner)
	for _, p := range resp.GetPartitions() {
		if p.GetOwner() == m.name {
			mine[int(p.GetPartition())] = p
		}
	}
	deadline := sent.Add(drain - m.c.margin(drain))
	for n, o := range m.owned {
		p := mine[n]
		switch {
		case p == nil || p.GetEpoch() != o.p.Epoch:
			o.stop(ErrPartitionMoved)
			delete(m.owned, n)
			m.stopping[n] = o
			go func() {
				<-o.done
				select { // its partition may be waiting to start again here
				case m.wake <- struct{}{}:
				default:
				}
			}()
		case p.GetDraining(), o.inner.Err() != nil:
			// Draining; or stopped at its own deadline (no read confirmed it in time)
			// yet still this member's: give it back once the handler has returned, so
			// that it is granted again — here, most likely — at a new epoch rather
			// than left idle. It stays in owned until the service shows it moved, so
			// that no read before the release lands starts it again at this epoch.
			m.drain(s, n, o)
		default:
			o.confirm(deadline)
		}
	}
	for n, p := range mine {
		if m.owned[n] != nil {
			continue
		}
		if old := m.stopping[n]; old != nil {
			select {
			case <-old.done:
				delete(m.stopping, n)
			default:
				// The partition came back (at a new epoch) while the handler of its old
				// epoch is still winding down: never two handlers of one partition at
				// once. It starts at the first read after that handler returns.
				continue
			}
		}
		part := Partition{Group: m.group, Number: n, Epoch: p.GetEpoch()}
		if p.GetDraining() {
			go m.release(s, part) // nothing runs on it here
			continue
		}
		m.start(s, part, deadline)
	}
}

// start runs the handler for p.
func (m *groupMember) start(s *lease, p Partition, deadline time.Time) {
	o := &owned{p: p, done: make(chan struct{}), deadline: deadline}
	o.lock = &Lock{c: m.c, s: s, name: fmt.Sprintf("%s/%d", p.Group, p.Number), token: p.Epoch, class: leaseholdv1.LockClass_LOCK_CLASS_CORRECTNESS}
	o.lock.ctx, o.lock.cancel = context.WithCancelCause(context.Background())
	if err := s.add(o.lock); err != nil {
		o.lock.lost(err)
	}
	inner, cancel := context.WithCancelCause(o.lock.Context())
	o.ctx, o.inner, o.cancel = partitionContext{Context: inner, o: o}, inner, cancel
	o.mu.Lock()
	o.timer = time.AfterFunc(time.Until(deadline), o.checkDeadline)
	o.mu.Unlock()
	m.owned[p.Number] = o
	m.handlers.Add(1)
	go func() {
		defer m.handlers.Done()
		defer close(o.done)
		m.handler(o.ctx, p)
	}()
}

// drain stops o's handler and releases the partition once it has returned.
func (m *groupMember) drain(s *lease, n int, o *owned) {
	o.mu.Lock()
	already := o.draining
	o.draining = true
	o.mu.Unlock()
	if already {
		return
	}
	o.stop(ErrPartitionMoving)
	go func() {
		<-o.done
		m.releaseAndWake(s, o.p)
	}()
}

// releaseAndWake releases p and wakes follow: the release moved the partition, read
// again.
func (m *groupMember) releaseAndWake(s *lease, p Partition) {
	m.release(s, p)
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// release gives p back, retrying while the lease lives (a release of an ended epoch
// succeeds, so a retry is safe).
func (m *groupMember) release(s *lease, p Partition) {
	ctx, cancel := context.WithTimeout(context.Background(), max(s.remaining(), time.Millisecond))
	defer cancel()
	req := &leaseholdv1.GroupServiceReleaseRequest{Group: p.Group, Partition: uint32(p.Number), Epoch: p.Epoch, LeaseId: s.id}
	_, _ = call(ctx, m.c, repeatable, func(ctx context.Context) (*leaseholdv1.GroupServiceReleaseResponse, error) {
		return m.c.groups.Release(ctx, req)
	})
}

// stopAll stops every handler with cause and waits for them to return.
func (m *groupMember) stopAll(cause error) {
	for n, o := range m.owned {
		o.stop(cause)
		delete(m.owned, n)
	}
	m.handlers.Wait()
	clear(m.stopping)
}

// leave leaves the group, once every handler has returned, so that the partitions move
// at once. A repeat after a lost answer finds the member gone: that is success too.
func (m *groupMember) leave(ctx context.Context, s *lease) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), max(s.remaining(), time.Millisecond))
	defer cancel()
	req := &leaseholdv1.LeaveRequest{Group: m.group, Member: m.name, LeaseId: s.id}
	_, _ = call(ctx, m.c, repeatable, func(ctx context.Context) (*leaseholdv1.LeaveResponse, error) {
		return m.c.groups.Leave(ctx, req)
	})
}

// confirm extends o's cautious deadline to d.
func (o *owned) confirm(d time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if d.After(o.deadline) && o.inner.Err() == nil {
		o.deadline = d
		o.timer.Reset(time.Until(d))
	}
}

// checkDeadline ends o's context if its cautious deadline has passed.
func (o *owned) checkDeadline() {
	o.mu.Lock()
	late := !time.Now().Before(o.deadline)
	o.mu.Unlock()
	if late {
		o.stop(fmt.Errorf("%w (group %s, partition %d, epoch %d)", ErrPartitionDeadline, o.p.Group, o.p.Number, o.p.Epoch))
	}
}

// stop cancels o's context with cause (the first cause stays) and takes its lock off
// the lease.
func (o *owned) stop(cause error) {
	o.cancel(cause)
	o.mu.Lock()
	if o.timer != nil {
		o.timer.Stop()
	}
	o.mu.Unlock()
	o.lock.s.remove(o.lock)
	o.lock.lost(cause)
}

// partitionContext is a partition's context whose Err checks the ownership's deadline
// (and, through the lock's context, the lease's) against the clock.
type partitionContext struct {
	context.Context
	o *owned
}

func (c partitionContext) Err() error {
	c.o.lock.settle()
	c.o.checkDeadline()
	return c.Context.Err()
}
