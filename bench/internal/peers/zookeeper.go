package peers

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/leasehold/leasehold/internal/proc"
)

// zkJar is where Debian's zookeeper package puts the server; its manifest's Class-Path
// names the other jars it needs.
const zkJar = "/usr/share/java/zookeeper.jar"

// zkSys is a standalone ZooKeeper server. It fsyncs its transaction log before it
// acknowledges a write (forceSync=yes, the default).
type zkSys struct {
	o       Options
	p       *proc.Process
	addr    string
	version string
}

func newZooKeeper(o Options) *zkSys { return &zkSys{o: o} }

func (z *zkSys) Name() string { return "zookeeper" }

func (z *zkSys) Describe() string {
	return fmt.Sprintf("standalone ZooKeeper (JVM -Xmx%s, txn log fsynced per write); recipe zk.NewLock (ephemeral-sequential nodes, watch on the predecessor), one session (timeout %v) per worker",
		z.o.ZooKeeperHeap, z.o.TTL)
}

func (z *zkSys) Start(ctx context.Context, dir string) error {
	java, err := lookPath("java", "default-jre-headless")
	if err != nil {
		return err
	}
	if _, err := os.Stat(zkJar); err != nil {
		return fmt.Errorf("%w: %s missing (Debian package zookeeper; run make bench-peers-install)", ErrNotInstalled, zkJar)
	}
	ports, err := proc.FreePorts(1)
	if err != nil {
		return err
	}
	z.addr = fmt.Sprintf("127.0.0.1:%d", ports[0])
	data := filepath.Join(dir, "zk-data")
	if err := os.MkdirAll(data, 0o755); err != nil {
		return err
	}
	cfg := filepath.Join(dir, "zoo.cfg")
	conf := strings.Join([]string{
		"tickTime=2000",
		"dataDir=" + data,
		fmt.Sprintf("clientPort=%d", ports[0]),
		"clientPortAddress=127.0.0.1",
		"maxClientCnxns=0",            // the default (60 per address) is below 64 workers
		"admin.enableServer=false",    // no Jetty admin server on port 8080
		"4lw.commands.whitelist=srvr", // for the version
		"forceSync=yes",
		"",
	}, "\n")
	if err := os.WriteFile(cfg, []byte(conf), 0o644); err != nil {
		return err
	}
	z.p, err = proc.Start(proc.Options{Name: "zookeeper", Log: filepath.Join(dir, "zookeeper.log"), Group: true, Argv: []string{
		java, "-Xmx" + z.o.ZooKeeperHeap, "-Dzookeeper.admin.enableServer=false",
		"-cp", zkJar, "org.apache.zookeeper.server.ZooKeeperServerMain", cfg}})
	if err != nil {
		return err
	}
	if err := z.p.WaitTCP(ctx, z.addr); err != nil {
		return err
	}
	// The port opens before the server serves; srvr answers once it does.
	for {
		v, err := zkSrvr(z.addr)
		if err == nil && v != "" {
			z.version = v
			break
		}
		if ctx.Err() != nil {
			return fmt.Errorf("zookeeper: not serving: %w (last: %s); log:\n%s", ctx.Err(), proc.ExitText(err), z.p.LogTail(20))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if deb := debVersion("zookeeper"); deb != "" {
		z.version += " (Debian " + deb + ")"
	}
	return nil
}

// zkSrvr asks the server for its version with the srvr four-letter command.
func zkSrvr(addr string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.WriteString(c, "srvr"); err != nil {
		return "", err
	}
	b, err := io.ReadAll(c)
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Zookeeper version: "); ok {
			v, _, _ = strings.Cut(v, ",")
			v = strings.TrimSuffix(v, "-${mvngit.commit.id}")
			return v, nil
		}
	}
	return "", errors.New("zookeeper: no version in srvr output")
}

func (z *zkSys) Version() string { return z.version }
func (z *zkSys) PIDs() []int     { return []int{z.p.PID()} }

func (z *zkSys) Stop() {
	if z.p != nil {
		_ = z.p.Stop(10 * time.Second)
	}
}

type nopLogger struct{}

func (nopLogger) Printf(string, ...any) {}

type zkWorker struct {
	conn *zk.Conn
}

// SharedClient is false: every worker has a ZooKeeper session, so a connection, of its
// own.
func (z *zkSys) SharedClient() bool { return false }

func (z *zkSys) NewWorker(ctx context.Context) (Worker, error) {
	conn, events, err := zk.Connect([]string{z.addr}, z.o.TTL, zk.WithLogger(nopLogger{}), zk.WithLogInfo(false))
	if err != nil {
		return nil, fmt.Errorf("zookeeper: connect: %w", err)
	}
	for {
		select {
		case ev := <-events:
			if ev.State == zk.StateHasSession {
				go func() {
					for range events { // drained until the connection closes
					}
				}()
				return zkWorker{conn}, nil
			}
		case <-ctx.Done():
			conn.Close()
			return nil, fmt.Errorf("zookeeper: no session: %w", ctx.Err())
		}
	}
}

// Acquire runs the recipe. zk.Lock has no context: it waits on the predecessor's watch
// until the lock is granted or the session fails. The benchmark lets every holder
// release at the end, so every waiter is granted in turn.
func (w zkWorker) Acquire(_ context.Context, name string) (Held, error) {
	l := zk.NewLock(w.conn, "/leasehold-bench/"+name, zk.WorldACL(zk.PermAll))
	if err := l.Lock(); err != nil {
		return nil, err
	}
	return heldFunc(func(context.Context) error { return l.Unlock() }), nil
}

func (w zkWorker) Close(context.Context) error {
	w.conn.Close()
	return nil
}
