package fence

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/leasehold/leasehold/client"
)

// IdempotencyKeyHeader is the request header of the IETF httpapi draft "The
// Idempotency-Key HTTP Header Field".
const IdempotencyKeyHeader = "Idempotency-Key"

// ReplayedHeader is set to "true" on a response that Idempotency replays from its store
// rather than from the handler (the name Stripe's API uses for the same thing).
const ReplayedHeader = "Idempotent-Replayed"

// Problem types of the application/problem+json bodies that Idempotency writes.
const (
	// ProblemKeyInProgress is the type of a 409 answer: a request with the same key is
	// being served right now.
	ProblemKeyInProgress = "urn:leasehold:fence:idempotency-key-in-progress"
	// ProblemKeyReused is the type of a 422 answer: the key was used before for a
	// different request (another method, target or body).
	ProblemKeyReused = "urn:leasehold:fence:idempotency-key-reused"
	// ProblemKeyMissing is the type of a 400 answer to a request without the header,
	// when WithKeyRequired is set.
	ProblemKeyMissing = "urn:leasehold:fence:idempotency-key-missing"
	// ProblemKeyMalformed is the type of a 400 answer to a header that appears more than
	// once or does not hold a usable key.
	ProblemKeyMalformed = "urn:leasehold:fence:idempotency-key-malformed"
	// ProblemBodyTooLarge is the type of a 413 answer to a request body larger than the
	// middleware reads to tell requests apart (WithMaxRequestBody).
	ProblemBodyTooLarge = "urn:leasehold:fence:request-too-large"
)

// IdempotencyStore runs work at most once per key and returns its result: the one fn
// returns now, or the one stored when the work was done before, without running fn.
// While the work runs elsewhere it fails with an error matching client.ErrInProgress;
// when fn fails, nothing is stored and the key is free again. *client.Client and
// *client.Session implement it with leasehold's IdempotencyService (Client.Once
// documents the details: fn's context ends with the key's lease, the token fences
// fn's writes).
type IdempotencyStore interface {
	Once(ctx context.Context, key string, fn func(ctx context.Context, token uint64) ([]byte, error)) ([]byte, error)
}

// maxStoredResponse is how large a stored response may be: what the service keeps per
// key (core.MaxResultLen).
const maxStoredResponse = 32 << 10

// idemOptions are the options of Idempotency.
type idemOptions struct {
	prefix   string
	required bool
	methods  []string
	headers  []string
	maxBody  int64
}

func defaultIdemOptions() idemOptions {
	return idemOptions{
		prefix:  "http/",
		methods: []string{http.MethodPost, http.MethodPatch},
		headers: []string{"Content-Type", "Content-Language", "Content-Location", "Location", "ETag", "Last-Modified"},
		maxBody: 1 << 20,
	}
}

// WithKeyPrefix sets the prefix Idempotency puts before every key in its store (default
// "http/"), so that one store can serve several services, and so that permissions by
// name prefix can apply. Idempotency only.
func WithKeyPrefix(prefix string) Option { return func(o *options) { o.idem.prefix = prefix } }

// WithKeyRequired makes Idempotency answer 400 (ProblemKeyMissing) to a request of a
// covered method that has no Idempotency-Key header, as the draft says a resource that
// requires the header should. Without it such requests pass through unguarded.
// Idempotency only.
func WithKeyRequired() Option { return func(o *options) { o.idem.required = true } }

// WithKeyMethods sets the request methods Idempotency covers (default POST and PATCH,
// the draft's non-idempotent methods); requests of other methods pass through.
// Idempotency only.
func WithKeyMethods(methods ...string) Option {
	return func(o *options) { o.idem.methods = methods }
}

// WithReplayHeaders sets the response headers Idempotency stores and replays with a
// response (default Content-Type, Content-Language, Content-Location, Location, ETag
// and Last-Modified). Other headers — Set-Cookie, Date, anything per request — are not
// replayed. Idempotency only.
func WithReplayHeaders(names ...string) Option {
	return func(o *options) { o.idem.headers = names }
}

// WithMaxRequestBody sets how much of a request body Idempotency reads to tell a retry
// from a different request with the same key (default 1 MiB); a larger body is answered
// 413 (ProblemBodyTooLarge) without calling the handler. Idempotency only.
func WithMaxRequestBody(n int64) Option { return func(o *options) { o.idem.maxBody = n } }

// Idempotency returns HTTP middleware that serves each request carrying an
// Idempotency-Key header at most once per key, with store (guarantee G9 when store is
// a leasehold client), following the IETF httpapi draft:
//
//   - The first request with a key runs the handler, whose response goes to the client
//     as it is written and is stored with the key: status, the headers chosen by
//     WithReplayHeaders, and the body if the whole record fits in 32 KiB (otherwise the
//     body is not stored and a replay has an empty one).
//   - A later request with the same key, method, target (path and query) and body does
//     not run the handler: it gets the stored response, with ReplayedHeader set.
//   - A request with the key while the first is being served gets 409 Conflict
//     (ProblemKeyInProgress) and Retry-After: 1.
//   - A request that reuses the key for another method, target or body gets 422
//     Unprocessable Content (ProblemKeyReused).
//   - A malformed or repeated header gets 400 (ProblemKeyMalformed); a body above
//     WithMaxRequestBody gets 413; with WithKeyRequired, a request without the header gets
//     400 (ProblemKeyMissing). When the store fails before the handler ran, 503
//     (ProblemCheckFailed), logged.
//
// A key is the header's value — a structured-field string ("..."), or the bare value —
// of 1 to 200 ASCII letters, digits and . _ - : @ + (a UUID fits), prefixed by
// WithKeyPrefix in the store. Keys are not scoped by client: give each client its own
// prefix, or keys unlikely to collide (UUIDs), as the draft recommends.
//
// Every response the handler writes is stored, errors included (as Stripe does): the
// request was served, and serving it again could repeat its effects. If the handler
// panics, nothing is stored and the key is free for a retry. The handler runs with a
// context that ends when the key's lease is lost (a paused or partitioned server), and
// the key's fencing token is not passed on: a handler that writes to a fenced resource
// takes its own lock or uses client.Once directly.
//
// What it does not promise: with a store other than leasehold's, only what that store
// promises. A response that was written but could not be stored (the key's lease ended
// first, or the store became unreachable) is logged; the next request with the key may
// run the handler again.
func Idempotency(store IdempotencyStore, opts ...Option) func(http.Handler) http.Handler {
	if store == nil {
		panic("fence: Idempotency needs a non-nil IdempotencyStore")
	}
	o := newOptions(opts)
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			idempotent(w, r, next, store, o)
		})
	}
}

func idempotent(w http.ResponseWriter, r *http.Request, next http.Handler, store IdempotencyStore, o *options) {
	opt := o.idem
	if !covers(opt.methods, r.Method) {
		next.ServeHTTP(w, r)
		return
	}
	vals := r.Header.Values(IdempotencyKeyHeader)
	switch {
	case len(vals) == 0 && !opt.required:
		next.ServeHTTP(w, r)
		return
	case len(vals) == 0:
		writeProblem(w, problem{Type: ProblemKeyMissing, Title: "Idempotency-Key required", Status: http.StatusBadRequest,
			Detail: "this request must carry an " + IdempotencyKeyHeader + " header"})
		return
	case len(vals) > 1:
		writeProblem(w, problem{Type: ProblemKeyMalformed, Title: "malformed Idempotency-Key", Status: http.StatusBadRequest,
			Detail: fmt.Sprintf("%d %s headers, want exactly one", len(vals), IdempotencyKeyHeader)})
		return
	}
	key, err := parseIdempotencyKey(vals[0])
	if err != nil {
		writeProblem(w, problem{Type: ProblemKeyMalformed, Title: "malformed Idempotency-Key", Status: http.StatusBadRequest, Detail: err.Error()})
		return
	}
	body, err := readBody(r, opt.maxBody)
	if err != nil {
		writeProblem(w, problem{Type: ProblemBodyTooLarge, Title: "request too large", Status: http.StatusRequestEntityTooLarge, Detail: err.Error(), Key: key})
		return
	}
	fp := fingerprint(r, body)

	ran := false
	result, err := store.Once(r.Context(), opt.prefix+key, func(ctx context.Context, _ uint64) ([]byte, error) {
		ran = true
		rec := &recorder{ResponseWriter: w, keep: opt.headers}
		r2 := r.WithContext(ctx)
		r2.Body = io.NopCloser(bytes.NewReader(body))
		next.ServeHTTP(rec, r2)
		return rec.stored(fp), nil
	})
	switch {
	case err == nil && ran:
	case err == nil:
		replay(w, key, fp, result)
	case errors.Is(err, client.ErrInProgress):
		w.Header().Set("Retry-After", "1")
		writeProblem(w, problem{Type: ProblemKeyInProgress, Title: "request in progress", Status: http.StatusConflict,
			Detail: "a request with this Idempotency-Key is being served; retry later", Key: key})
	case ran:
		o.logger.ErrorContext(r.Context(), "fence: response served but not stored: a retry with its Idempotency-Key may be served again",
			"key", key, "err", err)
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		writeProblem(w, problem{Type: ProblemCheckFailed, Title: "idempotency check did not finish", Status: http.StatusServiceUnavailable,
			Detail: "the request ended before its Idempotency-Key was checked; nothing was done", Key: key})
	default:
		o.logger.ErrorContext(r.Context(), "fence: idempotency store failed", "key", key, "err", err)
		writeProblem(w, problem{Type: ProblemCheckFailed, Title: "idempotency check failed", Status: http.StatusServiceUnavailable,
			Detail: "the Idempotency-Key could not be checked; nothing was done", Key: key})
	}
}

func covers(methods []string, m string) bool {
	for _, x := range methods {
		if strings.EqualFold(x, m) {
			return true
		}
	}
	return false
}

// parseIdempotencyKey reads a key from the header value: a structured-field string
// (RFC 8941: "..." with \" and \\ escapes), or, leniently, the bare value.
func parseIdempotencyKey(v string) (string, error) {
	key := strings.TrimSpace(v)
	if strings.HasPrefix(key, `"`) {
		var b strings.Builder
		i := 1
		for ; i < len(key) && key[i] != '"'; i++ {
			if key[i] == '\\' && i+1 < len(key) && (key[i+1] == '"' || key[i+1] == '\\') {
				i++
			}
			b.WriteByte(key[i])
		}
		if i != len(key)-1 {
			return "", fmt.Errorf("fence: %s %q is not one quoted string", IdempotencyKeyHeader, v)
		}
		key = b.String()
	}
	if key == "" || len(key) > 200 {
		return "", fmt.Errorf("fence: %s must be 1 to 200 characters, got %d", IdempotencyKeyHeader, len(key))
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '.' || c == '_' || c == '-' || c == ':' || c == '@' || c == '+'
		if !ok {
			return "", fmt.Errorf("fence: %s has character %q at byte %d; allowed are letters, digits and . _ - : @ +", IdempotencyKeyHeader, rune(c), i)
		}
	}
	return key, nil
}

// readBody reads all of r's body, up to limit bytes.
func readBody(r *http.Request, limit int64) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		return nil, fmt.Errorf("fence: read the request body: %w", err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("fence: the request body is larger than %d bytes, the most an idempotent request may carry here", limit)
	}
	return b, nil
}

// fingerprint identifies a request: its method, target and body.
func fingerprint(r *http.Request, body []byte) []byte {
	h := sha256.New()
	h.Write([]byte(r.Method + "\x00" + r.URL.RequestURI() + "\x00"))
	h.Write(body)
	return h.Sum(nil)
}

// storedResponse is what Idempotency stores for a key.
type storedResponse struct {
	Fingerprint []byte      `json:"fingerprint"`
	Status      int         `json:"status"`
	Header      http.Header `json:"header,omitempty"`
	Body        []byte      `json:"body,omitempty"`
	BodyOmitted bool        `json:"bodyOmitted,omitempty"`
}

// recorder passes a response through to the client and keeps a copy to store.
type recorder struct {
	http.ResponseWriter
	keep     []string
	status   int
	header   http.Header
	body     bytes.Buffer
	overflow bool
}

func (r *recorder) WriteHeader(code int) {
	if r.status == 0 && code >= 200 {
		r.status = code
		r.header = http.Header{}
		for _, k := range r.keep {
			if v := r.ResponseWriter.Header().Values(k); len(v) > 0 {
				r.header[http.CanonicalHeaderKey(k)] = v
			}
		}
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.WriteHeader(http.StatusOK)
	}
	if !r.overflow {
		if r.body.Len()+len(p) > maxStoredResponse {
			r.overflow = true
			r.body = bytes.Buffer{}
		} else {
			r.body.Write(p)
		}
	}
	return r.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach the connection's writer (Flush, deadlines).
func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// stored encodes the recorded response, without its body if the whole does not fit.
func (r *recorder) stored(fp []byte) []byte {
	if r.status == 0 {
		r.WriteHeader(http.StatusOK) // the handler wrote nothing: net/http answers 200
	}
	s := storedResponse{Fingerprint: fp, Status: r.status, Header: r.header, Body: r.body.Bytes(), BodyOmitted: r.overflow}
	b, err := json.Marshal(s)
	if err != nil || len(b) > maxStoredResponse {
		s.Body, s.BodyOmitted = nil, true
		b, _ = json.Marshal(s)
	}
	return b
}

// replay writes the response stored for key, or 422 when it was stored for another
// request.
func replay(w http.ResponseWriter, key string, fp, result []byte) {
	var s storedResponse
	if err := json.Unmarshal(result, &s); err != nil || s.Status < 200 || s.Status > 999 {
		writeProblem(w, problem{Type: ProblemKeyReused, Title: "Idempotency-Key reused", Status: http.StatusUnprocessableEntity,
			Detail: "this Idempotency-Key holds a result that is not an HTTP response", Key: key})
		return
	}
	if !bytes.Equal(s.Fingerprint, fp) {
		writeProblem(w, problem{Type: ProblemKeyReused, Title: "Idempotency-Key reused", Status: http.StatusUnprocessableEntity,
			Detail: "this Idempotency-Key was used for another request (method, target or body)", Key: key})
		return
	}
	h := w.Header()
	for k, v := range s.Header {
		h[k] = v
	}
	h.Set(ReplayedHeader, "true")
	if !s.BodyOmitted {
		h.Set("Content-Length", strconv.Itoa(len(s.Body)))
	}
	w.WriteHeader(s.Status)
	_, _ = w.Write(s.Body)
}
