package server

import (
	"context"
	"errors"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/api/leasehold/v1/leaseholdv1connect"
	"github.com/leasehold/leasehold/leader"
)

// Release on disconnect (G7). A Grant with release_on_disconnect that arrives on a
// fast-lane connection binds its lease to that connection, on the node that holds the
// connection — the leader or a follower that forwarded the Grant. When the connection
// ends (the client died or closed it, a write failed, or it stayed silent for
// BoundIdleTimeout), that node revokes the lease at once, through the log, with
// reason "disconnected": itself when it leads, otherwise forwarded to the leader as a
// Revoke with disconnected set. The binding lives with the connection, not with the
// leader, so a leader change elsewhere leaves it alone; when the connection's node is
// the one that fails, the client sees its connection end and gives the lease up, and
// the TTL applies on the server.

// bindIfAsked binds the lease a successful Grant created to the connection, when the
// Grant asked for release on disconnect.
func (c *fastConn) bindIfAsked(req, resp proto.Message) {
	g, ok := req.(*leaseholdv1.GrantRequest)
	if !ok || !g.GetReleaseOnDisconnect() {
		return
	}
	r := resp.(*leaseholdv1.GrantResponse)
	c.mu.Lock()
	if c.bound == nil {
		c.bound = make(map[string]time.Duration)
	}
	c.bound[r.GetLeaseId()] = time.Duration(r.GetTtlMs()) * time.Millisecond
	c.mu.Unlock()
	if c.lane != nil {
		c.lane.bind(c.s.cfg.BoundIdleTimeout)
	}
}

// revokeBound revokes, in the background, every lease bound to the connection, which
// has ended.
func (c *fastConn) revokeBound() {
	c.mu.Lock()
	bound := c.bound
	c.bound = nil
	c.mu.Unlock()
	for id, ttl := range bound {
		go c.s.revokeDisconnected(c.principal, id, ttl)
	}
}

// revokeDisconnected revokes lease id, whose connection ended, retrying while no
// leader takes it, for at most its TTL: after that it has expired anyway. The revoke
// goes as who, the connection's caller: forwarded from a follower, it carries that
// caller's credential, as the leader takes no other (never the forwarding node's).
func (s *Server) revokeDisconnected(who *principal, id string, ttl time.Duration) {
	ctx, cancel := context.WithTimeout(withPrincipal(context.Background(), who), ttl)
	defer cancel()
	m := s.methods.byProcedure[leaseholdv1connect.LeaseServiceRevokeProcedure]
	req := &leaseholdv1.RevokeRequest{LeaseId: id, Disconnected: true}
	wait := 20 * time.Millisecond
	for {
		_, err := s.call(ctx, m, req, caller{})
		var gone *leader.LeaseGoneError
		switch code := connect.CodeOf(err); {
		case err == nil, code == connect.CodeNotFound, errors.As(err, &gone):
			return // revoked, or gone already (the client revoked it, or it expired)
		case code != connect.CodeUnavailable && code != connect.CodeDeadlineExceeded && code != connect.CodeCanceled:
			s.log.Warn("release on disconnect: revoke failed", "err", err)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
}

// bindBeat is how often a Bind stream sends a message: a client that stopped reading,
// or whose connection broke, is found when one cannot be written.
const bindBeat = time.Second

// Bind serves LeaseService.Bind: release on disconnect over Connect. The lease is bound
// to the stream: when the stream ends because its caller went away, the lease is
// revoked (revokeDisconnected). A node shutting down ends its streams without revoking.
func (s *Server) Bind(ctx context.Context, req *leaseholdv1.BindRequest, send func(*leaseholdv1.BindResponse) error) error {
	id, err := leaseID(req.GetLeaseId())
	if err != nil {
		return err
	}
	ka, err := s.leader.KeepAlive(ctx, id)
	if err != nil {
		return err
	}
	resp := &leaseholdv1.BindResponse{TtlMs: ka.TTL.Milliseconds()}
	t := time.NewTicker(bindBeat)
	defer t.Stop()
	for {
		if err := send(resp); err != nil {
			go s.revokeDisconnected(principalOf(ctx), req.GetLeaseId(), ka.TTL)
			return err
		}
		select {
		case <-ctx.Done():
			if errors.Is(context.Cause(ctx), ErrShuttingDown) {
				return ctx.Err() // this node goes away, not the client: it binds again elsewhere
			}
			go s.revokeDisconnected(principalOf(ctx), req.GetLeaseId(), ka.TTL)
			return ctx.Err()
		case <-t.C:
		}
	}
}
