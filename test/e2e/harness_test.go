package e2e

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/internal/proc"
)

// Paths of the binaries built once by TestMain.
var (
	leaseholdBin   string
	pauseclientBin string
	groupmemberBin string
)

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	root, err := proc.ModuleRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	dir, err := os.MkdirTemp("", "leasehold-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	leaseholdBin = filepath.Join(dir, "leasehold")
	pauseclientBin = filepath.Join(dir, "pauseclient")
	groupmemberBin = filepath.Join(dir, "groupmember")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for _, b := range []struct{ out, pkg string }{
		{leaseholdBin, "./cmd/leasehold"},
		{pauseclientBin, "./test/cmd/pauseclient"},
		{groupmemberBin, "./test/cmd/groupmember"},
	} {
		if err := proc.Build(ctx, root, b.out, b.pkg); err != nil {
			fmt.Fprintln(os.Stderr, "e2e:", err)
			return 1
		}
	}
	return m.Run()
}

// freePort returns a loopback port that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	ports, err := proc.FreePorts(1)
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	return ports[0]
}

// ---- server processes -------------------------------------------------------------

// Server is a `leasehold server` process (internal/proc) on free loopback ports with its
// own data dir. Its output goes to a log file that is printed only when the test fails.
// Restart starts a new process on the same ports and data dir.
type Server struct {
	t        testing.TB
	Addr     string // API address, host:port
	RaftAddr string
	FastAddr string // fast-lane address
	Dir      string // data dir
	srv      *proc.Server
}

// StartServer starts a server and waits until it serves as leader. extra flags are
// appended to the command line.
func StartServer(t testing.TB, extra ...string) *Server {
	t.Helper()
	base := t.TempDir()
	s := &Server{t: t, srv: &proc.Server{
		Bin:  leaseholdBin,
		Dir:  filepath.Join(base, "data"),
		Log:  filepath.Join(base, "server.log"),
		Args: append([]string{"--min-ttl", "100ms"}, extra...),
	}}
	s.Dir = s.srv.Dir
	t.Cleanup(func() {
		s.Kill9()
		if t.Failed() {
			if b, err := os.ReadFile(s.srv.Log); err == nil {
				t.Logf("server %s log (%s):\n%s", s.Addr, s.srv.Log, b)
			}
		}
	})
	s.start()
	s.Addr, s.RaftAddr, s.FastAddr = s.srv.API, s.srv.Raft, s.srv.Fast
	return s
}

// start starts the server process and waits until /readyz answers 200 (the node serves
// as leader).
func (s *Server) start() {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.srv.Start(ctx); err != nil {
		s.t.Fatalf("start server: %v", err)
	}
	if err := s.srv.WaitHealthy(ctx); err != nil {
		s.t.Fatalf("server %s not healthy: %v", s.srv.API, err)
	}
}

// Pid returns the running process's pid.
func (s *Server) Pid() int {
	if !s.srv.Running() {
		s.t.Fatalf("server %s is not running", s.Addr)
	}
	return s.srv.PID()
}

// Kill9 kills the server with SIGKILL and waits for it. It does nothing if no server
// process runs.
func (s *Server) Kill9() {
	if err := s.srv.Kill(); err != nil {
		s.t.Errorf("server %s did not die within 10s of SIGKILL: %v", s.Addr, err)
	}
}

// Stop sends SIGTERM and waits up to timeout for the process to exit. It returns the
// exit code (-1 if killed by a signal) and how long the exit took; when the process
// outlives timeout it is killed and the test fails.
func (s *Server) Stop(timeout time.Duration) (int, time.Duration) {
	s.t.Helper()
	p := s.srv.Process()
	if !s.srv.Running() {
		s.t.Fatalf("Stop: server %s is not running", s.Addr)
	}
	start := time.Now()
	_ = p.Signal(syscall.SIGTERM)
	if err := p.Wait(timeout); err != nil {
		s.Kill9()
		s.t.Fatalf("server %s did not exit within %v of SIGTERM", s.Addr, timeout)
	}
	return p.ExitCode(), time.Since(start)
}

// Restart starts a new server process on the same ports and data dir and waits until
// it is healthy. The previous process must have exited.
func (s *Server) Restart() {
	s.t.Helper()
	if s.srv.Running() {
		s.t.Fatalf("Restart: server %s is still running", s.Addr)
	}
	s.start()
}

// Signal sends sig (SIGSTOP, SIGCONT, ...) to the running server.
func (s *Server) Signal(sig syscall.Signal) {
	s.t.Helper()
	if err := s.srv.Signal(sig); err != nil {
		s.t.Fatalf("signal %v to server: %v", sig, err)
	}
}

// Client dials the server; the client is closed when the test ends.
func (s *Server) Client(t testing.TB, opts ...client.Option) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, s.Addr, opts...)
	if err != nil {
		t.Fatalf("dial %s: %v", s.Addr, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = c.Close(ctx)
	})
	return c
}

// ---- other processes ----------------------------------------------------------------

// Line is one line a process wrote to stdout, with the time the test read it.
type Line struct {
	Text string
	At   time.Time
}

// Proc is a helper process (a client, or a `leasehold lock`). Its stdout is read line by
// line as it comes; stderr is collected. It is killed when the test ends.
type Proc struct {
	t     testing.TB
	p     *proc.Process
	bin   string
	Lines chan Line     // stdout lines; closed at EOF
	eof   chan struct{} // closed when stdout has been read to its end

	stderrPath string

	mu     sync.Mutex
	stdout []string
}

// StartProc starts bin with args. stdout and stderr are a pipe and a file passed to the
// process directly, so waiting for the process does not wait for grandchildren that
// inherited them.
func StartProc(t testing.TB, bin string, args ...string) *Proc {
	t.Helper()
	p := &Proc{t: t, bin: filepath.Base(bin), Lines: make(chan Line, 4096), eof: make(chan struct{})}
	p.stderrPath = filepath.Join(t.TempDir(), "stderr")
	errf, err := os.Create(p.stderrPath)
	if err != nil {
		t.Fatalf("stderr file: %v", err)
	}
	defer errf.Close()
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatalf("stdout pipe: %v", err)
	}
	p.p, err = proc.Start(proc.Options{Argv: append([]string{bin}, args...), Stdout: pw, Stderr: errf})
	pw.Close()
	if err != nil {
		pr.Close()
		t.Fatal(err)
	}
	go func() {
		defer close(p.eof)
		defer close(p.Lines)
		defer pr.Close()
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			l := Line{Text: sc.Text(), At: time.Now()}
			p.mu.Lock()
			p.stdout = append(p.stdout, l.Text)
			p.mu.Unlock()
			select {
			case p.Lines <- l:
			default: // nobody is reading; the line is still in Stdout()
			}
		}
	}()
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("%s %s (pid %d):\nstdout:\n%s\nstderr:\n%s", p.bin, strings.Join(args, " "), p.Pid(), strings.Join(p.Stdout(), "\n"), p.Stderr())
		}
	})
	return p
}

// Pid returns the process id.
func (p *Proc) Pid() int { return p.p.PID() }

// Signal sends sig to the process.
func (p *Proc) Signal(sig syscall.Signal) {
	p.t.Helper()
	if err := p.p.Signal(sig); err != nil {
		p.t.Fatalf("signal %v to pid %d: %v", sig, p.Pid(), err)
	}
}

// Kill ends the process: SIGCONT and SIGTERM first (so that `leasehold lock` forwards
// it to CMD's group), then SIGKILL if it lingers.
func (p *Proc) Kill() {
	if err := p.p.Stop(2 * time.Second); err != nil {
		p.t.Errorf("pid %d did not die within 10s of SIGKILL: %v", p.Pid(), err)
	}
}

// Wait waits up to timeout for the process to exit and returns its exit code (-1 when a
// signal ended it). The test fails if it does not exit in time.
func (p *Proc) Wait(timeout time.Duration) int {
	p.t.Helper()
	if err := p.p.Wait(timeout); err != nil {
		p.t.Fatalf("pid %d (%s) did not exit within %v", p.Pid(), p.bin, timeout)
	}
	// Let Stdout() hold the last lines the process wrote: the pipe is read by another
	// goroutine, which may still be behind. A grandchild that inherited the pipe can
	// keep it open, so this waits a moment, not for EOF at any cost.
	select {
	case <-p.eof:
	case <-time.After(2 * time.Second):
	}
	return p.p.ExitCode()
}

// Done is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.p.Done() }

// Stdout returns every line read so far.
func (p *Proc) Stdout() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.stdout...)
}

// Stderr returns what the process wrote to stderr so far.
func (p *Proc) Stderr() string {
	b, _ := os.ReadFile(p.stderrPath)
	return string(b)
}

// Expect returns the next stdout line starting with prefix, skipping others, or fails
// the test after timeout or at EOF.
func (p *Proc) Expect(prefix string, timeout time.Duration) Line {
	p.t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case l, ok := <-p.Lines:
			if !ok {
				p.t.Fatalf("%s: stdout ended before a line starting with %q; stderr:\n%s", p.bin, prefix, p.Stderr())
			}
			if strings.HasPrefix(l.Text, prefix) {
				return l
			}
		case <-deadline:
			p.t.Fatalf("%s: no line starting with %q within %v; stdout so far: %q; stderr:\n%s", p.bin, prefix, timeout, p.Stdout(), p.Stderr())
		}
	}
}

// CLIResult is the outcome of one `leasehold` CLI run.
type CLIResult struct {
	Code           int
	Stdout, Stderr string
	Took           time.Duration
}

// RunCLI runs `leasehold args...` to completion (killed after timeout) and returns its
// exit code and output.
func RunCLI(t testing.TB, timeout time.Duration, args ...string) CLIResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, leaseholdBin, args...)
	cmd.WaitDelay = time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	r := CLIResult{Code: cmd.ProcessState.ExitCode(), Stdout: stdout.String(), Stderr: stderr.String(), Took: time.Since(start)}
	if ctx.Err() != nil {
		t.Fatalf("leasehold %s: still running after %v (killed); stdout %q stderr %q", strings.Join(args, " "), timeout, r.Stdout, r.Stderr)
	}
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("leasehold %s: %v", strings.Join(args, " "), err)
	}
	return r
}

// processGone reports whether pid no longer runs: it does not exist, or it is a zombie
// waiting to be reaped (a killed orphan whose new parent has not reaped it yet).
func processGone(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return errors.Is(err, os.ErrNotExist)
	}
	// pid (comm) S ...: the state follows the last ')'.
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] == 'Z' || s[i+2] == 'X'
	}
	return false
}

// eventually polls cond every 10ms until it is true or timeout passes.
func eventually(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// stacksWith returns the stacks of the goroutines whose stack mentions fn.
func stacksWith(fn string) string {
	var buf bytes.Buffer
	_ = pprof.Lookup("goroutine").WriteTo(&buf, 2)
	var out []string
	for _, g := range strings.Split(buf.String(), "\n\n") {
		if strings.Contains(g, fn) {
			out = append(out, g)
		}
	}
	return strings.Join(out, "\n\n")
}
