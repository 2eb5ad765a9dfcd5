package fence

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// A tiny test service without code generation: Put is unary, Watch server-streaming.
const (
	putProcedure   = "/fence.test.v1.Orders/Put"
	watchProcedure = "/fence.test.v1.Orders/Watch"
)

type connectServer struct {
	url    string
	client *http.Client
	calls  atomic.Int64
	last   atomic.Value // "lock=token" seen by the last handler call
}

func newConnectServer(t *testing.T, g Guard, opts ...Option) *connectServer {
	t.Helper()
	s := &connectServer{}
	record := func(ctx context.Context) {
		s.calls.Add(1)
		lock, token, ok := FromContext(ctx)
		if !ok {
			t.Error("handler ran without a token in its context")
		}
		s.last.Store(FormatHeader(lock, token))
	}
	interceptors := connect.WithInterceptors(ServerInterceptor(g, opts...))
	mux := http.NewServeMux()
	mux.Handle(putProcedure, connect.NewUnaryHandler(putProcedure,
		func(ctx context.Context, req *connect.Request[wrapperspb.StringValue]) (*connect.Response[emptypb.Empty], error) {
			record(ctx)
			return connect.NewResponse(&emptypb.Empty{}), nil
		}, interceptors))
	mux.Handle(watchProcedure, connect.NewServerStreamHandler(watchProcedure,
		func(ctx context.Context, req *connect.Request[wrapperspb.StringValue], stream *connect.ServerStream[wrapperspb.StringValue]) error {
			record(ctx)
			for _, v := range []string{"a", "b"} {
				if err := stream.Send(wrapperspb.String(v)); err != nil {
					return err
				}
			}
			return nil
		}, interceptors))
	srv := httptest.NewUnstartedServer(mux)
	srv.EnableHTTP2 = true // gRPC needs HTTP/2
	srv.StartTLS()
	t.Cleanup(srv.Close)
	s.url, s.client = srv.URL, srv.Client()
	return s
}

var protocols = []struct {
	name string
	opt  connect.ClientOption
}{
	{"connect", nil},
	{"grpc", connect.WithGRPC()},
	{"grpcweb", connect.WithGRPCWeb()},
}

func (s *connectServer) putClient(protocol connect.ClientOption, token func() (string, uint64, bool)) *connect.Client[wrapperspb.StringValue, emptypb.Empty] {
	var opts []connect.ClientOption
	if protocol != nil {
		opts = append(opts, protocol)
	}
	if token != nil {
		opts = append(opts, connect.WithInterceptors(ClientInterceptor(token)))
	}
	return connect.NewClient[wrapperspb.StringValue, emptypb.Empty](s.client, s.url+putProcedure, opts...)
}

func staticToken(lock string, token uint64) func() (string, uint64, bool) {
	return func() (string, uint64, bool) { return lock, token, true }
}

func TestConnectTwoClients(t *testing.T) {
	for _, p := range protocols {
		t.Run(p.name, func(t *testing.T) {
			ctx := context.Background()
			srv := newConnectServer(t, NewMemory())
			older := srv.putClient(p.opt, staticToken("orders/42", 33))
			newer := srv.putClient(p.opt, staticToken("orders/42", 34))

			if _, err := newer.CallUnary(ctx, connect.NewRequest(wrapperspb.String("v1"))); err != nil {
				t.Fatalf("newer: %v", err)
			}
			if got := srv.last.Load(); got != "orders/42=34" {
				t.Errorf("handler saw %v from FromContext", got)
			}
			_, err := older.CallUnary(ctx, connect.NewRequest(wrapperspb.String("v0")))
			if connect.CodeOf(err) != connect.CodeFailedPrecondition {
				t.Fatalf("older: %v; want FailedPrecondition", err)
			}
			if !strings.Contains(err.Error(), `token 33 for "orders/42" is stale: highest accepted is 34`) {
				t.Errorf("message %q does not name both tokens", err)
			}
			wantStale(t, err, "orders/42", 33, 34)
			if _, err := newer.CallUnary(ctx, connect.NewRequest(wrapperspb.String("v2"))); err != nil {
				t.Errorf("newer again (equal token): %v", err)
			}
			if n := srv.calls.Load(); n != 2 {
				t.Errorf("handler ran %d times; want 2", n)
			}
		})
	}
}

func TestConnectRejects(t *testing.T) {
	for _, p := range protocols {
		t.Run(p.name, func(t *testing.T) {
			ctx := context.Background()
			srv := newConnectServer(t, NewMemory())
			raw := srv.putClient(p.opt, nil) // sets headers by hand, no client interceptor
			for _, tc := range []struct {
				name   string
				values []string
				code   connect.Code
				want   string
			}{
				{"missing", nil, connect.CodeFailedPrecondition, "no fencing token"},
				{"missing equals", []string{"orders/42"}, connect.CodeInvalidArgument, "missing '='"},
				{"negative", []string{"orders/42=-1"}, connect.CodeInvalidArgument, `token "-1" is not a positive integer`},
				{"non-numeric", []string{"orders/42=x"}, connect.CodeInvalidArgument, "is not a positive integer"},
				{"empty lock", []string{"=1"}, connect.CodeInvalidArgument, "lock name is empty"},
				{"oversized", []string{strings.Repeat("a", 400) + "=1"}, connect.CodeInvalidArgument, "the limit is 300"},
				{"twice", []string{"orders/42=1", "orders/42=2"}, connect.CodeInvalidArgument, "want exactly one"},
			} {
				t.Run(tc.name, func(t *testing.T) {
					req := connect.NewRequest(wrapperspb.String("v"))
					for _, v := range tc.values {
						req.Header().Add(MetadataKey, v)
					}
					_, err := raw.CallUnary(ctx, req)
					if connect.CodeOf(err) != tc.code {
						t.Fatalf("err = %v; want code %v", err, tc.code)
					}
					if !strings.Contains(err.Error(), tc.want) {
						t.Errorf("message %q does not say %q", err, tc.want)
					}
				})
			}
			if n := srv.calls.Load(); n != 0 {
				t.Errorf("handler ran %d times for rejected calls", n)
			}
		})
	}
}

func TestConnectClientWithoutToken(t *testing.T) {
	ctx := context.Background()
	srv := newConnectServer(t, NewMemory())
	none := srv.putClient(nil, func() (string, uint64, bool) { return "", 0, false })
	_, err := none.CallUnary(ctx, connect.NewRequest(wrapperspb.String("v")))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || !errors.Is(err, ErrNoToken) {
		t.Errorf("no token: %v; want FailedPrecondition wrapping ErrNoToken", err)
	}
	bad := srv.putClient(nil, staticToken("orders 42", 1))
	_, err = bad.CallUnary(ctx, connect.NewRequest(wrapperspb.String("v")))
	if connect.CodeOf(err) != connect.CodeInvalidArgument || !errors.Is(err, ErrMalformedToken) {
		t.Errorf("bad lock: %v; want InvalidArgument wrapping ErrMalformedToken", err)
	}
	if n := srv.calls.Load(); n != 0 {
		t.Errorf("handler ran %d times; nothing should have been sent", n)
	}
}

func TestConnectGuardFailure(t *testing.T) {
	g := guardFunc(func(context.Context, string, uint64) error { return errors.New("db down: secret") })
	srv := newConnectServer(t, g)
	_, err := srv.putClient(nil, staticToken("orders/42", 1)).CallUnary(context.Background(), connect.NewRequest(wrapperspb.String("v")))
	if connect.CodeOf(err) != connect.CodeUnavailable || strings.Contains(err.Error(), "secret") {
		t.Errorf("err = %v; want Unavailable without the internal detail", err)
	}
}

func TestConnectResource(t *testing.T) {
	ctx := context.Background()
	srv := newConnectServer(t, NewMemory(), WithConnectResource(func(spec connect.Spec, h http.Header, lock string) (string, error) {
		if h.Get("Shard") == "" {
			return "", errors.New("missing Shard header")
		}
		return lock + "#" + h.Get("Shard"), nil
	}))
	call := func(shard string, token uint64) error {
		req := connect.NewRequest(wrapperspb.String("v"))
		if shard != "" {
			req.Header().Set("Shard", shard)
		}
		_, err := srv.putClient(nil, staticToken("orders", token)).CallUnary(ctx, req)
		return err
	}
	if err := call("1", 10); err != nil {
		t.Fatal(err)
	}
	if err := call("2", 5); err != nil {
		t.Errorf("another shard is another resource: %v", err)
	}
	wantStale(t, call("1", 9), "orders#1", 9, 10)
	if err := call("", 11); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("mapping error: %v; want InvalidArgument", err)
	}
}

func TestConnectServerStream(t *testing.T) {
	for _, p := range protocols {
		t.Run(p.name, func(t *testing.T) {
			ctx := context.Background()
			srv := newConnectServer(t, NewMemory())
			watch := func(token uint64) ([]string, error) {
				opts := []connect.ClientOption{connect.WithInterceptors(ClientInterceptor(staticToken("orders/42", token)))}
				if p.opt != nil {
					opts = append(opts, p.opt)
				}
				c := connect.NewClient[wrapperspb.StringValue, wrapperspb.StringValue](srv.client, srv.url+watchProcedure, opts...)
				stream, err := c.CallServerStream(ctx, connect.NewRequest(wrapperspb.String("w")))
				if err != nil {
					return nil, err
				}
				defer func() { _ = stream.Close() }()
				var got []string
				for stream.Receive() {
					got = append(got, stream.Msg().GetValue())
				}
				return got, stream.Err()
			}
			got, err := watch(7)
			if err != nil || strings.Join(got, "") != "ab" {
				t.Fatalf("watch(7) = %v, %v", got, err)
			}
			if got := srv.last.Load(); got != "orders/42=7" {
				t.Errorf("stream handler saw %v", got)
			}
			if _, err := watch(8); err != nil {
				t.Fatal(err)
			}
			_, err = watch(7)
			if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "highest accepted is 8") {
				t.Errorf("stale stream: %v; want FailedPrecondition naming 8", err)
			}
			if n := srv.calls.Load(); n != 2 {
				t.Errorf("stream handler ran %d times; want 2", n)
			}
		})
	}
}
