package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/api/leasehold/v1/leaseholdv1connect"
	"github.com/leasehold/leasehold/fastlane"
	"github.com/leasehold/leasehold/internal/peerclosed"
)

// Release on disconnect (G7), the client's side: a bound lease is granted over the
// fast-lane connection it is bound to, and ends, with ErrDisconnected, the moment that
// connection breaks (found within boundProbe when no call is reading it), or stays
// unacknowledged for boundSilence.

// Probing a bound connection: a probe (a cancel of request 0, which the server ignores
// but reads) every boundProbe keeps the server's BoundIdleTimeout (default 5 s) from
// closing a quiet connection, and one left unacknowledged by the node's TCP for
// boundSilence means the path is cut.
const (
	boundProbe   = 500 * time.Millisecond
	boundSilence = 2 * time.Second
)

var grantMethod = fastlane.MustMethodOf(leaseholdv1connect.LeaseServiceGrantProcedure)

// grantBound grants the bound lease of req: over the fast-lane connection to the
// current node, recording in *conn the connection the lease is then bound to, or, when
// no fast-lane connection can be had (WithoutFastLane, a node without one, one that
// cannot be reached), over Connect, then bound to a Bind stream (bindStream), recorded
// in *bind.
func (c *Client) grantBound(ctx context.Context, req *leaseholdv1.GrantRequest, conn **flConn, bind **bindStream) (*leaseholdv1.GrantResponse, error) {
	if fc := c.fast.get(ctx); fc != nil {
		resp := new(leaseholdv1.GrantResponse)
		if err := fc.call(ctx, grantMethod, req, resp); err != nil {
			return nil, err
		}
		*conn = fc
		return resp, nil
	}
	plain := &leaseholdv1.GrantRequest{TtlMs: req.GetTtlMs()}
	resp, err := c.leases.Grant(ctx, plain)
	if err != nil {
		return nil, err
	}
	b, err := c.bind(ctx, resp.GetLeaseId())
	if err != nil {
		// The lease is bound to nothing: let it go (it expires after its TTL anyway).
		go func() {
			_, _ = c.leases.Revoke(context.Background(), &leaseholdv1.RevokeRequest{LeaseId: resp.GetLeaseId()})
		}()
		return nil, err
	}
	*bind = b
	return resp, nil
}

// watchConn ends the bound lease s with ErrDisconnected when conn breaks, or when a
// probe stays unacknowledged by the node's TCP for boundSilence (the connection is then
// failed too); it probes every boundProbe meanwhile. It stops when s ends. The lease
// is then revoked in the background too, in case the server has not seen the end.
func (s *lease) watchConn(conn *flConn) {
	t := time.NewTicker(boundProbe)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-conn.dead:
			s.end(fmt.Errorf("%w (lease %s): %w", ErrDisconnected, s.id, conn.brokenError()))
			go s.c.revokeLater(s)
			return
		case <-t.C:
		}
		if err := peerclosed.Check(rawConn(conn.conn)); err != nil {
			conn.fail(err) // closed by the server, or broken: dead now
			continue
		}
		if s.c.opts.tcpAcked == nil {
			conn.cancel(probeMethod, 0)
			continue
		}
		if unacked, sinceAck, ok := s.c.opts.tcpAcked(conn.conn); ok && unacked && sinceAck >= boundSilence {
			conn.fail(errFastLaneSilent)
			continue // dead now
		}
		conn.cancel(probeMethod, 0)
	}
}

// bindStream is a Bind stream that a lease is bound to (release on disconnect over
// Connect).
type bindStream struct {
	st     *connect.ServerStreamForClient[leaseholdv1.BindResponse]
	cancel context.CancelFunc
}

// bind opens a Bind stream for lease id and waits for its first message: the lease is
// then bound.
func (c *Client) bind(ctx context.Context, id string) (*bindStream, error) {
	sctx, cancel := context.WithCancel(context.Background()) // outlives the Lock's ctx
	stop := context.AfterFunc(ctx, cancel)
	st, err := c.leases.Bind(sctx, &leaseholdv1.BindRequest{LeaseId: id})
	if err == nil && !st.Receive() {
		err = st.Err()
		if err == nil {
			err = connect.NewError(connect.CodeUnavailable, errors.New("client: the Bind stream ended at once"))
		}
	}
	if !stop() || err != nil {
		cancel()
		if err == nil {
			err = ctx.Err()
		}
		return nil, err
	}
	return &bindStream{st: st, cancel: cancel}, nil
}

// watchBind ends the bound lease s with ErrDisconnected when its Bind stream breaks —
// the connection failed, or no message came for boundSilence — and binds it again when a
// node ended the stream with an answer of its own (its leader changed, it shuts down),
// until the lease ends. It stops when s ends.
func (s *lease) watchBind(b *bindStream) {
	c := s.c
	for {
		msgs := make(chan bool, 1)
		go func() {
			for b.st.Receive() {
				select {
				case msgs <- true:
				default:
				}
			}
			close(msgs)
		}()
		silence := time.NewTimer(boundSilence)
	watch:
		for {
			select {
			case <-s.stop:
				silence.Stop()
				b.cancel()
				return
			case _, ok := <-msgs:
				if !ok {
					break watch
				}
				silence.Reset(boundSilence)
			case <-silence.C:
				b.cancel()
				s.end(fmt.Errorf("%w (lease %s): the Bind stream fell silent", ErrDisconnected, s.id))
				go c.revokeLater(s)
				return
			}
		}
		silence.Stop()
		err := b.st.Err()
		b.cancel()
		switch {
		case errIsLeaseGone(err):
			s.end(leaseGoneCause(err))
			return
		case detailReason(err) == "":
			// The transport's failure, not a node's answer: the connection is gone.
			s.end(fmt.Errorf("%w (lease %s): %w", ErrDisconnected, s.id, err))
			go c.revokeLater(s)
			return
		}
		// A node ended it (a leader change, a shutdown): bind again, before the TTL.
		retry := newBackoff()
		for {
			ctx, cancel := context.WithTimeout(context.Background(), max(s.remaining(), time.Millisecond))
			nb, err := c.bind(ctx, s.id)
			cancel()
			if err == nil {
				b = nb
				break
			}
			if errIsLeaseGone(err) || !s.alive() {
				s.end(leaseGoneCause(err))
				return
			}
			c.judge(context.Background(), c.nodes.current(), err, false)
			select {
			case <-s.stop:
				return
			case <-time.After(retry.delay()):
			}
		}
	}
}
