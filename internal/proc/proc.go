// Package proc starts and controls the child processes of leasehold's process-level
// tests (test/e2e, test/nemesis) and of its benchmarks (bench): it builds the leasehold
// binary, starts a process with its output in a log file, signals it (SIGKILL, SIGSTOP
// and SIGCONT, SIGTERM then SIGKILL), waits for it, picks free loopback ports, and reads
// a process's memory and CPU time from /proc. Server is a `leasehold server` process on
// top of that: free ports (picked again when one was taken before the server bound it),
// readiness, and restarts on the same ports and data directory.
//
// Every process it starts gets SIGKILL if the thread that started it dies
// (PR_SET_PDEATHSIG), so a test binary that crashes leaves no server behind; processes
// are only ever signalled by their pid (or their own group's), never by name.
//
// The package uses no testing.TB: the benchmarks' command (bench/cmd/lockbench) uses it
// outside tests, so every failure is an error for the caller to report.
package proc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// Errors returned by Process and Server.
var (
	// ErrTimeout is returned by Wait and Kill when the process did not exit in time.
	ErrTimeout = errors.New("proc: process still running")
	// ErrExited is returned by a wait for readiness when the process exited first.
	ErrExited = errors.New("proc: process exited")
	// ErrAddrInUse wraps ErrExited when the process's log says it could not bind an
	// address ("address already in use"): a port picked free was taken before the
	// process bound it. RetryPorts starts again on other ports.
	ErrAddrInUse = errors.New("proc: address already in use")
)

// Options says how to start a process.
type Options struct {
	// Name names the process in errors. Default: the program's base name.
	Name string
	// Argv is the program and its arguments. Required.
	Argv []string
	// Env is added to this process's environment.
	Env []string
	// Log, if set, receives the process's stdout and stderr, appended, between a line
	// saying when it started and one saying when and how it exited.
	Log string
	// Stdout and Stderr, if set, are passed to the process directly instead of Log (a
	// pipe the caller reads, say). Being files, waiting for the process never waits for
	// a grandchild that inherited them.
	Stdout, Stderr *os.File
	// Group starts the process in a process group of its own; Signal, Stop and Kill then
	// signal the whole group.
	Group bool
}

// Process is one started child process.
type Process struct {
	Name string
	Log  string // Options.Log
	cmd  *exec.Cmd
	// logFrom is the size of the log when the process started: what follows is its own.
	logFrom int64
	group   bool
	done    chan struct{}
	err     error // cmd.Wait's result, valid once done is closed
}

// Start starts a process. It does not wait for it to be ready (see WaitTCP, WaitHTTP).
func Start(o Options) (*Process, error) {
	if len(o.Argv) == 0 {
		return nil, errors.New("proc: Start: no program given")
	}
	if o.Name == "" {
		o.Name = o.Argv[0][strings.LastIndexByte(o.Argv[0], '/')+1:]
	}
	cmd := exec.Command(o.Argv[0], o.Argv[1:]...)
	if len(o.Env) > 0 {
		cmd.Env = append(os.Environ(), o.Env...)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: o.Group, Pdeathsig: syscall.SIGKILL}
	p := &Process{Name: o.Name, Log: o.Log, cmd: cmd, group: o.Group, done: make(chan struct{})}
	var logf *os.File
	if o.Log != "" {
		var err error
		if logf, err = os.OpenFile(o.Log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644); err != nil {
			return nil, fmt.Errorf("proc: %s: log: %w", o.Name, err)
		}
		if st, err := logf.Stat(); err == nil {
			p.logFrom = st.Size()
		}
		fmt.Fprintf(logf, "==== %s: starting %s\n", time.Now().Format(time.RFC3339Nano), strings.Join(o.Argv, " "))
		cmd.Stdout, cmd.Stderr = logf, logf
	}
	if o.Stdout != nil {
		cmd.Stdout = o.Stdout
	}
	if o.Stderr != nil {
		cmd.Stderr = o.Stderr
	}
	if err := cmd.Start(); err != nil {
		if logf != nil {
			_ = logf.Close()
		}
		return nil, fmt.Errorf("proc: start %s: %w", o.Name, err)
	}
	go func() {
		p.err = cmd.Wait()
		if logf != nil {
			fmt.Fprintf(logf, "==== %s: %s exited: %s\n", time.Now().Format(time.RFC3339Nano), o.Name, ExitText(p.err))
			_ = logf.Close()
		}
		close(p.done)
	}()
	return p, nil
}

// PID returns the process id.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Done is closed once the process has exited and been waited for.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has ended, and how (cmd.Wait's error).
func (p *Process) Exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// ExitCode is the exit status once the process has exited: -1 when a signal ended it,
// or while it runs.
func (p *Process) ExitCode() int {
	if ok, _ := p.Exited(); !ok {
		return -1
	}
	return p.cmd.ProcessState.ExitCode()
}

// Signal sends sig to the process (its group, with Options.Group). It fails once the
// process has exited.
func (p *Process) Signal(sig syscall.Signal) error {
	if ok, err := p.Exited(); ok {
		return fmt.Errorf("%w: %s (%s)", ErrExited, p.Name, ExitText(err))
	}
	pid := p.PID()
	if p.group {
		pid = -pid
	}
	if err := syscall.Kill(pid, sig); err != nil {
		return fmt.Errorf("proc: signal %v to %s: %w", sig, p.Name, err)
	}
	return nil
}

// Wait waits up to timeout for the process to exit; ErrTimeout if it still runs.
func (p *Process) Wait(timeout time.Duration) error {
	select {
	case <-p.done:
		return nil
	case <-time.After(timeout):
		return fmt.Errorf("%w: %s (pid %d) after %v", ErrTimeout, p.Name, p.PID(), timeout)
	}
}

// killWait is how long Kill and Stop wait for a process to die of SIGKILL.
const killWait = 10 * time.Second

// Kill sends SIGKILL and waits for the exit. It does nothing to a process that has
// exited, and fails with ErrTimeout if the process outlives SIGKILL by 10 seconds.
func (p *Process) Kill() error {
	if ok, _ := p.Exited(); ok {
		return nil
	}
	_ = p.Signal(syscall.SIGKILL)
	return p.Wait(killWait)
}

// Stop ends the process: SIGCONT (a paused process could not act on what follows) and
// SIGTERM, then SIGKILL if it has not exited after grace, and waits for the exit. It
// fails with ErrTimeout only if the process outlived SIGKILL too (see Kill). Safe to
// call more than once.
func (p *Process) Stop(grace time.Duration) error {
	if ok, _ := p.Exited(); ok {
		return nil
	}
	_ = p.Signal(syscall.SIGCONT)
	_ = p.Signal(syscall.SIGTERM)
	if p.Wait(grace) == nil {
		return nil
	}
	return p.Kill()
}

// LogTail returns the last n lines of the process's log (see Tail).
func (p *Process) LogTail(n int) string { return Tail(p.Log, n) }

// exitErr is ErrExited (wrapping ErrAddrInUse when its log says so) with the log's tail.
func (p *Process) exitErr() error {
	why := ErrExited
	if p.Log != "" {
		if b, err := os.ReadFile(p.Log); err == nil && int64(len(b)) >= p.logFrom &&
			strings.Contains(strings.ToLower(string(b[p.logFrom:])), "address already in use") {
			why = fmt.Errorf("%w: %w", ErrExited, ErrAddrInUse)
		}
	}
	_, err := p.Exited()
	return fmt.Errorf("%w: %s (%s); log:\n%s", why, p.Name, ExitText(err), p.LogTail(20))
}

// WaitTCP waits until addr accepts a TCP connection, the process exits (ErrExited), or
// ctx ends.
func (p *Process) WaitTCP(ctx context.Context, addr string) error {
	return p.waitUntil(ctx, "listening on "+addr, func() error {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			_ = c.Close()
		}
		return err
	})
}

// waitUntil polls ready every 20 ms until it returns nil, the process exits, or ctx
// ends.
func (p *Process) waitUntil(ctx context.Context, what string, ready func() error) error {
	for {
		err := ready()
		if err == nil {
			return nil
		}
		if ok, _ := p.Exited(); ok {
			return p.exitErr()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("proc: %s not %s: %w (last: %w); log:\n%s", p.Name, what, ctx.Err(), err, p.LogTail(20))
		case <-p.done:
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// ExitText describes an exit status or error for a message; nil is "no error".
func ExitText(err error) string {
	if err == nil {
		return "no error"
	}
	return err.Error()
}

// Tail returns the last n lines of the file at path, after a line counting the lines
// left out, or the error reading it.
func Tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	ls := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(ls) > n {
		ls = append([]string{fmt.Sprintf("... (%d earlier lines)", len(ls)-n)}, ls[len(ls)-n:]...)
	}
	return strings.Join(ls, "\n")
}
