package fence

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"strconv"
)

// Problem types used in the application/problem+json bodies (RFC 9457) that Middleware
// writes. Clients match on them; ProblemFromResponse does.
const (
	// ProblemStale is the type of a 409 answer to a stale token.
	ProblemStale = "urn:leasehold:fence:stale-token"
	// ProblemMalformed is the type of a 400 answer to a malformed token or several
	// Fencing-Token headers.
	ProblemMalformed = "urn:leasehold:fence:malformed-token"
	// ProblemNoToken is the type of a 428 answer to a request without a token.
	ProblemNoToken = "urn:leasehold:fence:no-token"
	// ProblemCheckFailed is the type of a 503 answer when the Guard itself failed (its
	// database is down, or the request's context ended during the check).
	ProblemCheckFailed = "urn:leasehold:fence:check-failed"
)

// problem is an RFC 9457 problem details object with the fencing extension members.
type problem struct {
	Type     string `json:"type"`
	Title    string `json:"title"`
	Status   int    `json:"status"`
	Detail   string `json:"detail"`
	Lock     string `json:"lock,omitempty"`
	Resource string `json:"resource,omitempty"`
	Token    uint64 `json:"token,omitempty"`
	Highest  uint64 `json:"highest,omitempty"`
	Key      string `json:"key,omitempty"` // an Idempotency-Key
}

// Middleware returns HTTP middleware that admits a request through g before it reaches
// the wrapped handler. It panics if g is nil.
//
// For every request it reads the Fencing-Token header (see ParseHeader) and answers,
// without calling the handler, with an application/problem+json body:
//
//   - 428 Precondition Required (type ProblemNoToken) when the header is missing. 428 is
//     the status for "this request must be conditional", which a fenced write is.
//   - 400 Bad Request (type ProblemMalformed) when the header appears more than once or
//     does not parse, or when g says the token is malformed; the detail says what is wrong.
//   - 409 Conflict (type ProblemStale, title "stale fencing token") when g says the token is
//     stale; the body carries "lock", "resource", "token" and "highest".
//   - 503 Service Unavailable (type ProblemCheckFailed) when g failed for any other reason
//     (its database is down, or the request's context ended during the check). A Guard
//     failure is logged (WithLogger), not shown to the client.
//
// When g admits the token, the handler runs with the lock and token in the request
// context (FromContext). The resource is the lock name unless WithResource maps it.
//
// What it does not promise: the check and the handler's write are two steps. If two
// requests overlap — token 33 is admitted, then token 34 is admitted and written, then the
// handler of 33 writes — the older write lands last. The middleware guarantees that no
// request whose token is lower than one already admitted reaches the handler; ordering of
// overlapping writes needs the check inside the write's transaction (SQL.Admit with the
// token from FromContext), or a handler that serializes writes per resource and admits
// under that serialization.
func Middleware(g Guard, opts ...Option) func(http.Handler) http.Handler {
	if g == nil {
		panic("fence: Middleware needs a non-nil Guard")
	}
	o := newOptions(opts)
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			lock, token, err := tokenFromHeader(r.Header)
			if err != nil {
				writeTokenError(w, err)
				return
			}
			resource := lock
			if o.httpResource != nil {
				resource, err = o.httpResource(r, lock)
				if err != nil {
					writeProblem(w, problem{Type: "about:blank", Title: http.StatusText(http.StatusBadRequest),
						Status: http.StatusBadRequest, Detail: err.Error(), Lock: lock, Token: token})
					return
				}
			}
			if err := g.Admit(r.Context(), resource, token); err != nil {
				writeAdmitError(w, r, o.logger, err, lock, resource, token)
				return
			}
			next.ServeHTTP(w, r.WithContext(newContext(r.Context(), lock, token)))
		})
	}
}

// tokenFromHeader reads exactly one fencing token from h. Errors wrap ErrNoToken or
// ErrMalformedToken.
func tokenFromHeader(h http.Header) (lock string, token uint64, err error) {
	vals := h.Values(HeaderName)
	switch len(vals) {
	case 0:
		return "", 0, fmt.Errorf("%w: the request needs a %s header (<lock>=<token>)", ErrNoToken, HeaderName)
	case 1:
		return ParseHeader(vals[0])
	default:
		return "", 0, fmt.Errorf("%w: %d %s headers, want exactly one", ErrMalformedToken, len(vals), HeaderName)
	}
}

func writeTokenError(w http.ResponseWriter, err error) {
	if errors.Is(err, ErrNoToken) {
		writeProblem(w, problem{Type: ProblemNoToken, Title: "fencing token required",
			Status: http.StatusPreconditionRequired, Detail: err.Error()})
		return
	}
	writeProblem(w, problem{Type: ProblemMalformed, Title: "malformed fencing token",
		Status: http.StatusBadRequest, Detail: err.Error()})
}

func writeAdmitError(w http.ResponseWriter, r *http.Request, logger *slog.Logger, err error, lock, resource string, token uint64) {
	var stale *StaleError
	switch {
	case errors.As(err, &stale):
		writeProblem(w, problem{Type: ProblemStale, Title: "stale fencing token", Status: http.StatusConflict,
			Detail: stale.Error(), Lock: lock, Resource: resource, Token: token, Highest: stale.Highest})
	case errors.Is(err, ErrMalformedToken):
		writeProblem(w, problem{Type: ProblemMalformed, Title: "malformed fencing token",
			Status: http.StatusBadRequest, Detail: err.Error(), Lock: lock, Resource: resource, Token: token})
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		writeProblem(w, problem{Type: ProblemCheckFailed, Title: "fencing check did not finish",
			Status: http.StatusServiceUnavailable, Detail: "the request ended before the fencing token was checked; nothing was written",
			Lock: lock, Resource: resource, Token: token})
	default:
		logger.ErrorContext(r.Context(), "fence: guard failed", "lock", lock, "resource", resource, "token", token, "err", err)
		writeProblem(w, problem{Type: ProblemCheckFailed, Title: "fencing check failed",
			Status: http.StatusServiceUnavailable, Detail: "the fencing token could not be checked; nothing was written",
			Lock: lock, Resource: resource, Token: token})
	}
}

func writeProblem(w http.ResponseWriter, p problem) {
	body, err := json.Marshal(p)
	if err != nil { // unreachable: problem holds only strings and numbers
		http.Error(w, p.Title, p.Status)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Content-Length", strconv.Itoa(len(body)+1))
	w.WriteHeader(p.Status)
	_, _ = w.Write(append(body, '\n'))
}

// Transport is an http.RoundTripper that adds a Fencing-Token header to every request it
// sends. It clones the request and never modifies the caller's; a Fencing-Token header
// the caller set is replaced.
//
// Token is called once per request (including each redirect hop) and returns the token to
// send, typically the one of a lock the program currently holds. When it returns ok ==
// false — the lock is not held — or returns a lock name or token that could not be parsed
// on the other side, RoundTrip sends nothing and returns an error wrapping ErrNoToken or
// ErrMalformedToken: a fenced write is never sent unfenced. A nil Token is treated as one
// that never has a token. Use Transport only for requests that must be fenced.
//
// A Transport is safe for concurrent use if Base and Token are.
type Transport struct {
	// Base sends the request. Nil means http.DefaultTransport.
	Base http.RoundTripper
	// Token returns the lock name and token to send, and false when there is none.
	Token func() (lock string, token uint64, ok bool)
}

// RoundTrip implements http.RoundTripper. Errors from the token check wrap ErrNoToken or
// ErrMalformedToken; the request body, if any, is closed as the RoundTripper contract
// requires. Errors from Base are returned unchanged.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	lock, token, err := callToken(t.Token)
	if err != nil {
		if req.Body != nil {
			_ = req.Body.Close()
		}
		return nil, fmt.Errorf("%w (request %s %s not sent)", err, req.Method, req.URL.Redacted())
	}
	out := req.Clone(req.Context())
	out.Header.Set(HeaderName, FormatHeader(lock, token))
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	return base.RoundTrip(out)
}

// callToken calls a token func and checks what it returns. Errors wrap ErrNoToken or
// ErrMalformedToken.
func callToken(fn func() (string, uint64, bool)) (string, uint64, error) {
	if fn == nil {
		return "", 0, fmt.Errorf("%w: the token func is nil", ErrNoToken)
	}
	lock, token, ok := fn()
	if !ok {
		return "", 0, fmt.Errorf("%w: no lock held", ErrNoToken)
	}
	if err := checkFence(lock, token); err != nil {
		return "", 0, err
	}
	return lock, token, nil
}

// maxProblemBody bounds how much of a response body ProblemFromResponse reads.
const maxProblemBody = 64 << 10

// ProblemFromResponse turns a fencing rejection written by Middleware back into an error
// on the client side: a 409 with type ProblemStale becomes a *StaleError (matching
// ErrStale) naming the server's resource, the rejected token and the highest accepted;
// a 400 with type ProblemMalformed an error wrapping ErrMalformedToken; a 428 with type
// ProblemNoToken an error wrapping ErrNoToken. For every other response — including a 409
// that is not a fencing problem — it returns nil.
//
// It reads at most 64 KiB of the body, and only for those three statuses with an
// application/problem+json content type; the body stays readable from the start
// afterwards, and closing it stays the caller's job. A failure to read the body is
// returned as an error.
func ProblemFromResponse(resp *http.Response) error {
	if resp == nil || resp.Body == nil {
		return nil
	}
	switch resp.StatusCode {
	case http.StatusConflict, http.StatusBadRequest, http.StatusPreconditionRequired:
	default:
		return nil
	}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != "application/problem+json" {
		return nil
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxProblemBody))
	resp.Body = &replayBody{Reader: io.MultiReader(bytes.NewReader(body), resp.Body), Closer: resp.Body}
	if err != nil {
		return fmt.Errorf("fence: read problem response: %w", err)
	}
	var p problem
	if jerr := json.Unmarshal(body, &p); jerr != nil || p.Status != resp.StatusCode {
		return nil //nolint:nilerr // not a fence problem body: the caller reads the response as usual
	}
	switch {
	case p.Type == ProblemStale && p.Status == http.StatusConflict && p.Highest > p.Token:
		resource := p.Resource
		if resource == "" {
			resource = p.Lock
		}
		return &StaleError{Resource: resource, Token: p.Token, Highest: p.Highest}
	case p.Type == ProblemMalformed && p.Status == http.StatusBadRequest:
		return &remoteError{sentinel: ErrMalformedToken, status: p.Status, detail: p.Detail}
	case p.Type == ProblemNoToken && p.Status == http.StatusPreconditionRequired:
		return &remoteError{sentinel: ErrNoToken, status: p.Status, detail: p.Detail}
	}
	return nil
}

type replayBody struct {
	io.Reader
	io.Closer
}

// remoteError is a rejection reported by a server. It matches its sentinel.
type remoteError struct {
	sentinel error
	status   int
	detail   string
}

func (e *remoteError) Error() string {
	return fmt.Sprintf("fence: server answered %d: %s", e.status, e.detail)
}

func (e *remoteError) Unwrap() error { return e.sentinel }
