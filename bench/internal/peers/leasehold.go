package peers

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/leasehold/leasehold/bench/internal/proc"
	"github.com/leasehold/leasehold/client"
)

// Leasehold is a single leasehold node run from the binary built out of the parent
// module, as a separate process (so its RSS and CPU are measured like the peers'). The
// benchmark talks to it only through the public Go client, so whatever transport the
// client picks (the fast lane when the server offers one) is what gets measured.
type Leasehold struct {
	o           Options
	correctness bool
	p           *proc.Process
	addr        string
	fastLane    bool
	version     string
}

func newLeasehold(o Options, correctness bool) *Leasehold {
	return &Leasehold{o: o, correctness: correctness}
}

// NewLeasehold returns a leasehold system of the given class, for the scale scenarios.
func NewLeasehold(o Options, correctness bool) *Leasehold { return newLeasehold(o, correctness) }

// Name is "leasehold-efficiency" or "leasehold-correctness".
func (l *Leasehold) Name() string {
	if l.correctness {
		return "leasehold-correctness"
	}
	return "leasehold-efficiency"
}

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
	return fmt.Sprintf("one leasehold node (separate process, `leasehold server`), %s; recipe client.Dial (one client, so one lease of TTL %v, per worker) + Lock(ctx, name, %s) / Unlock — %s",
		lane, l.o.TTL, class, how)
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
	help, _ := exec.Command(bin, "server", "-h").CombinedOutput()
	l.fastLane = strings.Contains(string(help), "fast-lane-addr")
	ports, err := proc.FreePorts(3)
	if err != nil {
		return err
	}
	l.addr = fmt.Sprintf("127.0.0.1:%d", ports[0])
	args := []string{bin, "server",
		"--addr", l.addr,
		"--raft-addr", fmt.Sprintf("127.0.0.1:%d", ports[1]),
		"--data-dir", filepath.Join(dir, "leasehold-data"),
		"--log-level", "warn",
	}
	if l.fastLane {
		args = append(args, "--fast-lane-addr", fmt.Sprintf("127.0.0.1:%d", ports[2]))
	}
	l.p, err = proc.Start(l.Name(), filepath.Join(dir, "leasehold.log"), nil, args...)
	if err != nil {
		return err
	}
	if err := l.p.WaitTCP(ctx, l.addr); err != nil {
		return err
	}
	// Serving once a lock can be taken (the node has become leader).
	for {
		err := l.probe(ctx)
		if err == nil {
			return nil
		}
		if ok, perr := l.p.Exited(); ok {
			return fmt.Errorf("leasehold: server exited (%s); log:\n%s", proc.ExitText(perr), l.p.LogTail(20))
		}
		if ctx.Err() != nil {
			return fmt.Errorf("leasehold: not serving: %w (last: %s); log:\n%s", ctx.Err(), proc.ExitText(err), l.p.LogTail(20))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (l *Leasehold) probe(ctx context.Context) error {
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	c, err := client.Dial(pctx, l.addr)
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

// PIDs is the server process.
func (l *Leasehold) PIDs() []int { return []int{l.p.PID()} }

// Stop stops the server.
func (l *Leasehold) Stop() {
	if l.p != nil {
		l.p.Stop(10 * time.Second)
	}
}

// Class is the lock option of this system's class.
func (l *Leasehold) Class() client.LockOption {
	if l.correctness {
		return client.Correctness
	}
	return client.Efficiency
}

type leaseholdWorker struct {
	c     *client.Client
	class client.LockOption
}

// NewWorker dials a client of its own: a worker is a separate lease holder.
func (l *Leasehold) NewWorker(ctx context.Context) (Worker, error) {
	c, err := client.Dial(ctx, l.addr, client.WithTTL(l.o.TTL))
	if err != nil {
		return nil, err
	}
	return leaseholdWorker{c: c, class: l.Class()}, nil
}

func (w leaseholdWorker) Acquire(ctx context.Context, name string) (Held, error) {
	lk, err := w.c.Lock(ctx, name, w.class)
	if err != nil {
		return nil, err
	}
	return heldFunc(lk.Unlock), nil
}

func (w leaseholdWorker) Close(ctx context.Context) error { return w.c.Close(ctx) }

// BuildLeasehold builds the leasehold binary from the module rooted at root into out,
// stamping `git describe` as its version. It uses the parent module's own go.mod, not
// the benchmark module's, so the server is built exactly as `make build` builds it.
func BuildLeasehold(ctx context.Context, root, out string) error {
	version := "dev"
	if b, err := exec.CommandContext(ctx, "git", "-C", root, "describe", "--always", "--dirty").Output(); err == nil {
		version = strings.TrimSpace(string(b))
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", "-X main.version="+version, "-o", out, "./cmd/leasehold")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("leasehold: go build in %s: %w\n%s", root, err, b)
	}
	return nil
}
