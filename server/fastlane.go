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
)

// ServeFastLane serves the fast lane (docs/PROTOCOL.md) on ln until ln is closed. Every
// request goes through the same handlers as Connect — validation, forwarding to the
// leader, the error table — so the two transports cannot disagree.
func (s *Server) ServeFastLane(ln net.Listener, log *slog.Logger) error {
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
		go func() {
			defer wg.Done()
			if err := s.serveFastConn(conn); err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				log.Debug("fast-lane connection ended", "remote", conn.RemoteAddr().String(), "err", err)
			}
		}()
	}
}

// serveFastConn serves one connection: a reader (this goroutine), one goroutine per
// request in flight, and one batching writer. Closing the connection cancels every
// request still in flight (a waiting Acquire leaves its queue).
func (s *Server) serveFastConn(conn net.Conn) error {
	defer conn.Close()
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	if err := fastlane.ServerHello(conn); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := fastlane.NewWriter(conn)
	var (
		mu       sync.Mutex
		inflight = make(map[uint64]context.CancelFunc)
		reqs     sync.WaitGroup
	)
	defer func() {
		cancel()
		reqs.Wait()
	}()
	r := fastlane.NewReader(conn)
	for {
		f, err := r.Read()
		if err != nil {
			return err
		}
		switch f.Kind {
		case fastlane.KindCancel:
			mu.Lock()
			if c := inflight[f.ID]; c != nil {
				c()
			}
			mu.Unlock()
			continue
		case fastlane.KindRequest:
		default:
			return fastlane.ErrProtocol
		}
		mu.Lock()
		_, dup := inflight[f.ID]
		full := len(inflight) >= fastlane.MaxInFlight
		var rctx context.Context
		var rcancel context.CancelFunc
		if !dup && !full {
			rctx, rcancel = context.WithCancel(ctx)
			inflight[f.ID] = rcancel
		}
		mu.Unlock()
		switch {
		case dup:
			w.Send(errorFrame(f.Method, f.ID, connect.NewError(connect.CodeInvalidArgument, errors.New("fastlane: request id already in flight"))), false)
			continue
		case full:
			w.Send(errorFrame(f.Method, f.ID, connect.NewError(connect.CodeResourceExhausted, errors.New("fastlane: too many requests in flight on this connection"))), false)
			continue
		}
		req, err := decodeRequest(f.Method, f.Payload)
		if err != nil {
			mu.Lock()
			delete(inflight, f.ID)
			mu.Unlock()
			rcancel()
			w.Send(errorFrame(f.Method, f.ID, err), false)
			continue
		}
		method, id := f.Method, f.ID
		serve := func() {
			start := time.Now()
			resp, err := s.dispatchFast(rctx, method, req)
			s.metrics.observe(fastProcedures[method], start, err)
			mu.Lock()
			delete(inflight, id)
			others := len(inflight) > 0
			mu.Unlock()
			rcancel()
			if err != nil {
				w.Send(errorFrame(method, id, err), others)
				return
			}
			frame, ferr := fastlane.AppendFrame(nil, fastlane.KindResponse, method, id, func(b []byte) ([]byte, error) {
				return proto.MarshalOptions{}.MarshalAppend(b, resp)
			})
			if ferr != nil {
				frame = errorFrame(method, id, ferr)
			}
			w.Send(frame, others)
		}
		if s.servesAtOnce(method, req) {
			serve()
			continue
		}
		reqs.Add(1)
		go func() {
			defer reqs.Done()
			serve()
		}()
	}
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
