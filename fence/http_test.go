package fence

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// fencedServer serves a handler behind Middleware and counts the calls that reach it.
type fencedServer struct {
	*httptest.Server
	calls atomic.Int64
	mu    sync.Mutex
	seen  []string // "lock=token" from FromContext, per call
}

func newFencedServer(t *testing.T, g Guard, opts ...Option) *fencedServer {
	t.Helper()
	s := &fencedServer{}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.calls.Add(1)
		lock, token, ok := FromContext(r.Context())
		if !ok {
			t.Error("handler ran without a token in its context")
		}
		s.mu.Lock()
		s.seen = append(s.seen, FormatHeader(lock, token))
		s.mu.Unlock()
		_, _ = io.WriteString(w, "written")
	})
	s.Server = httptest.NewServer(Middleware(g, opts...)(handler))
	t.Cleanup(s.Close)
	return s
}

// fencedClient is an HTTP client whose Transport sends the given token.
func fencedClient(lock string, token uint64) *http.Client {
	return &http.Client{Transport: &Transport{Token: func() (string, uint64, bool) { return lock, token, true }}}
}

// decodeProblem checks the content type and decodes a problem+json body.
func decodeProblem(t *testing.T, resp *http.Response) map[string]any {
	t.Helper()
	if ct := resp.Header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type = %q; want application/problem+json", ct)
	}
	var p map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&p); err != nil {
		t.Fatalf("decode problem: %v", err)
	}
	if int(p["status"].(float64)) != resp.StatusCode {
		t.Errorf("problem status %v != response status %d", p["status"], resp.StatusCode)
	}
	return p
}

func TestHTTPTwoClients(t *testing.T) {
	srv := newFencedServer(t, NewMemory())
	older := fencedClient("orders/42", 33)
	newer := fencedClient("orders/42", 34)

	post := func(c *http.Client) *http.Response {
		t.Helper()
		resp, err := c.Post(srv.URL+"/orders/42", "text/plain", strings.NewReader("payload"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = resp.Body.Close() })
		return resp
	}

	if resp := post(newer); resp.StatusCode != http.StatusOK || ProblemFromResponse(resp) != nil {
		_ = resp.Body.Close()
		t.Fatalf("newer client: status %d", resp.StatusCode)
	} else {
		_ = resp.Body.Close()
	}
	resp := post(older)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusConflict {
		t.Fatalf("older client: status %d; want 409", resp.StatusCode)
	}
	err := ProblemFromResponse(resp)
	wantStale(t, err, "orders/42", 33, 34)
	// The body is still readable after ProblemFromResponse.
	p := decodeProblem(t, resp)
	want := map[string]any{
		"type": ProblemStale, "title": "stale fencing token", "status": 409.0,
		"detail": `fence: token 33 for "orders/42" is stale: highest accepted is 34`,
		"lock":   "orders/42", "resource": "orders/42", "token": 33.0, "highest": 34.0,
	}
	for k, v := range want {
		if p[k] != v {
			t.Errorf("problem[%q] = %v; want %v", k, p[k], v)
		}
	}
	// The holder of the highest token keeps writing; equal tokens are admitted.
	if resp := post(newer); resp.StatusCode != http.StatusOK {
		_ = resp.Body.Close()
		t.Errorf("newer client again: status %d", resp.StatusCode)
	}
	if n := srv.calls.Load(); n != 2 {
		t.Errorf("handler ran %d times; want 2 (the stale write must not reach it)", n)
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if strings.Join(srv.seen, " ") != "orders/42=34 orders/42=34" {
		t.Errorf("handler saw %v from FromContext", srv.seen)
	}
}

func TestHTTPMalformed(t *testing.T) {
	srv := newFencedServer(t, NewMemory())
	for _, tc := range []struct {
		name   string
		values []string // Fencing-Token headers to send
		status int
		want   string // in the problem's detail
	}{
		{"missing", nil, http.StatusPreconditionRequired, "needs a Fencing-Token header"},
		{"missing equals", []string{"orders/42"}, http.StatusBadRequest, "missing '='"},
		{"non-numeric", []string{"orders/42=abc"}, http.StatusBadRequest, `token "abc" is not a positive integer`},
		{"negative", []string{"orders/42=-1"}, http.StatusBadRequest, `token "-1" is not a positive integer`},
		{"zero", []string{"orders/42=0"}, http.StatusBadRequest, "token 0 is never issued"},
		{"overflow", []string{"orders/42=99999999999999999999"}, http.StatusBadRequest, "larger than"},
		{"oversized", []string{strings.Repeat("a", 10000) + "=1"}, http.StatusBadRequest, "value is 10002 bytes, the limit is 300"},
		{"empty lock", []string{"=34"}, http.StatusBadRequest, "lock name is empty"},
		{"empty value", []string{""}, http.StatusBadRequest, "value is empty"},
		{"tab in lock", []string{"orders\t42=1"}, http.StatusBadRequest, `byte '\t'`},
		{"two headers", []string{"orders/42=34", "orders/42=35"}, http.StatusBadRequest, "2 Fencing-Token headers, want exactly one"},
		{"comma list", []string{"orders/42=34, orders/42=35"}, http.StatusBadRequest, "is not a positive integer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodPut, srv.URL+"/x", strings.NewReader("payload"))
			if err != nil {
				t.Fatal(err)
			}
			for _, v := range tc.values {
				req.Header.Add(HeaderName, v)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = resp.Body.Close() }()
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d; want %d", resp.StatusCode, tc.status)
			}
			perr := ProblemFromResponse(resp)
			wantType, wantErr := ProblemMalformed, ErrMalformedToken
			if tc.status == http.StatusPreconditionRequired {
				wantType, wantErr = ProblemNoToken, ErrNoToken
			}
			if !errors.Is(perr, wantErr) {
				t.Errorf("ProblemFromResponse = %v; want %v", perr, wantErr)
			}
			p := decodeProblem(t, resp)
			if p["type"] != wantType {
				t.Errorf("type = %v; want %v", p["type"], wantType)
			}
			if d, _ := p["detail"].(string); !strings.Contains(d, tc.want) {
				t.Errorf("detail %q does not say %q", d, tc.want)
			}
		})
	}
	if n := srv.calls.Load(); n != 0 {
		t.Errorf("handler ran %d times for malformed requests", n)
	}
}

// guardFunc adapts a function to Guard.
type guardFunc func(ctx context.Context, resource string, token uint64) error

func (f guardFunc) Admit(ctx context.Context, resource string, token uint64) error {
	return f(ctx, resource, token)
}

func TestHTTPGuardFailures(t *testing.T) {
	for _, tc := range []struct {
		name     string
		err      error
		status   int
		typ      string
		logged   bool
		hideText string // must not reach the client
	}{
		{"storage down", errors.New("dial tcp 10.0.0.7:5432: secret detail"), http.StatusServiceUnavailable, ProblemCheckFailed, true, "secret detail"},
		{"context ended", fmt.Errorf("query: %w", context.Canceled), http.StatusServiceUnavailable, ProblemCheckFailed, false, ""},
		{"too large for the guard", fmt.Errorf("%w: token too large", ErrMalformedToken), http.StatusBadRequest, ProblemMalformed, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logBuf bytes.Buffer
			logger := slog.New(slog.NewTextHandler(&logBuf, nil))
			g := guardFunc(func(context.Context, string, uint64) error { return tc.err })
			srv := newFencedServer(t, g, WithLogger(logger))
			resp, err := fencedClient("orders/42", 5).Post(srv.URL, "text/plain", nil)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = resp.Body.Close() }()
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d; want %d", resp.StatusCode, tc.status)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body = io.NopCloser(bytes.NewReader(body))
			p := decodeProblem(t, resp)
			if p["type"] != tc.typ {
				t.Errorf("type = %v; want %v", p["type"], tc.typ)
			}
			if tc.hideText != "" && strings.Contains(string(body), tc.hideText) {
				t.Errorf("internal error text reached the client: %s", body)
			}
			if got := strings.Contains(logBuf.String(), "guard failed"); got != tc.logged {
				t.Errorf("logged = %v; want %v (log: %q)", got, tc.logged, logBuf.String())
			}
			if srv.calls.Load() != 0 {
				t.Error("handler ran although the guard failed")
			}
		})
	}
}

func TestHTTPWithResource(t *testing.T) {
	mux := http.NewServeMux()
	var calls atomic.Int64
	mw := Middleware(NewMemory(), WithResource(func(r *http.Request, lock string) (string, error) {
		id := r.PathValue("id")
		if id == "bad" {
			return "", errors.New("no such order")
		}
		return "order-row/" + id, nil
	}))
	mux.Handle("PUT /orders/{id}", mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
	})))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	put := func(path string, token uint64) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPut, srv.URL+path, nil)
		resp, err := fencedClient("orders", token).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = resp.Body.Close() })
		return resp
	}
	if resp := put("/orders/1", 10); resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	// Another resource under the same lock has its own highest token.
	if resp := put("/orders/2", 9); resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	resp := put("/orders/1", 9)
	wantStale(t, ProblemFromResponse(resp), "order-row/1", 9, 10)
	if resp := put("/orders/bad", 11); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("mapping error: status %d; want 400", resp.StatusCode)
	}
	if n := calls.Load(); n != 2 {
		t.Errorf("handler ran %d times; want 2", n)
	}
}

// closeTracker is a request body that records whether it was closed.
type closeTracker struct {
	io.Reader
	closed atomic.Bool
}

func (c *closeTracker) Close() error { c.closed.Store(true); return nil }

// roundTripFunc adapts a function to http.RoundTripper.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestTransport(t *testing.T) {
	var sent []*http.Request
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		sent = append(sent, r)
		return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody, Request: r}, nil
	})
	token := func(lock string, tok uint64, ok bool) func() (string, uint64, bool) {
		return func() (string, uint64, bool) { return lock, tok, ok }
	}

	req, _ := http.NewRequest(http.MethodPost, "http://example.invalid/x", nil)
	req.Header.Set(HeaderName, "caller=1")
	req.Header.Set("X-Other", "kept")
	tr := &Transport{Base: base, Token: token("orders/42", 34, true)}
	if _, err := tr.RoundTrip(req); err != nil {
		t.Fatal(err)
	}
	if got := req.Header.Values(HeaderName); len(got) != 1 || got[0] != "caller=1" {
		t.Errorf("caller's request was modified: %v", got)
	}
	if len(sent) != 1 || sent[0] == req {
		t.Fatalf("the caller's request itself was sent, or nothing was")
	}
	if got := sent[0].Header.Values(HeaderName); len(got) != 1 || got[0] != "orders/42=34" {
		t.Errorf("sent %s = %v; want [orders/42=34]", HeaderName, got)
	}
	if sent[0].Header.Get("X-Other") != "kept" {
		t.Error("other headers were not sent")
	}

	for _, tc := range []struct {
		name string
		tr   *Transport
		want error
	}{
		{"no lock held", &Transport{Base: base, Token: token("", 0, false)}, ErrNoToken},
		{"nil token func", &Transport{Base: base}, ErrNoToken},
		{"bad lock name", &Transport{Base: base, Token: token("orders 42", 1, true)}, ErrMalformedToken},
		{"token zero", &Transport{Base: base, Token: token("orders/42", 0, true)}, ErrMalformedToken},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sent = nil
			body := &closeTracker{Reader: strings.NewReader("payload")}
			req, _ := http.NewRequest(http.MethodPost, "http://example.invalid/x", body)
			_, err := (&http.Client{Transport: tc.tr}).Do(req)
			if !errors.Is(err, tc.want) {
				t.Errorf("err = %v; want %v", err, tc.want)
			}
			if len(sent) != 0 {
				t.Error("a request was sent without a valid token")
			}
			if !body.closed.Load() {
				t.Error("request body was not closed")
			}
		})
	}
}

func TestProblemFromResponseIgnoresOthers(t *testing.T) {
	mk := func(status int, ct, body string) *http.Response {
		return &http.Response{StatusCode: status, Header: http.Header{"Content-Type": {ct}},
			Body: io.NopCloser(strings.NewReader(body))}
	}
	for _, tc := range []struct {
		name string
		resp *http.Response
	}{
		{"nil", nil},
		{"ok", mk(200, "application/problem+json", `{"type":"`+ProblemStale+`","status":200}`)},
		{"plain 409", mk(409, "text/plain", "conflict")},
		{"other problem", mk(409, "application/problem+json", `{"type":"urn:x","status":409}`)},
		{"not json", mk(409, "application/problem+json", `{`)},
		{"status mismatch", mk(409, "application/problem+json", `{"type":"`+ProblemStale+`","status":400,"token":1,"highest":2}`)},
		{"highest not higher", mk(409, "application/problem+json", `{"type":"`+ProblemStale+`","status":409,"token":2,"highest":2}`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := ProblemFromResponse(tc.resp); err != nil {
				t.Errorf("ProblemFromResponse = %v; want nil", err)
			}
			if tc.resp != nil && tc.resp.StatusCode == 409 {
				// The body is still there for the caller.
				b, _ := io.ReadAll(tc.resp.Body)
				if len(b) == 0 {
					t.Error("body was consumed")
				}
			}
		})
	}
}
