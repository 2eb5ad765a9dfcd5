package client

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/api/leasehold/v1/leaseholdv1connect"
	"github.com/leasehold/leasehold/fastlane"
)

// WithoutFastLane makes the client use Connect (HTTP/2) for every call instead of the
// fast lane. The fast lane is used by default when the server offers one.
func WithoutFastLane() Option { return func(o *options) { o.noFastLane = true } }

// errFastLaneBroken means the fast-lane connection failed; the request's outcome is
// unknown if it had been sent.
var errFastLaneBroken = errors.New("client: fast-lane connection broken")

// flConn is one fast-lane connection: a reader goroutine that routes responses to
// waiting calls by request id, and a batching writer.
type flConn struct {
	conn    net.Conn
	w       *fastlane.Writer
	dead    chan struct{}
	nextID  atomic.Uint64
	mu      sync.Mutex
	pending map[uint64]chan flResult
	err     error
}

type flResult struct {
	kind    fastlane.Kind
	payload []byte
}

func dialFastLane(ctx context.Context, addr string) (*flConn, error) {
	conn, err := (&net.Dialer{Timeout: 2 * time.Second}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	if err := fastlane.ClientHello(conn); err != nil {
		_ = conn.Close()
		return nil, err
	}
	c := &flConn{conn: conn, w: fastlane.NewWriter(conn), dead: make(chan struct{}), pending: make(map[uint64]chan flResult)}
	go c.readLoop()
	return c, nil
}

func (c *flConn) readLoop() {
	r := fastlane.NewReader(c.conn)
	for {
		f, err := r.Read()
		if err != nil {
			c.fail(err)
			return
		}
		c.mu.Lock()
		ch := c.pending[f.ID]
		delete(c.pending, f.ID)
		c.mu.Unlock()
		if ch != nil {
			ch <- flResult{kind: f.Kind, payload: append([]byte(nil), f.Payload...)}
		}
	}
}

// fail marks the connection dead and fails every call waiting on it.
func (c *flConn) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return
	}
	c.err = err
	close(c.dead)
	_ = c.conn.Close()
	clear(c.pending)
}

func (c *flConn) broken() bool {
	select {
	case <-c.dead:
		return true
	default:
		return false
	}
}

// call sends req and decodes the answer into resp. Errors are *connect.Error with the
// code and details the server gave, or Unavailable when the connection broke.
func (c *flConn) call(ctx context.Context, m fastlane.Method, req, resp proto.Message) error {
	id := c.nextID.Add(1)
	frame, err := fastlane.AppendFrame(nil, fastlane.KindRequest, m, id, func(b []byte) ([]byte, error) {
		return proto.MarshalOptions{}.MarshalAppend(b, req)
	})
	if err != nil {
		return connect.NewError(connect.CodeInvalidArgument, err)
	}
	ch := make(chan flResult, 1)
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return connect.NewError(connect.CodeUnavailable, fmt.Errorf("%w: %w", errFastLaneBroken, c.err))
	}
	c.pending[id] = ch
	others := len(c.pending) > 1
	c.mu.Unlock()
	if !c.w.Send(frame, others) {
		c.fail(errFastLaneBroken)
		return connect.NewError(connect.CodeUnavailable, errFastLaneBroken)
	}
	select {
	case r := <-ch:
		if r.kind == fastlane.KindError {
			return decodeFastError(r.payload)
		}
		if err := proto.Unmarshal(r.payload, resp); err != nil {
			return connect.NewError(connect.CodeInternal, fmt.Errorf("client: fast-lane response does not decode: %w", err))
		}
		return nil
	case <-ctx.Done():
		c.mu.Lock()
		delete(c.pending, id)
		c.mu.Unlock()
		if cancel, err := fastlane.AppendFrame(nil, fastlane.KindCancel, m, id, nil); err == nil {
			c.w.Send(cancel, false)
		}
		return connect.NewError(connect.CodeOf(ctx.Err()), ctx.Err())
	case <-c.dead:
		return connect.NewError(connect.CodeUnavailable, errFastLaneBroken)
	}
}

func decodeFastError(payload []byte) error {
	var fe leaseholdv1.FastLaneError
	if err := proto.Unmarshal(payload, &fe); err != nil {
		return connect.NewError(connect.CodeInternal, fmt.Errorf("client: fast-lane error frame does not decode: %w", err))
	}
	ce := connect.NewError(connect.Code(fe.GetCode()), errors.New(fe.GetMessage()))
	if fe.GetDetail() != nil {
		if d, err := connect.NewErrorDetail(fe.GetDetail()); err == nil {
			ce.AddDetail(d)
		}
	}
	return ce
}

// fastLanes keeps one fast-lane connection to the node the client currently talks to.
// When a node has no fast lane, or it cannot be reached, calls go through Connect and the
// fast lane is tried again after a pause.
type fastLanes struct {
	c        *Client
	mu       sync.Mutex
	node     string // API address the connection belongs to
	conn     *flConn
	retryAt  time.Time
	dialing  bool
	disabled bool
}

// get returns a live connection to the current node, or nil to use Connect.
func (f *fastLanes) get(ctx context.Context) *flConn {
	node := f.c.nodes.current()
	f.mu.Lock()
	if f.disabled {
		f.mu.Unlock()
		return nil
	}
	if f.conn != nil && f.node == node && !f.conn.broken() {
		c := f.conn
		f.mu.Unlock()
		return c
	}
	if f.dialing || time.Now().Before(f.retryAt) {
		f.mu.Unlock()
		return nil
	}
	f.dialing = true
	f.mu.Unlock()

	conn, err := f.connect(ctx, node)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.dialing = false
	if err != nil {
		f.retryAt = time.Now().Add(time.Second)
		return nil
	}
	if f.conn != nil {
		f.conn.fail(errors.New("replaced"))
	}
	f.node, f.conn = node, conn
	return conn
}

// connect learns the node's fast-lane address from its Status and dials it.
func (f *fastLanes) connect(ctx context.Context, node string) (*flConn, error) {
	sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	st, err := f.c.cluster.Status(sctx, &leaseholdv1.StatusRequest{})
	if err != nil {
		return nil, err
	}
	addr := st.GetFastLaneAddr()
	if addr == "" {
		return nil, errors.New("no fast lane")
	}
	// A node bound to 0.0.0.0 reports that; reach it on the host we reach its API on.
	if host, port, err := net.SplitHostPort(addr); err == nil {
		if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
			if apiHost, _, err := net.SplitHostPort(node); err == nil {
				addr = net.JoinHostPort(apiHost, port)
			}
		}
	}
	return dialFastLane(sctx, addr)
}

func (f *fastLanes) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.disabled = true
	if f.conn != nil {
		f.conn.fail(errors.New("client closed"))
	}
}

// fastCall runs one RPC over the fast lane when there is one, else through Connect.
func fastCall[Req, Res proto.Message](ctx context.Context, f *fastLanes, m fastlane.Method, req Req, resp Res, viaConnect func(context.Context, Req) (Res, error)) (Res, error) {
	conn := f.get(ctx)
	if conn == nil {
		return viaConnect(ctx, req)
	}
	if err := conn.call(ctx, m, req, resp); err != nil {
		if errors.Is(err, errFastLaneBroken) {
			f.c.nodes.next()
		}
		var zero Res
		return zero, err
	}
	return resp, nil
}

// The service clients the Client uses: hot calls over the fast lane, the rest Connect.

type fastLeaseClient struct {
	leaseholdv1connect.LeaseServiceClient
	f *fastLanes
}

func (c fastLeaseClient) Grant(ctx context.Context, req *leaseholdv1.GrantRequest) (*leaseholdv1.GrantResponse, error) {
	return fastCall(ctx, c.f, fastlane.MethodGrant, req, new(leaseholdv1.GrantResponse), c.LeaseServiceClient.Grant)
}

func (c fastLeaseClient) KeepAlive(ctx context.Context, req *leaseholdv1.KeepAliveRequest) (*leaseholdv1.KeepAliveResponse, error) {
	return fastCall(ctx, c.f, fastlane.MethodKeepAlive, req, new(leaseholdv1.KeepAliveResponse), c.LeaseServiceClient.KeepAlive)
}

func (c fastLeaseClient) Revoke(ctx context.Context, req *leaseholdv1.RevokeRequest) (*leaseholdv1.RevokeResponse, error) {
	return fastCall(ctx, c.f, fastlane.MethodRevoke, req, new(leaseholdv1.RevokeResponse), c.LeaseServiceClient.Revoke)
}

type fastLockClient struct {
	leaseholdv1connect.LockServiceClient
	f *fastLanes
}

func (c fastLockClient) Acquire(ctx context.Context, req *leaseholdv1.AcquireRequest) (*leaseholdv1.AcquireResponse, error) {
	return fastCall(ctx, c.f, fastlane.MethodAcquire, req, new(leaseholdv1.AcquireResponse), c.LockServiceClient.Acquire)
}

func (c fastLockClient) Release(ctx context.Context, req *leaseholdv1.ReleaseRequest) (*leaseholdv1.ReleaseResponse, error) {
	return fastCall(ctx, c.f, fastlane.MethodRelease, req, new(leaseholdv1.ReleaseResponse), c.LockServiceClient.Release)
}

func (c fastLockClient) CheckToken(ctx context.Context, req *leaseholdv1.CheckTokenRequest) (*leaseholdv1.CheckTokenResponse, error) {
	return fastCall(ctx, c.f, fastlane.MethodCheckToken, req, new(leaseholdv1.CheckTokenResponse), c.LockServiceClient.CheckToken)
}

type fastKVClient struct {
	leaseholdv1connect.KVServiceClient
	f *fastLanes
}

func (c fastKVClient) Get(ctx context.Context, req *leaseholdv1.GetRequest) (*leaseholdv1.GetResponse, error) {
	return fastCall(ctx, c.f, fastlane.MethodGet, req, new(leaseholdv1.GetResponse), c.KVServiceClient.Get)
}

func (c fastKVClient) Put(ctx context.Context, req *leaseholdv1.PutRequest) (*leaseholdv1.PutResponse, error) {
	return fastCall(ctx, c.f, fastlane.MethodPut, req, new(leaseholdv1.PutResponse), c.KVServiceClient.Put)
}

func (c fastKVClient) Delete(ctx context.Context, req *leaseholdv1.DeleteRequest) (*leaseholdv1.DeleteResponse, error) {
	return fastCall(ctx, c.f, fastlane.MethodDelete, req, new(leaseholdv1.DeleteResponse), c.KVServiceClient.Delete)
}
