package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/leasehold/leasehold/internal/auth"
	"github.com/leasehold/leasehold/internal/tlsconf"
)

// Authentication and authorization (G11, docs/SECURITY.md). Each transport finds the
// caller's credentials once — Connect per request (identified), the fast lane per
// connection, at its handshake — and every RPC is then authorized in one place,
// authorize, from the method table's columns (the permission, and the request's name it
// applies to), before any handler or fast-lane shortcut runs.
//
// Forwarded requests. A follower forwards a request to the leader with the caller's
// credential, never with a verdict of its own: a bearer token travels as it came (the
// leader checks it as if the caller had sent it there), and the subject of a client
// certificate travels in forwardedSubjectHeader, which the leader believes only from a
// connection that presented a certificate of the peer CA (another node; see
// tlsconf.Node.PeerName). A forwarded request that brings neither is anonymous.

// forwardedSubjectHeader carries, on a request forwarded to the leader, the common name
// of the caller's verified client certificate.
const forwardedSubjectHeader = "Leasehold-Forwarded-Subject"

// forwardedPeerHeader carries, on a request forwarded to the leader, the name of the
// node whose peer certificate its caller presented (a node joining through a
// follower). The leader believes it only from a peer connection too: a node that
// vouches for another gains nothing, since it could do anything itself.
const forwardedPeerHeader = "Leasehold-Forwarded-Peer"

// errNoCredentials is the answer to a caller that brings no credential when auth is on.
var errNoCredentials = fmt.Errorf("%w: no credentials: send a token (Authorization: Bearer TOKEN; client.WithToken; leasehold --auth-token-file) or a client certificate the auth file maps", auth.ErrUnauthenticated)

// principal is who sent a request, as its transport found out: an identity, or the error
// that says why there is none; and the credential to forward to the leader with.
type principal struct {
	who     *auth.Identity
	err     error  // why who is nil
	token   string // the bearer token it came with
	subject string // or the client certificate's subject
	gen     uint64 // the auth file's generation it was looked up in
}

type principalKey struct{}

// withPrincipal returns ctx carrying c.
func withPrincipal(ctx context.Context, c *principal) context.Context {
	return context.WithValue(ctx, principalKey{}, c)
}

// principalOf returns the principal ctx carries, or nil.
func principalOf(ctx context.Context) *principal {
	c, _ := ctx.Value(principalKey{}).(*principal)
	return c
}

// authOn reports whether callers must authenticate.
func (s *Server) authOn() bool { return s.cfg.Auth != nil }

// identify finds who sent a request from its token (header, or the fast lane's hello),
// the verified TLS connection it came on, and, for a request another node forwarded,
// the subject that node vouches for.
func (s *Server) identify(token string, cs *tls.ConnectionState, forwarded bool, forwardedSubject, forwardedPeer string) *principal {
	c := &principal{gen: s.cfg.Auth.Generation()}
	peerName, peer := "", false
	if s.cfg.TLS != nil {
		peerName, peer = s.cfg.TLS.PeerName(cs)
	}
	switch {
	case token != "":
		c.token = token
		c.who, c.err = s.cfg.Auth.Token(token)
	case forwarded && peer && forwardedSubject != "":
		c.subject = forwardedSubject
		c.who, c.err = s.cfg.Auth.Subject(forwardedSubject)
	case forwarded && peer && forwardedPeer != "":
		c.who = auth.Peer(forwardedPeer)
	case forwarded:
		// Never the forwarding node's own identity: the caller's is what counts.
		c.err = errNoCredentials
	case peer:
		c.who = auth.Peer(peerName)
	case s.cfg.TLS != nil && s.cfg.TLS.ClientName(cs) != "":
		c.subject = s.cfg.TLS.ClientName(cs)
		c.who, c.err = s.cfg.Auth.Subject(c.subject)
	default:
		c.err = errNoCredentials
	}
	return c
}

// identifyHTTP identifies the sender of an HTTP request (Connect, /metrics, /admin/*).
func (s *Server) identifyHTTP(r *http.Request) *principal {
	token, err := bearer(r.Header.Get("Authorization"))
	if err != nil {
		return &principal{err: err}
	}
	return s.identify(token, r.TLS, r.Header.Get(forwardedHeader) != "", r.Header.Get(forwardedSubjectHeader), r.Header.Get(forwardedPeerHeader))
}

// bearer extracts the token of an Authorization header ("" when there is none).
func bearer(h string) (string, error) {
	if h == "" {
		return "", nil
	}
	scheme, token, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(token) == "" {
		return "", fmt.Errorf("%w: the Authorization header must be \"Bearer TOKEN\"", auth.ErrUnauthenticated)
	}
	return strings.TrimSpace(token), nil
}

// identified puts the caller of every request into its context, for authorize and for
// forwarding. Without auth it passes requests through untouched.
func (s *Server) identified(h http.Handler) http.Handler {
	if !s.authOn() {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r.WithContext(withPrincipal(r.Context(), s.identifyHTTP(r))))
	})
}

// gate is what both transports ask before serving a request: authorize, then charge
// the caller's quotas (quota.go). When it returns a settle function, that must be called
// with the answer.
func (s *Server) gate(c *principal, m *method, req proto.Message) (settle func(proto.Message, error), err error) {
	if !s.authOn() {
		return nil, nil
	}
	if err := s.authorize(c, m, req); err != nil {
		return nil, err
	}
	if m.perm == permAdmin {
		return s.logAdmin(c, m, req), nil
	}
	return s.charge(c, req)
}

// logAdmin returns the settle function of an admin RPC: it logs the action, with the
// caller's identity and how it ended, once it has.
func (s *Server) logAdmin(c *principal, m *method, req proto.Message) func(proto.Message, error) {
	return func(_ proto.Message, err error) {
		result := "ok"
		if err != nil {
			result = connect.CodeOf(err).String()
		}
		s.log.Info("admin action", "identity", c.who.String(), "procedure", m.procedure, "request", requestText(req), "result", result)
	}
}

// authorize checks that c may call m with req: the one check of every RPC, on both
// transports. Missing or unknown credentials are auth.ErrUnauthenticated
// (Unauthenticated); a rule that does not allow it, auth.ErrPermissionDenied
// (PermissionDenied) naming what is missing. A refused admin RPC is logged with the
// identity (an admitted one when it ends: logAdmin).
func (s *Server) authorize(c *principal, m *method, req proto.Message) error {
	if !s.authOn() {
		return nil
	}
	if c == nil {
		return errNoCredentials
	}
	if c.who == nil {
		return c.err
	}
	names := []string{""}
	if m.names != nil {
		names = m.names(req)
	}
	for _, name := range names {
		if err := c.who.Allow(m.perm, name, m.names != nil); err != nil {
			if m.perm == permAdmin {
				s.log.Warn("admin action refused", "identity", c.who.String(), "procedure", m.procedure, "err", err)
			}
			return err
		}
	}
	return nil
}

// reauthorize authorizes c's request req to m again when the auth file was reloaded
// since c was identified, and returns the principal to check the next time: a server
// stream calls it before each message, so that a token taken out of the file, or whose
// rules no longer allow the request, gets nothing more from a stream it opened before
// (SECURITY.md, "Reloading"). The token or certificate subject is looked up again; a
// peer stays a peer.
func (s *Server) reauthorize(c *principal, m *method, req proto.Message) (*principal, error) {
	if !s.authOn() || c == nil || c.who == nil {
		return c, nil // gate admitted it: no auth, or nothing to look up
	}
	gen := s.cfg.Auth.Generation()
	if c.gen == gen {
		return c, nil
	}
	again := &principal{gen: gen, token: c.token, subject: c.subject, who: c.who}
	switch {
	case c.token != "":
		again.who, again.err = s.cfg.Auth.Token(c.token)
	case c.subject != "":
		again.who, again.err = s.cfg.Auth.Subject(c.subject)
	}
	return again, s.authorize(again, m, req)
}

// requestText renders an admin request for the log (admin requests carry no secret).
func requestText(req proto.Message) string {
	const maxLen = 512
	t := fmt.Sprint(req)
	if len(t) > maxLen {
		t = t[:maxLen] + "…"
	}
	return t
}

// forwardCredentials sets, on a request forwarded to the leader, the credential its
// caller came with (see the comment at the top of this file).
func forwardCredentials(ctx context.Context, h http.Header) {
	c := principalOf(ctx)
	switch {
	case c == nil:
	case c.token != "":
		h.Set("Authorization", "Bearer "+c.token)
	case c.subject != "":
		h.Set(forwardedSubjectHeader, sanitizeHeader(c.subject))
	case c.who != nil && c.who.Kind == auth.KindPeer:
		h.Set(forwardedPeerHeader, sanitizeHeader(c.who.Name))
	}
}

// requireHTTP serves h only to callers allowed p on every name (admin: /admin/*,
// /debug/pprof/; read: /metrics). Without auth it serves everyone.
func (s *Server) requireHTTP(p permission, h http.Handler) http.Handler {
	if !s.authOn() {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := principalOf(r.Context())
		if c == nil {
			c = s.identifyHTTP(r)
		}
		err := c.err
		if c.who != nil {
			err = c.who.Allow(p, "", false)
		}
		if err != nil {
			status := http.StatusForbidden
			if errors.Is(err, auth.ErrUnauthenticated) {
				status = http.StatusUnauthorized
				w.Header().Set("WWW-Authenticate", `Bearer realm="leasehold"`)
			}
			if p == permAdmin && c.who != nil {
				s.log.Warn("admin action refused", "identity", c.who.String(), "path", r.URL.Path, "err", err)
			}
			// Not a byte more of a refused request is read: its body may stall, and
			// /debug/pprof/ is mounted outside the guard's deadlines.
			_ = http.NewResponseController(w).SetReadDeadline(time.Now())
			if r.ProtoMajor == 1 {
				w.Header().Set("Connection", "close") // HTTP/2 resets the stream alone
			}
			http.Error(w, err.Error(), status)
			return
		}
		if p == permAdmin {
			s.log.Info("admin action", "identity", c.who.String(), "method", r.Method, "path", r.URL.Path)
		}
		h.ServeHTTP(w, r)
	})
}

// AdminOnly serves h (say, /debug/pprof/) only to callers with admin on every name,
// when auth is on; each request is logged with the caller's identity.
func (s *Server) AdminOnly(h http.Handler) http.Handler { return s.requireHTTP(permAdmin, h) }

// forwardDialer dials another node's API over TLS (to forward a request to the leader),
// with a config made per connection so that reloaded certificates take effect.
func forwardDialer(tc *tlsconf.Node) func(ctx context.Context, network, addr string) (net.Conn, error) {
	nd := &net.Dialer{Timeout: 2 * time.Second}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		cfg := tc.ForwardClient()
		cfg.NextProtos = []string{"h2"}
		if host, _, err := net.SplitHostPort(addr); err == nil {
			cfg.ServerName = host
		}
		return (&tls.Dialer{NetDialer: nd, Config: cfg}).DialContext(ctx, network, addr)
	}
}

// authenticate finds who a fast-lane connection's requests come from: the token of its
// hello, or its verified TLS client certificate.
func (c *fastConn) authenticate(conn net.Conn, token string) {
	if !c.s.authOn() {
		return
	}
	if lc, ok := conn.(*laneConn); ok {
		conn = lc.Conn
	}
	if tc, ok := conn.(*tls.Conn); ok {
		cs := tc.ConnectionState()
		c.tlsState = &cs
	}
	c.token = token
	c.settles = make(map[uint64]func(proto.Message, error))
	c.current()
}

// current returns the connection's caller, looked up again after the auth file was
// reloaded (a revoked token stops working on connections already open). Only the
// reader of the moment calls it.
func (c *fastConn) current() *principal {
	if !c.s.authOn() {
		return nil
	}
	if c.principal == nil || c.principal.gen != c.s.cfg.Auth.Generation() {
		c.principal = c.s.identify(c.token, c.tlsState, false, "", "")
		c.base = withPrincipal(context.Background(), c.principal)
	}
	return c.principal
}
