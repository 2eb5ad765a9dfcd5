package client

import (
	"context"
	"fmt"
	"time"

	"connectrpc.com/connect"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/api/leasehold/v1/leaseholdv1connect"
	"github.com/leasehold/leasehold/fastlane"
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

// grantBound sends Grant req over the fast-lane connection to the current node,
// waiting for one while it is being dialled, and records in *conn the connection the
// lease is then bound to.
func (c *Client) grantBound(ctx context.Context, req *leaseholdv1.GrantRequest, conn **flConn) (*leaseholdv1.GrantResponse, error) {
	b := newBackoff()
	for {
		if c.fast.off() {
			return nil, ErrNoFastLane
		}
		if fc := c.fast.get(ctx); fc != nil {
			resp := new(leaseholdv1.GrantResponse)
			if err := fc.call(ctx, grantMethod, req, resp); err != nil {
				return nil, err
			}
			*conn = fc
			return resp, nil
		}
		if err := b.sleep(ctx); err != nil {
			return nil, connect.NewError(connect.CodeDeadlineExceeded, fmt.Errorf("no fast-lane connection: %w", err))
		}
	}
}

// off reports whether the fast lane is turned off (WithoutFastLane, or Close).
func (f *fastLanes) off() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.disabled
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
		if err := peerClosed(rawConn(conn.conn)); err != nil {
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
