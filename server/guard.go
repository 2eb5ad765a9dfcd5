package server

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// guard stands in front of every HTTP request to the API port (G6):
//
//   - Deadlines. A request's body must arrive within ReadTimeout of the end of its
//     headers, and its answer must be written within WriteTimeout of its start, so a
//     client that stalls mid-request or stops reading loses its request (and, on
//     HTTP/1.1, its connection) instead of holding a goroutine for ever. These are
//     per-request deadlines (http.ResponseController) rather than http.Server's
//     ReadTimeout and WriteTimeout: those count from the start of the request to the
//     end of the answer, so they would also cut off an Acquire that waits for its lock
//     and every streaming RPC. The read deadline is lifted once the body has arrived
//     (on HTTP/1.1 it would otherwise end the wait of an Acquire through net/http's
//     background read). A server stream's request (one message) has the read deadline
//     too, lifted as it ends; streams get no write deadline, and client or bidi streams
//     (gRPC reflection) neither.
//   - Envelopes. A gRPC, gRPC-Web or Connect-streaming body is a sequence of messages,
//     each behind a 5-byte prefix (flags, length). Connect answers a broken one —
//     flags it does not know, the compressed flag without a compression, a body that
//     ends inside a prefix or a message — with Internal, as if the fault were the
//     server's; the guard checks the prefixes as the body streams through and fails
//     the read with InvalidArgument (ResourceExhausted for a message over
//     MaxRequestBytes, before reading it), which Connect passes on as it is. A unary
//     or server-streaming RPC takes exactly one message.
//   - Size. A unary RPC's body may not exceed MaxRequestBytes (plus a prefix): Connect
//     would otherwise read and discard any excess to keep the connection.
type guard struct {
	next        http.Handler
	routes      map[string]routeKind
	read, write time.Duration
	maxMessage  int
}

// routeKind is how the guard treats the requests to one path.
type routeKind uint8

const (
	plainRoute  routeKind = iota // not an RPC (/metrics, /readyz, …), or no such path
	unaryRoute                   // one message each way
	streamRoute                  // one message in, a stream of answers out
	duplexRoute                  // a stream of messages in (client or bidi streaming)
)

// newGuard guards next, whose RPCs are routes (procedure → kind); any other path is a
// plain route.
func newGuard(next http.Handler, cfg Config, routes map[string]routeKind) *guard {
	return &guard{next: next, routes: routes, read: cfg.ReadTimeout, write: cfg.WriteTimeout, maxMessage: cfg.MaxRequestBytes}
}

// routesOf adds the RPCs of file's services to routes.
func routesOf(file protoreflect.FileDescriptor, routes map[string]routeKind) map[string]routeKind {
	services := file.Services()
	for i := range services.Len() {
		sd := services.Get(i)
		methods := sd.Methods()
		for j := range methods.Len() {
			md := methods.Get(j)
			kind := unaryRoute
			switch {
			case md.IsStreamingClient():
				kind = duplexRoute
			case md.IsStreamingServer():
				kind = streamRoute
			}
			routes["/"+string(sd.FullName())+"/"+string(md.Name())] = kind
		}
	}
	return routes
}

func (g *guard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	kind := g.routes[r.URL.Path]
	hasBody := r.ContentLength != 0 // -1: unknown length; HTTP/2 without a body says 0
	var body *guardedBody
	if env := envelopesOf(r, kind, g.maxMessage); hasBody || env != nil {
		body = &guardedBody{ReadCloser: r.Body, env: env} // an empty body has no message either
		if kind == unaryRoute && hasBody {
			body.ReadCloser = http.MaxBytesReader(w, r.Body, int64(g.maxMessage)+5)
		}
		r.Body = body
	}
	if kind == duplexRoute {
		g.next.ServeHTTP(w, r)
		return
	}
	rc := http.NewResponseController(w)
	if hasBody {
		// A server stream's request is one message, like a unary one's: Connect reads
		// it to its end before the handler runs, and the deadline is lifted there.
		_ = rc.SetReadDeadline(time.Now().Add(g.read))
		body.rc = rc
	}
	if kind == streamRoute {
		g.next.ServeHTTP(w, r)
		return
	}
	_ = rc.SetWriteDeadline(time.Time{}) // what an earlier answer on this connection left
	dw := &deadlineWriter{ResponseWriter: w, rc: rc, timeout: g.write}
	defer dw.arm() // for an answer that net/http writes after the handler returned
	g.next.ServeHTTP(dw, r)
}

// guardedBody is a request body under the guard: its envelopes are checked (env), and
// the read deadline is lifted when it ends (rc).
type guardedBody struct {
	io.ReadCloser
	rc  *http.ResponseController // nil: no deadline to lift
	env *envelopes               // nil: not enveloped
	err error                    // the envelope fault, once found
}

func (b *guardedBody) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	n, err := b.ReadCloser.Read(p)
	eof := errors.Is(err, io.EOF)
	if b.env != nil {
		if b.err = b.env.check(p[:n], eof); b.err != nil {
			return 0, b.err
		}
	}
	if eof && b.rc != nil {
		_ = b.rc.SetReadDeadline(time.Time{})
		b.rc = nil
	}
	return n, err
}

// envelopes follows the 5-byte prefixes of an enveloped body.
type envelopes struct {
	single     bool // the RPC takes one message
	compressed bool // the request names a compression: messages may be compressed
	max        int  // the largest message
	head       [5]byte
	inHead     int    // bytes of the current prefix seen
	left       uint32 // bytes of the current message still to come
	count      int    // messages begun
}

// envelopesOf returns what follows r's envelopes, or nil when r's body is not
// enveloped (Connect's unary protocol, or not an RPC).
func envelopesOf(r *http.Request, kind routeKind, maxMessage int) *envelopes {
	if kind == plainRoute {
		return nil
	}
	single := kind != duplexRoute
	ct := r.Header.Get("Content-Type")
	encoding := ""
	switch {
	case strings.HasPrefix(ct, "application/grpc"): // gRPC and gRPC-Web
		encoding = r.Header.Get("Grpc-Encoding")
	case strings.HasPrefix(ct, "application/connect+"): // Connect's streaming protocol
		encoding = r.Header.Get("Connect-Content-Encoding")
	default:
		return nil
	}
	return &envelopes{single: single, compressed: encoding != "" && encoding != "identity", max: maxMessage}
}

// check follows the envelopes through p, the next bytes of the body (eof: the last
// ones), and returns the first fault as a *connect.Error.
func (e *envelopes) check(p []byte, eof bool) error {
	for len(p) > 0 {
		if e.left > 0 {
			k := min(uint32(len(p)), e.left)
			p, e.left = p[k:], e.left-k
			continue
		}
		if e.inHead == 0 && e.single && e.count == 1 {
			return envelopeFault(connect.CodeInvalidArgument, "the RPC takes one message, and more follows it")
		}
		k := copy(e.head[e.inHead:], p)
		p, e.inHead = p[k:], e.inHead+k
		if e.inHead < len(e.head) {
			break
		}
		flags, size := e.head[0], binary.BigEndian.Uint32(e.head[1:])
		switch {
		case flags&^1 != 0:
			return envelopeFault(connect.CodeInvalidArgument, "message %d has flags %#02x; a request may set only the compressed flag (1)", e.count+1, flags)
		case flags&1 != 0 && !e.compressed:
			return envelopeFault(connect.CodeInvalidArgument, "message %d is flagged compressed, but the request names no compression (grpc-encoding)", e.count+1)
		case int64(size) > int64(e.max):
			return envelopeFault(connect.CodeResourceExhausted, "message %d is %d bytes, the limit is %d", e.count+1, size, e.max)
		}
		e.inHead, e.left, e.count = 0, size, e.count+1
	}
	if !eof {
		return nil
	}
	switch {
	case e.inHead > 0:
		return envelopeFault(connect.CodeInvalidArgument, "the body ends inside the 5-byte prefix of message %d", e.count+1)
	case e.left > 0:
		return envelopeFault(connect.CodeInvalidArgument, "the body ends %d bytes short of the length of message %d", e.left, e.count)
	case e.count == 0 && e.single:
		return envelopeFault(connect.CodeInvalidArgument, "the body holds no message")
	}
	return nil
}

func envelopeFault(code connect.Code, format string, args ...any) error {
	return connect.NewError(code, fmt.Errorf("malformed request envelope: "+format, args...))
}

// deadlineWriter sets the write deadline when the answer starts.
type deadlineWriter struct {
	http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
	armed   bool
}

func (w *deadlineWriter) arm() {
	if !w.armed {
		w.armed = true
		_ = w.rc.SetWriteDeadline(time.Now().Add(w.timeout))
	}
}

func (w *deadlineWriter) WriteHeader(code int) {
	w.arm()
	w.ResponseWriter.WriteHeader(code)
}

func (w *deadlineWriter) Write(b []byte) (int, error) {
	w.arm()
	return w.ResponseWriter.Write(b)
}

// Flush implements http.Flusher, which Connect needs.
func (w *deadlineWriter) Flush() {
	w.arm()
	_ = w.rc.Flush()
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *deadlineWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
