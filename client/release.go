package client

import (
	"context"
	"fmt"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/internal/reason"
)

// release is a release that runs in the background, on a lease, until the server
// confirms it or the lease ends: after an Unlock whose outcome was unknown, and after a
// Lock that gave up with its outcome unknown (abandon). While it runs, its names are
// in the lease's releasing set and a new Lock of one of them on that lease waits for it:
// the server's Acquire is idempotent per lease, so a Lock sent before the release is
// through would get the old grant back, under the old token, as if it were new.
type release struct {
	done chan struct{}
	err  error // set before done is closed: nil once the lock is not held
}

// background starts run as the release of names on lease s. run's context ends when
// the lease does: whatever the lease held is then gone with it, and the release counts
// as done. If the lease has already ended, background returns a release that is done.
func (s *lease) background(names []string, run func(context.Context) error) *release {
	r := &release{done: make(chan struct{})}
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		close(r.done)
		return r
	}
	for _, n := range names {
		s.releasing[n] = r
	}
	s.mu.Unlock()
	go func() {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() {
			select {
			case <-s.stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		err := run(ctx)
		if ctx.Err() != nil {
			err = nil // the lease ended, and its locks with it
		}
		s.mu.Lock()
		for _, n := range names {
			if s.releasing[n] == r {
				delete(s.releasing, n)
			}
		}
		r.err = err
		s.mu.Unlock()
		close(r.done)
	}()
	return r
}

// settle waits until no release of any of names is running on s, or ctx ends, or s
// ends (the caller then takes a fresh lease).
func (s *lease) settle(ctx context.Context, names []string) error {
	for {
		s.mu.Lock()
		var r *release
		for _, n := range names {
			if r = s.releasing[n]; r != nil {
				break
			}
		}
		s.mu.Unlock()
		if r == nil {
			return nil
		}
		select {
		case <-r.done:
		case <-s.stop:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("%w: this holder's release of %q is not confirmed yet: %w", ErrUnavailable, names, ctx.Err())
		}
	}
}

// wait waits for the background release to end and returns its outcome.
func (r *release) wait(ctx context.Context) error {
	select {
	case <-r.done:
		return r.err
	case <-ctx.Done():
		return fmt.Errorf("%w: the release is not confirmed yet (it goes on in the background): %w", ErrUnavailable, ctx.Err())
	}
}

// releaseGrant releases grant token of lease s on name (for a lock set, any of its
// names), retrying until ctx ends. It returns nil when the lock is not held by the
// lease afterwards: released now, by an attempt whose answer was lost, or gone with the
// lease.
func (c *Client) releaseGrant(ctx context.Context, s *lease, name string, token uint64) error {
	req := &leaseholdv1.ReleaseRequest{Name: name, LeaseId: s.id, Token: token}
	_, err := call(ctx, c, repeatable, func(ctx context.Context) (*leaseholdv1.ReleaseResponse, error) {
		return rpc(ctx, c, c.locks.Release, req)
	})
	if err == nil || detailReason(err) == reason.NotHolder || errIsLeaseGone(err) {
		return nil
	}
	return err
}
