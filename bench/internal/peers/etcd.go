package peers

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"

	"github.com/leasehold/leasehold/internal/proc"
)

// etcdSys is an etcd cluster of n members on loopback (n = 1 or 3). etcd fsyncs its
// write-ahead log before it acknowledges a write, so its locks compare with leasehold's
// correctness class.
type etcdSys struct {
	o         Options
	n         int
	ps        []*proc.Process
	endpoints []string
	cli       *clientv3.Client
	version   string
}

func newEtcd(o Options, n int) *etcdSys { return &etcdSys{o: o, n: n} }

func (e *etcdSys) Name() string {
	if e.n == 1 {
		return "etcd"
	}
	return fmt.Sprintf("etcd-%d", e.n)
}

func (e *etcdSys) Describe() string {
	members := "one etcd member"
	if e.n > 1 {
		members = fmt.Sprintf("a cluster of %d etcd members", e.n)
	}
	return fmt.Sprintf("%s on loopback, WAL fsynced per write; recipe concurrency.NewSession (TTL %v, one per worker, one shared clientv3 client) + concurrency.NewMutex Lock/Unlock",
		members, e.o.TTL)
}

func (e *etcdSys) Start(ctx context.Context, dir string) error {
	bin, err := lookPath("etcd", "etcd-server")
	if err != nil {
		return err
	}
	ports, err := proc.FreePorts(2 * e.n)
	if err != nil {
		return err
	}
	var cluster []string
	for i := range e.n {
		cluster = append(cluster, fmt.Sprintf("m%d=http://127.0.0.1:%d", i, ports[2*i+1]))
	}
	for i := range e.n {
		client := fmt.Sprintf("http://127.0.0.1:%d", ports[2*i])
		peer := fmt.Sprintf("http://127.0.0.1:%d", ports[2*i+1])
		p, err := proc.Start(proc.Options{Name: fmt.Sprintf("etcd m%d", i), Log: filepath.Join(dir, fmt.Sprintf("etcd-m%d.log", i)), Group: true, Argv: []string{
			bin,
			"--name", fmt.Sprintf("m%d", i),
			"--data-dir", filepath.Join(dir, fmt.Sprintf("m%d", i)),
			"--listen-client-urls", client, "--advertise-client-urls", client,
			"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
			"--initial-cluster", strings.Join(cluster, ","),
			"--initial-cluster-state", "new", "--initial-cluster-token", "leasehold-bench",
			"--logger", "zap", "--log-outputs", "stderr", "--log-level", "warn",
		}})
		if err != nil {
			stopAll(e.ps)
			return err
		}
		e.ps = append(e.ps, p)
		e.endpoints = append(e.endpoints, strings.TrimPrefix(client, "http://"))
	}
	for i, p := range e.ps {
		if err := p.WaitTCP(ctx, e.endpoints[i]); err != nil {
			return err
		}
	}
	e.cli, err = clientv3.New(clientv3.Config{Endpoints: e.endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return fmt.Errorf("etcd: client: %w", err)
	}
	// Wait for a leader, then for a write to commit.
	for {
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		st, err := e.cli.Status(sctx, e.endpoints[0])
		if err == nil && st.Leader != 0 {
			_, err = e.cli.Put(sctx, "/leasehold-bench/ready", "1")
		}
		cancel()
		if err == nil && st.Leader != 0 {
			e.version = st.Version
			break
		}
		if ctx.Err() != nil {
			return fmt.Errorf("etcd: no leader: %w (last: %s); log:\n%s", ctx.Err(), proc.ExitText(err), e.ps[0].LogTail(20))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if deb := debVersion("etcd-server"); deb != "" {
		e.version += " (Debian " + deb + ")"
	}
	return nil
}

func (e *etcdSys) Version() string { return e.version }
func (e *etcdSys) PIDs() []int     { return pidsOf(e.ps) }

func (e *etcdSys) Stop() {
	if e.cli != nil {
		_ = e.cli.Close()
	}
	stopAll(e.ps)
}

type etcdWorker struct {
	s *concurrency.Session
}

// SharedClient is true: every worker's session is on one clientv3 client (one gRPC
// connection per member it talks to).
func (e *etcdSys) SharedClient() bool { return true }

func (e *etcdSys) NewWorker(ctx context.Context) (Worker, error) {
	s, err := concurrency.NewSession(e.cli, concurrency.WithTTL(max(1, int(e.o.TTL/time.Second))))
	if err != nil {
		return nil, fmt.Errorf("etcd: session: %w", err)
	}
	return etcdWorker{s}, nil
}

func (w etcdWorker) Acquire(ctx context.Context, name string) (Held, error) {
	m := concurrency.NewMutex(w.s, "/leasehold-bench/"+name)
	if err := m.Lock(ctx); err != nil {
		return nil, err
	}
	return heldFunc(m.Unlock), nil
}

func (w etcdWorker) Close(ctx context.Context) error { return w.s.Close() }
