package e2e

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/leasehold/leasehold/client"
)

// grant is one acknowledged Lock: called at call, acknowledged at ack. released is the
// time Unlock was called when it then succeeded (zero otherwise).
type grant struct {
	worker   int
	name     string
	token    uint64
	call     time.Time
	ack      time.Time
	released time.Time
}

// history collects what the workers saw.
type history struct {
	mu     sync.Mutex
	grants []grant
	lost   int // Unlocks that reported the lock lost
	failed int // Lock calls that failed
	// broken lists Lock calls that failed otherwise than with ErrNotAcquired, although
	// Lock retries while no server is available until its context (8s) ends.
	broken []string
	// reissued lists locks an Unlock reported lost that the same client's next Lock
	// on that name was granted again under the same token.
	reissued []string
	// unsure lists Unlocks that reported ErrLockLost although neither the lock's
	// context nor the server said the lock was lost.
	unsure []string
	start  time.Time // times in messages are relative to it
}

func (h *history) rel(at time.Time) time.Duration { return at.Sub(h.start).Round(time.Millisecond) }

func (h *history) add(g grant) {
	h.mu.Lock()
	h.grants = append(h.grants, g)
	h.mu.Unlock()
}

// TestKill9NoTokenLostOrReused (G1, G3): 32 clients (odd-numbered ones over Connect
// only, the others over the fast lane) take and release correctness locks on 8 names; mid-run the server is killed with SIGKILL and restarted on the same data
// dir while the clients keep going. No acknowledged token may appear twice; a grant
// acknowledged before another is called carries a smaller token; every grant called
// after the restart is above every token acknowledged before the kill; the restarted
// server's last token covers them all; a lock held at the kill is still held, under the
// same token, after the restart; and no two acknowledged holds of one name overlap.
func TestKill9NoTokenLostOrReused(t *testing.T) {
	s := StartServer(t)
	const (
		workers = 32
		names   = 8
		ttl     = 2 * time.Second
		before  = 3 * time.Second // of load before the kill
		after   = 3 * time.Second // of load after the restart
	)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// A lock held across the kill, by a client whose lease outlives the downtime.
	sentinel := s.Client(t, client.WithTTL(30*time.Second))

	h := &history{start: time.Now()}
	var stop atomic.Bool
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runWorker(ctx, t, s.Addr, w, names, ttl, h, &stop)
		}()
	}

	time.Sleep(before)
	sentinelCall := time.Now()
	sl, err := sentinel.Lock(ctx, "e2e/kill9/sentinel", client.Correctness, client.TryOnce)
	sentinelAck := time.Now()
	if err != nil {
		t.Fatalf("sentinel lock: %v", err)
	}
	killed := time.Now()
	s.Kill9()
	h.mu.Lock()
	beforeKill := len(h.grants)
	var maxBefore uint64
	for _, g := range h.grants {
		if g.ack.Before(killed) {
			maxBefore = max(maxBefore, g.token)
		}
	}
	h.mu.Unlock()
	maxBefore = max(maxBefore, sl.Token())
	time.Sleep(200 * time.Millisecond) // the clients notice the server is gone
	s.Restart()
	restarted := time.Now()
	t.Logf("killed after %d grants (max token %d); down for %v", beforeKill, maxBefore, restarted.Sub(killed).Round(time.Millisecond))

	// G3: the lock acknowledged before the kill is still held, under the same token.
	info, err := sentinel.Describe(ctx, "e2e/kill9/sentinel")
	if err != nil {
		t.Fatalf("describe sentinel after restart: %v", err)
	}
	if !info.GetHeld() || info.GetToken() != sl.Token() {
		t.Errorf("G3: sentinel lock after restart: held=%v token=%d, want held under %d", info.GetHeld(), info.GetToken(), sl.Token())
	}

	time.Sleep(after)
	stop.Store(true)
	waited := make(chan struct{})
	go func() { wg.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(30 * time.Second):
		t.Fatalf("workers did not stop within 30s; their goroutines:\n%s", stacksWith("runWorker"))
	}

	// The sentinel's session survived the downtime (TTL 30s): still held, and released.
	if err := sl.Context().Err(); err != nil {
		t.Errorf("sentinel lock context ended: %v", context.Cause(sl.Context()))
	}
	if cur, err := sentinel.CheckToken(ctx, "e2e/kill9/sentinel", sl.Token()); err != nil || !cur {
		t.Errorf("CheckToken(sentinel %d) = %v, %v; want true", sl.Token(), cur, err)
	}
	if err := sl.Unlock(ctx); err != nil {
		t.Errorf("sentinel unlock: %v", err)
	}

	h.mu.Lock()
	grants := append([]grant(nil), h.grants...)
	lost, failed := h.lost, h.failed
	broken, reissued, unsure := h.broken, h.reissued, h.unsure
	h.mu.Unlock()
	t.Logf("killed at %v, serving again at %v (times below are relative to the kill)", h.rel(killed), h.rel(restarted))
	// Lock retries while no server answers, until its context ends (8s here, the
	// server is down for about a second): it must not fail because of the kill.
	for i, b := range broken {
		if i == 5 {
			t.Errorf("... %d Lock calls failed in all", len(broken))
			break
		}
		t.Errorf("client: Lock failed during the kill although its context was alive: %s", b)
	}
	// A lock Unlock reported lost must really be gone: if the same client's next Lock
	// gets the same grant back, the release never happened and the client's live lease
	// kept the lock while the client believed it lost (and the same token is handed out
	// a second time, after larger ones).
	for i, u := range unsure {
		if i == 5 {
			t.Errorf("... %d such Unlocks in all", len(unsure))
			break
		}
		t.Errorf("client: Unlock reported ErrLockLost when the server did not answer (the outcome is unknown: ErrUnavailable or a retry is due): %s", u)
	}
	for _, r := range reissued {
		t.Errorf("client: Unlock reported a lock lost that its lease still held: %s", r)
	}
	grants = append(grants, grant{worker: -1, name: "e2e/kill9/sentinel", token: sl.Token(), call: sentinelCall, ack: sentinelAck})
	var afterRestart int
	for _, g := range grants {
		if g.call.After(restarted) {
			afterRestart++
		}
	}
	t.Logf("%d grants acknowledged (%d called after the restart), %d unlocks found the lock lost, %d lock calls failed",
		len(grants), afterRestart, lost, failed)
	if beforeKill < 50 || afterRestart < 50 {
		t.Errorf("too little load to mean anything: %d grants before the kill, %d called after the restart", beforeKill, afterRestart)
	}
	checkGrants(t, grants, killed, restarted)

	// The restarted server's sequence covers every acknowledged token.
	var maxTok uint64
	for _, g := range grants {
		maxTok = max(maxTok, g.token)
	}
	st, err := sentinel.Status(ctx)
	if err != nil {
		t.Fatalf("status: %v", err)
	}
	if st.GetLastToken() < maxTok {
		t.Errorf("G1: Status last_token %d < max acknowledged token %d", st.GetLastToken(), maxTok)
	}
	r := RunCLI(t, 10*time.Second, "status", "--addr", s.Addr)
	m := regexp.MustCompile(`(?m)^last token\s+(\d+)\s*$`).FindStringSubmatch(r.Stdout)
	if r.Code != 0 || m == nil {
		t.Fatalf("leasehold status: exit %d, stdout %q, stderr %q", r.Code, r.Stdout, r.Stderr)
	}
	if n, _ := strconv.ParseUint(m[1], 10, 64); n < maxTok {
		t.Errorf("G1: `leasehold status` last token %d < max acknowledged token %d", n, maxTok)
	}
}

// runWorker loops Lock/Unlock on random names until stop, recording every acknowledged
// grant. After any outcome it cannot be sure of (a failed Lock, an Unlock that did not
// answer) it closes its client and dials a new one, so that its next Lock runs on a new
// lease: Lock is idempotent per lease, and a retry on the old lease could legitimately
// return an older grant that was never acknowledged. After an Unlock that reports the
// lock lost, the next Lock goes to the same name on the same client: it must not get the
// lost grant back.
func runWorker(ctx context.Context, t *testing.T, addr string, w, names int, ttl time.Duration, h *history, stop *atomic.Bool) {
	var c *client.Client
	closeClient := func() {
		if c != nil {
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			_ = c.Close(cctx)
			cancel()
			c = nil
		}
	}
	defer closeClient()
	who := fmt.Sprintf("worker %d (fast lane)", w)
	if w%2 == 1 {
		who = fmt.Sprintf("worker %d (Connect)", w)
	}
	var lostTok uint64 // token of the lock the last Unlock reported lost
	lostName := ""
	for !stop.Load() && ctx.Err() == nil {
		if c == nil {
			dctx, cancel := context.WithTimeout(ctx, time.Second)
			var err error
			opts := []client.Option{client.WithTTL(ttl)}
			if w%2 == 1 {
				opts = append(opts, client.WithoutFastLane()) // half the workers use Connect only
			}
			c, err = client.Dial(dctx, addr, opts...)
			cancel()
			if err != nil {
				c = nil
				time.Sleep(50 * time.Millisecond) // the server is down
				continue
			}
		}
		name := fmt.Sprintf("e2e/kill9/%d", rand.IntN(names))
		if lostName != "" {
			name = lostName
		}
		lctx, cancel := context.WithTimeout(ctx, 8*time.Second)
		call := time.Now()
		l, err := c.Lock(lctx, name, client.Correctness, client.LockTTL(ttl), client.WaitFor(2*time.Second))
		ack := time.Now()
		cancel()
		relock := lostName != ""
		lostName = ""
		if err != nil {
			h.mu.Lock()
			h.failed++
			if !errors.Is(err, client.ErrNotAcquired) {
				h.broken = append(h.broken, fmt.Sprintf("%s: Lock(%s) called at %v failed after %v: %v",
					who, name, h.rel(call), ack.Sub(call).Round(time.Millisecond), err))
			}
			h.mu.Unlock()
			if !errors.Is(err, client.ErrNotAcquired) {
				closeClient()
			}
			continue
		}
		g := grant{worker: w, name: name, token: l.Token(), call: call, ack: ack}
		if relock && l.Token() == lostTok {
			h.mu.Lock()
			h.reissued = append(h.reissued, fmt.Sprintf("%s: %s token %d reported lost by Unlock, granted again to the same client at %v",
				who, name, lostTok, h.rel(ack)))
			h.mu.Unlock()
		}
		time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
		uctx, cancel := context.WithTimeout(ctx, 8*time.Second)
		release := time.Now()
		err = l.Unlock(uctx)
		cancel()
		switch {
		case err == nil:
			g.released = release
		case errors.Is(err, client.ErrLockLost):
			h.mu.Lock()
			h.lost++
			if !lostForSure(err) {
				h.unsure = append(h.unsure, fmt.Sprintf("%s: Unlock(%s) token %d at %v: %v", who, name, g.token, h.rel(release), err))
			}
			h.mu.Unlock()
			lostName, lostTok = name, g.token
		default:
			closeClient()
		}
		h.add(g)
	}
}

// lostForSure reports whether an Unlock error that wraps ErrLockLost says why the lock
// is gone: one of the lock context's causes, or the server's answer that the lease is
// unknown (NotFound) or does not hold the lock (FailedPrecondition). A transport failure
// is no such answer.
func lostForSure(err error) bool {
	for _, cause := range []error{client.ErrLeaseExpired, client.ErrLeaseRevoked, client.ErrLeaseDeadline, client.ErrReleasedByOperator, client.ErrStateLost} {
		if errors.Is(err, cause) {
			return true
		}
	}
	switch connect.CodeOf(err) {
	case connect.CodeNotFound, connect.CodeFailedPrecondition:
		return true
	}
	return false
}

// checkGrants checks the invariants of G1 and G2 on acknowledged grants.
func checkGrants(t *testing.T, grants []grant, killed, restarted time.Time) {
	t.Helper()
	// No token is acknowledged twice, whatever the name.
	byToken := make(map[uint64]grant, len(grants))
	for _, g := range grants {
		if o, dup := byToken[g.token]; dup {
			t.Errorf("G1: token %d acknowledged twice: %s to worker %d at %v and %s to worker %d at %v",
				g.token, o.name, o.worker, o.ack.Sub(killed), g.name, g.worker, g.ack.Sub(killed))
		}
		byToken[g.token] = g
	}

	// Real-time order: a grant acknowledged before another was called has a smaller
	// token (one sequence per cluster, so across names too).
	byAck := slices.Clone(grants)
	slices.SortFunc(byAck, func(a, b grant) int { return a.ack.Compare(b.ack) })
	prefixMax := make([]grant, len(byAck)) // grant with the largest token among byAck[:i+1]
	for i, g := range byAck {
		prefixMax[i] = g
		if i > 0 && prefixMax[i-1].token > g.token {
			prefixMax[i] = prefixMax[i-1]
		}
	}
	violations := 0
	for _, g := range grants {
		// Grants acknowledged strictly before g was called.
		i, _ := slices.BinarySearchFunc(byAck, g.call, func(a grant, t time.Time) int {
			if a.ack.Before(t) {
				return -1
			}
			return 1
		})
		if i == 0 {
			continue
		}
		if p := prefixMax[i-1]; p.token >= g.token {
			violations++
			if violations <= 5 {
				t.Errorf("G1: token %d (%s, worker %d, called %v) is not above token %d (%s, worker %d) acknowledged before that call at %v",
					g.token, g.name, g.worker, g.call.Sub(killed), p.token, p.name, p.worker, p.ack.Sub(killed))
			}
		}
	}
	if violations > 5 {
		t.Errorf("G1: %d real-time order violations in all", violations)
	}

	// Across the kill: every grant called after the restart is above every token
	// acknowledged before the kill.
	var maxBefore uint64
	for _, g := range grants {
		if g.ack.Before(killed) {
			maxBefore = max(maxBefore, g.token)
		}
	}
	for _, g := range grants {
		if g.call.After(restarted) && g.token <= maxBefore {
			t.Errorf("G1/G3: token %d granted after the restart is not above %d, acknowledged before the kill", g.token, maxBefore)
		}
	}

	// G2 as the clients see it: for one name, the spans from acknowledgement to the
	// Unlock call of cleanly released grants never overlap.
	byName := make(map[string][]grant)
	for _, g := range grants {
		if !g.released.IsZero() {
			byName[g.name] = append(byName[g.name], g)
		}
	}
	for name, gs := range byName {
		slices.SortFunc(gs, func(a, b grant) int { return a.ack.Compare(b.ack) })
		cover := gs[0] // the earlier grant released last
		for _, g := range gs[1:] {
			if g.ack.Before(cover.released) {
				t.Errorf("G2: %s: token %d (worker %d) acknowledged at %v while token %d (worker %d) was held until %v",
					name, g.token, g.worker, g.ack.Sub(killed), cover.token, cover.worker, cover.released.Sub(killed))
			}
			if g.released.After(cover.released) {
				cover = g
			}
		}
	}
}
