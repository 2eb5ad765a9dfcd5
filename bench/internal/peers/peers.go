// Package peers starts the lock services the benchmark compares — leasehold itself and
// its peers Redis, etcd and ZooKeeper, each a real server process on loopback with its
// data in a temporary directory — and implements, for each, the lock recipe its users
// write:
//
//   - Redis: SET key token NX PX ttl to acquire (retried after a short sleep while the
//     lock is taken), a compare-and-delete Lua script to release; through go-redis v9
//     (a connection per command in flight) or through one auto-pipelining rueidis
//     client shared by every worker.
//   - etcd: concurrency.NewSession (one per worker, on one shared clientv3 client) and
//     concurrency.NewMutex.
//   - ZooKeeper: the ephemeral-sequential recipe of zk.NewLock (one session per worker).
//   - leasehold: a client.Session per worker on one shared client.Dial, or (the
//     "-per-worker" systems) a client.Dial per worker; Lock/Unlock with
//     client.Efficiency or client.Correctness.
//
// Each system says whether its workers share one client (SharedClient): a shared
// client batches the requests of many workers into few system calls, a client per
// worker cannot, so the report compares leasehold with the peer of the same kind.
//
// A System is started once, serves every scenario, and is stopped before the next
// System starts, so two servers never compete for the CPU.
package peers

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/leasehold/leasehold/internal/proc"
)

// ErrNotInstalled is returned by Start when the system's server program is missing.
var ErrNotInstalled = errors.New("peers: not installed")

// Held is a held lock.
type Held interface {
	// Release gives the lock up; an error means it was not (or no longer) held.
	Release(ctx context.Context) error
}

// Worker is one benchmark worker's connection or session: what one process (or one
// goroutine with its own session) of a user's program would hold.
type Worker interface {
	// Acquire blocks until the lock name is held or ctx ends.
	Acquire(ctx context.Context, name string) (Held, error)
	// Close ends the worker's session and releases whatever it still holds.
	Close(ctx context.Context) error
}

// SemaphoreWorker is a Worker of a system whose Go client has a counting semaphore:
// AcquireSemaphore blocks until it holds one of limit slots of semaphore name (every
// worker asks for the same limit).
type SemaphoreWorker interface {
	AcquireSemaphore(ctx context.Context, name string, limit int) (Held, error)
}

// SetWorker is a Worker of a system that takes several locks for one holder in one
// request: AcquireSet blocks until it holds all of names. A system without one takes a
// set with AcquireInOrder, its users' recipe.
type SetWorker interface {
	AcquireSet(ctx context.Context, names []string) (Held, error)
}

// AcquireInOrder takes several locks the way users of a lock service without lock sets
// do: one lock per name, in sorted order (the order keeps two holders of overlapping
// sets from deadlocking; Curator's InterProcessMultiLock does the same), released in
// reverse. On an error it releases what it took.
func AcquireInOrder(ctx context.Context, w Worker, names []string) (Held, error) {
	sorted := slices.Sorted(slices.Values(names))
	held := make([]Held, 0, len(sorted))
	release := func(ctx context.Context) error {
		var err error
		for i := len(held) - 1; i >= 0; i-- {
			err = errors.Join(err, held[i].Release(ctx))
		}
		return err
	}
	for _, n := range sorted {
		h, err := w.Acquire(ctx, n)
		if err != nil {
			return nil, errors.Join(err, release(context.WithoutCancel(ctx)))
		}
		held = append(held, h)
	}
	return heldFunc(release), nil
}

// System is a lock service under test.
type System interface {
	// Name identifies the system in the report ("redis-mem", "leasehold-efficiency").
	Name() string
	// Describe says how the server is configured and which recipe is used.
	Describe() string
	// Start launches the server processes with their data under dir and waits until
	// they serve.
	Start(ctx context.Context, dir string) error
	// Version is the server's version as the server reports it, after Start.
	Version() string
	// PIDs are the server processes, for RSS and CPU.
	PIDs() []int
	// SharedClient says whether every worker's requests go through one client that
	// multiplexes or pipelines them (leasehold's Sessions, rueidis, etcd's clientv3),
	// rather than a client or connection per worker (leasehold -per-worker, go-redis's
	// pool, ZooKeeper).
	SharedClient() bool
	// NewWorker opens one worker's session.
	NewWorker(ctx context.Context) (Worker, error)
	// Stop stops the servers this System started (and only those).
	Stop()
}

// Options are shared by every system.
type Options struct {
	// TTL is the lock or session TTL for every system (Redis PX, etcd session TTL,
	// ZooKeeper session timeout, leasehold lease TTL).
	TTL time.Duration
	// RedisRetry is how long the Redis recipe sleeps (±50% jitter) before retrying a
	// SET NX that found the lock taken.
	RedisRetry time.Duration
	// LeaseholdBin is the leasehold binary (built from the parent module).
	LeaseholdBin string
	// ZooKeeperHeap is the JVM's -Xmx for ZooKeeper (upstream's default is 1000m).
	ZooKeeperHeap string
	// LeaseholdPprof starts leasehold servers with --pprof, so that a run can fetch
	// profiles from /debug/pprof/ on the API address.
	LeaseholdPprof bool
}

// Names lists every system the harness knows, in report order.
var Names = []string{
	"leasehold-efficiency", "leasehold-efficiency" + PerWorker,
	"leasehold-correctness", "leasehold-correctness" + PerWorker,
	"leasehold-correctness-3", "leasehold-correctness-3" + PerWorker,
	"redis-mem", "redis-mem-rueidis", "redis-aof", "redis-aof-rueidis",
	"etcd", "etcd-3", "zookeeper",
}

// PerWorker ends the name of a leasehold system whose workers each dial a client (a
// connection and a lease) of their own, instead of a Session on one shared client.
const PerWorker = "-per-worker"

// New returns the named system. A leasehold system's name may end in PerWorker, and
// then in +tls, +auth or +tls+auth to run it secured (security.go).
func New(name string, o Options) (System, error) {
	name, sec, err := parseSecurity(name)
	if err != nil {
		return nil, err
	}
	if sec.tls || sec.auth {
		if !strings.HasPrefix(name, "leasehold-") {
			return nil, fmt.Errorf("peers: %s: only leasehold systems take +tls and +auth", name)
		}
		s, err := New(name, o)
		if err != nil {
			return nil, err
		}
		s.(*Leasehold).sec = sec
		return s, nil
	}
	if base, ok := strings.CutSuffix(name, PerWorker); ok && strings.HasPrefix(name, "leasehold-") {
		s, err := New(base, o)
		if err != nil {
			return nil, err
		}
		s.(*Leasehold).perWorker = true
		return s, nil
	}
	switch name {
	case "leasehold-efficiency":
		return newLeasehold(o, false), nil
	case "leasehold-correctness":
		return newLeasehold(o, true), nil
	case "leasehold-correctness-3":
		l := newLeasehold(o, true)
		l.nodes = 3
		return l, nil
	case "redis-mem":
		return newRedis(o, false, false), nil
	case "redis-aof":
		return newRedis(o, true, false), nil
	case "redis-mem-rueidis":
		return newRedis(o, false, true), nil
	case "redis-aof-rueidis":
		return newRedis(o, true, true), nil
	case "etcd":
		return newEtcd(o, 1), nil
	case "etcd-3":
		return newEtcd(o, 3), nil
	case "zookeeper":
		return newZooKeeper(o), nil
	}
	return nil, fmt.Errorf("peers: unknown system %q (known: %s)", name, strings.Join(Names, ", "))
}

// lookPath finds a server program or returns ErrNotInstalled naming the Debian package.
func lookPath(prog, pkg string) (string, error) {
	p, err := exec.LookPath(prog)
	if err != nil {
		return "", fmt.Errorf("%w: %s not found in PATH (Debian package %s; run make bench-peers-install)", ErrNotInstalled, prog, pkg)
	}
	return p, nil
}

// debVersion returns the installed Debian package version, or "".
func debVersion(pkg string) string {
	out, err := exec.Command("dpkg-query", "-W", "-f", "${Version}", pkg).Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

// stopAll stops processes in reverse start order.
func stopAll(ps []*proc.Process) {
	for i := len(ps) - 1; i >= 0; i-- {
		_ = ps[i].Stop(10 * time.Second)
	}
}

func pidsOf(ps []*proc.Process) []int {
	pids := make([]int, len(ps))
	for i, p := range ps {
		pids[i] = p.PID()
	}
	return pids
}

// heldFunc adapts a function to Held.
type heldFunc func(ctx context.Context) error

func (f heldFunc) Release(ctx context.Context) error { return f(ctx) }
