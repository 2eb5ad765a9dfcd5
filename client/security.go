package client

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/leasehold/leasehold/fastlane"
)

// WithTLS makes the client reach the servers over TLS — the API and the fast lane alike
// — verifying them with cfg (its RootCAs, or the system's roots when nil; a client
// certificate in cfg.Certificates or GetClientCertificate for servers that require one).
// When cfg.ServerName is empty, each server's certificate must be valid for the host of
// the address it is reached at. A server that does not serve TLS cannot be reached.
// WithHTTPClient, if also given, replaces the HTTP client this option would set up, and
// then must speak TLS itself.
func WithTLS(cfg *tls.Config) Option { return func(o *options) { o.tls = cfg.Clone() } }

// WithToken makes the client authenticate with a bearer token from the server's auth
// file (docs/SECURITY.md): on Connect as "Authorization: Bearer TOKEN", on the fast lane
// in its handshake. A server without auth ignores it. Send tokens only over TLS or
// loopback: anyone who reads one can act with it.
func WithToken(token string) Option { return func(o *options) { o.token = token } }

// scheme is the URL scheme of the API.
func (o *options) scheme() string {
	if o.tls != nil {
		return "https"
	}
	return "http"
}

// defaultHTTPClient is the HTTP client of a Client given no WithHTTPClient: HTTP/2 over
// TLS with WithTLS, else HTTP/2 without TLS (h2c).
//
// A connection that carries nothing for 5 s is pinged, and fails — with every call on it,
// which then moves to another node — if the ping is not answered within 2 s: so a node
// cut off the network is noticed, in the end, even by a call that is never abandoned for
// silence (an Acquire waiting for ever, a Put). Not sooner: a node too busy to answer a
// ping in time would lose every call at once. Dialling a node that does not answer gives
// up after 1 s (nothing was sent, the call goes to the next node).
//
// closeAll closes every connection the client opened, idle or not: for Client.Close,
// after which nothing of the Client's may keep a connection open (an idle one would stay
// for IdleConnTimeout, one with a request still in flight until that ends and then as
// long again).
func (o *options) defaultHTTPClient() (h *http.Client, closeAll func()) {
	conns := &dialedConns{open: make(map[*trackedConn]struct{})}
	d := &net.Dialer{Timeout: time.Second, KeepAlive: 15 * time.Second}
	tr := &http.Transport{
		DialContext:     conns.dial(d.DialContext),
		Protocols:       new(http.Protocols),
		IdleConnTimeout: 90 * time.Second,
	}
	if o.tls != nil {
		tr.TLSClientConfig = o.tls.Clone()
		tr.ForceAttemptHTTP2 = true
		tr.Protocols.SetHTTP2(true)
		tr.Protocols.SetHTTP1(true)
	} else {
		tr.Protocols.SetUnencryptedHTTP2(true)
	}
	tr.HTTP2 = &http.HTTP2Config{PingTimeout: 2 * time.Second, SendPingTimeout: 5 * time.Second}
	return &http.Client{Transport: tr}, func() {
		tr.CloseIdleConnections()
		conns.closeAll()
	}
}

// dialedConns keeps the connections a transport dialled until they close.
type dialedConns struct {
	mu     sync.Mutex
	open   map[*trackedConn]struct{}
	closed bool // closeAll was called: a connection dialled since is closed at once
}

// dial wraps a DialContext so that every connection it makes is kept in c.
func (c *dialedConns) dial(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.closed {
			_ = conn.Close()
			return nil, net.ErrClosed
		}
		t := &trackedConn{Conn: conn, in: c}
		c.open[t] = struct{}{}
		return t, nil
	}
}

// closeAll closes every connection kept, and any dialled from now on.
func (c *dialedConns) closeAll() {
	c.mu.Lock()
	c.closed = true
	open := c.open
	c.open = nil
	c.mu.Unlock()
	for t := range open {
		_ = t.Conn.Close()
	}
}

// trackedConn is a connection kept in dialedConns until it closes.
type trackedConn struct {
	net.Conn
	in *dialedConns
}

func (t *trackedConn) Close() error {
	t.in.mu.Lock()
	delete(t.in.open, t)
	t.in.mu.Unlock()
	return t.Conn.Close()
}

// connectOptions are the options of the client's Connect clients: the bearer token on
// every request (streams too), when there is one.
func (o *options) connectOptions() []connect.ClientOption {
	opts := []connect.ClientOption{connect.WithSendCompression("identity")}
	if o.token != "" {
		opts = append(opts, connect.WithInterceptors(bearer("Bearer "+o.token)))
	}
	return opts
}

// bearer sets the Authorization header of every unary call and stream.
type bearer string

func (b bearer) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		req.Header().Set("Authorization", string(b))
		return next(ctx, req)
	}
}

func (b bearer) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		conn.RequestHeader().Set("Authorization", string(b))
		return conn
	}
}

func (b bearer) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// dialFastConn opens a connection to the fast lane at addr, over TLS (handshake made)
// with WithTLS; the fast lane's own handshake is the caller's (dialFastLane).
func (o *options) dialFastConn(ctx context.Context, addr string) (net.Conn, error) {
	conn, err := (&net.Dialer{Timeout: 2 * time.Second}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if o.tls != nil {
		cfg := o.tls.Clone()
		if cfg.ServerName == "" {
			cfg.ServerName, _, _ = net.SplitHostPort(addr)
		}
		tc := tls.Client(conn, cfg)
		hctx, cancel := context.WithTimeout(ctx, fastlane.HandshakeTimeout)
		err = tc.HandshakeContext(hctx)
		cancel()
		if err != nil {
			_ = conn.Close()
			return nil, err
		}
		conn = tc
	}
	return conn, nil
}

// rawConn is the TCP connection under conn (under TLS, say), for looking at its socket.
func rawConn(conn net.Conn) net.Conn {
	if tc, ok := conn.(*tls.Conn); ok {
		return tc.NetConn()
	}
	return conn
}

// refused reports whether err is a server's refusal of the client's credentials.
func refused(err error) bool {
	code := connect.CodeOf(err)
	return code == connect.CodeUnauthenticated || code == connect.CodePermissionDenied
}
