package e2e

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/leasehold/leasehold/client"
)

// startHolder starts test/cmd/pauseclient holding lock name with ttl and returns it
// with its token and the time just before it was started.
func startHolder(t *testing.T, s *Server, name string, ttl time.Duration) (*Proc, uint64, time.Time) {
	t.Helper()
	started := time.Now()
	a := StartProc(t, pauseclientBin, "--addr", s.Addr, "--name", name, "--ttl", ttl.String())
	line := a.Expect("TOKEN ", 15*time.Second)
	tok, err := strconv.ParseUint(strings.TrimPrefix(line.Text, "TOKEN "), 10, 64)
	if err != nil || tok == 0 {
		t.Fatalf("holder printed %q: want TOKEN <positive number>", line.Text)
	}
	return a, tok, started
}

// TestPauseScenario is the pause scenario with real processes (G4, G4b): holder A is
// stopped with SIGSTOP well past its TTL; B must get the lock, with a larger token,
// while A is stopped; when A runs again its lock Context must report the loss at once
// (its Err checks the clock), before A performs another write.
func TestPauseScenario(t *testing.T) {
	s := StartServer(t)
	const (
		name  = "e2e/pause/ledger"
		ttl   = time.Second
		pause = 2500 * time.Millisecond
	)
	a, tokA, _ := startHolder(t, s, name, ttl)
	// Let A renew a few times so the pause hits a lease in its steady state.
	time.Sleep(400 * time.Millisecond)
	select {
	case l := <-a.Lines:
		t.Fatalf("holder reported %q before it was paused", l.Text)
	default:
	}

	a.Signal(syscall.SIGSTOP)
	stopped := time.Now()
	resumed := false
	defer func() {
		if !resumed {
			_ = syscall.Kill(a.Pid(), syscall.SIGCONT)
		}
	}()

	b := s.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lb, err := b.Lock(ctx, name, client.Correctness, client.LockTTL(10*time.Second), client.WaitFor(5*time.Second))
	gotB := time.Now()
	if err != nil {
		t.Fatalf("B could not take %s while A was stopped: %v", name, err)
	}
	t.Logf("A token %d stopped at 0; B got token %d after %v", tokA, lb.Token(), gotB.Sub(stopped).Round(time.Millisecond))
	if lb.Token() <= tokA {
		t.Errorf("G1: B's token %d is not larger than A's %d", lb.Token(), tokA)
	}
	if w := gotB.Sub(stopped); w > ttl+time.Second {
		t.Errorf("B waited %v for the lock after A stopped; A's lease should expire within TTL %v of its last keepalive", w, ttl)
	}
	if cur, err := b.CheckToken(ctx, name, tokA); err != nil || cur {
		t.Errorf("CheckToken(A's token %d) = %v, %v after B's grant; want false", tokA, cur, err)
	}

	// Keep A stopped for the whole pause, and make sure B's grant came while it was.
	time.Sleep(time.Until(stopped.Add(pause)))
	a.Signal(syscall.SIGCONT)
	resumed = true
	cont := time.Now()

	var lost Line
	for lost.Text == "" {
		select {
		case l, ok := <-a.Lines:
			if !ok {
				t.Fatalf("holder exited without reporting LOST; stderr:\n%s", a.Stderr())
			}
			switch f := strings.Fields(l.Text); f[0] {
			case "PAUSED":
			case "LATE-WRITE":
				// SIGSTOP landed between the holder's check and its write: the window
				// only a fencing resource closes. Not a client bug.
				t.Logf("holder: %s (the pause fell between its check and its write)", l.Text)
			case "WROTE-AFTER-RESUME":
				t.Errorf("G4b: holder wrote after it resumed although its lock was lost: %s", l.Text)
			case "LOST":
				lost = l
			default:
				t.Errorf("holder printed unexpected line %q", l.Text)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("holder did not report LOST within 5s of SIGCONT; stdout %q; stderr:\n%s", a.Stdout(), a.Stderr())
		}
	}
	f := strings.Fields(lost.Text)
	if len(f) < 3 {
		t.Fatalf("bad LOST line %q", lost.Text)
	}
	t.Logf("holder: %q, read %v after SIGCONT", lost.Text, lost.At.Sub(cont).Round(time.Millisecond))
	if ms, err := strconv.ParseInt(f[1], 10, 64); err != nil || ms > 200 {
		t.Errorf("G4b: holder saw the loss %s ms after it first ran again; want < 200ms (Context().Err checks the clock)", f[1])
	}
	if d := lost.At.Sub(cont); d > 500*time.Millisecond {
		t.Errorf("G4b: LOST reached the test %v after SIGCONT; want < 500ms", d)
	}
	if f[2] != "deadline" && f[2] != "expired" {
		t.Errorf("G4b: cause %q, want ErrLeaseDeadline or ErrLeaseExpired", strings.Join(f[2:], " "))
	}
	if code := a.Wait(5 * time.Second); code != 0 {
		t.Errorf("holder exited %d", code)
	}

	// B still holds the lock and can release it.
	if err := lb.Context().Err(); err != nil {
		t.Errorf("B's lock context ended: %v", context.Cause(lb.Context()))
	}
	if err := lb.Unlock(ctx); err != nil {
		t.Errorf("B's unlock: %v", err)
	}
}

// TestPauseScenarioKilledHolder: a holder killed with SIGKILL cannot release its lock;
// the lock must free when its lease expires — not before the TTL counted from the lease's
// last keepalive (G4), and not much later.
func TestPauseScenarioKilledHolder(t *testing.T) {
	s := StartServer(t)
	const (
		name = "e2e/pause/killed"
		ttl  = time.Second
	)
	a, tokA, started := startHolder(t, s, name, ttl)
	b := s.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	a.Signal(syscall.SIGKILL)
	killed := time.Now()
	a.Wait(5 * time.Second)
	described := time.Now()
	info, err := b.Describe(ctx, name)
	if err != nil {
		t.Fatalf("describe: %v", err)
	}
	if !info.GetHeld() || info.GetToken() != tokA {
		t.Fatalf("right after A was killed: held=%v token=%d, want held by A's token %d", info.GetHeld(), info.GetToken(), tokA)
	}
	left := time.Duration(info.GetTtlRemainingMs()) * time.Millisecond

	lb, err := b.Lock(ctx, name, client.Correctness, client.LockTTL(10*time.Second), client.WaitFor(5*time.Second))
	gotB := time.Now()
	if err != nil {
		t.Fatalf("B could not take %s after A was killed: %v", name, err)
	}
	t.Logf("A started, token %d, killed %v later; server reported %v left; B got token %d %v after the kill",
		tokA, killed.Sub(started).Round(time.Millisecond), left, lb.Token(), gotB.Sub(killed).Round(time.Millisecond))
	if lb.Token() <= tokA {
		t.Errorf("G1: B's token %d is not larger than A's %d", lb.Token(), tokA)
	}
	// A's lease was granted after A started, so it cannot expire before started+TTL.
	if gotB.Before(started.Add(ttl)) {
		t.Errorf("G4: B got the lock %v after A started; A's lease (TTL %v, granted after A started) expired early",
			gotB.Sub(started), ttl)
	}
	// The server said the lease had `left` to live when it answered Describe.
	if gotB.Before(described.Add(left)) {
		t.Errorf("G4: B got the lock %v after Describe, which reported %v of TTL left", gotB.Sub(described), left)
	}
	if w := gotB.Sub(killed); w > ttl+time.Second {
		t.Errorf("B got the lock %v after A was killed; want within TTL %v + 1s", w, ttl)
	}
	if err := lb.Unlock(ctx); err != nil {
		t.Errorf("B's unlock: %v", err)
	}
}

// keepAliveRecorder wraps an HTTP transport and records when each KeepAlive call was
// sent and whether it was answered with success.
type keepAliveRecorder struct {
	next http.RoundTripper

	mu      sync.Mutex
	lastAck time.Time // send time of the last KeepAlive answered 200
	acks    int
}

func (r *keepAliveRecorder) RoundTrip(req *http.Request) (*http.Response, error) {
	if !strings.HasSuffix(req.URL.Path, "/KeepAlive") {
		return r.next.RoundTrip(req)
	}
	sent := time.Now()
	resp, err := r.next.RoundTrip(req)
	if err == nil && resp.StatusCode == http.StatusOK {
		r.mu.Lock()
		if sent.After(r.lastAck) {
			r.lastAck = sent
		}
		r.acks++
		r.mu.Unlock()
	}
	return resp, err
}

func (r *keepAliveRecorder) last() (time.Time, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lastAck, r.acks
}

// TestHolderHearsBeforeServerExpires (G4b): the SERVER is stopped while a client holds a
// correctness lock. The client's lock Context must be cancelled with ErrLeaseDeadline
// while the server is still stopped, before the server could possibly expire the lease,
// and not much earlier than the safety margin requires.
//
// Over Connect the test sees every keepalive (a wrapped HTTP transport) and checks the
// exact window: cancelled within [TTL-margin-slack, TTL) of the send time of the last
// acknowledged keepalive. Over the fast lane it checks the window the stop time implies.
func TestHolderHearsBeforeServerExpires(t *testing.T) {
	t.Run("connect", func(t *testing.T) { testHolderHearsFirst(t, true) })
	t.Run("fastlane", func(t *testing.T) { testHolderHearsFirst(t, false) })
}

func testHolderHearsFirst(t *testing.T, viaConnect bool) {
	s := StartServer(t)
	const (
		ttl    = time.Second
		margin = ttl / 5 // the client's default safety margin
		pause  = 3 * time.Second
		every  = ttl / 3 * 11 / 10 // the longest keepalive interval (TTL/3 + 10% jitter)
	)
	opts := []client.Option{client.WithTTL(ttl)}
	var rec *keepAliveRecorder
	if viaConnect {
		tr := &http.Transport{Protocols: new(http.Protocols)}
		tr.Protocols.SetUnencryptedHTTP2(true)
		tr.HTTP2 = &http.HTTP2Config{PingTimeout: 2 * time.Second, SendPingTimeout: 5 * time.Second}
		rec = &keepAliveRecorder{next: tr}
		opts = append(opts, client.WithoutFastLane(), client.WithHTTPClient(&http.Client{Transport: rec}))
	}
	c := s.Client(t, opts...)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := c.Lock(ctx, "e2e/hears-first", client.Correctness, client.LockTTL(ttl))
	if err != nil {
		t.Fatalf("lock: %v", err)
	}
	cancelled := make(chan time.Time, 1)
	go func() {
		<-l.Context().Done()
		cancelled <- time.Now()
	}()
	// Let a few keepalives go through.
	if rec != nil {
		if !eventually(3*time.Second, func() bool { _, n := rec.last(); return n >= 2 }) {
			t.Fatal("no two keepalives acknowledged within 3s")
		}
	} else {
		time.Sleep(ttl)
	}
	if err := l.Context().Err(); err != nil {
		t.Fatalf("lock lost before the server was stopped: %v", context.Cause(l.Context()))
	}

	s.Signal(syscall.SIGSTOP)
	stopped := time.Now()
	resumed := false
	defer func() {
		if !resumed {
			_ = syscall.Kill(s.Pid(), syscall.SIGCONT)
		}
	}()

	var at time.Time
	select {
	case at = <-cancelled:
	case <-time.After(pause):
	}
	s.Signal(syscall.SIGCONT)
	resumed = true
	if at.IsZero() {
		t.Fatalf("G4b: the lock Context was still live after the server had been stopped for %v (TTL %v)", pause, ttl)
	}
	cause := context.Cause(l.Context())
	if !errors.Is(cause, client.ErrLeaseDeadline) {
		t.Errorf("G4b: cause %v, want ErrLeaseDeadline", cause)
	}
	// The last acknowledged keepalive was sent before the stop, so the client's deadline
	// (its send time + TTL - margin) is at most stopped + TTL - margin.
	t.Logf("context cancelled %v after the server was stopped: %v", at.Sub(stopped).Round(time.Millisecond), cause)
	if d := at.Sub(stopped); d >= ttl-margin+100*time.Millisecond {
		t.Errorf("G4b: cancelled %v after the server was stopped; the cautious deadline is at most TTL-margin = %v after it", d, ttl-margin)
	}
	if d := at.Sub(stopped); d < ttl-margin-every-50*time.Millisecond {
		t.Errorf("G4b: cancelled only %v after the server was stopped: earlier than any keepalive schedule explains", d)
	}
	if rec != nil {
		lastAck, acks := rec.last()
		t.Logf("last acknowledged keepalive sent %v before the stop (%d acks); cancelled %v after it",
			stopped.Sub(lastAck).Round(time.Millisecond), acks, at.Sub(lastAck).Round(time.Millisecond))
		if lastAck.After(stopped) {
			t.Fatalf("a keepalive sent %v after the server was stopped was acknowledged", lastAck.Sub(stopped))
		}
		// The server counts the TTL from when it received the keepalive, which is after
		// it was sent: it cannot expire the lease before lastAck+TTL.
		if !at.Before(lastAck.Add(ttl)) {
			t.Errorf("G4b: cancelled %v after the last acknowledged keepalive was sent; the server may expire the lease from %v", at.Sub(lastAck), ttl)
		}
		if at.Before(lastAck.Add(ttl - margin - 50*time.Millisecond)) {
			t.Errorf("G4b: cancelled %v after the last acknowledged keepalive was sent; the cautious deadline is TTL-margin = %v", at.Sub(lastAck), ttl-margin)
		}
	}
	if err := l.Unlock(ctx); !errors.Is(err, client.ErrLockLost) {
		t.Errorf("Unlock after the loss = %v, want ErrLockLost", err)
	}
	// The service recovers: the lease expires on the server and the lock is free again.
	c2 := s.Client(t)
	l2, err := c2.Lock(ctx, "e2e/hears-first", client.Correctness, client.WaitFor(5*time.Second))
	if err != nil {
		t.Fatalf("lock after the server resumed: %v", err)
	}
	if l2.Token() <= l.Token() {
		t.Errorf("G1: token %d after %d", l2.Token(), l.Token())
	}
}
