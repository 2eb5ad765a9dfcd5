// Package proc starts the benchmark's server processes (the peers and leasehold itself)
// and measures them from outside: resident memory from /proc/PID/status (VmRSS) and CPU
// time from /proc/PID/stat. Every process it starts is its own process group, gets
// SIGKILL if the benchmark dies (PR_SET_PDEATHSIG), writes its output to a log file in
// the benchmark's temporary directory, and is stopped by Stop — never by name.
package proc

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Process is one started child process.
type Process struct {
	Name string
	Log  string // path of the file holding its stdout and stderr
	cmd  *exec.Cmd
	done chan struct{}
	err  error // exit status, valid after done is closed
}

// Start runs argv[0] with the rest as arguments, output to logPath. It does not wait for
// the process to be ready; see WaitTCP.
func Start(name, logPath string, env []string, argv ...string) (*Process, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return nil, fmt.Errorf("proc: start %s: %w", name, err)
	}
	p := &Process{Name: name, Log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		_ = logf.Close()
		close(p.done)
	}()
	return p, nil
}

// PID returns the process id.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Exited reports whether the process has ended, and how.
func (p *Process) Exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// Stop sends SIGTERM to the process group, waits up to grace, then sends SIGKILL and
// waits for the exit. It is safe to call more than once.
func (p *Process) Stop(grace time.Duration) {
	if ok, _ := p.Exited(); ok {
		return
	}
	_ = syscall.Kill(-p.PID(), syscall.SIGTERM)
	select {
	case <-p.done:
		return
	case <-time.After(grace):
	}
	_ = syscall.Kill(-p.PID(), syscall.SIGKILL)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
	}
}

// LogTail returns the last n lines of the process's log, for error messages.
func (p *Process) LogTail(n int) string {
	b, err := os.ReadFile(p.Log)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// WaitTCP waits until addr accepts a TCP connection, the process exits, or ctx ends.
func (p *Process) WaitTCP(ctx context.Context, addr string) error {
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			_ = c.Close()
			return nil
		}
		if ok, perr := p.Exited(); ok {
			return fmt.Errorf("proc: %s exited before listening on %s (%s); log:\n%s", p.Name, addr, ExitText(perr), p.LogTail(20))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("proc: %s not listening on %s: %w; log:\n%s", p.Name, addr, ctx.Err(), p.LogTail(20))
		case <-time.After(50 * time.Millisecond):
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

// FreePorts returns n distinct loopback TCP ports that were free a moment ago.
func FreePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	lns := make([]net.Listener, 0, n)
	defer func() {
		for _, ln := range lns {
			_ = ln.Close()
		}
	}()
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// RSS returns the resident set size of pid in bytes (VmRSS in /proc/PID/status).
func RSS(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			fields := strings.Fields(rest)
			if len(fields) < 1 {
				break
			}
			kb, err := strconv.ParseInt(fields[0], 10, 64)
			if err != nil {
				return 0, err
			}
			return kb * 1024, nil
		}
	}
	return 0, errors.New("proc: no VmRSS line")
}

// clockTick is USER_HZ, the unit of utime and stime in /proc/PID/stat. It is 100 on
// every Linux architecture Go supports.
const clockTick = 100

// CPU returns the user plus system CPU time pid has used so far (10 ms resolution).
func CPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may contain spaces; fields after its ')' are plain.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("proc: malformed stat")
	}
	f := strings.Fields(string(b[i+1:]))
	// After ')': state is field 3, so utime (14) and stime (15) are f[11] and f[12].
	if len(f) < 13 {
		return 0, errors.New("proc: short stat")
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return time.Duration(ut+st) * time.Second / clockTick, nil
}

// SumRSS and SumCPU add up several processes (a three-node cluster is one system).
func SumRSS(pids []int) (int64, error) {
	var total int64
	for _, pid := range pids {
		v, err := RSS(pid)
		if err != nil {
			return 0, err
		}
		total += v
	}
	return total, nil
}

// SumCPU adds the CPU time of pids.
func SumCPU(pids []int) (time.Duration, error) {
	var total time.Duration
	for _, pid := range pids {
		v, err := CPU(pid)
		if err != nil {
			return 0, err
		}
		total += v
	}
	return total, nil
}
