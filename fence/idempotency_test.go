package fence

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/internal/testnode"
)

// idemServer serves handler behind Idempotency backed by a leasehold node.
func idemServer(t *testing.T, handler http.Handler, opts ...Option) (*httptest.Server, *client.Client) {
	t.Helper()
	node := testnode.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, node.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	opts = append(opts, WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	hs := httptest.NewServer(Idempotency(c, opts...)(handler))
	t.Cleanup(hs.Close)
	return hs, c
}

type idemAnswer struct {
	status int
	header http.Header
	body   string
	p      problem
}

func send(t *testing.T, url, method, body string, keys ...string) idemAnswer {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		req.Header.Add(IdempotencyKeyHeader, k)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	a := idemAnswer{status: resp.StatusCode, header: resp.Header, body: string(b)}
	if resp.Header.Get("Content-Type") == "application/problem+json" {
		if err := json.Unmarshal(b, &a.p); err != nil {
			t.Fatalf("problem body %q: %v", b, err)
		}
	}
	return a
}

// TestIdempotencyMiddleware: the IETF draft's semantics over a leasehold store — the
// first request runs the handler, a retry replays its response (status, kept headers,
// body) without running it, a request while the first runs gets 409, a different
// request with the same key gets 422, and malformed, missing and oversized input get
// 400 and 413 without the handler.
func TestIdempotencyMiddleware(t *testing.T) {
	var runs atomic.Int32
	release := make(chan struct{})
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		b, _ := io.ReadAll(r.Body)
		if r.URL.Path == "/slow" {
			<-release
		}
		if r.URL.Path == "/big" {
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write(bytes.Repeat([]byte("x"), 40<<10))
			return
		}
		w.Header().Set("Location", "/orders/"+string(b))
		w.Header().Set("Set-Cookie", "per=request")
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "created "+string(b)+" in run "+string(rune('0'+n)))
	})
	hs, _ := idemServer(t, handler)

	first := send(t, hs.URL+"/orders", "POST", "42", "8e03978e-40d5-43e8-bc93-6894a57f9324")
	if first.status != http.StatusCreated || first.body != "created 42 in run 1" || first.header.Get(ReplayedHeader) != "" {
		t.Fatalf("first: %d %q %v", first.status, first.body, first.header)
	}
	for _, k := range []string{"8e03978e-40d5-43e8-bc93-6894a57f9324", `"8e03978e-40d5-43e8-bc93-6894a57f9324"`} {
		again := send(t, hs.URL+"/orders", "POST", "42", k)
		if again.status != http.StatusCreated || again.body != first.body || again.header.Get(ReplayedHeader) != "true" ||
			again.header.Get("Location") != "/orders/42" || again.header.Get("Content-Type") != "text/plain" || again.header.Get("Set-Cookie") != "" {
			t.Fatalf("retry with %s: %d %q %v", k, again.status, again.body, again.header)
		}
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("the handler ran %d times", n)
	}
	for _, other := range []struct{ method, path, body string }{{"POST", "/orders", "43"}, {"PATCH", "/orders", "42"}, {"POST", "/orders?x=1", "42"}} {
		if a := send(t, hs.URL+other.path, other.method, other.body, "8e03978e-40d5-43e8-bc93-6894a57f9324"); a.status != http.StatusUnprocessableEntity || a.p.Type != ProblemKeyReused {
			t.Fatalf("%v with the same key: %d %+v", other, a.status, a.p)
		}
	}

	// In progress: 409 with Retry-After, then the first finishes and is replayed.
	done := make(chan idemAnswer)
	go func() { done <- send(t, hs.URL+"/slow", "POST", "", "slow-1") }()
	deadline := time.Now().Add(10 * time.Second)
	for runs.Load() < 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	busy := send(t, hs.URL+"/slow", "POST", "", "slow-1")
	if busy.status != http.StatusConflict || busy.p.Type != ProblemKeyInProgress || busy.header.Get("Retry-After") == "" || busy.p.Key != "slow-1" {
		t.Fatalf("while in progress: %d %+v %v", busy.status, busy.p, busy.header)
	}
	close(release)
	if a := <-done; a.status != http.StatusCreated {
		t.Fatalf("the slow request: %d %q", a.status, a.body)
	}
	if a := send(t, hs.URL+"/slow", "POST", "", "slow-1"); a.status != http.StatusCreated || a.header.Get(ReplayedHeader) != "true" {
		t.Fatalf("after the slow request: %d %v", a.status, a.header)
	}

	// A response too big to store: the first gets it whole, a replay its status only.
	if a := send(t, hs.URL+"/big", "POST", "", "big-1"); a.status != http.StatusOK || len(a.body) != 40<<10 {
		t.Fatalf("big: %d, %d bytes", a.status, len(a.body))
	}
	if a := send(t, hs.URL+"/big", "POST", "", "big-1"); a.status != http.StatusOK || a.body != "" || a.header.Get(ReplayedHeader) != "true" {
		t.Fatalf("big replayed: %d, %d bytes", a.status, len(a.body))
	}

	before := runs.Load()
	for name, keys := range map[string][]string{"two headers": {"a", "b"}, "bad character": {"a b"}, "empty": {`""`}, "unterminated": {`"abc`}, "too long": {strings.Repeat("k", 201)}} {
		if a := send(t, hs.URL+"/orders", "POST", "1", keys...); a.status != http.StatusBadRequest || a.p.Type != ProblemKeyMalformed {
			t.Errorf("%s: %d %+v", name, a.status, a.p)
		}
	}
	if a := send(t, hs.URL+"/orders", "POST", strings.Repeat("b", 1<<20+1), "huge"); a.status != http.StatusRequestEntityTooLarge || a.p.Type != ProblemBodyTooLarge {
		t.Errorf("huge body: %d %+v", a.status, a.p)
	}
	if n := runs.Load(); n != before {
		t.Errorf("the handler ran for rejected requests (%d runs)", n-before)
	}
	// Not covered: no header, or a GET.
	send(t, hs.URL+"/orders", "POST", "1")
	send(t, hs.URL+"/orders", "GET", "", "get-key")
	send(t, hs.URL+"/orders", "GET", "", "get-key")
	if n := runs.Load(); n != before+3 {
		t.Errorf("requests without a key, or GETs, ran %d times, want 3", n-before)
	}
}

// TestIdempotencyKeyRequired: with WithKeyRequired a covered request without the header
// gets 400; WithKeyPrefix places the keys in the store.
func TestIdempotencyKeyRequired(t *testing.T) {
	hs, c := idemServer(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }),
		WithKeyRequired(), WithKeyPrefix("svc/a/"), WithKeyMethods("POST", "DELETE"))
	if a := send(t, hs.URL, "DELETE", ""); a.status != http.StatusBadRequest || a.p.Type != ProblemKeyMissing {
		t.Fatalf("DELETE without a key: %d %+v", a.status, a.p)
	}
	if a := send(t, hs.URL, "DELETE", "", "k1"); a.status != http.StatusOK || a.body != "ok" {
		t.Fatalf("DELETE with a key: %d %q", a.status, a.body)
	}
	k, err := c.Key(context.Background(), "svc/a/k1")
	if err != nil || k.Status != client.KeyDone {
		t.Fatalf("the stored key: %+v %v", k, err)
	}
}

// TestIdempotencyHandlerPanics: a handler that panics stores nothing; the retry runs it.
func TestIdempotencyHandlerPanics(t *testing.T) {
	var runs atomic.Int32
	hs, _ := idemServer(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if runs.Add(1) == 1 {
			panic(http.ErrAbortHandler)
		}
		_, _ = io.WriteString(w, "second")
	}))
	req, _ := http.NewRequest("POST", hs.URL, nil)
	req.Header.Set(IdempotencyKeyHeader, "p1")
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("the panicking request answered %d", resp.StatusCode)
	}
	if a := send(t, hs.URL, "POST", "", "p1"); a.status != http.StatusOK || a.body != "second" {
		t.Fatalf("retry after a panic: %d %q", a.status, a.body)
	}
}

// failingStore fails every call, like a store that cannot be reached.
type failingStore struct{ err error }

func (f failingStore) Once(context.Context, string, func(context.Context, uint64) ([]byte, error)) ([]byte, error) {
	return nil, f.err
}

// TestIdempotencyStoreFails: a store that fails before the handler ran is 503, and the
// handler does not run.
func TestIdempotencyStoreFails(t *testing.T) {
	for _, err := range []error{errors.New("store down"), context.DeadlineExceeded} {
		h := Idempotency(failingStore{err}, WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
			t.Error("the handler ran")
		}))
		w := httptest.NewRecorder()
		r := httptest.NewRequest("POST", "/", nil)
		r.Header.Set(IdempotencyKeyHeader, "k")
		h.ServeHTTP(w, r)
		if w.Code != http.StatusServiceUnavailable || !strings.Contains(w.Body.String(), ProblemCheckFailed) {
			t.Errorf("%v: %d %s", err, w.Code, w.Body)
		}
	}
}
