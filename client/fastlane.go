package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/api/leasehold/v1/leaseholdv1connect"
	"github.com/leasehold/leasehold/fastlane"
	"github.com/leasehold/leasehold/internal/peerclosed"
)

// WithoutFastLane makes the client use Connect (HTTP/2) for every call instead of the
// fast lane. The fast lane is used by default when the server offers one.
func WithoutFastLane() Option { return func(o *options) { o.noFastLane = true } }

// errFastLaneBroken means the fast-lane connection failed; the request's outcome is
// unknown if it had been sent.
var errFastLaneBroken = errors.New("client: fast-lane connection broken")

// errFastLaneFull means the connection has as many requests in flight as the server
// accepts: the request was not sent; fastCall sends it through Connect.
var errFastLaneFull = errors.New("client: fast-lane connection has the most requests in flight the server accepts")

// errFastLaneLeft is why the client closes its connection to a node it has moved away
// from, once nothing is pending on it or after retireBound: calls still waiting then
// fail with it (their outcome unknown), and their retries do not hold it against that
// node.
var errFastLaneLeft = errors.New("client: moved to another node")

// errFastLaneSilent is why the client closes a connection on which calls wait while the
// path to its node is cut: the node's TCP acknowledges nothing (see fastLanes.watch).
var errFastLaneSilent = errors.New("client: the node stopped answering")

// errFastLaneClosed means the server had closed the connection before the request was
// sent: the request was not sent, and is safe to send again on a new connection.
var errFastLaneClosed = errors.New("client: fast-lane connection closed by the server")

// errFastLaneGoingAway is why the client closes a connection on which its node sent a
// GOAWAY (it is shutting down, docs/PROTOCOL.md): no request is sent on it any more.
var errFastLaneGoingAway = errors.New("client: the node is shutting down (GOAWAY)")

// flConn is one fast-lane connection: many calls in flight, answers routed to them by
// request id, and a batching writer.
//
// Who reads: a call that finds nobody reading the connection reads it itself, and
// returns as soon as its own answer arrives. With one call at a time, the usual case
// for a single worker, the answer therefore wakes the caller directly, without a hand-off
// through a reader goroutine. Calls that find a reader already at work wait for it to
// hand them their answers; a reading call that got its answer while others still wait
// leaves the reading to a goroutine (readLoop), which reads until nothing is pending.
// Whenever a call is pending, someone is reading.
//
// In flight: the server answers a request beyond fastlane.MaxInFlight on one
// connection with ResourceExhausted, so a call first takes one of that many slots. When
// they are all taken (thousands of Sessions of one Client, each waiting for a lock, can
// get there), the call is not sent and goes through Connect instead (errFastLaneFull):
// waiting for a slot could wait for ever, behind acquires that wait for the very
// release or keepalive that would be queued. A slot is freed when the server has
// answered the request — not when its caller gives up: a call abandoned by its context
// stays pending, with no one to hand the answer to, until the answer to its cancel
// arrives.
type flConn struct {
	conn   net.Conn
	w      *fastlane.Writer
	r      *fastlane.Reader // used by the one reader of the moment
	dead   chan struct{}
	slots  chan struct{} // one per request the server has not answered yet
	nextID atomic.Uint64
	// lastRead is when the last frame arrived (monotonic, since clockBase).
	lastRead atomic.Int64

	mu sync.Mutex
	// pending holds the calls the server has not answered yet; nil for a call whose
	// caller gave up (its answer still to come).
	pending     map[uint64]chan flResult
	reading     bool   // someone reads; true whenever pending is not empty
	turn        uint64 // counts the reading calls, so that a late interrupt hits no one else
	interrupted bool   // a read deadline is set to wake the reading call
	retired     bool   // the client moved to another node: closed once nothing is pending (retire)
	err         error
	// goneAway: the node sent GOAWAY; get hands the connection out no more. onGoAway,
	// set before the connection is handed out, tells the client's node list.
	goneAway atomic.Bool
	onGoAway func()
	// busySince is when calls last began to wait on an idle connection (like
	// lastRead); see fastLanes.watch.
	busySince int64
	// probed is when a probe last found the node reachable (like lastRead).
	probed atomic.Int64
}

// idleCheckAfter is how long a connection must have been idle before a call checks that
// the server has not closed it. The check costs a system call; back-to-back calls (the
// release right after an acquire's answer) skip it.
const idleCheckAfter = time.Millisecond

// clockBase is the origin of flConn.lastRead's monotonic timestamps.
var clockBase = time.Now()

type flResult struct {
	kind    fastlane.Kind
	payload []byte
}

func dialFastLane(ctx context.Context, addr string, id *clusterID, o *options) (*flConn, error) {
	conn, err := o.dialFastConn(ctx, addr)
	if err != nil {
		return nil, err
	}
	if err := id.fastLaneHello(conn, addr, fastlane.Extensions{Token: o.token, GoAway: true}); err != nil {
		_ = conn.Close()
		return nil, err
	}
	return &flConn{
		conn: conn, w: fastlane.NewWriter(conn), r: fastlane.NewReader(conn),
		dead: make(chan struct{}), slots: make(chan struct{}, fastlane.MaxInFlight),
		pending: make(map[uint64]chan flResult),
	}, nil
}

// readLoop reads for the calls in flight until none is left.
func (c *flConn) readLoop() {
	for {
		f, err := c.read()
		if err != nil {
			c.fail(err)
			return
		}
		if c.handOut(f, true) {
			return
		}
	}
}

// readOwn reads the connection for the call id until its answer arrives (handing other
// calls theirs on the way) or ctx ends, then gives up reading. The caller must hold the
// reading role.
func (c *flConn) readOwn(ctx context.Context, id uint64) (flResult, error) {
	c.mu.Lock()
	turn := c.turn
	c.mu.Unlock()
	stop := func() bool { return true }
	if ctx.Done() != nil {
		stop = context.AfterFunc(ctx, func() { c.interrupt(turn) })
	}
	defer stop()
	for {
		f, err := c.read()
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				if ctx.Err() != nil {
					c.endTurn(id, false)
					return flResult{}, ctxError(ctx)
				}
				_ = c.conn.SetReadDeadline(time.Time{}) // cannot happen; read on
				continue
			}
			c.fail(err)
			return flResult{}, c.brokenError()
		}
		if f.ID == id {
			// Copy the payload before the turn ends: the next reader reuses the
			// reader's buffer that f.Payload points into.
			res := flResult{kind: f.Kind, payload: bytes.Clone(f.Payload)}
			c.endTurn(id, true)
			return res, nil
		}
		c.handOut(f, false)
	}
}

// read reads the next frame and notes when it arrived. A GOAWAY is taken on the way
// (goAway, then retire: the connection closes once nothing is pending) and not
// returned: it answers no call.
func (c *flConn) read() (fastlane.Frame, error) {
	for {
		f, err := c.r.Read()
		if err != nil {
			return f, err
		}
		c.lastRead.Store(int64(time.Since(clockBase)))
		if f.Kind != fastlane.KindGoAway {
			return f, nil
		}
		if c.goAway() {
			c.retire()
		}
	}
}

// handOut gives frame f to the call waiting for it, if any (the call may have given up).
// With last, a reader that has just handed out the final pending answer stops reading,
// in the same step, and handOut reports true.
func (c *flConn) handOut(f fastlane.Frame, last bool) bool {
	// Copy the payload while this goroutine still reads: once stop is decided another
	// call may take the reading, and the reader's buffer under f.Payload with it.
	res := flResult{kind: f.Kind, payload: bytes.Clone(f.Payload)}
	c.mu.Lock()
	ch, ok := c.pending[f.ID]
	delete(c.pending, f.ID)
	stop := last && len(c.pending) == 0
	if stop {
		c.reading = false
	}
	done := c.retired && len(c.pending) == 0
	c.mu.Unlock()
	if done {
		defer c.fail(errFastLaneLeft)
	}
	if ok {
		<-c.slots // answered: the server no longer counts it
	}
	if ch != nil {
		ch <- res
	}
	return stop
}

// interrupt wakes the call reading in the given turn, if it is still reading.
func (c *flConn) interrupt(turn uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.reading && c.turn == turn && c.err == nil {
		c.interrupted = true
		_ = c.conn.SetReadDeadline(time.Unix(1, 0))
	}
}

// endTurn ends the reading call id's turn, answered or abandoned (its answer still to
// come, so it stays pending without a channel), and the reading passes to a readLoop
// if calls are pending.
func (c *flConn) endTurn(id uint64, answered bool) {
	if answered {
		<-c.slots
	}
	c.mu.Lock()
	if answered {
		delete(c.pending, id)
	} else {
		c.abandonLocked(id)
	}
	c.turn++
	if c.interrupted {
		c.interrupted = false
		_ = c.conn.SetReadDeadline(time.Time{})
	}
	if len(c.pending) > 0 && c.err == nil {
		go c.readLoop()
	} else {
		c.reading = false
	}
	done := c.retired && len(c.pending) == 0
	c.mu.Unlock()
	if done {
		c.fail(errFastLaneLeft)
	}
}

// retireBound is how long a retired connection may keep calls in flight before it is
// closed anyway (they fail with errFastLaneLeft, and their retries go to the new node).
const retireBound = 10 * time.Second

// retire stops using c, whose node the client has moved away from: get no longer hands
// it out, and it is closed once the calls in flight on it have their answers (or after
// retireBound), so that a node that is still serving — one that drains before it stops,
// one that sent the client to the leader — answers them instead of leaving their
// outcome unknown. A node cut off the network fails c sooner, through watch.
func (c *flConn) retire() {
	c.mu.Lock()
	c.retired = true
	idle := len(c.pending) == 0
	c.mu.Unlock()
	if idle {
		c.fail(errFastLaneLeft)
		return
	}
	time.AfterFunc(retireBound, func() { c.fail(errFastLaneLeft) })
}

// goAway takes the node's GOAWAY: it is shutting down. The connection is handed out no
// more and the node is distrusted; goAway reports whether this was news. The reader
// then retires the connection (read): it is closed once the calls in flight on it have
// their answers, which the node still sends.
func (c *flConn) goAway() bool {
	if c.goneAway.Swap(true) {
		return false
	}
	if c.onGoAway != nil {
		c.onGoAway()
	}
	return true
}

// abandonLocked leaves call id pending without a caller, if its answer has not been
// handed out yet: its slot is freed when the answer arrives.
func (c *flConn) abandonLocked(id uint64) {
	if _, ok := c.pending[id]; ok {
		c.pending[id] = nil
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

// quiet reports whether calls wait on the connection, and for how long it has heard
// nothing: no frame, no probe answer, and — on a connection that was idle — not since
// the calls began to wait.
func (c *flConn) quiet() (bool, time.Duration) {
	c.mu.Lock()
	waiting := len(c.pending) > 0
	heard := max(c.busySince, c.probed.Load(), c.lastRead.Load())
	c.mu.Unlock()
	return waiting, time.Since(clockBase) - time.Duration(heard)
}

// alive records that a probe found the connection's node reachable.
func (c *flConn) alive() { c.probed.Store(int64(time.Since(clockBase))) }

// heardAfter reports whether a frame arrived, or a probe found the node reachable,
// after t.
func (c *flConn) heardAfter(t time.Time) bool {
	at := int64(t.Sub(clockBase))
	return c.lastRead.Load() > at || c.probed.Load() > at
}

// brokenError is the error of a call on the connection after it failed, wrapping why.
func (c *flConn) brokenError() error {
	<-c.dead
	return connect.NewError(connect.CodeUnavailable, fmt.Errorf("%w: %w", errFastLaneBroken, c.err))
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
// code and details the server gave, or Unavailable when the connection broke (wrapping
// errFastLaneClosed when the request was not sent).
func (c *flConn) call(ctx context.Context, m fastlane.Method, req, resp proto.Message) error {
	id := c.nextID.Add(1)
	buf := fastlane.GetBuffer()
	frame, err := fastlane.AppendFrame(*buf, fastlane.KindRequest, m, id, func(b []byte) ([]byte, error) {
		return proto.MarshalOptions{}.MarshalAppend(b, req)
	})
	defer fastlane.PutBuffer(buf, frame) // Send has copied it by then
	if err != nil {
		return connect.NewError(connect.CodeInvalidArgument, err)
	}
	select {
	case c.slots <- struct{}{}:
	default:
		return errFastLaneFull
	}
	ch := make(chan flResult, 1)
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		<-c.slots
		return connect.NewError(connect.CodeUnavailable, fmt.Errorf("%w: %w", errFastLaneBroken, c.err))
	}
	reader := !c.reading
	if reader {
		now := time.Since(clockBase)
		c.busySince = int64(now)
		if now-time.Duration(c.lastRead.Load()) > idleCheckAfter {
			// Nobody has read the connection for a while: make sure the server has not
			// closed it meanwhile (restarted, say), nor sent a GOAWAY (the only frame a
			// server sends unasked: with nothing pending, anything waiting is that),
			// while the request is still unsent.
			waiting, err := peerclosed.Peek(rawConn(c.conn))
			if err == nil && waiting {
				err = errFastLaneGoingAway
			}
			if err != nil {
				c.mu.Unlock()
				<-c.slots
				if waiting {
					c.goAway()
				}
				c.fail(err)
				return connect.NewError(connect.CodeUnavailable, fmt.Errorf("%w: %w", errFastLaneClosed, err))
			}
		}
	}
	c.pending[id] = ch
	c.reading = true
	others := len(c.pending) > 1
	c.mu.Unlock()
	if !c.w.Send(frame, others) {
		c.fail(errFastLaneBroken)
		return connect.NewError(connect.CodeUnavailable, errFastLaneBroken)
	}
	var r flResult
	if reader {
		if r, err = c.readOwn(ctx, id); err != nil {
			if connect.CodeOf(err) != connect.CodeUnavailable {
				c.cancel(m, id)
			}
			return err
		}
	} else {
		select {
		case r = <-ch:
		case <-ctx.Done():
			c.mu.Lock()
			c.abandonLocked(id)
			c.mu.Unlock()
			c.cancel(m, id)
			return ctxError(ctx)
		case <-c.dead:
			return c.brokenError()
		}
	}
	if r.kind == fastlane.KindError {
		return decodeFastError(r.payload)
	}
	if err := proto.Unmarshal(r.payload, resp); err != nil {
		return connect.NewError(connect.CodeInternal, fmt.Errorf("client: fast-lane response does not decode: %w", err))
	}
	return nil
}

// ctxError is the error of a call whose context ended: Canceled or DeadlineExceeded,
// as Connect reports it.
func ctxError(ctx context.Context) error {
	code := connect.CodeCanceled
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		code = connect.CodeDeadlineExceeded
	}
	return connect.NewError(code, ctx.Err())
}

// cancel tells the server that the caller of request id gave up.
func (c *flConn) cancel(m fastlane.Method, id uint64) {
	if frame, err := fastlane.AppendFrame(nil, fastlane.KindCancel, m, id, nil); err == nil {
		c.w.Send(frame, false)
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

// fastLanes keeps one fast-lane connection to the node the client currently talks to,
// and follows it: when the client moves to another node (see failover), the next call
// connects to that node's fast lane, and the connection to the old node is retired: it
// is closed once the calls still waiting on it have their answers (see retire). When
// a node has no fast lane, or it cannot be reached, calls go through Connect and the
// fast lane is tried again after redialPause.
type fastLanes struct {
	c *Client
	// ready is the connection get returns to calls for its node, read without mu
	// (see serves).
	ready    atomic.Pointer[readyLane]
	mu       sync.Mutex
	node     string // API address the connection belongs to
	conn     *flConn
	retryAt  time.Time
	dialing  bool
	disabled bool
}

type readyLane struct {
	node string
	conn *flConn
}

// serves reports whether a call to node now goes over a live fast-lane connection,
// whose silence watch (see watch) then stands in for the call's attempt deadline.
func (f *fastLanes) serves(node string) bool {
	r := f.ready.Load()
	return r != nil && r.node == node && !r.conn.broken()
}

// redialPause is how long calls go through Connect after the fast lane of a node could
// not be reached (or the node has none) before it is dialled again.
const redialPause = time.Second

// get returns a live connection to the current node, or nil to use Connect.
func (f *fastLanes) get(ctx context.Context) *flConn {
	node := f.c.nodes.current()
	f.mu.Lock()
	if f.disabled {
		f.mu.Unlock()
		return nil
	}
	if f.conn != nil && f.node == node && !f.conn.broken() && !f.conn.goneAway.Load() {
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
		f.retryAt = time.Now().Add(redialPause)
		return nil
	}
	if f.conn != nil {
		f.conn.retire()
	}
	conn.onGoAway = func() { f.c.nodes.distrust(node) }
	f.node, f.conn = node, conn
	f.ready.Store(&readyLane{node: node, conn: conn})
	if quiet := f.c.opts.attempt / 2; quiet > 0 {
		go f.watch(conn, node, quiet)
	}
	return conn
}

// probeMethod is the method of watch's probe: a cancel for request 0, which names no
// request (docs/PROTOCOL.md: the server ignores a cancel of an id not in flight).
var probeMethod = fastlane.MustMethodOf(leaseholdv1connect.LockServiceCheckTokenProcedure)

// watch notices a node cut off the network under calls that have no deadline of their
// own to notice it (a TCP connection on a cut path looks alive for minutes): an Acquire
// waiting in a queue, a Put. While calls wait on conn and nothing has come from the node
// for quiet (half the attempt timeout), it sends a cancel for request 0, which the
// server ignores (docs/PROTOCOL.md), and looks whether the node's TCP acknowledges it:
// one that acknowledges is reachable, however slow its application (the calls wait in a
// queue, for a slow commit, or on a machine too loaded to answer soon), and is waited
// for; data left unacknowledged for quiet means the path is cut, and the node is
// distrusted and conn fails, so that its calls go, by their retries, to another node.
// Where the kernel does not tell (tcpAcked), the node must answer a Status call within
// quiet instead. It stops when conn fails.
func (f *fastLanes) watch(conn *flConn, node string, quiet time.Duration) {
	t := time.NewTicker(quiet / 4)
	defer t.Stop()
	var probed time.Time // when the probe now unanswered was sent; zero: none
	for {
		select {
		case <-conn.dead:
			return
		case <-t.C:
		}
		if waiting, silent := conn.quiet(); !waiting || silent < quiet {
			probed = time.Time{}
			continue
		}
		if probed.IsZero() {
			conn.cancel(probeMethod, 0)
			probed = time.Now()
			continue
		}
		since := time.Since(probed)
		if since < quiet {
			continue
		}
		if !f.reachable(conn, node, since, quiet) {
			f.c.nodes.distrust(node)
			conn.fail(errFastLaneSilent)
			return
		}
		conn.alive()
		probed = time.Time{}
	}
}

// reachable reports whether conn's node has acknowledged, at the TCP level, anything
// since the probe sent since ago — or, where the kernel does not tell, answers a Status
// call within quiet.
func (f *fastLanes) reachable(conn *flConn, node string, since, quiet time.Duration) bool {
	if unacked, sinceAck, ok := f.c.opts.tcpAcked(conn.conn); ok {
		return !unacked || sinceAck < since
	}
	ctx, cancel := context.WithTimeout(withNode(context.Background(), node), quiet)
	defer cancel()
	_, err := f.c.cluster.Status(ctx, &leaseholdv1.StatusRequest{})
	return err == nil
}

// connect learns the node's fast-lane address from its Status and dials it, within the
// call's deadline.
func (f *fastLanes) connect(ctx context.Context, node string) (*flConn, error) {
	sctx, cancel := context.WithTimeout(withNode(ctx, node), 2*time.Second)
	defer cancel()
	st, err := rpc(sctx, f.c, f.c.cluster.Status, &leaseholdv1.StatusRequest{})
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
	return dialFastLane(sctx, addr, f.c.id, &f.c.opts)
}

// heardSince reports whether the fast-lane connection to node heard from it after t.
func (f *fastLanes) heardSince(node string, t time.Time) bool {
	r := f.ready.Load()
	return r != nil && r.node == node && r.conn.heardAfter(t)
}

func (f *fastLanes) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.disabled = true
	f.ready.Store(nil)
	if f.conn != nil {
		f.conn.fail(errors.New("client closed"))
	}
}

// rpc runs one RPC: over the fast lane when the .proto file gives the RPC a fast-lane
// number (its `fast_lane` option; see package fastlane) and a connection is up, else
// through viaConnect, the generated Connect client's method. Call sites name the RPC
// once, by its Connect method: rpc(ctx, c, c.locks.Acquire, req). It makes one
// attempt: moving to another node after a failure is the caller's retry's (call, or
// the keepalive loop), as for Connect.
func rpc[Req, Res any, PReq interface {
	*Req
	proto.Message
}, PRes interface {
	*Res
	proto.Message
}](ctx context.Context, c *Client, viaConnect func(context.Context, PReq) (PRes, error), req PReq) (PRes, error) {
	m, ok := fastlane.MethodFor(req)
	if !ok {
		return viaConnect(ctx, req)
	}
	f := c.fast
	for attempt := 0; ; attempt++ {
		conn := f.get(ctx)
		if conn == nil {
			return viaConnect(ctx, req)
		}
		resp := PRes(new(Res))
		err := conn.call(ctx, m, req, resp)
		switch {
		case err == nil:
			return resp, nil
		case errors.Is(err, errFastLaneFull):
			return viaConnect(ctx, req)
		case errors.Is(err, errFastLaneClosed) && attempt == 0:
			continue // not sent: send it once more, on a new connection or through Connect
		}
		return nil, err
	}
}
