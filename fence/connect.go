package fence

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"

	"connectrpc.com/connect"
)

// Response metadata that ServerInterceptor attaches to a stale-token error, so that
// ClientInterceptor can rebuild the *StaleError.
const (
	metaHighest  = "Fencing-Highest"
	metaResource = "Fencing-Resource"
)

// ServerInterceptor returns a Connect interceptor for handlers that admits every call
// through g before the handler runs. It works for the Connect, gRPC and gRPC-Web
// protocols alike, reading the metadata key "fencing-token" (MetadataKey; the same
// header as HeaderName) in the format of ParseHeader. It panics if g is nil.
//
// A call fails, and the handler does not run, with:
//
//   - CodeFailedPrecondition when the call carries no token. A fenced procedure's
//     precondition is a token; the caller must acquire a lock first, and retrying the
//     same call cannot succeed, which is what FailedPrecondition says.
//   - CodeInvalidArgument when the key appears more than once, does not parse, or g says
//     the token is malformed; the message says what is wrong.
//   - CodeFailedPrecondition when g says the token is stale, with the message of the
//     *StaleError (it names the resource and both tokens) and the response metadata
//     "fencing-highest" and "fencing-resource", which ClientInterceptor turns back into a
//     *StaleError.
//   - the context's error (CodeCanceled or CodeDeadlineExceeded) when the call ended
//     during the check, and CodeUnavailable when g failed otherwise; the failure is logged
//     (WithLogger), not sent to the client.
//
// When g admits the token, the handler runs with the lock and token in its context
// (FromContext). The resource is the lock name unless WithConnectResource maps it.
//
// Streaming calls are checked once, when the stream opens, since that is when metadata
// arrives; the messages that follow on the stream are not checked again. A stream that
// writes many times and lives long can outlast its token: a handler that needs every
// write ordered calls its Guard (for example SQL.Admit) per write with the token from
// FromContext. Apply the interceptor only to handlers whose procedures all write, since it
// rejects every unfenced call. The same overlap window as Middleware's applies: see there.
func ServerInterceptor(g Guard, opts ...Option) connect.Interceptor {
	if g == nil {
		panic("fence: ServerInterceptor needs a non-nil Guard")
	}
	return &serverInterceptor{guard: g, opts: newOptions(opts)}
}

type serverInterceptor struct {
	guard Guard
	opts  *options
}

func (s *serverInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if req.Spec().IsClient {
			return next(ctx, req)
		}
		ctx, err := s.admit(ctx, req.Spec(), req.Header())
		if err != nil {
			return nil, err
		}
		return next(ctx, req)
	}
}

// WrapStreamingClient leaves client streams alone: this is a handler interceptor.
func (s *serverInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (s *serverInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		ctx, err := s.admit(ctx, conn.Spec(), conn.RequestHeader())
		if err != nil {
			return err
		}
		return next(ctx, conn)
	}
}

// admit checks the call's token and returns the context for the handler, or the error
// to answer with.
func (s *serverInterceptor) admit(ctx context.Context, spec connect.Spec, header http.Header) (context.Context, error) {
	lock, token, err := tokenFromHeader(header)
	if errors.Is(err, ErrNoToken) {
		return ctx, connect.NewError(connect.CodeFailedPrecondition, err)
	}
	if err != nil {
		return ctx, connect.NewError(connect.CodeInvalidArgument, err)
	}
	resource := lock
	if s.opts.connectResource != nil {
		resource, err = s.opts.connectResource(spec, header, lock)
		if err != nil {
			return ctx, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("fence: resource for lock %q: %w", lock, err))
		}
	}
	if err := s.guard.Admit(ctx, resource, token); err != nil {
		return ctx, admitConnectError(ctx, s.opts.logger, spec, err, lock, resource, token)
	}
	return newContext(ctx, lock, token), nil
}

func admitConnectError(ctx context.Context, logger *slog.Logger, spec connect.Spec, err error, lock, resource string, token uint64) error {
	var stale *StaleError
	switch {
	case errors.As(err, &stale):
		cerr := connect.NewError(connect.CodeFailedPrecondition, stale)
		cerr.Meta().Set(metaHighest, strconv.FormatUint(stale.Highest, 10))
		cerr.Meta().Set(metaResource, resource)
		return cerr
	case errors.Is(err, ErrMalformedToken):
		return connect.NewError(connect.CodeInvalidArgument, err)
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return err
	default:
		logger.ErrorContext(ctx, "fence: guard failed", "procedure", spec.Procedure, "lock", lock, "resource", resource, "token", token, "err", err)
		return connect.NewError(connect.CodeUnavailable, errors.New("fence: the fencing token could not be checked; nothing was written"))
	}
}

// ClientInterceptor returns a Connect interceptor for clients that attaches the token
// returned by token to every call, in the metadata key "fencing-token" (replacing one the
// caller set). token is called once per call.
//
// When token returns ok == false, or a lock name or token that the server could not parse,
// a unary call is not sent and fails with CodeFailedPrecondition (wrapping ErrNoToken) or
// CodeInvalidArgument (wrapping ErrMalformedToken); a stream fails the same way on its
// first Send or Receive. A nil token func is one that never has a token.
//
// When a unary call fails because the server's ServerInterceptor found the token stale,
// the returned error still is the *connect.Error (connect.CodeOf works) and also matches
// ErrStale, and errors.As finds a *StaleError with the server's resource, the token sent
// and the highest accepted. Stream errors are returned as they come.
func ClientInterceptor(token func() (lock string, token uint64, ok bool)) connect.Interceptor {
	return &clientInterceptor{token: token}
}

type clientInterceptor struct {
	token func() (string, uint64, bool)
}

func (c *clientInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if !req.Spec().IsClient {
			return next(ctx, req)
		}
		lock, token, err := callToken(c.token)
		if err != nil {
			return nil, tokenConnectError(err)
		}
		req.Header().Set(MetadataKey, FormatHeader(lock, token))
		resp, err := next(ctx, req)
		if err != nil {
			return nil, staleFromConnect(err, token)
		}
		return resp, nil
	}
}

func (c *clientInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		lock, token, err := callToken(c.token)
		if err != nil {
			return newFailedClientConn(spec, tokenConnectError(err))
		}
		conn := next(ctx, spec)
		conn.RequestHeader().Set(MetadataKey, FormatHeader(lock, token))
		return conn
	}
}

// WrapStreamingHandler leaves handlers alone: this is a client interceptor.
func (c *clientInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

func tokenConnectError(err error) *connect.Error {
	if errors.Is(err, ErrNoToken) {
		return connect.NewError(connect.CodeFailedPrecondition, err)
	}
	return connect.NewError(connect.CodeInvalidArgument, err)
}

// staleFromConnect turns a stale-token rejection from ServerInterceptor into an error
// that matches both the *connect.Error and a *StaleError. Other errors are returned
// unchanged.
func staleFromConnect(err error, token uint64) error {
	var cerr *connect.Error
	if !errors.As(err, &cerr) || cerr.Code() != connect.CodeFailedPrecondition {
		return err
	}
	highest, perr := strconv.ParseUint(cerr.Meta().Get(metaHighest), 10, 64)
	if perr != nil || highest <= token {
		return err
	}
	return &staleConnectError{
		err:   err,
		stale: &StaleError{Resource: cerr.Meta().Get(metaResource), Token: token, Highest: highest},
	}
}

// staleConnectError is a *connect.Error that also carries the *StaleError it reports.
type staleConnectError struct {
	err   error
	stale *StaleError
}

func (e *staleConnectError) Error() string   { return e.err.Error() }
func (e *staleConnectError) Unwrap() []error { return []error{e.err, e.stale} }

// failedClientConn is a client stream that was never opened because its token check
// failed; every operation returns the error.
type failedClientConn struct {
	spec            connect.Spec
	err             error
	requestHeader   http.Header
	responseHeader  http.Header
	responseTrailer http.Header
}

func newFailedClientConn(spec connect.Spec, err error) *failedClientConn {
	return &failedClientConn{spec: spec, err: err, requestHeader: make(http.Header),
		responseHeader: make(http.Header), responseTrailer: make(http.Header)}
}

func (c *failedClientConn) Spec() connect.Spec           { return c.spec }
func (c *failedClientConn) Peer() connect.Peer           { return connect.Peer{} }
func (c *failedClientConn) Send(any) error               { return c.err }
func (c *failedClientConn) RequestHeader() http.Header   { return c.requestHeader }
func (c *failedClientConn) CloseRequest() error          { return c.err }
func (c *failedClientConn) Receive(any) error            { return c.err }
func (c *failedClientConn) ResponseHeader() http.Header  { return c.responseHeader }
func (c *failedClientConn) ResponseTrailer() http.Header { return c.responseTrailer }
func (c *failedClientConn) CloseResponse() error         { return c.err }
