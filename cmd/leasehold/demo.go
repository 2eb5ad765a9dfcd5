package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/replication"
	"github.com/leasehold/leasehold/server"
	"github.com/leasehold/leasehold/service"
)

// demoWorkerCmd is the hidden subcommand the demo runs as clients A and B.
const demoWorkerCmd = "demo-worker"

// runDemo replays the paused-client scenario with real processes against an embedded
// single node, once against a store that does not check tokens and once against one
// that does. It exits 0 when the fenced run protected the data.
func newDemoCmd() *cobra.Command {
	var ttl *time.Duration
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "the pause scenario, unfenced then fenced, live",
		Args:  cobra.NoArgs,
		RunE:  func(*cobra.Command, []string) error { return exitWith(runDemo(*ttl)) },
	}
	ttl = cmd.Flags().Duration("ttl", time.Second, "lease TTL of the demo's clients")
	return cmd
}

// runDemo runs the demo with clients of the given lease TTL and returns the exit code.
func runDemo(ttl time.Duration) int {
	if ttl < 200*time.Millisecond || ttl > 5*time.Second {
		fmt.Fprintln(os.Stderr, "leasehold demo: --ttl must be between 200ms and 5s")
		return exitUsage
	}
	dir, err := os.MkdirTemp("", "leasehold-demo-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "leasehold demo: %v\n", err)
		return exitError
	}
	defer os.RemoveAll(dir)
	node, err := service.Start(demoNodeConfig(dir))
	if err != nil {
		fmt.Fprintf(os.Stderr, "leasehold demo: start the embedded server: %v\n", err)
		return exitError
	}
	defer func() { _ = node.Close(context.Background()) }()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := node.WaitReady(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "leasehold demo: %v\n", err)
		return exitError
	}
	observer, err := client.Dial(ctx, node.Addr())
	if err != nil {
		fmt.Fprintf(os.Stderr, "leasehold demo: %v\n", err)
		return exitError
	}
	fmt.Printf("leasehold demo — a client pauses while it holds a lock (embedded server at %s, data in %s)\n", node.Addr(), dir)
	fmt.Println("A and B are separate processes. A checks that it still holds the lock, then is paused")
	fmt.Println("(SIGSTOP: think GC pause, swap, VM migration) just before it writes. Its lease expires,")
	fmt.Println("B takes the lock and writes, then A wakes up and writes too — it does not know time passed.")

	d := &demo{addr: node.Addr(), ttl: ttl, obs: observer}
	unfenced, err := d.run(ctx, "unfenced", false)
	if err != nil {
		fmt.Fprintf(os.Stderr, "leasehold demo: %v\n", err)
		return exitError
	}
	fenced, err := d.run(ctx, "fenced", true)
	if err != nil {
		fmt.Fprintf(os.Stderr, "leasehold demo: %v\n", err)
		return exitError
	}
	fmt.Println()
	switch {
	case fenced.protected && !unfenced.protected:
		fmt.Println("Result: without fencing, A's late write silently replaced B's newer data. With fencing, the")
		fmt.Println("store rejected A's write because its token was lower than one it had already accepted.")
		fmt.Println("The lock alone could not prevent this; the token checked at the resource did.")
		return exitOK
	case fenced.protected:
		fmt.Println("Result: the fenced store protected the data. (In the unfenced run A's write did not land")
		fmt.Println("after B's this time — the timing of a real pause varies; the fenced store does not care.)")
		return exitOK
	default:
		fmt.Println("Result: the fenced store did NOT protect the data — this is a bug; please report it.")
		return exitError
	}
}

// demoNodeConfig configures the demo's embedded node: every listener on a free loopback
// port, so that the demo runs beside a server on the default ports (the README's
// quick start runs one in another terminal).
func demoNodeConfig(dir string) service.Config {
	return service.Config{
		Addr:         "127.0.0.1:0",
		FastLaneAddr: "127.0.0.1:0",
		Raft:         replication.Config{DataDir: dir, RaftAddr: "127.0.0.1:0", Bootstrap: true},
		Server:       server.Config{MinTTL: 100 * time.Millisecond},
		Logger:       slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
}

type demo struct {
	addr  string
	ttl   time.Duration
	obs   *client.Client
	start time.Time
}

type demoResult struct{ protected bool }

func (d *demo) say(who, format string, args ...any) {
	fmt.Printf("  %+8.3fs  %-2s %s\n", time.Since(d.start).Seconds(), who, fmt.Sprintf(format, args...))
}

// run plays the scenario once. The store is leasehold's own KV: unfenced writes are
// plain Puts; fenced writes carry the lock's token.
func (d *demo) run(ctx context.Context, label string, fenced bool) (demoResult, error) {
	lock, key := "demo/"+label+"/ledger", "demo/"+label+"/balance"
	fmt.Println()
	if fenced {
		fmt.Println("Run 2: the store checks fencing tokens")
	} else {
		fmt.Println("Run 1: the store does NOT check tokens")
	}
	d.start = time.Now()
	a, err := d.spawn(ctx, "A", lock, key, "balance=50 (written by A)", fenced)
	if err != nil {
		return demoResult{}, err
	}
	defer a.kill()
	tokA, err := a.expect("ACQUIRED")
	if err != nil {
		return demoResult{}, err
	}
	d.say("A", "acquired %s — token %s", lock, tokA)
	if _, err := a.expect("CHECKED"); err != nil {
		return demoResult{}, err
	}
	d.say("A", "checked: the lock is still held; about to write %q", "balance=50 (written by A)")
	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		return demoResult{}, fmt.Errorf("pause A: %w", err)
	}
	d.say("--", "A is paused (SIGSTOP) before its write reaches the store")
	for {
		info, err := d.obs.Describe(ctx, lock)
		if err != nil {
			return demoResult{}, err
		}
		if !info.GetHeld() || strconv.FormatUint(info.GetToken(), 10) != tokA {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	d.say("--", "the server expired A's lease (TTL %v without a keepalive); the lock is free", d.ttl)
	b, err := d.spawn(ctx, "B", lock, key, "balance=80 (written by B)", fenced)
	if err != nil {
		return demoResult{}, err
	}
	defer b.kill()
	tokB, err := b.expect("ACQUIRED")
	if err != nil {
		return demoResult{}, err
	}
	d.say("B", "acquired %s — token %s", lock, tokB)
	if _, err := b.expect("CHECKED"); err != nil {
		return demoResult{}, err
	}
	outB, err := b.expect("WROTE")
	if err != nil {
		return demoResult{}, err
	}
	d.say("B", "wrote %q (%s)", "balance=80 (written by B)", outB)
	_ = b.wait()
	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		return demoResult{}, fmt.Errorf("resume A: %w", err)
	}
	d.say("--", "A resumes (SIGCONT) and carries on from where it was: its write goes out")
	line, err := a.next()
	if err != nil {
		return demoResult{}, err
	}
	verb, rest, _ := strings.Cut(line, " ")
	switch verb {
	case "WROTE":
		d.say("A", "wrote %q with token %s — accepted (%s)", "balance=50 (written by A)", tokA, rest)
	case "REJECTED":
		d.say("A", "write with token %s REJECTED: %s", tokA, rest)
	default:
		return demoResult{}, fmt.Errorf("client A said %q", line)
	}
	_ = a.wait()
	v, err := d.obs.Get(ctx, key)
	if err != nil {
		return demoResult{}, err
	}
	protected := string(v.Data) == "balance=80 (written by B)"
	note := "B's newer update is lost: the data is corrupted"
	if protected {
		note = "B's update stands"
	}
	d.say("", "the store holds %q — %s", v.Data, note)
	return demoResult{protected: protected}, nil
}

type worker struct {
	name string
	cmd  *exec.Cmd
	out  *bufio.Scanner
}

func (d *demo) spawn(ctx context.Context, name, lock, key, value string, fenced bool) (*worker, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, self, demoWorkerCmd,
		"--addr", d.addr, "--lock", lock, "--key", key, "--value", value,
		"--ttl", d.ttl.String(), "--fenced="+strconv.FormatBool(fenced))
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	return &worker{name: name, cmd: cmd, out: bufio.NewScanner(stdout)}, nil
}

func (w *worker) next() (string, error) {
	if !w.out.Scan() {
		return "", fmt.Errorf("%s stopped talking: %w", w.name, w.out.Err())
	}
	return w.out.Text(), nil
}

// expect reads the next line, which must start with verb, and returns the rest.
func (w *worker) expect(verb string) (string, error) {
	line, err := w.next()
	if err != nil {
		return "", err
	}
	v, rest, _ := strings.Cut(line, " ")
	if v != verb {
		return "", fmt.Errorf("%s said %q, expected %s", w.name, line, verb)
	}
	return rest, nil
}

func (w *worker) wait() error { return w.cmd.Wait() }

func (w *worker) kill() {
	if w.cmd.ProcessState == nil {
		_ = w.cmd.Process.Signal(syscall.SIGCONT)
		_ = w.cmd.Process.Kill()
		_ = w.cmd.Wait()
	}
}

// newDemoWorkerCmd is the hidden command of one client of the demo: acquire, check,
// (maybe be paused), write. It prints ACQUIRED <token>, CHECKED, then WROTE <details> or
// REJECTED <reason>.
func newDemoWorkerCmd() *cobra.Command {
	var w demoWorkerFlags
	cmd := &cobra.Command{
		Use:    demoWorkerCmd,
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE:   func(*cobra.Command, []string) error { return exitWith(runDemoWorker(w)) },
	}
	fs := cmd.Flags()
	fs.StringVar(&w.addr, "addr", "", "server")
	fs.StringVar(&w.lock, "lock", "", "lock name")
	fs.StringVar(&w.key, "key", "", "key to write")
	fs.StringVar(&w.value, "value", "", "value to write")
	fs.DurationVar(&w.ttl, "ttl", time.Second, "lease TTL")
	fs.BoolVar(&w.fenced, "fenced", false, "carry the token with the write")
	return cmd
}

// demoWorkerFlags are the flags of the hidden demo-worker command.
type demoWorkerFlags struct {
	addr, lock, key, value string
	ttl                    time.Duration
	fenced                 bool
}

// runDemoWorker runs one demo client and returns its exit code.
func runDemoWorker(f demoWorkerFlags) int {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, f.addr, client.WithTTL(f.ttl))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return exitUnavailable
	}
	l, err := c.Lock(ctx, f.lock, client.Correctness)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return exitNotAcquired
	}
	fmt.Printf("ACQUIRED %d\n", l.Token())
	// The check a careful client makes. The pause lands after it, before the write.
	if l.Context().Err() != nil {
		fmt.Println("LOST")
		return exitLockLost
	}
	fmt.Println("CHECKED")
	time.Sleep(300 * time.Millisecond) // the window the demo pauses us in
	var opts []client.WriteOption
	if f.fenced {
		opts = append(opts, client.Fenced(l))
	}
	ver, err := c.Put(ctx, f.key, []byte(f.value), opts...)
	var stale *client.StaleTokenError
	switch {
	case errors.As(err, &stale):
		fmt.Printf("REJECTED token %d is lower than %d, which the store has already accepted\n", stale.Token, stale.Highest)
	case err != nil:
		fmt.Fprintln(os.Stderr, err)
		return exitError
	default:
		how := "no token checked"
		if f.fenced {
			how = fmt.Sprintf("token %d checked", l.Token())
		}
		fmt.Printf("WROTE version %d, %s\n", ver, how)
	}
	_ = l.Unlock(context.Background())
	_ = c.Close(context.Background())
	return exitOK
}
