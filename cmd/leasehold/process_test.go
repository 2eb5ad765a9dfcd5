package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/leasehold/leasehold/internal/testnode"
)

// asCLIEnv makes this test binary run as the leasehold CLI (TestRunAsLeasehold).
const asCLIEnv = "LEASEHOLD_TEST_RUN_AS_CLI"

// TestRunAsLeasehold is not a test: leaseholdProcess runs this test binary with it to
// get a real `leasehold` process, whose arguments follow the --.
func TestRunAsLeasehold(t *testing.T) {
	if os.Getenv(asCLIEnv) == "" {
		t.Skip("only run by leaseholdProcess")
	}
	os.Exit(run(flag.Args()))
}

// leaseholdProcess returns the command running the CLI on args as its own process.
func leaseholdProcess(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"-test.run=^TestRunAsLeasehold$", "--"}, args...)...)
	cmd.Env = append(os.Environ(), asCLIEnv+"=1")
	return cmd
}

// The CLI run by the tests, in this process or as leaseholdProcess, runs its guard
// (runGroup) as this test binary too.
func init() {
	selfCommand = func() (argv, env []string) {
		return []string{"/proc/self/exe", "-test.run=^TestRunAsLeasehold$", "--"}, []string{asCLIEnv + "=1"}
	}
}

// readPids waits up to 10 s for file to hold n numbers and returns them.
func readPids(t *testing.T, file string, n int) []int {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		b, err := os.ReadFile(file)
		f := strings.Fields(string(b))
		if err != nil || len(f) < n {
			continue
		}
		pids := make([]int, n)
		for i := range pids {
			_, _ = fmt.Sscan(f[i], &pids[i])
		}
		return pids
	}
	t.Fatalf("CMD did not write %d pids to %s within 10s", n, file)
	return nil
}

// alive reports whether pid runs (a zombie does not).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// TestOnceStdoutClosedStoresOutcome: `leasehold once KEY -- CMD | head -1`. The reader
// of leasehold's standard output goes away while CMD writes. leasehold must not die of
// SIGPIPE — that leaves CMD running with no claim, the key in progress until its TTL
// and then free, so the work runs again — but pass the broken pipe on to CMD, as
// `leasehold lock` does (CMD writes to the pipe itself there), and store the outcome.
func TestOnceStdoutClosedStoresOutcome(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node")
	}
	addr := testnode.Start(t).Addr()
	pidfile := filepath.Join(t.TempDir(), "pid")
	cmd := leaseholdProcess(t, "once", "t/once/pipe", "--addr", addr, "--ttl", "2s", "--",
		"sh", "-c", `echo $$ > `+pidfile+`; seq 1 1000000; exit 5`)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "1\n" {
		t.Fatalf("first line %q, %v", line, err)
	}
	_ = out.Close() // like head -1
	sh := readPids(t, pidfile, 1)[0]
	t.Cleanup(func() { _ = syscall.Kill(-sh, syscall.SIGKILL) })
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("leasehold once did not exit within 20s of its stdout closing; stderr %q", stderr.String())
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws := ee.Sys().(syscall.WaitStatus); ws.Signaled() {
			t.Errorf("leasehold once died of %v when its stdout closed; stderr %q", ws.Signal(), stderr.String())
		}
	}
	if !eventuallyTrue(2*time.Second, func() bool { return !alive(sh) }) {
		t.Errorf("CMD (pid %d) still runs after leasehold once exited", sh)
	}
	// The outcome was stored: a later call does not run CMD again.
	code, stdout, stderr2 := cli(t, "once", "t/once/pipe", "--addr", addr, "--", "sh", "-c", "echo again; exit 3")
	if code == exitNotAcquired || code == 3 || strings.Contains(stdout, "again") {
		t.Errorf("the next once of the key: exit %d, stdout %.40q, stderr %q; want the first run's stored outcome", code, stdout, stderr2)
	}
}

// TestLockStoppedStopsCMD: `leasehold lock` stopped by SIGTSTP (Ctrl-Z at a terminal
// sends it to leasehold's process group, not to CMD's) must stop CMD too: a stopped
// leasehold sends no keepalives, the lease lapses and another holder gets the lock, so
// a CMD running on would run beside it. On SIGCONT both go on, and leasehold, finding
// the lock lost, kills CMD and exits 76.
func TestLockStoppedStopsCMD(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node")
	}
	addr := testnode.Start(t).Addr()
	pidfile := filepath.Join(t.TempDir(), "pid")
	cmd := leaseholdProcess(t, "lock", "t/lock/tstp", "--addr", addr, "--ttl", "1s", "--",
		"sh", "-c", `echo $$ > `+pidfile+`; while :; do sleep 0.05; done`)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sh := readPids(t, pidfile, 1)[0]
	t.Cleanup(func() { _ = syscall.Kill(-sh, syscall.SIGKILL); _ = cmd.Process.Kill() })
	_ = cmd.Process.Signal(syscall.SIGTSTP)
	if !eventuallyTrue(2*time.Second, func() bool { return procState(sh) == 'T' }) {
		t.Errorf("CMD (state %c) runs on while leasehold is stopped by SIGTSTP", procState(sh))
	}
	time.Sleep(1500 * time.Millisecond) // past the TTL: the lease lapses
	continuedLosesLock(t, cmd)
	if !eventuallyTrue(time.Second, func() bool { return !alive(sh) }) {
		t.Errorf("CMD (pid %d) still runs after leasehold lost the lock", sh)
	}
}

// procState is pid's state letter in /proc (0: gone).
func procState(pid int) byte {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	i := strings.LastIndexByte(string(b), ')')
	if err != nil || i < 0 || i+2 >= len(b) {
		return 0
	}
	return b[i+2]
}

// TestLockKilledStopsCMD: `leasehold lock|elect|once` killed with SIGKILL while CMD
// runs. Its lease lapses after the TTL and another holder gets the lock — so CMD and
// its group (here a grandchild, `sh -c 'sleep 1000 & wait'`) must be gone before then,
// or two holders run at once. The guard sees leasehold's end of its pipe close and
// kills the group at once, well within the TTL.
func TestLockKilledStopsCMD(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node")
	}
	addr := testnode.Start(t).Addr()
	for _, verb := range []string{"lock", "elect", "once"} {
		t.Run(verb, func(t *testing.T) {
			pidfile := filepath.Join(t.TempDir(), "pids")
			cmd := leaseholdProcess(t, verb, "t/killed/"+verb, "--addr", addr, "--ttl", "5s", "--",
				"sh", "-c", `sleep 1000 & echo $$ $! > `+pidfile+`; wait`)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			pids := readPids(t, pidfile, 2)
			t.Cleanup(func() { _ = syscall.Kill(-pids[0], syscall.SIGKILL) })
			killed := time.Now()
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			for _, pid := range pids {
				if !eventuallyTrue(time.Second, func() bool { return !alive(pid) }) {
					t.Errorf("pid %d of the killed leasehold's CMD still runs %v after the kill (TTL 5s)", pid, time.Since(killed).Round(time.Millisecond))
				}
			}
			if verb != "lock" {
				return
			}
			// The lease lapses a TTL after the kill; another holder then gets the lock.
			if code, _, stderr := cli(t, verb, "t/killed/"+verb, "--addr", addr, "--", "true"); code != exitOK {
				t.Fatalf("the next holder: exit %d, %s", code, stderr)
			}
		})
	}
}

// TestLockGuardKilled: the guard between leasehold and CMD killed with SIGKILL (by the
// OOM killer, say). leasehold kills what is left of CMD's group, releases the lock
// and exits 137, as if CMD had died of SIGKILL.
func TestLockGuardKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node")
	}
	addr := testnode.Start(t).Addr()
	pidfile := filepath.Join(t.TempDir(), "pids")
	cmd := leaseholdProcess(t, "lock", "t/guard/killed", "--addr", addr, "--", "sh", "-c", `echo $$ $PPID > `+pidfile+`; sleep 1000`)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pids := readPids(t, pidfile, 2) // sh, the guard
	t.Cleanup(func() { _ = syscall.Kill(-pids[1], syscall.SIGKILL) })
	_ = syscall.Kill(pids[1], syscall.SIGKILL)
	if err := cmd.Wait(); exitCode(err) != 128+int(syscall.SIGKILL) {
		t.Errorf("leasehold lock after its guard was killed: %v, want exit %d", err, 128+int(syscall.SIGKILL))
	}
	if !eventuallyTrue(time.Second, func() bool { return !alive(pids[0]) }) {
		t.Errorf("CMD (pid %d) runs on after its guard was killed and leasehold exited", pids[0])
	}
	if code, _, stderr := cli(t, "lock", "t/guard/killed", "--addr", addr, "--wait", "0", "--", "true"); code != exitOK {
		t.Errorf("the lock after the guard was killed: exit %d, %s; want it released", code, stderr)
	}
}

// TestLockAtTerminal: `leasehold lock NAME -- CMD` run from a terminal, as its
// foreground job, on a pseudo-terminal.
//
//   - CMD reads a line typed on the terminal. (CMD in a process group that is not the
//     terminal's foreground group is stopped by SIGTTIN instead, and leasehold waits
//     for it for ever, holding the lock.)
//   - With leasehold's standard input redirected, a CMD that opens /dev/tty (a password
//     prompt) reads it too: CMD's group is the foreground job whenever leasehold's is.
//   - Ctrl-Z stops CMD and leasehold with it, so that the shell sees the job stopped and
//     gets the terminal back; continued, CMD has the terminal again and reads it.
//   - Ctrl-C interrupts CMD; leasehold releases the lock at once and exits 130, as a
//     shell reports a job ended by SIGINT.
func TestLockAtTerminal(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node")
	}
	addr := testnode.Start(t).Addr()
	t.Run("CMD reads the terminal", func(t *testing.T) {
		term := lockAtTerminal(t, addr, "t/tty/read", "")
		time.Sleep(time.Second) // CMD is reading by now
		term.typeIn("hello\n")
		term.wantRead("hello")
	})
	t.Run("CMD reads /dev/tty", func(t *testing.T) {
		term := lockAtTerminalRunning(t, addr, "t/tty/devtty", `read x < /dev/tty; echo "got $x"`, true)
		time.Sleep(time.Second)
		term.typeIn("secret\n")
		term.wantRead("secret")
	})
	t.Run("Ctrl-Z", func(t *testing.T) {
		pidfile := filepath.Join(t.TempDir(), "pid")
		term := lockAtTerminal(t, addr, "t/tty/ctrlz", pidfile)
		sh := readPids(t, pidfile, 1)[0]
		time.Sleep(300 * time.Millisecond) // sh is reading by now
		term.typeIn("\x1a")
		if !eventuallyTrue(5*time.Second, func() bool { return procState(sh) == 'T' && procState(term.cmd.Process.Pid) == 'T' }) {
			t.Fatalf("after Ctrl-Z: CMD state %c, leasehold state %c; want both stopped", procState(sh), procState(term.cmd.Process.Pid))
		}
		if pg, err := unix.IoctlGetInt(int(term.master.Fd()), unix.TIOCGPGRP); err != nil || pg != term.cmd.Process.Pid {
			t.Errorf("while stopped, the terminal's foreground group is %d (%v), want leasehold's %d", pg, err, term.cmd.Process.Pid)
		}
		_ = syscall.Kill(term.cmd.Process.Pid, syscall.SIGCONT) // as the shell's fg does
		time.Sleep(300 * time.Millisecond)
		term.typeIn("hello\n")
		term.wantRead("hello")
	})
	t.Run("Ctrl-C", func(t *testing.T) {
		pidfile := filepath.Join(t.TempDir(), "pid")
		term := lockAtTerminal(t, addr, "t/tty/ctrlc", pidfile)
		readPids(t, pidfile, 1)
		time.Sleep(300 * time.Millisecond)
		term.typeIn("\x03")
		if code := term.exit(); code != 128+int(syscall.SIGINT) {
			t.Errorf("leasehold lock after Ctrl-C: exit %d, want %d", code, 128+int(syscall.SIGINT))
		}
		if code, _, stderr := cli(t, "lock", "t/tty/ctrlc", "--addr", addr, "--wait", "0", "--", "true"); code != exitOK {
			t.Errorf("the lock after Ctrl-C: exit %d, %s; want it released", code, stderr)
		}
	})
}

// ptySession is `leasehold lock` run as the foreground job of a terminal session of its
// own, its CMD `read x; echo "got $x"` (after writing its pid to a file, if given).
type ptySession struct {
	t      *testing.T
	cmd    *exec.Cmd
	master *os.File
	out    chan string
	done   chan error
}

func lockAtTerminal(t *testing.T, addr, name, pidfile string) *ptySession {
	t.Helper()
	script := `read x; echo "got $x"`
	if pidfile != "" {
		script = `echo $$ > ` + pidfile + `; ` + script
	}
	return lockAtTerminalRunning(t, addr, name, script, false)
}

// lockAtTerminalRunning is lockAtTerminal with CMD `sh -c script`, and standard input
// /dev/null if stdinNull.
func lockAtTerminalRunning(t *testing.T, addr, name, script string, stdinNull bool) *ptySession {
	t.Helper()
	master, slave := openPTY(t)
	cmd := leaseholdProcess(t, "lock", name, "--addr", addr, "--", "sh", "-c", script)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0} // a terminal session, leasehold its foreground job
	if stdinNull {
		cmd.Stdin, cmd.SysProcAttr.Ctty = nil, 1 // /dev/null; the terminal is standard output's
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	_ = slave.Close()
	term := &ptySession{t: t, cmd: cmd, master: master, out: make(chan string, 1), done: make(chan error, 1)}
	go func() {
		var all strings.Builder
		r := bufio.NewReader(master)
		for {
			line, err := r.ReadString('\n')
			all.WriteString(line)
			if strings.Contains(line, "got ") || err != nil {
				term.out <- all.String()
				return
			}
		}
	}()
	go func() { term.done <- cmd.Wait() }()
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	return term
}

// typeIn writes s to the terminal, as if typed.
func (term *ptySession) typeIn(s string) {
	if _, err := term.master.Write([]byte(s)); err != nil {
		term.t.Fatal(err)
	}
}

// exit waits up to 10 s for leasehold to exit and returns its code.
func (term *ptySession) exit() int {
	select {
	case err := <-term.done:
		return exitCode(err)
	case <-time.After(10 * time.Second):
		term.t.Fatal("leasehold lock did not exit within 10s (CMD stopped by SIGTTIN?); it still held the lock")
		return -1
	}
}

// wantRead checks that CMD read want from the terminal and leasehold exited 0.
func (term *ptySession) wantRead(want string) {
	term.t.Helper()
	if code := term.exit(); code != exitOK {
		term.t.Errorf("leasehold lock: exit %d, want 0", code)
	}
	if out := term.output(); !strings.Contains(out, "got "+want) {
		term.t.Errorf("CMD did not read %q from the terminal: %q", want, out)
	}
}

// output is what the terminal showed up to CMD's "got" line.
func (term *ptySession) output() string {
	select {
	case s := <-term.out:
		return s
	case <-time.After(time.Second):
		return ""
	}
}

// openPTY opens a pseudo-terminal pair.
func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals: %v", err)
	}
	t.Cleanup(func() { _ = m.Close() })
	var unlock int32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, m.Fd(), syscall.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); e != 0 {
		t.Fatal(e)
	}
	var n uint32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, m.Fd(), syscall.TIOCGPTN, uintptr(unsafe.Pointer(&n))); e != 0 {
		t.Fatal(e)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	return m, s
}

// eventuallyTrue polls cond every 20 ms for up to d.
func eventuallyTrue(d time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(d); ; time.Sleep(20 * time.Millisecond) {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

// TestLockStalledStopsCMD: `leasehold lock` stopped with SIGSTOP — which it cannot
// catch, so it cannot stop CMD, send keepalives or kill CMD when the lease lapses. The
// guard, fed the lease's deadline by leasehold, kills CMD's group when the last
// deadline it heard runs out: before the server can expire the lease and grant the
// lock to another. Continued, leasehold finds the lock lost and exits 76.
func TestLockStalledStopsCMD(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node")
	}
	addr := testnode.Start(t).Addr()
	pidfile := filepath.Join(t.TempDir(), "pid")
	const ttl = 2 * time.Second
	cmd := leaseholdProcess(t, "lock", "t/lock/stalled", "--addr", addr, "--ttl", ttl.String(), "--",
		"sh", "-c", `echo $$ > `+pidfile+`; while :; do sleep 0.05; done`)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sh := readPids(t, pidfile, 1)[0]
	t.Cleanup(func() { _ = syscall.Kill(-sh, syscall.SIGKILL); _ = cmd.Process.Kill() })
	stopped := time.Now()
	_ = cmd.Process.Signal(syscall.SIGSTOP)
	if !eventuallyTrue(ttl+time.Second, func() bool { return !alive(sh) }) {
		t.Fatalf("CMD (pid %d) still runs %v after leasehold was stopped (TTL %v)", sh, time.Since(stopped).Round(time.Millisecond), ttl)
	}
	if since := time.Since(stopped); since >= ttl {
		t.Errorf("CMD was killed %v after leasehold stopped, not before the TTL (%v) could lapse", since.Round(time.Millisecond), ttl)
	}
	continuedLosesLock(t, cmd)
}

// continuedLosesLock continues the stopped leasehold cmd and checks that it exits, within
// 10 s, with exitLockLost: its lease lapsed while it was stopped.
func continuedLosesLock(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	_ = cmd.Process.Signal(syscall.SIGCONT)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if code := exitCode(err); code != exitLockLost {
			t.Errorf("leasehold after SIGCONT: %v (exit %d), want exit %d", err, code, exitLockLost)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("leasehold did not exit within 10s of SIGCONT")
	}
}
