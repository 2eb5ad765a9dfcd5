package client

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"connectrpc.com/connect"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
)

// lease is one lease and the locks held on it. One goroutine (keepAlive) owns the
// renewals; it stops when the lease ends.
type lease struct {
	c      *Client
	id     string
	ttl    time.Duration
	margin time.Duration

	mu       sync.Mutex
	deadline time.Time // cautious local deadline, monotonic
	locks    map[*Lock]struct{}
	err      error // why the lease ended; nil while alive
	timer    *time.Timer
	stop     chan struct{}
	// releasing holds the names whose release has not been confirmed (a background
	// release after an Unlock of unknown outcome, or an abandoned Lock's): a new Lock
	// of one of them on this lease waits for it, so that the server's idempotent
	// Acquire does not hand back the old grant as a new lock.
	releasing map[string]*release
}

func newLease(c *Client, id string, ttl time.Duration, sent time.Time) *lease {
	s := &lease{
		c:      c,
		id:     id,
		ttl:    ttl,
		margin: c.margin(ttl),
		locks:  make(map[*Lock]struct{}),
		stop:   make(chan struct{}),

		releasing: make(map[string]*release),
	}
	s.deadline = sent.Add(ttl - s.margin)
	// Under mu: a deadline already past (a grant answered late) fires the timer at once,
	// and its end reads s.timer.
	s.mu.Lock()
	s.timer = time.AfterFunc(time.Until(s.deadline), s.checkDeadline)
	s.mu.Unlock()
	go s.keepAlive()
	return s
}

// alive reports whether the lease can still take locks. It checks the clock itself,
// so a process resumed after a pause sees an expired lease at once.
func (s *lease) alive() bool { return s.endCause() == nil }

// endCause ends the lease if its cautious deadline has passed, and returns why the
// lease has ended (nil while it lives).
func (s *lease) endCause() error {
	s.checkDeadline()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// checkDeadline ends the lease if its cautious deadline has passed.
func (s *lease) checkDeadline() {
	s.mu.Lock()
	late := s.err == nil && !time.Now().Before(s.deadline)
	s.mu.Unlock()
	if late {
		s.end(fmt.Errorf("%w (lease %s, TTL %v)", ErrLeaseDeadline, s.id, s.ttl))
	}
}

// renewed records an acknowledged keepalive that was sent at sent.
func (s *lease) renewed(sent time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return
	}
	if d := sent.Add(s.ttl - s.margin); d.After(s.deadline) {
		s.deadline = d
		s.timer.Reset(time.Until(d))
	}
}

// end cancels every lock of the lease with cause and stops the keepalives.
func (s *lease) end(cause error) {
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return
	}
	s.err = cause
	s.timer.Stop()
	close(s.stop)
	locks := s.locks
	s.locks = nil
	s.mu.Unlock()
	for l := range locks {
		l.lost(cause)
	}
	// Client.lease calls alive (and so end) with its leaseSet's mu held; it replaces
	// dead leases itself, so end must not take that mu.
}

func (s *lease) add(l *Lock) error {
	s.checkDeadline() // a grant answered after the deadline (a pause) must not be held
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return s.err
	}
	s.locks[l] = struct{}{}
	return nil
}

func (s *lease) remove(l *Lock) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.locks, l)
}

// removeGrant unregisters every Lock on s of the grant of name under token — the Lock
// calls of one holder for one name share one grant (Session) — and returns them.
func (s *lease) removeGrant(name string, token uint64) []*Lock {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*Lock
	for l := range s.locks {
		if l.token == token && l.holds(name) {
			out = append(out, l)
			delete(s.locks, l)
		}
	}
	return out
}

// holding reports whether a Lock on s still holds the grant of name under token.
func (s *lease) holding(name string, token uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for l := range s.locks {
		if l.token == token && l.holds(name) {
			return true
		}
	}
	return false
}

func (s *lease) remaining() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return time.Until(s.deadline)
}

// keepAlive renews the lease about every TTL/3 (jittered by ±10%), and sooner after a
// failure, until the lease ends. No attempt runs past the cautious deadline (its answer
// would be useless after it), and while more time is left than two attempt limits — a
// fifth of the TTL, at most the client's attempt timeout — an attempt is abandoned
// when its node has been silent for a limit (cutIfSilent; a node that is slow but
// answers is waited for): a node that stays silent costs that much, then the next node
// is tried, so one dead path never costs the lease.
func (s *lease) keepAlive() {
	interval := s.ttl / 3
	next := aligned(jitter(interval), interval)
	limit := s.ttl / 5
	if a := s.c.opts.attempt; a > 0 {
		limit = min(limit, a)
	}
	retry := newBackoff()
	t := time.NewTimer(next)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		s.checkDeadline()
		left := s.remaining()
		if left <= 0 {
			return
		}
		node := s.c.nodes.current()
		ctx, cancel := context.WithTimeout(context.Background(), left)
		var cut *silenceCut
		if limit < left/2 {
			cut = s.c.cutIfSilent(node, limit, cancel)
		}
		sent := time.Now()
		resp, err := rpc(ctx, s.c, s.c.leases.KeepAlive, &leaseholdv1.KeepAliveRequest{LeaseId: s.id})
		silent := cut != nil && cut.stop() && err != nil
		cancel()
		s.c.judge(context.Background(), node, err, silent)
		switch {
		case err == nil:
			s.renewed(sent)
			s.deliver(resp)
			retry = newBackoff()
			next = aligned(jitter(interval), interval)
		case connect.CodeOf(err) == connect.CodeNotFound:
			s.end(leaseGoneCause(err))
			return
		default:
			// Unknown: the lease may still be alive. Retry at once on the node judge
			// chose, with backoff, keeping several attempts inside the remaining time.
			next = min(retry.delay(), max(left/4, time.Millisecond))
		}
		t.Reset(next)
	}
}

// deliver applies what a keepalive answer says about individual locks: force releases
// and a changed efficiency epoch.
func (s *lease) deliver(resp *leaseholdv1.KeepAliveResponse) {
	s.mu.Lock()
	var lost []*Lock
	var causes []error
	for l := range s.locks {
		if l.class == leaseholdv1.LockClass_LOCK_CLASS_EFFICIENCY && l.epoch != resp.GetEpoch() {
			lost = append(lost, l)
			causes = append(causes, fmt.Errorf("%w (epoch %s, now %s)", ErrStateLost, l.epoch, resp.GetEpoch()))
			continue
		}
		for _, ll := range resp.GetLost() {
			if l.holds(ll.GetName()) && ll.GetToken() == l.token {
				lost = append(lost, l)
				causes = append(causes, fmt.Errorf("%w: %s", ErrReleasedByOperator, ll.GetReason()))
			}
		}
	}
	for _, l := range lost {
		delete(s.locks, l)
	}
	s.mu.Unlock()
	for i, l := range lost {
		l.lost(causes[i])
	}
}

// aligned stretches a wait of d so that it ends on a boundary of a quantum shared by
// every lease in the process (interval/32, between 1 ms and 100 ms): renewals that fall
// due close together are sent together, so the fast lane carries them in one write and
// the server reads them in one read. A renewal is late by less than a quantum, about 3%
// of the renewal interval, which leaves the lease two thirds of its TTL to spare.
func aligned(d, interval time.Duration) time.Duration {
	return alignedAt(time.Since(processStart), d, interval)
}

// alignedAt is aligned at now (time since processStart).
func alignedAt(now, d, interval time.Duration) time.Duration {
	q := min(max(interval/32, time.Millisecond), 100*time.Millisecond)
	end := now + d
	return d + (q-end%q)%q
}

// processStart anchors the quanta of aligned.
var processStart = time.Now()

func jitter(d time.Duration) time.Duration {
	return d - d/10 + time.Duration(rand.Int64N(int64(d/5)+1))
}

// errIsLeaseGone reports whether err says the lease no longer exists.
func errIsLeaseGone(err error) bool {
	return connect.CodeOf(err) == connect.CodeNotFound && !errors.Is(err, context.Canceled)
}
