// Package client is the Go client of leasehold.
//
//	c, err := client.Dial(ctx, "127.0.0.1:7740")
//	l, err := c.Lock(ctx, "orders/42", client.Correctness)
//	defer l.Unlock(context.Background())
//	write(l.Context(), l.Token()) // pass the token to the resource; it checks it
//
// A Client keeps one lease per TTL alive in the background (a keepalive about every
// TTL/3, jittered). A held lock's Context is cancelled the moment the lock is known
// lost — and, even when no server answers, at a cautious local deadline: the send time
// of the last acknowledged keepalive plus the TTL minus a safety margin, on this
// process's monotonic clock. The server cannot expire the lease before that moment
// (it counts the TTL from when it *received* the keepalive), so the holder hears first
// (guarantee G4b). context.Cause tells why: ErrLeaseExpired, ErrLeaseRevoked,
// ErrLeaseDeadline, ErrReleasedByOperator, ErrStateLost, ErrDisconnected (a lock taken
// with ReleaseOnDisconnect whose connection broke, G7), ErrUnlocked, or
// ErrUnlockUnconfirmed (Unlock returned before a server confirmed it; the release goes
// on in the background).
//
// Client.Elect runs a function while the client leads an election (G8), fenced by the
// leadership's epoch; Client.Leader and Client.Observe tell who leads.
//
// All locks a Client takes hang on its leases; a Session (Client.NewSession) is a lock
// holder with leases of its own on the same connections, for workers of one process that
// must contend with each other.
//
// What the client cannot promise: that your code stops when the context is cancelled.
// A process that is paused (GC, swap, SIGSTOP, VM migration) does not run its
// cancellation either. Only a resource that checks the fencing token stops a paused
// holder's late write; see package fence.
package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"connectrpc.com/connect"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/api/leasehold/v1/leaseholdv1connect"
)

// Holder describes who holds a lock, for listings.
type Holder struct {
	Host string
	PID  uint32
	Note string
}

// Option configures a Client.
type Option func(*options)

type options struct {
	ttl        time.Duration
	margin     time.Duration
	attempt    time.Duration
	tcpAcked   func(net.Conn) (unacked bool, sinceAck time.Duration, ok bool) // see fastLanes.watch
	httpClient connect.HTTPClient
	holder     Holder
	noFastLane bool
	tls        *tls.Config // security.go
	token      string
	clusterID  string
	lazy       bool
}

// WithTTL sets the default lease TTL for locks that do not ask for their own
// (default 10s; the server bounds it, by default to 100ms..1h).
func WithTTL(d time.Duration) Option { return func(o *options) { o.ttl = d } }

// WithSafetyMargin sets how long before the server could expire a lease the client
// gives its locks up when keepalives go unanswered. Default: TTL/5, at least 20ms.
// It must absorb the difference in clock rates between client and server.
func WithSafetyMargin(d time.Duration) Option { return func(o *options) { o.margin = d } }

// WithHTTPClient replaces the HTTP client (it must speak HTTP/2 without TLS to reach a
// default server, or HTTP/1.1).
func WithHTTPClient(h connect.HTTPClient) Option { return func(o *options) { o.httpClient = h } }

// WithHolder sets the default holder description (default: host name and pid).
func WithHolder(h Holder) Option { return func(o *options) { o.holder = h } }

// WithLazyConnect makes Dial return at once, without checking that a node answers (as
// etcd's client does): the first call connects, and like every call it retries while
// no node answers, until its context ends (then it fails with ErrUnavailable). Use it
// to start a process before, or while, the cluster is unreachable. Credentials a node
// refuses are then only found by the first call.
func WithLazyConnect() Option { return func(o *options) { o.lazy = true } }

// Client is a connection to a leasehold server. It is safe for concurrent use.
type Client struct {
	opts    options
	nodes   *failover
	leases  leaseholdv1connect.LeaseServiceClient
	locks   leaseholdv1connect.LockServiceClient
	cluster leaseholdv1connect.ClusterServiceClient
	kv      leaseholdv1connect.KVServiceClient
	keys    leaseholdv1connect.IdempotencyServiceClient
	groups  leaseholdv1connect.GroupServiceClient
	elect   leaseholdv1connect.ElectionServiceClient
	fast    *fastLanes
	id      *clusterID // the cluster every answer must come from (cluster.go)
	// closeHTTP closes the connections of the HTTP client the Client made itself (none
	// with WithHTTPClient: that one is the caller's to close).
	closeHTTP func()

	own leaseSet // the leases of locks taken with Client.Lock

	mu       sync.Mutex
	sessions map[*Session]struct{}
	closed   bool
}

// Dial returns a Client for the cluster at addr — one "host:port" (or http:// URL), or
// several separated by commas — and checks that a node answers (each address is tried
// once, in turn). A node that refuses the client's credentials (WithToken, WithTLS's
// certificate) fails Dial at once with its Unauthenticated or PermissionDenied error.
// Dial creates no lease until the first Lock. With WithLazyConnect it contacts no node
// at all.
//
// Any node serves any request (followers forward to the leader). The client stays on a
// node while it serves, and moves when it fails a call: to the leader a node names when
// it answers that it is not the leader, otherwise to the next listed address, passing
// over for a while a node that stayed silent or refused the connection. A call that no
// node could serve is repeated, after a jittered backoff, until its context ends: always
// when it was certainly not carried out, and also after an unknown outcome (a silent
// node, a broken connection) when it is safe to repeat — reads, Lock, Unlock and the
// keepalives, not Put, Delete, ForceRelease or membership changes, which then fail with
// ErrUnavailable and their outcome unknown. See WithAttemptTimeout for how silence is
// told from slowness.
func Dial(ctx context.Context, addr string, opts ...Option) (*Client, error) {
	o := options{ttl: 10 * time.Second, attempt: defaultAttemptTimeout, tcpAcked: tcpAcked}
	for _, opt := range opts {
		opt(&o)
	}
	if o.holder == (Holder{}) {
		host, _ := os.Hostname()
		o.holder = Holder{Host: host, PID: uint32(os.Getpid())}
	}
	closeHTTP := func() {}
	if o.httpClient == nil {
		o.httpClient, closeHTTP = o.defaultHTTPClient()
	}
	addrs := splitAddrs(addr)
	if len(addrs) == 0 {
		return nil, fmt.Errorf("%w: no address given", ErrUnavailable)
	}
	id, err := newClusterID(o.clusterID)
	if err != nil {
		return nil, err
	}
	fo := newFailover(clusterChecked{base: o.httpClient, id: id}, addrs)
	hc := connect.HTTPClient(fo)
	base := o.scheme() + "://" + placeholderHost
	copts := o.connectOptions()
	c := &Client{
		opts:      o,
		nodes:     fo,
		leases:    leaseholdv1connect.NewLeaseServiceClient(hc, base, copts...),
		locks:     leaseholdv1connect.NewLockServiceClient(hc, base, copts...),
		cluster:   leaseholdv1connect.NewClusterServiceClient(hc, base, copts...),
		kv:        leaseholdv1connect.NewKVServiceClient(hc, base, copts...),
		keys:      leaseholdv1connect.NewIdempotencyServiceClient(hc, base, copts...),
		groups:    leaseholdv1connect.NewGroupServiceClient(hc, base, copts...),
		elect:     leaseholdv1connect.NewElectionServiceClient(hc, base, copts...),
		id:        id,
		closeHTTP: closeHTTP,
		sessions:  make(map[*Session]struct{}),
	}
	c.fast = &fastLanes{c: c, disabled: o.noFastLane}
	if o.lazy {
		return c, nil
	}
	status := policy{repeatable: true, tries: len(addrs)}
	if _, err := call(ctx, c, status, c.status); err != nil {
		c.fast.close()
		c.closeHTTP()
		if refused(err) {
			return nil, fmt.Errorf("client: %s: %w", addr, err)
		}
		return nil, fmt.Errorf("%w: %s: %w", ErrUnavailable, addr, err)
	}
	return c, nil
}

// Status returns the status of the node the client talks to now.
func (c *Client) Status(ctx context.Context) (*leaseholdv1.StatusResponse, error) {
	return call(ctx, c, repeatable, c.status)
}

func (c *Client) status(ctx context.Context) (*leaseholdv1.StatusResponse, error) {
	return rpc(ctx, c, c.cluster.Status, &leaseholdv1.StatusRequest{})
}

// List lists locks under prefix (limit 0 means the server's default).
func (c *Client) List(ctx context.Context, prefix string, limit int) (*leaseholdv1.ListResponse, error) {
	return call(ctx, c, repeatable, func(ctx context.Context) (*leaseholdv1.ListResponse, error) {
		return rpc(ctx, c, c.locks.List, &leaseholdv1.ListRequest{Prefix: prefix, Limit: uint32(max(0, limit))})
	})
}

// Describe shows one lock.
func (c *Client) Describe(ctx context.Context, name string) (*leaseholdv1.LockInfo, error) {
	resp, err := call(ctx, c, repeatable, func(ctx context.Context) (*leaseholdv1.DescribeResponse, error) {
		return rpc(ctx, c, c.locks.Describe, &leaseholdv1.DescribeRequest{Name: name})
	})
	return resp.GetLock(), err
}

// ForceRelease releases a lock whoever holds it (an operator's action). It returns the
// released token and the fence token every later grant exceeds. It is never sent twice
// (a second force release would take the next holder's grant): an error wrapping
// ErrUnavailable means its outcome is unknown.
func (c *Client) ForceRelease(ctx context.Context, name, reason string) (released, fence uint64, err error) {
	resp, err := call(ctx, c, once, func(ctx context.Context) (*leaseholdv1.ForceReleaseResponse, error) {
		return rpc(ctx, c, c.locks.ForceRelease, &leaseholdv1.ForceReleaseRequest{Name: name, Reason: reason})
	})
	return resp.GetReleasedToken(), resp.GetFenceToken(), err
}

// CheckToken tells whether token is the current holder's token for lock name.
func (c *Client) CheckToken(ctx context.Context, name string, token uint64) (bool, error) {
	resp, err := call(ctx, c, repeatable, func(ctx context.Context) (*leaseholdv1.CheckTokenResponse, error) {
		return rpc(ctx, c, c.locks.CheckToken, &leaseholdv1.CheckTokenRequest{Name: name, Token: token})
	})
	return resp.GetCurrent(), err
}

// Close revokes the client's leases and those of its Sessions, which releases every
// lock they hold, and stops the keepalives. It waits at most until ctx ends; a lease it
// could not revoke expires on its own after its TTL.
func (c *Client) Close(ctx context.Context) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	sets := []*leaseSet{&c.own}
	for s := range c.sessions {
		sets = append(sets, &s.set)
	}
	clear(c.sessions)
	c.mu.Unlock()
	var errs []error
	for _, set := range sets {
		if err := c.revokeAll(ctx, set); err != nil {
			errs = append(errs, err)
		}
	}
	c.fast.close()
	// Without this the HTTP/2 connection stays open for its idle timeout (90 s) after
	// Close: a program that dials and closes clients in a loop would pile them up until
	// the server's per-address bound (MaxConnsPerClient) refused the next.
	if c.closeHTTP != nil {
		c.closeHTTP()
	}
	return errors.Join(errs...)
}

// leaseSet is the leases of one lock holder, the Client itself or one Session: one per
// TTL, each granted when a Lock first needs it.
type leaseSet struct {
	mu     sync.Mutex
	byTTL  map[leaseKind]*lease
	keys   map[string]uint64 // idempotency keys a Once of this holder runs, with their tokens (once.go)
	closed bool
}

// revokeAll closes set and revokes its leases, which releases their locks.
func (c *Client) revokeAll(ctx context.Context, set *leaseSet) error {
	set.mu.Lock()
	if set.closed {
		set.mu.Unlock()
		return nil
	}
	set.closed = true
	leases := make([]*lease, 0, len(set.byTTL))
	for _, s := range set.byTTL {
		leases = append(leases, s)
	}
	clear(set.byTTL)
	set.mu.Unlock()
	var errs []error
	for _, s := range leases {
		s.end(ErrLeaseRevoked)
		if err := c.revoke(ctx, s); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// revoke revokes lease s, trying for at most its TTL: after that it is gone anyway.
func (c *Client) revoke(ctx context.Context, s *lease) error {
	ctx, cancel := context.WithTimeout(ctx, s.ttl)
	defer cancel()
	_, err := call(ctx, c, repeatable, func(ctx context.Context) (*leaseholdv1.RevokeResponse, error) {
		return c.leases.Revoke(ctx, &leaseholdv1.RevokeRequest{LeaseId: s.id})
	})
	if connect.CodeOf(err) == connect.CodeNotFound {
		return nil // gone already (or revoked by an earlier attempt)
	}
	return err
}

// leaseKind is what tells a holder's leases apart: the TTL, and whether the lease is
// bound to the fast-lane connection (release on disconnect, G7).
type leaseKind struct {
	ttl   time.Duration
	bound bool
}

// leaseFor returns set's live lease of kind k, granting a new one if needed.
func (c *Client) leaseFor(ctx context.Context, set *leaseSet, k leaseKind) (*lease, error) {
	set.mu.Lock()
	if set.closed {
		set.mu.Unlock()
		return nil, ErrClosed
	}
	if s := set.byTTL[k]; s != nil && s.alive() {
		set.mu.Unlock()
		return s, nil
	}
	set.mu.Unlock()

	// A repeated Grant after an unknown outcome may leave a lease nobody uses; it
	// expires after its TTL.
	var sent time.Time
	var conn *flConn     // the fast-lane connection a bound lease is bound to
	var bind *bindStream // or the Bind stream (over Connect)
	req := &leaseholdv1.GrantRequest{TtlMs: k.ttl.Milliseconds(), ReleaseOnDisconnect: k.bound}
	resp, err := call(ctx, c, repeatable, func(ctx context.Context) (*leaseholdv1.GrantResponse, error) {
		sent = time.Now() // the answered attempt's: the lease's countdown began after it
		if k.bound {
			return c.grantBound(ctx, req, &conn, &bind)
		}
		return rpc(ctx, c, c.leases.Grant, req)
	})
	if err != nil {
		return nil, err
	}
	s := newLease(c, resp.GetLeaseId(), time.Duration(resp.GetTtlMs())*time.Millisecond, sent)
	switch {
	case conn != nil:
		go s.watchConn(conn)
	case bind != nil:
		go s.watchBind(bind)
	}
	set.mu.Lock()
	defer set.mu.Unlock()
	if set.closed {
		s.end(ErrClosed)
		go c.revokeLater(s)
		return nil, ErrClosed
	}
	if old := set.byTTL[k]; old != nil && old.alive() {
		// Another Lock won the race; keep one lease per TTL and let this one go.
		s.end(ErrLeaseRevoked)
		go c.revokeLater(s)
		return old, nil
	}
	if set.byTTL == nil {
		set.byTTL = make(map[leaseKind]*lease)
	}
	set.byTTL[k] = s
	return s, nil
}

// revokeLater revokes a lease nobody uses, in the background.
func (c *Client) revokeLater(s *lease) { _ = c.revoke(context.Background(), s) }

func (c *Client) margin(ttl time.Duration) time.Duration {
	if c.opts.margin > 0 {
		return min(c.opts.margin, ttl/2)
	}
	return max(ttl/5, 20*time.Millisecond)
}

// Members lists the cluster's nodes.
func (c *Client) Members(ctx context.Context) ([]*leaseholdv1.Member, error) {
	resp, err := call(ctx, c, repeatable, func(ctx context.Context) (*leaseholdv1.MembersResponse, error) {
		return rpc(ctx, c, c.cluster.Members, &leaseholdv1.MembersRequest{})
	})
	return resp.GetMembers(), err
}

// AddMember adds a running node to the cluster as a voter. An error wrapping
// ErrUnavailable means its outcome is unknown (see Dial).
func (c *Client) AddMember(ctx context.Context, id, raftAddr, apiAddr string) ([]*leaseholdv1.Member, error) {
	resp, err := call(ctx, c, once, func(ctx context.Context) (*leaseholdv1.AddMemberResponse, error) {
		return rpc(ctx, c, c.cluster.AddMember, &leaseholdv1.AddMemberRequest{NodeId: id, RaftAddr: raftAddr, ApiAddr: apiAddr})
	})
	return resp.GetMembers(), err
}

// RemoveMember removes a node from the cluster. An error wrapping ErrUnavailable means
// its outcome is unknown (see Dial).
func (c *Client) RemoveMember(ctx context.Context, id string) ([]*leaseholdv1.Member, error) {
	resp, err := call(ctx, c, once, func(ctx context.Context) (*leaseholdv1.RemoveMemberResponse, error) {
		return rpc(ctx, c, c.cluster.RemoveMember, &leaseholdv1.RemoveMemberRequest{NodeId: id})
	})
	return resp.GetMembers(), err
}
