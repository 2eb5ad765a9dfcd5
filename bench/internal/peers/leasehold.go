package peers

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/internal/proc"
)

// Leasehold is a single leasehold node run from the binary built out of the parent
// module, as a separate process (so its RSS and CPU are measured like the peers'). The
// benchmark talks to it only through the public Go client, so whatever transport the
// client picks (the fast lane when the server offers one) is what gets measured.
type Leasehold struct {
	o           Options
	correctness bool
	nodes       int // 0 or 1: one node; 3: a three-node cluster
	srvs        []*proc.Server
	addrs       []string
	addr        string // every node's API address, comma-separated (what clients dial)
	fastLane    bool
	version     string
	sec         security // +tls, +auth
	perWorker   bool     // PerWorker: a client per worker, not Sessions on a shared one

	mu     sync.Mutex
	shared *client.Client // the workers' client, unless each has its own
}

func newLeasehold(o Options, correctness bool) *Leasehold {
	return &Leasehold{o: o, correctness: correctness}
}

// NewLeasehold returns a leasehold system of the given class, for the scale scenarios.
func NewLeasehold(o Options, correctness bool) *Leasehold { return newLeasehold(o, correctness) }

// Name is "leasehold-efficiency", "leasehold-correctness" or "leasehold-correctness-3",
// then PerWorker if each worker has a client of its own, then the suffix of its security
// ("+tls+auth").
func (l *Leasehold) Name() string {
	name := "leasehold-efficiency"
	switch {
	case l.nodes == 3:
		name = "leasehold-correctness-3"
	case l.correctness:
		name = "leasehold-correctness"
	}
	if l.perWorker {
		name += PerWorker
	}
	return name + l.sec.suffix()
}

// SharedClient is true unless every worker has a client of its own.
func (l *Leasehold) SharedClient() bool { return !l.perWorker }

// Describe says how the node runs.
func (l *Leasehold) Describe() string {
	class, how := "client.Efficiency", "granted in the leader's memory, no disk write"
	if l.correctness {
		class, how = "client.Correctness", "committed through raft and fsynced before the reply"
	}
	lane := "no fast lane in this build: Connect over HTTP/2"
	if l.fastLane {
		lane = "server offers the fast lane; the client picks its transport"
	}
	nodes := "one leasehold node (separate process, `leasehold server`)"
	if l.nodes == 3 {
		nodes = "three leasehold nodes on loopback (separate processes; clients given all three addresses)"
	}
	recipe := fmt.Sprintf("one shared client.Dial, a client.Session (so a lease of TTL %v) per worker", l.o.TTL)
	if l.perWorker {
		recipe = fmt.Sprintf("client.Dial (one client, so one connection and one lease of TTL %v) per worker", l.o.TTL)
	}
	return fmt.Sprintf("%s, %s; recipe %s + Lock(ctx, name, %s) / Unlock — %s%s",
		nodes, lane, recipe, class, how, l.sec.describe())
}

// Start runs `leasehold server` on free loopback ports with its data under dir.
func (l *Leasehold) Start(ctx context.Context, dir string) error {
	bin := l.o.LeaseholdBin
	if bin == "" {
		return fmt.Errorf("%w: no leasehold binary given", ErrNotInstalled)
	}
	if _, err := os.Stat(bin); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrNotInstalled, bin, err)
	}
	l.fastLane = proc.HasFastLane(bin)
	if err := l.sec.prepare(dir); err != nil {
		return err
	}
	n := max(1, l.nodes)
	l.srvs, l.addrs = nil, nil
	for i := range n {
		name := l.Name()
		if n > 1 {
			name = fmt.Sprintf("%s-n%d", l.Name(), i+1)
		}
		srv := &proc.Server{
			Bin:   bin,
			Name:  name,
			ID:    fmt.Sprintf("n%d", i+1),
			Dir:   filepath.Join(dir, fmt.Sprintf("leasehold-data-%d", i+1)),
			Log:   filepath.Join(dir, fmt.Sprintf("leasehold-%d.log", i+1)),
			Args:  []string{"--log-level", "warn"},
			Group: true,
		}
		if l.o.LeaseholdPprof {
			srv.Args = append(srv.Args, "--pprof")
		}
		srv.Args = append(srv.Args, l.sec.args...)
		if i > 0 {
			srv.Join = l.addrs[0]
		}
		l.srvs = append(l.srvs, srv)
		if err := srv.Start(ctx); err != nil {
			return err
		}
		l.addrs = append(l.addrs, srv.API)
		if i == 0 {
			l.addr = srv.API
			if err := l.waitServing(ctx, srv.Process()); err != nil {
				return err
			}
		}
	}
	l.addr = strings.Join(l.addrs, ",")
	if n > 1 {
		return l.waitMembers(ctx, n)
	}
	return nil
}

// waitServing waits until a lock can be taken (the node has become leader).
func (l *Leasehold) waitServing(ctx context.Context, p *proc.Process) error {
	for {
		err := l.probe(ctx)
		if err == nil {
			return nil
		}
		if ok, perr := p.Exited(); ok {
			return fmt.Errorf("leasehold: server exited (%s); log:\n%s", proc.ExitText(perr), p.LogTail(20))
		}
		if ctx.Err() != nil {
			return fmt.Errorf("leasehold: not serving: %w (last: %s); log:\n%s", ctx.Err(), proc.ExitText(err), p.LogTail(20))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitMembers waits until the cluster has n voters.
func (l *Leasehold) waitMembers(ctx context.Context, n int) error {
	c, err := client.Dial(ctx, l.addr, l.sec.clientOptions()...)
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	for {
		ms, err := c.Members(ctx)
		if err == nil && len(ms) == n {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("leasehold: cluster of %d not formed: %w (last: %w)", n, ctx.Err(), err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (l *Leasehold) probe(ctx context.Context) error {
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	c, err := client.Dial(pctx, l.addr, l.sec.clientOptions()...)
	if err != nil {
		return err
	}
	defer c.Close(pctx)
	lk, err := c.Lock(pctx, "leasehold-bench/ready", client.Efficiency, client.TryOnce)
	if err != nil {
		return err
	}
	if err := lk.Unlock(pctx); err != nil {
		return err
	}
	st, err := c.Status(pctx)
	if err != nil {
		return err
	}
	l.version = st.GetVersion()
	if st.GetFastLaneAddr() != "" {
		l.version += " (fast lane on)"
	}
	return nil
}

// Addr is the API address.
func (l *Leasehold) Addr() string { return l.addr }

// Version is the server's version string (the build's `git describe`).
func (l *Leasehold) Version() string { return l.version }

// PIDs are the server processes.
func (l *Leasehold) PIDs() []int {
	var pids []int
	for _, srv := range l.srvs {
		pids = append(pids, srv.PID())
	}
	return pids
}

// FetchProfiles writes every node's CPU profile over d, at once: to base+".cpu.pprof"
// for one node, to base+"-n1.cpu.pprof" and so on for a cluster (n1 is the first node).
func (l *Leasehold) FetchProfiles(ctx context.Context, d time.Duration, base string) error {
	if len(l.addrs) == 0 {
		return errors.New("leasehold: not started")
	}
	errs := make([]error, len(l.addrs))
	var wg sync.WaitGroup
	for i, addr := range l.addrs {
		file := base + ".cpu.pprof"
		if len(l.addrs) > 1 {
			file = fmt.Sprintf("%s-n%d.cpu.pprof", base, i+1)
		}
		wg.Go(func() {
			errs[i] = l.fetchProfile(ctx, addr, fmt.Sprintf("/debug/pprof/profile?seconds=%d", max(1, int(d.Seconds()))), file)
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// FetchHeapProfile writes the first node's heap profile, taken after a full collection,
// to file (read it with go tool pprof -sample_index=inuse_space).
func (l *Leasehold) FetchHeapProfile(ctx context.Context, file string) error {
	if len(l.addrs) == 0 {
		return errors.New("leasehold: not started")
	}
	return l.fetchProfile(ctx, l.addrs[0], "/debug/pprof/heap?gc=1", file)
}

// FetchMetrics returns the first node's Prometheus metrics (/metrics) as text.
func (l *Leasehold) FetchMetrics(ctx context.Context) (string, error) {
	if len(l.addrs) == 0 {
		return "", errors.New("leasehold: not started")
	}
	b, err := l.get(ctx, l.addrs[0], "/metrics")
	return string(b), err
}

// fetchProfile writes the profile at path (under /debug/pprof/) of the server whose API
// is at addr.
func (l *Leasehold) fetchProfile(ctx context.Context, addr, path, file string) error {
	b, err := l.get(ctx, addr, path)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return err
	}
	return os.WriteFile(file, b, 0o644)
}

// get returns the body of an HTTP GET of path on the server whose API is at addr.
func (l *Leasehold) get(ctx context.Context, addr, path string) ([]byte, error) {
	req, hc, err := l.sec.httpGet(addr, path)
	if err != nil {
		return nil, err
	}
	url := req.URL.String()
	resp, err := hc.Do(req.WithContext(ctx))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", url, resp.Status)
	}
	return io.ReadAll(resp.Body)
}

// Stop closes the shared client and stops the servers.
func (l *Leasehold) Stop() {
	l.mu.Lock()
	if l.shared != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = l.shared.Close(ctx)
		cancel()
		l.shared = nil
	}
	l.mu.Unlock()
	for i := len(l.srvs) - 1; i >= 0; i-- {
		_ = l.srvs[i].Stop(10 * time.Second)
	}
}

// Class is the lock option of this system's class.
func (l *Leasehold) Class() client.LockOption {
	if l.correctness {
		return client.Correctness
	}
	return client.Efficiency
}

// NewWorker returns a separate lease holder: a Session of its own on the shared client
// (dialled by the first worker), as the etcd recipe gives each worker a
// concurrency.Session on one shared clientv3 client; or, for a PerWorker system, a
// client of its own.
func (l *Leasehold) NewWorker(ctx context.Context) (Worker, error) {
	if l.perWorker {
		c, err := client.Dial(ctx, l.addr, append(l.sec.clientOptions(), client.WithTTL(l.o.TTL))...)
		if err != nil {
			return nil, err
		}
		return leaseholdWorker{lock: c.Lock, lockSet: c.LockSet, close: c.Close, class: l.Class()}, nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.shared == nil {
		c, err := client.Dial(ctx, l.addr, append(l.sec.clientOptions(), client.WithTTL(l.o.TTL))...)
		if err != nil {
			return nil, err
		}
		l.shared = c
	}
	s := l.shared.NewSession()
	return leaseholdWorker{lock: s.Lock, lockSet: s.LockSet, close: s.Close, class: l.Class()}, nil
}

type leaseholdWorker struct {
	lock    func(ctx context.Context, name string, opts ...client.LockOption) (*client.Lock, error)
	lockSet func(ctx context.Context, names []string, opts ...client.LockOption) (*client.Lock, error)
	close   func(ctx context.Context) error
	class   client.LockOption
}

func (w leaseholdWorker) Acquire(ctx context.Context, name string) (Held, error) {
	lk, err := w.lock(ctx, name, w.class)
	if err != nil {
		return nil, err
	}
	return heldFunc(lk.Unlock), nil
}

// AcquireSemaphore takes one slot of a leasehold semaphore (client.Semaphore).
func (w leaseholdWorker) AcquireSemaphore(ctx context.Context, name string, limit int) (Held, error) {
	lk, err := w.lock(ctx, name, w.class, client.Semaphore(limit))
	if err != nil {
		return nil, err
	}
	return heldFunc(lk.Unlock), nil
}

// AcquireSet takes a leasehold lock set (client.LockSet): one request, one token.
func (w leaseholdWorker) AcquireSet(ctx context.Context, names []string) (Held, error) {
	lk, err := w.lockSet(ctx, names, w.class)
	if err != nil {
		return nil, err
	}
	return heldFunc(lk.Unlock), nil
}

func (w leaseholdWorker) Close(ctx context.Context) error { return w.close(ctx) }

// BuildLeasehold builds the leasehold binary from the module rooted at root into out,
// stamping `git describe` as its version. It uses the parent module's own go.mod, not
// the benchmark module's, so the server is built exactly as `make build` builds it.
func BuildLeasehold(ctx context.Context, root, out string) error {
	version := "dev"
	if b, err := exec.CommandContext(ctx, "git", "-C", root, "describe", "--always", "--dirty").Output(); err == nil {
		version = strings.TrimSpace(string(b))
	}
	if err := proc.Build(ctx, root, out, "./cmd/leasehold", "-trimpath", "-ldflags", "-X main.version="+version); err != nil {
		return fmt.Errorf("leasehold: %w", err)
	}
	return nil
}
