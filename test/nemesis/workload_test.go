package nemesis

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"github.com/anishathalye/porcupine"
	"google.golang.org/protobuf/proto"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/client"
)

// The workload: N workers, each with its own client.Dial over all three nodes (or, for a
// quarter of them, a Session on another worker's client), run a
// mixed workload until stopped —
//
//   - a correctness Lock (short WaitFor) on one of a few locks, then 1–3 fenced Puts with
//     the grant's token on the key that lock guards (and sometimes a Get of it), then
//     Unlock;
//   - unfenced Puts and Gets of plain keys;
//   - compare-and-set Puts (IfVersion from a prior Get) of plain keys.
//
// Every KV operation goes into a porcupine history (call and return on one monotonic
// clock: time since the run began); every acknowledged grant becomes a Grant with its
// holding interval. Half the clients talk Connect through an observing HTTP client that
// also records lease grants, acknowledged keepalives and "lease gone" answers — the raw
// material of the G4 (no early expiry) check; the other half use the client's defaults
// (the fast lane, where the server offers one).

// ---- history ------------------------------------------------------------------------

// History is everything a run observed. Times are nanoseconds since start.
type History struct {
	start time.Time

	mu        sync.Mutex
	ops       []porcupine.Operation
	grants    []*Grant
	leases    map[string]*leaseObs
	leaseGone []leaseGoneObs
	counts    map[string]int
	events    []event
	notes     []string
	// unknownHolds are the locks held at the end under a token that no worker holds,
	// still so after every worker's lease could have ended (Finish).
	unknownHolds []string
}

func newHistory() *History {
	return &History{start: time.Now(), leases: map[string]*leaseObs{}, counts: map[string]int{}}
}

func (h *History) now() int64 { return int64(time.Since(h.start)) }

func (h *History) count(key string) {
	h.mu.Lock()
	h.counts[key]++
	h.mu.Unlock()
}

// note keeps the first few unexpected errors of each kind for the report.
func (h *History) note(kind string, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.counts["unexpected "+kind]++
	if h.counts["unexpected "+kind] <= 3 {
		h.notes = append(h.notes, fmt.Sprintf("+%v %s: %v", fmtT(h.now()), kind, err))
	}
}

// event records a fault-schedule step, for the report and for violation excerpts.
func (h *History) event(format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.events = append(h.events, event{at: h.now(), what: fmt.Sprintf(format, args...)})
}

type event struct {
	at   int64
	what string
}

func (h *History) addOp(op porcupine.Operation) {
	h.mu.Lock()
	h.ops = append(h.ops, op)
	h.mu.Unlock()
}

func (h *History) addGrant(g *Grant) {
	h.mu.Lock()
	h.grants = append(h.grants, g)
	h.mu.Unlock()
}

// leaseObs is what the observing clients saw of one lease.
type leaseObs struct {
	ttl     time.Duration
	lastAck int64 // send time of the latest acknowledged Grant or KeepAlive
	acks    int
}

// leaseGoneObs is a "lease not found" answer to a KeepAlive or an Acquire.
type leaseGoneObs struct {
	lease string
	at    int64 // when the answer arrived
	rpc   string
}

func (h *History) leaseAck(lease string, sent int64, ttl time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	o := h.leases[lease]
	if o == nil {
		o = &leaseObs{}
		h.leases[lease] = o
	}
	if ttl > 0 {
		o.ttl = ttl
	}
	o.lastAck = max(o.lastAck, sent)
	o.acks++
}

func (h *History) leaseGoneAt(lease string, at int64, rpc string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.leaseGone = append(h.leaseGone, leaseGoneObs{lease: lease, at: at, rpc: rpc})
}

func fmtT(ns int64) string {
	if ns == math.MaxInt64 {
		return "∞"
	}
	return time.Duration(ns).Round(time.Millisecond).String()
}

// ---- KV operations as porcupine sees them ----------------------------------------------

type opKind uint8

const (
	opGet opKind = iota
	opPut
)

// kvInput is one KV call. A Put may carry a fence (Lock, Token) and/or a version
// condition (CAS with IfVersion).
type kvInput struct {
	Op        opKind
	Key       string
	Value     string
	Lock      string
	Token     uint64 // 0: not fenced
	CAS       bool
	IfVersion uint64
}

// kvOutput is its outcome. Ambiguous means "possibly applied" (no answer, Unavailable,
// deadline): the operation then has an infinite return time.
type kvOutput struct {
	Ambiguous bool
	// Get
	Found      bool
	Value      string
	Version    uint64 // Get: the key's version; Put: the new version
	FenceToken uint64
	// Put failures with a definite outcome
	Stale    bool
	Highest  uint64
	Mismatch bool
	Current  uint64
}

// Grant is one acknowledged correctness grant and what became of it.
type Grant struct {
	Worker int
	Name   string
	Token  uint64
	Lease  string // "" when the client was not observed
	Chain  int64  // call time of the first Lock attempt whose outcome was unknown, or Call
	Call   int64
	Ack    int64
	DOA    bool // the lock's context was already cancelled when Lock returned

	mu          sync.Mutex
	cancelAt    int64 // when the lock's context was seen cancelled (0: not seen)
	cancelCause error

	UnlockCall   int64 // 0: Unlock never called
	UnlockDone   int64
	UnlockErr    error
	LiveAtUnlock bool      // context not cancelled when Unlock was called
	Releases     []attempt // Release RPCs Unlock made (observed clients only)
	HeldAtEnd    bool      // the run ended while it was held
	LiveAtEnd    bool
	Describe     *leaseholdv1.LockInfo // at the end, for HeldAtEnd grants
	DescribeErr  error

	StaleWhileLive []string // fenced Puts rejected as stale while the context was live
}

func (g *Grant) setCancel(at int64, cause error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cancelAt == 0 {
		g.cancelAt, g.cancelCause = at, cause
	}
}

func (g *Grant) cancel() (int64, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.cancelAt, g.cancelCause
}

// End is when the holder stopped being one, as the client saw it: the first of the
// Unlock call and the moment its context was cancelled. math.MaxInt64 while held.
func (g *Grant) End() int64 {
	end := int64(math.MaxInt64)
	if g.UnlockCall > 0 {
		end = g.UnlockCall
	}
	if c, _ := g.cancel(); c > 0 {
		end = min(end, c)
	}
	return end
}

func (g *Grant) String() string {
	c, cause := g.cancel()
	s := fmt.Sprintf("grant{w%d %s token=%d lease=%.8s call=%s ack=%s end=%s", g.Worker, g.Name, g.Token, g.Lease, fmtT(g.Call), fmtT(g.Ack), fmtT(g.End()))
	if c > 0 {
		s += fmt.Sprintf(" cancelled=%s (%v)", fmtT(c), cause)
	}
	if g.UnlockCall > 0 {
		s += fmt.Sprintf(" unlock=%s..%s err=%v", fmtT(g.UnlockCall), fmtT(g.UnlockDone), g.UnlockErr)
	}
	if g.DOA {
		s += " DOA"
	}
	return s + "}"
}

// ---- the observing HTTP client -------------------------------------------------------

// attempt is one Release RPC as the observer saw it.
type attempt struct {
	Status int // HTTP status; 0 on a transport error
	Err    string
}

// callRec collects, for one client call (via its context), the leases its Acquire
// requests carried and the Release attempts it made.
type callRec struct {
	mu       sync.Mutex
	leases   []string
	releases []attempt
}

type callRecKey struct{}

func withRec(ctx context.Context, r *callRec) context.Context {
	return context.WithValue(ctx, callRecKey{}, r)
}

func recOf(ctx context.Context) *callRec {
	r, _ := ctx.Value(callRecKey{}).(*callRec)
	return r
}

func (r *callRec) lastLease() string {
	if r == nil {
		return ""
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.leases) == 0 {
		return ""
	}
	return r.leases[len(r.leases)-1]
}

// observer is a connect.HTTPClient that records lease traffic and passes every request
// on unchanged.
type observer struct {
	h      *History
	base   *http.Client
	closed atomic.Bool // set before Client.Close: revocations are not expiries
}

func newObserver(h *History) *observer {
	tr := &http.Transport{
		DialContext:     (&net.Dialer{Timeout: 3 * time.Second, KeepAlive: 15 * time.Second}).DialContext,
		Protocols:       new(http.Protocols),
		IdleConnTimeout: 90 * time.Second,
	}
	tr.Protocols.SetUnencryptedHTTP2(true)
	tr.HTTP2 = &http.HTTP2Config{PingTimeout: 2 * time.Second, SendPingTimeout: 5 * time.Second}
	return &observer{h: h, base: &http.Client{Transport: tr}}
}

const (
	pathGrant     = "/leasehold.v1.LeaseService/Grant"
	pathKeepAlive = "/leasehold.v1.LeaseService/KeepAlive"
	pathAcquire   = "/leasehold.v1.LockService/Acquire"
	pathRelease   = "/leasehold.v1.LockService/Release"
)

func (o *observer) Do(req *http.Request) (*http.Response, error) {
	path := req.URL.Path
	var body []byte
	switch path {
	case pathKeepAlive, pathAcquire, pathRelease:
		if req.Body != nil {
			var err error
			body, err = io.ReadAll(req.Body)
			req.Body.Close()
			if err != nil {
				return nil, err
			}
			req.Body = io.NopCloser(bytes.NewReader(body))
			req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
			req.ContentLength = int64(len(body))
		}
	}
	sent := o.h.now()
	resp, err := o.base.Do(req)
	recv := o.h.now()
	status := 0
	if err == nil {
		status = resp.StatusCode
	}
	rec := recOf(req.Context())
	switch path {
	case pathGrant:
		if status == http.StatusOK && resp.Header.Get("Content-Encoding") == "" {
			b, rerr := io.ReadAll(resp.Body)
			resp.Body.Close()
			resp.Body = io.NopCloser(bytes.NewReader(b))
			var gr leaseholdv1.GrantResponse
			if rerr == nil && proto.Unmarshal(b, &gr) == nil {
				o.h.leaseAck(gr.GetLeaseId(), sent, time.Duration(gr.GetTtlMs())*time.Millisecond)
			}
		}
	case pathKeepAlive:
		var ka leaseholdv1.KeepAliveRequest
		if proto.Unmarshal(body, &ka) == nil {
			switch {
			case status == http.StatusOK:
				o.h.leaseAck(ka.GetLeaseId(), sent, 0)
			case status == http.StatusNotFound && !o.closed.Load():
				o.h.leaseGoneAt(ka.GetLeaseId(), recv, "KeepAlive")
			}
		}
	case pathAcquire:
		var ar leaseholdv1.AcquireRequest
		if proto.Unmarshal(body, &ar) == nil {
			if rec != nil {
				rec.mu.Lock()
				rec.leases = append(rec.leases, ar.GetLeaseId())
				rec.mu.Unlock()
			}
			if status == http.StatusNotFound && !o.closed.Load() {
				o.h.leaseGoneAt(ar.GetLeaseId(), recv, "Acquire")
			}
		}
	case pathRelease:
		var rr leaseholdv1.ReleaseRequest
		if status == http.StatusNotFound && !o.closed.Load() && proto.Unmarshal(body, &rr) == nil {
			o.h.leaseGoneAt(rr.GetLeaseId(), recv, "Release")
		}
		if rec != nil {
			a := attempt{Status: status}
			if err != nil {
				a.Err = err.Error()
			}
			rec.mu.Lock()
			rec.releases = append(rec.releases, a)
			rec.mu.Unlock()
		}
	}
	return resp, err
}

// ---- workers ------------------------------------------------------------------------

// WorkloadConfig shapes a workload. Zero fields take the defaults in StartWorkload.
type WorkloadConfig struct {
	Clients   int
	Locks     int // each guards one fenced key
	Keys      int // plain keys (unfenced and CAS writes)
	OpTimeout time.Duration
	LockWait  time.Duration
	Seed      uint64
}

// Workload runs the workers until Stop.
type Workload struct {
	cfg      WorkloadConfig
	h        *History
	stopping atomic.Bool
	closing  chan struct{}
	wg       sync.WaitGroup
	workers  []*worker
}

type worker struct {
	id      int
	w       *Workload
	c       *client.Client
	session *client.Session // set: the worker locks through a Session of a shared c
	obs     *observer       // nil: default client (fast lane)
	rng     *rand.Rand
	ttl     time.Duration
	seq     int
	pending string // lock whose last Lock call had an unknown outcome: retry it first
	chain   int64
	held    *client.Lock
	heldG   *Grant
}

func lockName(i int) string  { return fmt.Sprintf("nemesis/lock/%d", i) }
func fencedKey(i int) string { return fmt.Sprintf("nemesis/fenced/%d", i) }
func plainKey(i int) string  { return fmt.Sprintf("nemesis/kv/%d", i) }
func lockIndex(name string) int {
	var i int
	_, _ = fmt.Sscanf(name, "nemesis/lock/%d", &i)
	return i
}

// StartWorkload dials one client per worker (each with the node list rotated so that
// they start on different nodes) and starts them. Of the fast-lane workers, every
// second pair shares one client and locks through a Session each, so that separate
// lease holders multiplexed on one connection go through the faults too.
func StartWorkload(ctx context.Context, addrs []string, h *History, cfg WorkloadConfig) (*Workload, error) {
	if cfg.Clients == 0 {
		cfg.Clients = 8
	}
	if cfg.Locks == 0 {
		cfg.Locks = 4
	}
	if cfg.Keys == 0 {
		cfg.Keys = 12
	}
	if cfg.OpTimeout == 0 {
		cfg.OpTimeout = 5 * time.Second
	}
	if cfg.LockWait == 0 {
		cfg.LockWait = 500 * time.Millisecond
	}
	w := &Workload{cfg: cfg, h: h, closing: make(chan struct{})}
	ttls := []time.Duration{2 * time.Second, 3 * time.Second}
	for i := range cfg.Clients {
		rot := append(append([]string(nil), addrs[i%len(addrs):]...), addrs[:i%len(addrs)]...)
		wk := &worker{id: i, w: w, rng: rand.New(rand.NewPCG(cfg.Seed, uint64(i)+1)), ttl: ttls[i%len(ttls)]}
		opts := []client.Option{client.WithHolder(client.Holder{Host: "nemesis", PID: uint32(i)})}
		if i%2 == 0 {
			wk.obs = newObserver(h)
			opts = append(opts, client.WithoutFastLane(), client.WithHTTPClient(wk.obs))
		}
		if i%4 == 3 {
			// Shares the client of worker i-2 (also fast lane), each through a Session.
			peer := w.workers[i-2]
			peer.session = peer.c.NewSession()
			wk.c, wk.session = peer.c, peer.c.NewSession()
			w.workers = append(w.workers, wk)
			continue
		}
		dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		c, err := client.Dial(dctx, strings.Join(rot, ","), opts...)
		cancel()
		if err != nil {
			w.closeClients()
			return nil, fmt.Errorf("worker %d: dial: %w", i, err)
		}
		wk.c = c
		w.workers = append(w.workers, wk)
	}
	for _, wk := range w.workers {
		w.wg.Go(wk.run)
	}
	return w, nil
}

// Stop makes every worker finish its current step and return. A worker inside a lock
// cycle leaves the lock held (Finish checks that the service still shows it).
func (w *Workload) Stop() {
	w.stopping.Store(true)
	w.wg.Wait()
}

// Finish describes the locks still held, reads every key once more (the reads join the
// history), and closes the clients. The cluster should be healthy.
func (w *Workload) Finish(ctx context.Context, addrs string) error {
	c, err := client.Dial(ctx, addrs, client.WithoutFastLane())
	if err != nil {
		w.closeClients()
		return fmt.Errorf("final client: %w", err)
	}
	defer func() { _ = c.Close(context.Background()) }()
	for _, wk := range w.workers {
		if wk.held == nil {
			continue
		}
		g := wk.heldG
		g.LiveAtEnd = wk.held.Context().Err() == nil
		for try := 0; try < 20; try++ {
			dctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			g.Describe, g.DescribeErr = c.Describe(dctx, g.Name)
			cancel()
			if g.DescribeErr == nil || connect.CodeOf(g.DescribeErr) == connect.CodeNotFound {
				break
			}
			time.Sleep(250 * time.Millisecond)
		}
	}
	w.findUnknownHolds(ctx, c)
	// Final linearizable reads of every key, as one more client.
	reader := &worker{id: len(w.workers), w: w, c: c}
	var keys []string
	for i := range w.cfg.Locks {
		keys = append(keys, fencedKey(i))
	}
	for i := range w.cfg.Keys {
		keys = append(keys, plainKey(i))
	}
	for _, k := range keys {
		for try := 0; ; try++ {
			if _, ok := reader.get(k); ok {
				break
			}
			if try == 30 || ctx.Err() != nil {
				w.closeClients()
				return fmt.Errorf("final read of %s kept failing", k)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	w.closeClients()
	return nil
}

// findUnknownHolds records the locks held under a token that no worker holds at the end:
// a grant (or a place in a queue, granted since) made for a Lock call that had given up
// or failed, kept by a lease that lives on — nobody would ever release it, and the next
// Lock of the name by that lease would be answered with the old token. A hold whose
// release is still under way, or whose lease is ending (a grant lost on arrival), goes
// within a lease's TTL; only what is still there after that counts.
func (w *Workload) findUnknownHolds(ctx context.Context, c *client.Client) {
	known := map[uint64]bool{}
	for _, wk := range w.workers {
		if wk.held != nil {
			known[wk.heldG.Token] = true
		}
	}
	deadline := time.Now().Add(3*time.Second + 3*time.Second) // the longest worker TTL, and some
	for {
		var unknown []string
		for i := range w.cfg.Locks {
			dctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			d, err := c.Describe(dctx, lockName(i))
			cancel()
			if err == nil && d.GetHeld() && d.GetToken() != 0 && !known[d.GetToken()] {
				unknown = append(unknown, fmt.Sprintf("%s held under token %d by %s", lockName(i), d.GetToken(), d.GetHolder()))
			}
		}
		if len(unknown) == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			w.h.mu.Lock()
			w.h.unknownHolds = unknown
			w.h.mu.Unlock()
			return
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// bounded runs fn and waits at most d for it. On timeout it writes every goroutine's
// stack to a file and returns an error naming the file and quoting this package's
// goroutines, so that a hang is diagnosed instead of ending in the test binary's timeout.
func bounded(what string, d time.Duration, fn func()) error {
	done := make(chan struct{})
	go func() { fn(); close(done) }()
	select {
	case <-done:
		return nil
	case <-time.After(d):
	}
	var b bytes.Buffer
	_ = pprof.Lookup("goroutine").WriteTo(&b, 2)
	path := "(not written)"
	if f, err := os.CreateTemp("", "leasehold-nemesis-stacks-*.txt"); err == nil {
		_, _ = f.Write(b.Bytes())
		_ = f.Close()
		path = f.Name()
	}
	var ours []string
	for _, g := range strings.Split(b.String(), "\n\n") {
		if strings.Contains(g, "/test/nemesis.") && len(ours) < 12 {
			ours = append(ours, g)
		}
	}
	return fmt.Errorf("%s did not finish within %v; every goroutine's stack is in %s; this package's:\n%s", what, d, path, strings.Join(ours, "\n\n"))
}

func (w *Workload) closeClients() {
	select {
	case <-w.closing:
		return
	default:
	}
	close(w.closing)
	var wg sync.WaitGroup
	for _, wk := range w.workers {
		if wk.obs != nil {
			wk.obs.closed.Store(true)
		}
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = wk.c.Close(ctx)
		})
	}
	wg.Wait()
}

func (wk *worker) run() {
	for !wk.w.stopping.Load() {
		switch p := wk.rng.IntN(100); {
		case wk.pending != "" || p < 40:
			wk.lockCycle()
		case p < 65:
			wk.plainPut()
		case p < 85:
			wk.get(plainKey(wk.rng.IntN(wk.w.cfg.Keys)))
		default:
			wk.cas()
		}
		// A little think time keeps the history a size porcupine checks quickly.
		time.Sleep(time.Duration(wk.rng.IntN(20)) * time.Millisecond)
	}
}

func (wk *worker) value() string {
	wk.seq++
	return fmt.Sprintf("w%d-%d", wk.id, wk.seq)
}

func (wk *worker) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), wk.w.cfg.OpTimeout)
}

// ambiguous reports whether err leaves the outcome of a write unknown.
func ambiguous(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) || errors.Is(err, client.ErrUnavailable) {
		return true
	}
	switch connect.CodeOf(err) {
	case connect.CodeUnavailable, connect.CodeDeadlineExceeded, connect.CodeCanceled, connect.CodeUnknown,
		connect.CodeInternal, connect.CodeAborted, connect.CodeDataLoss:
		return true
	}
	return false
}

// get reads key and records the read; ok is false when the read failed (a failed read
// has no effect and is left out of the history).
func (wk *worker) get(key string) (kvOutput, bool) {
	ctx, cancel := wk.ctx()
	defer cancel()
	call := wk.w.h.now()
	v, err := wk.c.Get(ctx, key)
	ret := wk.w.h.now()
	if err != nil {
		if ambiguous(err) {
			wk.w.h.count("get: failed (unavailable/deadline)")
		} else {
			wk.w.h.note("get error", err)
		}
		return kvOutput{}, false
	}
	out := kvOutput{Found: v.Found, Value: string(v.Data), Version: v.Version, FenceToken: v.FenceToken}
	wk.w.h.addOp(porcupine.Operation{ClientId: wk.id, Input: kvInput{Op: opGet, Key: key}, Call: call, Output: out, Return: ret})
	wk.w.h.count("get: ok")
	return out, true
}

// put writes and records; kind names the operation in the counts.
func (wk *worker) put(kind string, in kvInput) (kvOutput, error) {
	var opts []client.WriteOption
	if in.Token != 0 {
		opts = append(opts, client.FencedBy(in.Lock, in.Token))
	}
	if in.CAS {
		opts = append(opts, client.IfVersion(in.IfVersion))
	}
	ctx, cancel := wk.ctx()
	defer cancel()
	call := wk.w.h.now()
	ver, err := wk.c.Put(ctx, in.Key, []byte(in.Value), opts...)
	ret := wk.w.h.now()
	var out kvOutput
	var stale *client.StaleTokenError
	var mism *client.VersionMismatchError
	switch {
	case err == nil:
		out.Version = ver
		wk.w.h.count(kind + ": ok")
	case errors.As(err, &stale):
		out.Stale, out.Highest = true, stale.Highest
		wk.w.h.count(kind + ": rejected, stale token")
	case errors.As(err, &mism):
		out.Mismatch, out.Current = true, mism.Current
		wk.w.h.count(kind + ": rejected, version mismatch")
	case ambiguous(err):
		out.Ambiguous = true
		ret = math.MaxInt64
		wk.w.h.count(kind + ": outcome unknown")
	default:
		// A definite failure that is neither of the expected ones: nothing was written.
		wk.w.h.note(kind+" error", err)
		return out, err
	}
	wk.w.h.addOp(porcupine.Operation{ClientId: wk.id, Input: in, Call: call, Output: out, Return: ret})
	return out, err
}

func (wk *worker) plainPut() {
	_, _ = wk.put("put", kvInput{Op: opPut, Key: plainKey(wk.rng.IntN(wk.w.cfg.Keys)), Value: wk.value()})
}

func (wk *worker) cas() {
	key := plainKey(wk.rng.IntN(wk.w.cfg.Keys))
	cur, ok := wk.get(key)
	if !ok {
		return
	}
	ver := cur.Version
	if wk.rng.IntN(10) == 0 {
		ver++ // now and then a CAS that must fail
	}
	_, _ = wk.put("cas put", kvInput{Op: opPut, Key: key, Value: wk.value(), CAS: true, IfVersion: ver})
}

// lockCycle takes a correctness lock, writes the key it guards with the grant's token,
// and unlocks. After a Lock whose outcome is unknown the next cycle retries the same
// lock: the server may have granted it to this client's lease, and only a retry (which
// returns the same grant) or the lease's end frees it.
func (wk *worker) lockCycle() {
	h := wk.w.h
	name := lockName(wk.rng.IntN(wk.w.cfg.Locks))
	call := h.now()
	chain := call
	if wk.pending != "" {
		name, chain = wk.pending, wk.chain
	}
	ctx, cancel := wk.ctx()
	rec := &callRec{}
	lock := wk.c.Lock
	if wk.session != nil {
		lock = wk.session.Lock
	}
	l, err := lock(withRec(ctx, rec), name, client.Correctness, client.WaitFor(wk.w.cfg.LockWait), client.LockTTL(wk.ttl))
	ack := h.now()
	cancel()
	if err != nil {
		switch {
		case errors.Is(err, client.ErrNotAcquired):
			h.count("lock: not acquired (held)")
			wk.pending = ""
		case ambiguous(err):
			h.count("lock: outcome unknown")
			if wk.pending == "" {
				wk.pending, wk.chain = name, call
			}
		default:
			h.note("lock error", err)
			wk.pending = ""
		}
		return
	}
	wk.pending = ""
	g := &Grant{Worker: wk.id, Name: name, Token: l.Token(), Lease: rec.lastLease(), Chain: chain, Call: call, Ack: ack}
	if l.Context().Err() != nil {
		g.DOA = true
		g.setCancel(ack, context.Cause(l.Context()))
		h.count("lock: granted, already lost on arrival")
	} else {
		h.count("lock: granted")
	}
	h.addGrant(g)
	go func() {
		select {
		case <-l.Context().Done():
			g.setCancel(h.now(), context.Cause(l.Context()))
		case <-wk.w.closing:
		}
	}()

	key := fencedKey(lockIndex(name))
	for range 1 + wk.rng.IntN(3) {
		if wk.w.stopping.Load() {
			g.HeldAtEnd = true
			wk.held, wk.heldG = l, g
			return
		}
		if l.Context().Err() != nil {
			break
		}
		out, _ := wk.put("fenced put", kvInput{Op: opPut, Key: key, Value: wk.value(), Lock: name, Token: g.Token})
		if out.Stale && l.Context().Err() == nil {
			g.StaleWhileLive = append(g.StaleWhileLive, fmt.Sprintf("at %s: key %s has accepted token %d", fmtT(h.now()), key, out.Highest))
		}
		if wk.rng.IntN(4) == 0 {
			wk.get(key)
		}
		time.Sleep(time.Duration(wk.rng.IntN(30)) * time.Millisecond)
	}
	if wk.w.stopping.Load() && wk.rng.IntN(2) == 0 {
		g.HeldAtEnd = true
		wk.held, wk.heldG = l, g
		return
	}
	g.LiveAtUnlock = l.Context().Err() == nil
	g.UnlockCall = h.now()
	urec := &callRec{}
	for try := 0; ; try++ {
		uctx, ucancel := wk.ctx()
		err = l.Unlock(withRec(uctx, urec))
		ucancel()
		if err == nil || !errors.Is(err, client.ErrUnavailable) || try == 10 {
			break
		}
	}
	g.UnlockDone, g.UnlockErr = h.now(), err
	urec.mu.Lock()
	g.Releases = urec.releases
	urec.mu.Unlock()
	switch {
	case err == nil:
		h.count("unlock: ok")
	case errors.Is(err, client.ErrLockLost):
		h.count("unlock: lock had been lost")
	case errors.Is(err, client.ErrUnavailable):
		h.count("unlock: unavailable (gave up)")
	default:
		h.note("unlock error", err)
	}
}
