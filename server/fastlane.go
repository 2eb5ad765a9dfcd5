package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/fastlane"
	"github.com/leasehold/leasehold/leader"
)

// ServeFastLane serves the fast lane (docs/PROTOCOL.md) on ln until ln is closed. Every
// request goes through the method table as Connect's do — the same handlers,
// validation, forwarding to the leader, error mapping and metrics — so the two
// transports cannot disagree.
func (s *Server) ServeFastLane(ln net.Listener, log *slog.Logger) error {
	pool := new(workers)
	defer pool.close()
	var wg sync.WaitGroup
	defer wg.Wait()
	var backoff time.Duration
	for {
		conn, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			if !acceptRetryable(err) {
				return err
			}
			// Out of descriptors or memory for a moment: go on accepting once some are
			// back, as net/http's Serve does, rather than leave a fast lane advertised
			// that nothing serves until the node restarts.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			log.Warn("fast lane: accept failed; retrying", "err", err, "in", backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		conn = newLaneConn(conn, s.cfg) // idle and write timeouts (G6)
		wg.Add(1)
		pool.Go(func() {
			defer wg.Done()
			if err := s.serveFastConn(conn, pool); err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				log.Debug("fast-lane connection ended", "remote", conn.RemoteAddr().String(), "err", err)
			}
		})
	}
}

// acceptRetryable reports whether an Accept error passes with time: the process or the
// machine out of descriptors or buffers, or a connection aborted before it was taken.
func acceptRetryable(err error) bool {
	for _, e := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM, syscall.ECONNABORTED} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// serveFastConn serves one connection until it fails or closes. Closing the connection
// cancels every request still in flight (a waiting Acquire leaves its queue).
func (s *Server) serveFastConn(conn net.Conn, pool *workers) error {
	defer conn.Close()
	s.metrics.fastLaneConns.Inc()
	defer s.metrics.fastLaneConns.Dec()
	// No SetNoDelay: Go's TCP connections have Nagle's algorithm off from the start.
	ext, err := fastlane.ServerHello(conn, s.ClusterID())
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &fastConn{
		s: s, pool: pool, conn: conn, r: fastlane.NewReader(conn), w: fastlane.NewWriter(conn),
		ctx: ctx, cancel: cancel, done: make(chan struct{}), base: context.Background(),
		inflight: make(map[uint64]context.CancelFunc), goAway: ext.GoAway,
	}
	if !s.lanes.add(c) {
		return nil // the server drains (DrainFastLane): the client will try elsewhere
	}
	defer s.lanes.remove(c)
	if lc, ok := conn.(*laneConn); ok {
		lc.watch(c.busy)
	}
	c.authenticate(conn, ext.Token)
	c.lane, _ = conn.(*laneConn)
	c.read()
	<-c.done
	c.wg.Wait()
	c.revokeBound()
	return c.err
}

// fastConn is one fast-lane connection on the server side. One goroutine at a time
// reads it. The reader takes the shortcuts the method table allows a request: it answers
// what it can answer at once itself (method.atOnce, method.now), and proposes
// correctness acquires and releases itself, leaving their answers to the commit
// (method.then); for any other request that may wait, it starts a
// new reader and serves that request itself, so the request goes on without waiting for
// a new goroutine to be scheduled (the new reader's start is off the request's path).
// One batching writer serves all.
type fastConn struct {
	s      *Server
	pool   *workers
	conn   net.Conn
	r      *fastlane.Reader
	w      *fastlane.Writer
	ctx    context.Context // ends with the connection
	cancel context.CancelFunc
	wg     sync.WaitGroup // readers and requests started by readers
	once   sync.Once
	done   chan struct{} // closed when the connection has failed
	err    error         // why; set before done is closed
	// lastFrame is when a frame last arrived since the server began to drain (Unix
	// nanoseconds; 0: none), see DrainFastLane.
	lastFrame atomic.Int64

	// Who the connection's requests come from (auth.go); only the reader of the moment
	// uses these. base is what each request's context derives from: it carries the principal.
	principal *principal
	token     string
	tlsState  *tls.ConnectionState
	base      context.Context

	lane *laneConn // nil when the listener's connections are not laneConns (tests)
	// unhold, while set, lets go of the proposals the reader of the moment held back
	// while more requests waited in its read buffer (holdProposals).
	unhold func()
	// goAway: the client understands GOAWAY; DrainFastLane sends it one.
	goAway bool

	mu       sync.Mutex
	bound    map[string]time.Duration // release-on-disconnect leases (disconnect.go), with their TTLs
	inflight map[uint64]context.CancelFunc
	settles  map[uint64]func(proto.Message, error) // quota.go; nil without auth
	// answering counts answers taken out of inflight and not yet handed to the Writer:
	// the connection is busy until they are (a drain must not close it in between).
	answering atomic.Int32
}

// busy reports whether requests are in flight on the connection.
func (c *fastConn) busy() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.inflight) > 0 || c.answering.Load() > 0
}

// end records why the connection ended and cancels every request in flight. Only the
// reader calls it, and no reader registers a request after it.
func (c *fastConn) end(err error) {
	c.once.Do(func() {
		c.err = err
		c.cancel()
		c.mu.Lock()
		for _, cancel := range c.inflight {
			cancel()
		}
		c.mu.Unlock()
		close(c.done)
	})
}

// read reads and dispatches frames until the connection fails, or until it hands the
// reading to a new goroutine to serve a request that may wait.
//
// The answers the reader gives itself (method.atOnce, method.now, a request refused by
// admit) are queued, not written one by one, while more whole frames wait in the read
// buffer (Reader.Buffered); the answer to the last one is written with them, and
// whatever is still queued is written before the next read could block or the reader
// hands over — so N requests that arrive in one read are answered in one write, and a
// lone request is written at once. An answer so waits at most for
// the reader to serve the other frames of the same read (32 KiB at most), and no more
// than fastlane.QueueLimit bytes of answers wait. Likewise, what the requests of one
// read propose goes to the log as one entry (holdProposals).
func (c *fastConn) read() {
	for {
		if !c.r.Buffered() {
			c.releaseProposals()
			c.flush()
		}
		f, err := c.r.Read()
		if err != nil {
			c.releaseProposals()
			c.end(err)
			return
		}
		c.heard()
		switch f.Kind {
		case fastlane.KindCancel:
			c.mu.Lock()
			if cancel := c.inflight[f.ID]; cancel != nil {
				cancel()
			}
			c.mu.Unlock()
			continue
		case fastlane.KindRequest:
		default:
			c.releaseProposals()
			c.end(fastlane.ErrProtocol)
			return
		}
		m, req, ok := c.admit(f)
		if !ok {
			continue
		}
		if m.atOnce != nil && m.atOnce(c.s, req) {
			// Nothing can cancel it: no other frame is read until it is answered. Served
			// in full here, it must not wait for a proposal this reader holds.
			c.releaseProposals()
			c.serve(c.ctx, m, f.ID, req, c.readerSend())
			continue
		}
		if m.now != nil {
			if resp, ok := m.now(c.s, req); ok {
				c.answer(m, f.ID, time.Now(), resp, nil, c.readerSend())
				continue
			}
		}
		c.holdProposals()
		if m.thenUncancelled != nil && c.proposeUncancelled(m, f.ID, req) {
			continue
		}
		// Not derived from c.ctx: end cancels it through inflight, and the requests of
		// a busy connection do not all register with (and lock) one parent context.
		ctx, cancel := context.WithCancel(c.base)
		c.register(f.ID, cancel)
		c.wg.Add(1) // the request answered later, or the new reader
		if m.then != nil && m.then(c.s, ctx, req, c.later(m, f.ID)) {
			continue
		}
		c.releaseProposals()
		c.flush() // the queued answers do not wait for the new reader to be scheduled
		c.pool.Go(func() {
			defer c.wg.Done()
			c.read()
		})
		c.serve(ctx, m, f.ID, req, sendNow)
		return
	}
}

// holdProposals, while more whole frames wait in the read buffer, makes what the
// requests read from it propose wait until the reader has served them all
// (releaseProposals, before it could block or hands the reading over), then go to the
// log as one entry: N correctness acquires that arrive in one read are one log write,
// where the first alone and the rest after its write were two. The hold lasts as long
// as the reader takes to serve what it has already read (at most 32 KiB of requests).
func (c *fastConn) holdProposals() {
	if c.unhold == nil && c.s.raft != nil && c.r.Buffered() {
		c.unhold = c.s.raft.HoldProposals()
	}
}

// releaseProposals lets go of what holdProposals held.
func (c *fastConn) releaseProposals() {
	if c.unhold != nil {
		c.unhold()
		c.unhold = nil
	}
}

// proposeUncancelled starts request id through m.thenUncancelled, and
// reports true; or reports false, having left nothing behind, when the request must take
// the full path. The request is in inflight (a duplicate id is refused, and the
// connection counts as busy) but with no context of its own: at a million leases renewed
// every ten seconds, a context per keepalive was 3.6% of the server's CPU.
func (c *fastConn) proposeUncancelled(m *method, id uint64, req proto.Message) bool {
	c.register(id, noCancel)
	c.wg.Add(1)
	if m.thenUncancelled(c.s, req, c.later(m, id)) {
		return true
	}
	c.wg.Done()
	c.mu.Lock()
	delete(c.inflight, id)
	c.mu.Unlock()
	return false
}

// noCancel stands in inflight for a request that has no context to cancel.
func noCancel() {}

// register records request id as in flight with the cancel function of its context.
func (c *fastConn) register(id uint64, cancel context.CancelFunc) {
	c.mu.Lock()
	c.inflight[id] = cancel
	c.mu.Unlock()
}

// readerSend is how the reader sends an answer it gives itself: queued while more whole
// frames wait in its read buffer, and with the last one written, together with what was
// queued, as any sender writes (Writer.Send, yielding first when other requests are in
// flight).
//
// A write may block (a client that does not read its answers blocks it for up to
// WriteTimeout), and while the reader holds the batcher no proposal of any connection
// reaches the log: so the reader lets go of its hold before an answer it writes at
// once, and before one it queues once half of QueueLimit waits (Queue writes at the
// limit; the answers a reader gives itself are far smaller than the other half).
func (c *fastConn) readerSend() sendMode {
	if c.r.Buffered() {
		if c.unhold != nil && c.w.Queued() >= fastlane.QueueLimit/2 {
			c.releaseProposals()
		}
		return sendQueued
	}
	c.releaseProposals()
	return sendNow
}

// flush writes the answers the reader queued. With other requests in flight (waiting
// acquires, say), it lets their goroutines run once first, as Writer.Send does, so that
// an answer one of them is about to send — the grant a queued release just made —
// joins the write.
func (c *fastConn) flush() { c.w.Flush(c.busy()) }

// admit finds request f's method and decodes its request. A duplicate id, too many
// requests in flight, an unknown method or a payload that does not decode is answered
// with an error frame at once, and admit returns false.
func (c *fastConn) admit(f fastlane.Frame) (*method, proto.Message, bool) {
	c.mu.Lock()
	_, dup := c.inflight[f.ID]
	full := len(c.inflight) >= fastlane.MaxInFlight
	c.mu.Unlock()
	m := c.s.methods.byFast[f.Method]
	var err error
	switch {
	case c.s.lanes.draining.Load() && m != nil:
		err = ErrShuttingDown
	case dup:
		err = connect.NewError(connect.CodeInvalidArgument, errors.New("fastlane: request id already in flight"))
	case full:
		err = connect.NewError(connect.CodeResourceExhausted, errors.New("fastlane: too many requests in flight on this connection"))
	case m == nil:
		err = connect.NewError(connect.CodeUnimplemented, fmt.Errorf("fastlane: unknown method %d", f.Method))
	}
	var req proto.Message
	if err == nil {
		req = m.newRequest()
		err = decodeProto(f.Payload, req) // InvalidArgument naming the field (G6)
		if err == nil {
			if settle, gerr := c.s.gate(c.current(), m, req); gerr != nil {
				err = gerr
			} else if settle != nil {
				c.mu.Lock()
				c.settles[f.ID] = settle
				c.mu.Unlock()
			}
		}
	}
	if err != nil {
		if m != nil {
			err = c.s.finish(m, time.Now(), err)
		}
		c.out(errorFrame(f.Method, f.ID, err), c.readerSend(), false)
		return nil, nil, false
	}
	return m, req, true
}

// serve answers one admitted request; one that may wait is in inflight with the
// cancel function of its ctx.
func (c *fastConn) serve(ctx context.Context, m *method, id uint64, req proto.Message, how sendMode) {
	resp, err := c.s.call(ctx, m, req, caller{fastLane: true})
	if err == nil {
		c.bindIfAsked(req, resp)
	}
	c.send(m.fast, id, resp, err, how)
}

// later returns what answers request id when the method's then shortcut takes it: the
// answer is queued on the connection without blocking (the caller answers other
// connections too), and the request counts in c.wg until then.
func (c *fastConn) later(m *method, id uint64) func(proto.Message, error) {
	start := time.Now()
	return func(resp proto.Message, err error) {
		err = c.s.finish(m, start, err)
		c.send(m.fast, id, resp, err, sendOffered)
		c.wg.Done()
	}
}

// answer sends the answer to request id, begun at start, that a shortcut produced.
func (c *fastConn) answer(m *method, id uint64, start time.Time, resp proto.Message, err error, how sendMode) {
	err = c.s.finish(m, start, err)
	c.send(m.fast, id, resp, err, how)
}

// sendMode is how send hands an answer to the connection's Writer.
type sendMode uint8

const (
	// sendNow writes it (Writer.Send), yielding first when other requests are in
	// flight: for a goroutine that served one request.
	sendNow sendMode = iota
	// sendQueued queues it for the reader's next flush (Writer.Queue): for the reader.
	sendQueued
	// sendOffered queues it without ever blocking (Writer.Offer): for the goroutine
	// that hands out commit results.
	sendOffered
)

// out hands frame to the Writer as how says; others is whether other requests are in
// flight on the connection.
func (c *fastConn) out(frame []byte, how sendMode, others bool) {
	switch how {
	case sendQueued:
		c.w.Queue(frame)
	case sendOffered:
		c.w.Offer(frame)
	default:
		c.w.Send(frame, others)
	}
}

// send frames the answer to request id — its response, or err, already finished (mapped
// to its code and counted) — and hands it to the Writer as how says.
func (c *fastConn) send(method fastlane.Method, id uint64, resp proto.Message, err error, how sendMode) {
	c.mu.Lock()
	cancel := c.inflight[id] // nil for a request served at once: never registered
	delete(c.inflight, id)
	others := len(c.inflight) > 0
	settle := c.settles[id]
	delete(c.settles, id)
	c.answering.Add(1)
	c.mu.Unlock()
	defer c.answering.Add(-1)
	if cancel != nil {
		cancel()
	}
	if settle != nil {
		settle(resp, err)
	}
	if err != nil {
		c.out(errorFrame(method, id, err), how, others)
		return
	}
	buf := fastlane.GetBuffer()
	frame, ferr := fastlane.AppendFrame(*buf, fastlane.KindResponse, method, id, func(b []byte) ([]byte, error) {
		return proto.MarshalOptions{}.MarshalAppend(b, resp)
	})
	if ferr != nil {
		c.out(errorFrame(method, id, ToConnect(ferr)), how, others)
	} else {
		c.out(frame, how, others)
	}
	fastlane.PutBuffer(buf, frame)
}

// The fast-lane reader's shortcuts of Acquire, Release and KeepAlive (see method). The
// reader must stay free to read cancels and other requests, so a request that may wait
// (a queue, a commit, a quorum round, a forward to another node) is served by the reader
// only when it can leave the wait to a callback (method.then: a commit, a quorum round).

// acquireAtOnce reports that an acquire is served from the leader's memory without
// waiting: an efficiency acquire that tries once. The reader then serves it itself,
// saving a goroutine start and a wake-up per call.
func (s *Server) acquireAtOnce(r *leaseholdv1.AcquireRequest) bool {
	return r.GetClass() == leaseholdv1.LockClass_LOCK_CLASS_EFFICIENCY && r.GetWaitMs() == 0 && s.leader.Active()
}

// releaseAtOnce reports that a release is of an efficiency lock this node holds in
// memory.
func (s *Server) releaseAtOnce(r *leaseholdv1.ReleaseRequest) bool {
	return s.leader.ServesInMemory(r.GetName())
}

// acquireNow answers an efficiency acquire that may wait when the leader can grant it at
// once from memory (leader.AcquireNow). It reports false, having changed nothing, when
// the request must go the full way, including when it is invalid.
func (s *Server) acquireNow(r *leaseholdv1.AcquireRequest) (*leaseholdv1.AcquireResponse, bool) {
	if r.GetClass() != leaseholdv1.LockClass_LOCK_CLASS_EFFICIENCY {
		return nil, false
	}
	a, err := s.acquireArgs(r)
	if err != nil {
		return nil, false
	}
	g, ok := s.leader.AcquireNow(a)
	if !ok {
		return nil, false
	}
	return acquireResponse(g), true
}

// acquireThen starts a correctness acquire on this node, the leader, without waiting
// for its commit, and reports true; done then gets the answer on the goroutine that
// hands out commit results (it must not block). The connection's reader so goes on
// reading the requests behind it at once, instead of handing the reading to another
// goroutine per request. Anything else — efficiency locks, invalid requests, a node
// that must forward — it leaves alone and reports false.
func (s *Server) acquireThen(ctx context.Context, r *leaseholdv1.AcquireRequest, done func(proto.Message, error)) bool {
	if !s.leader.Active() || r.GetClass() != leaseholdv1.LockClass_LOCK_CLASS_CORRECTNESS {
		return false
	}
	a, err := s.acquireArgs(r)
	if err != nil {
		return false
	}
	s.leader.AcquireThen(ctx, a, func(g leader.Grant, err error) { done(acquireResponse(g), err) })
	return true
}

// releaseThen is acquireThen for a release.
func (s *Server) releaseThen(r *leaseholdv1.ReleaseRequest, done func(proto.Message, error)) bool {
	if !s.leader.Active() {
		return false
	}
	id, err := s.releaseArgs(r)
	if err != nil {
		return false
	}
	s.leader.ReleaseThen(id, r.GetName(), r.GetToken(), func(err error) { done(&leaseholdv1.ReleaseResponse{}, err) })
	return true
}

// keepAliveThen restarts a lease's countdown on this node, the leader, and reports true;
// done gets the answer once a leadership round that began after it confirmed (G4), on
// the goroutine that runs the rounds. The reader so serves keepalive after keepalive
// with no goroutine, channel or wake-up per request: at a million leases renewed every
// ten seconds that was most of the server's CPU. A node that must forward, or an
// invalid lease ID, takes the full path.
func (s *Server) keepAliveThen(r *leaseholdv1.KeepAliveRequest, done func(proto.Message, error)) bool {
	if !s.leader.Active() {
		return false
	}
	id, err := leaseID(r.GetLeaseId())
	if err != nil {
		return false
	}
	s.leader.KeepAliveThen(id, func(ka leader.KeepAliveResult, err error) { done(keepAliveResponse(ka), err) })
	return true
}

// errorFrame encodes err as an error frame, with the code and ErrorDetail the Connect
// transport would give it.
func errorFrame(m fastlane.Method, id uint64, err error) []byte {
	fe := &leaseholdv1.FastLaneError{Message: err.Error()}
	if ce := new(connect.Error); errors.As(err, &ce) {
		fe.Code, fe.Message, fe.Detail = uint32(ce.Code()), ce.Message(), detailOf(ce)
	} else {
		code, detail := Classify(err)
		fe.Code, fe.Detail = uint32(code), detail
	}
	frame, ferr := fastlane.AppendFrame(nil, fastlane.KindError, m, id, func(b []byte) ([]byte, error) {
		return proto.MarshalOptions{}.MarshalAppend(b, fe)
	})
	if ferr != nil {
		// Only an absurdly long message can get here: send the code alone.
		frame, _ = fastlane.AppendFrame(nil, fastlane.KindError, m, id, func(b []byte) ([]byte, error) {
			return proto.MarshalOptions{}.MarshalAppend(b, &leaseholdv1.FastLaneError{Code: fe.Code})
		})
	}
	return frame
}
