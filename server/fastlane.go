package server

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/fastlane"
	"github.com/leasehold/leasehold/leader"
)

// ServeFastLane serves the fast lane (docs/PROTOCOL.md) on ln until ln is closed. Every
// request goes through the same handlers as Connect — validation, forwarding to the
// leader, the error table — so the two transports cannot disagree.
func (s *Server) ServeFastLane(ln net.Listener, log *slog.Logger) error {
	pool := new(workers)
	defer pool.close()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		conn, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		wg.Add(1)
		pool.Go(func() {
			defer wg.Done()
			if err := s.serveFastConn(conn, pool); err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				log.Debug("fast-lane connection ended", "remote", conn.RemoteAddr().String(), "err", err)
			}
		})
	}
}

// serveFastConn serves one connection until it fails or closes. Closing the connection
// cancels every request still in flight (a waiting Acquire leaves its queue).
func (s *Server) serveFastConn(conn net.Conn, pool *workers) error {
	defer conn.Close()
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	if err := fastlane.ServerHello(conn, s.ClusterID()); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &fastConn{
		s: s, pool: pool, r: fastlane.NewReader(conn), w: fastlane.NewWriter(conn),
		ctx: ctx, cancel: cancel, done: make(chan struct{}),
		inflight: make(map[uint64]context.CancelFunc),
	}
	c.read()
	<-c.done
	c.wg.Wait()
	return c.err
}

// fastConn is one fast-lane connection on the server side. One goroutine at a time
// reads it. The reader answers what it can answer at once itself (servesAtOnce,
// grantNow), and proposes correctness acquires and releases itself, leaving their
// answers to the commit (serveThen); for any other request that may wait, it starts a
// new reader and serves that request itself, so the request goes on without waiting for
// a new goroutine to be scheduled (the new reader's start is off the request's path).
// One batching writer serves all.
type fastConn struct {
	s      *Server
	pool   *workers
	r      *fastlane.Reader
	w      *fastlane.Writer
	ctx    context.Context // ends with the connection
	cancel context.CancelFunc
	wg     sync.WaitGroup // readers and requests started by readers
	once   sync.Once
	done   chan struct{} // closed when the connection has failed
	err    error         // why; set before done is closed

	mu       sync.Mutex
	inflight map[uint64]context.CancelFunc
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
func (c *fastConn) read() {
	for {
		f, err := c.r.Read()
		if err != nil {
			c.end(err)
			return
		}
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
			c.end(fastlane.ErrProtocol)
			return
		}
		req, ok := c.admit(f)
		if !ok {
			continue
		}
		if c.s.servesAtOnce(f.Method, req) {
			// Nothing can cancel it: no other frame is read until it is answered.
			c.serve(c.ctx, f.Method, f.ID, req)
			continue
		}
		if resp, ok := c.s.grantNow(f.Method, req); ok {
			c.answer(f.Method, f.ID, time.Now(), resp, nil)
			continue
		}
		// Not derived from c.ctx: end cancels it through inflight, and the requests of
		// a busy connection do not all register with (and lock) one parent context.
		ctx, cancel := context.WithCancel(context.Background())
		c.mu.Lock()
		c.inflight[f.ID] = cancel
		c.mu.Unlock()
		c.wg.Add(1) // the request answered later, or the new reader
		if c.s.serveThen(ctx, f.Method, req, c.later(f.Method, f.ID)) {
			continue
		}
		c.pool.Go(func() {
			defer c.wg.Done()
			c.read()
		})
		c.serve(ctx, f.Method, f.ID, req)
		return
	}
}

// admit decodes request f. A duplicate id, too many requests in flight or a payload
// that does not decode is answered with an error frame at once, and admit returns false.
func (c *fastConn) admit(f fastlane.Frame) (proto.Message, bool) {
	c.mu.Lock()
	_, dup := c.inflight[f.ID]
	full := len(c.inflight) >= fastlane.MaxInFlight
	c.mu.Unlock()
	var err error
	switch {
	case dup:
		err = connect.NewError(connect.CodeInvalidArgument, errors.New("fastlane: request id already in flight"))
	case full:
		err = connect.NewError(connect.CodeResourceExhausted, errors.New("fastlane: too many requests in flight on this connection"))
	}
	var req proto.Message
	if err == nil {
		req, err = decodeRequest(f.Method, f.Payload)
	}
	if err != nil {
		c.w.Send(errorFrame(f.Method, f.ID, err), false)
		return nil, false
	}
	return req, true
}

// serve answers one admitted request; one that may wait is in inflight with the
// cancel function of its ctx.
func (c *fastConn) serve(ctx context.Context, method fastlane.Method, id uint64, req proto.Message) {
	start := time.Now()
	resp, err := c.s.dispatchFast(ctx, method, req)
	c.answer(method, id, start, resp, err)
}

// later returns what answers request id when serveThen takes it: the answer is queued
// on the connection without blocking (the caller answers other connections too), and
// the request counts in c.wg until then.
func (c *fastConn) later(method fastlane.Method, id uint64) func(proto.Message, error) {
	start := time.Now()
	return func(resp proto.Message, err error) {
		c.respond(method, id, start, resp, err, func(frame []byte, _ bool) { c.w.Offer(frame) })
		c.wg.Done()
	}
}

// answer sends the answer to request id, begun at start.
func (c *fastConn) answer(method fastlane.Method, id uint64, start time.Time, resp proto.Message, err error) {
	c.respond(method, id, start, resp, err, func(frame []byte, others bool) { c.w.Send(frame, others) })
}

// respond frames the answer to request id, begun at start, and hands it to send, with
// whether other requests are in flight on the connection.
func (c *fastConn) respond(method fastlane.Method, id uint64, start time.Time, resp proto.Message, err error, send func(frame []byte, others bool)) {
	c.s.metrics.observe(fastProcedures[method], start, err)
	c.mu.Lock()
	cancel := c.inflight[id] // nil for a request served at once: never registered
	delete(c.inflight, id)
	others := len(c.inflight) > 0
	c.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	if err != nil {
		send(errorFrame(method, id, err), others)
		return
	}
	buf := fastlane.GetBuffer()
	frame, ferr := fastlane.AppendFrame(*buf, fastlane.KindResponse, method, id, func(b []byte) ([]byte, error) {
		return proto.MarshalOptions{}.MarshalAppend(b, resp)
	})
	if ferr != nil {
		send(errorFrame(method, id, ferr), others)
	} else {
		send(frame, others)
	}
	fastlane.PutBuffer(buf, frame)
}

// servesAtOnce reports whether a request is answered from the leader's memory without
// waiting — an efficiency acquire that tries once, or the release of an efficiency lock
// — so that the connection's reader can serve it itself instead of handing it to a new
// goroutine (saving a goroutine start and a wake-up per call). A request that may wait
// (a queue, a commit, a quorum round, a forward to another node) always gets its own
// goroutine: the reader must stay free to read cancels and other requests.
func (s *Server) servesAtOnce(m fastlane.Method, req proto.Message) bool {
	switch m {
	case fastlane.MethodAcquire:
		r := req.(*leaseholdv1.AcquireRequest)
		return r.GetClass() == leaseholdv1.LockClass_LOCK_CLASS_EFFICIENCY && r.GetWaitMs() == 0 && s.leader.Active()
	case fastlane.MethodRelease:
		return s.leader.ServesInMemory(req.(*leaseholdv1.ReleaseRequest).GetName())
	}
	return false
}

// serveThen starts serving a correctness Acquire or Release on this node, the leader,
// without waiting for its commit, and reports true; then gets the answer (its response
// counts only when the error is nil, as in respond), on the goroutine that hands out
// commit results (it must not block). The connection's reader can so go on reading the
// requests behind it at once, instead of handing the reading to another goroutine per
// request. Anything else — other methods, efficiency locks,
// invalid requests, a node that must forward — it leaves alone and reports false, for
// the full path (dispatchFast) to serve.
func (s *Server) serveThen(ctx context.Context, m fastlane.Method, req proto.Message, then func(proto.Message, error)) bool {
	if !s.leader.Active() {
		return false
	}
	switch m {
	case fastlane.MethodAcquire:
		r := req.(*leaseholdv1.AcquireRequest)
		if r.GetClass() != leaseholdv1.LockClass_LOCK_CLASS_CORRECTNESS {
			return false
		}
		a, err := s.acquireArgs(r)
		if err != nil {
			return false
		}
		s.leader.AcquireThen(ctx, a, func(g leader.Grant, err error) { then(acquireResponse(g), err) })
		return true
	case fastlane.MethodRelease:
		r := req.(*leaseholdv1.ReleaseRequest)
		id, err := s.releaseArgs(r)
		if err != nil {
			return false
		}
		s.leader.ReleaseThen(id, r.GetName(), r.GetToken(), func(err error) { then(&leaseholdv1.ReleaseResponse{}, err) })
		return true
	}
	return false
}

// grantNow answers an efficiency acquire that may wait when the leader can grant it at
// once from memory (leader.AcquireNow): the connection's reader then answers it itself.
// It reports false, having changed nothing, when the request must go the full way
// (through dispatchFast on a goroutine of its own), including when it is invalid.
func (s *Server) grantNow(m fastlane.Method, req proto.Message) (proto.Message, bool) {
	r, ok := req.(*leaseholdv1.AcquireRequest)
	if m != fastlane.MethodAcquire || !ok || r.GetClass() != leaseholdv1.LockClass_LOCK_CLASS_EFFICIENCY {
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

// fastProcedures names fast-lane methods as their Connect procedures, so metrics of
// both transports add up.
var fastProcedures = map[fastlane.Method]string{
	fastlane.MethodGrant:      "/leasehold.v1.LeaseService/Grant",
	fastlane.MethodKeepAlive:  "/leasehold.v1.LeaseService/KeepAlive",
	fastlane.MethodRevoke:     "/leasehold.v1.LeaseService/Revoke",
	fastlane.MethodAcquire:    "/leasehold.v1.LockService/Acquire",
	fastlane.MethodRelease:    "/leasehold.v1.LockService/Release",
	fastlane.MethodCheckToken: "/leasehold.v1.LockService/CheckToken",
	fastlane.MethodPut:        "/leasehold.v1.KVService/Put",
	fastlane.MethodGet:        "/leasehold.v1.KVService/Get",
	fastlane.MethodDelete:     "/leasehold.v1.KVService/Delete",
}

// decodeRequest unmarshals a request payload for method. Unknown methods and payloads
// that do not decode are InvalidArgument.
func decodeRequest(m fastlane.Method, payload []byte) (proto.Message, error) {
	var req proto.Message
	switch m {
	case fastlane.MethodGrant:
		req = new(leaseholdv1.GrantRequest)
	case fastlane.MethodKeepAlive:
		req = new(leaseholdv1.KeepAliveRequest)
	case fastlane.MethodRevoke:
		req = new(leaseholdv1.RevokeRequest)
	case fastlane.MethodAcquire:
		req = new(leaseholdv1.AcquireRequest)
	case fastlane.MethodRelease:
		req = new(leaseholdv1.ReleaseRequest)
	case fastlane.MethodCheckToken:
		req = new(leaseholdv1.CheckTokenRequest)
	case fastlane.MethodPut:
		req = new(leaseholdv1.PutRequest)
	case fastlane.MethodGet:
		req = new(leaseholdv1.GetRequest)
	case fastlane.MethodDelete:
		req = new(leaseholdv1.DeleteRequest)
	default:
		return nil, connect.NewError(connect.CodeUnimplemented, errors.New("fastlane: unknown method"))
	}
	if err := proto.Unmarshal(payload, req); err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("fastlane: request does not decode: "+err.Error()))
	}
	return req, nil
}

func (s *Server) dispatchFast(ctx context.Context, m fastlane.Method, req proto.Message) (proto.Message, error) {
	switch m {
	case fastlane.MethodGrant:
		return s.Grant(ctx, req.(*leaseholdv1.GrantRequest))
	case fastlane.MethodKeepAlive:
		return s.KeepAlive(ctx, req.(*leaseholdv1.KeepAliveRequest))
	case fastlane.MethodRevoke:
		return s.Revoke(ctx, req.(*leaseholdv1.RevokeRequest))
	case fastlane.MethodAcquire:
		return s.Acquire(ctx, req.(*leaseholdv1.AcquireRequest))
	case fastlane.MethodRelease:
		return s.Release(ctx, req.(*leaseholdv1.ReleaseRequest))
	case fastlane.MethodCheckToken:
		return s.CheckToken(ctx, req.(*leaseholdv1.CheckTokenRequest))
	case fastlane.MethodPut:
		return s.Put(ctx, req.(*leaseholdv1.PutRequest))
	case fastlane.MethodGet:
		return s.Get(ctx, req.(*leaseholdv1.GetRequest))
	case fastlane.MethodDelete:
		return s.Delete(ctx, req.(*leaseholdv1.DeleteRequest))
	}
	return nil, connect.NewError(connect.CodeUnimplemented, errors.New("fastlane: unknown method"))
}

// errorFrame encodes err as an error frame, with the code and ErrorDetail the Connect
// transport would give it.
func errorFrame(m fastlane.Method, id uint64, err error) []byte {
	fe := &leaseholdv1.FastLaneError{Message: err.Error()}
	if ce := new(connect.Error); errors.As(err, &ce) {
		fe.Code, fe.Message = uint32(ce.Code()), ce.Message()
		for _, d := range ce.Details() {
			if v, derr := d.Value(); derr == nil {
				if ed, ok := v.(*leaseholdv1.ErrorDetail); ok {
					fe.Detail = ed
				}
			}
		}
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
