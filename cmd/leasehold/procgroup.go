package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/leasehold/leasehold/client"
)

// How `leasehold lock|elect|once NAME -- CMD` runs CMD.
//
// CMD must never outlive the claim it runs under, whatever happens to leasehold. So
// leasehold does not start CMD itself: it starts a guard — itself again, as the hidden
// command run-guard — as the leader of a new process group, and the guard starts CMD in
// that group. The guard holds the read end of a pipe whose only write end leasehold
// holds. When leasehold dies in any way, kill -9 included, the kernel closes that end,
// the guard reads end-of-file and kills its whole group with SIGKILL: CMD is gone the
// moment leasehold is, long before its lease can lapse and another holder be granted
// the lock. The guard never exits by itself once CMD runs: it tells leasehold how CMD
// ended over a second pipe and waits to be killed with the rest of its group, so no
// process CMD left behind outlives leasehold either.
//
// Over the same pipe leasehold sends, ten times a second, how long its lease is good
// for (client.LeaseDeadline, plus a tenth of the TTL, which still comes before the
// server can expire it): should leasehold stall — stopped with SIGSTOP, starved, stuck
// — the guard kills the group when that time runs out.
//
// The group is the terminal's foreground job when leasehold is: a CMD at a terminal
// reads it and gets Ctrl-C and Ctrl-Z, as if the shell had started it. When CMD stops
// (Ctrl-Z, or SIGTTIN reading a terminal it does not own), leasehold takes the
// terminal back and stops itself, so that the shell sees the job stopped; on SIGCONT it
// gives the terminal back when it is in the foreground, and continues the group.
//
// What is not covered: a process of CMD's that leaves the group (setsid, setpgid) is
// out of reach, as under any supervisor that kills by process group; and a guard paused
// with leasehold (the whole machine or cgroup frozen) kills nothing until it runs
// again. That is what fencing tokens are for.

// runGuardCmd is the name of the hidden command the guard runs as.
const runGuardCmd = "run-guard"

// The guard's file descriptors, passed by runGroup as ExtraFiles.
const (
	guardLifeFD   = 3 // read end: lease deadlines, one a line (ms from now); end-of-file means leasehold is gone
	guardReportFD = 4 // write end: one line per event, guardStopped, guardExit N, guardError MSG
)

// guardParentEnv holds the pid of the leasehold that started the guard.
const guardParentEnv = "LEASEHOLD_GUARD_PARENT"

// The guard's reports to leasehold, one line each.
const (
	guardStopped = "stopped"    // CMD was stopped by a signal
	guardExit    = "exit "      // CMD ended; its code follows (128+N for signal N)
	guardError   = "start-err " // CMD could not be started; why follows
	guardLapsed  = "lapsed"     // leasehold sent no later deadline in time: the guard killed the group
)

// forwarded are the signals leasehold passes on to CMD's process group.
var forwarded = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT,
	syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGTSTP, syscall.SIGCONT}

// catchSignals starts catching the forwarded signals for a runGroup to come. A caller
// calls it before it stops catching SIGINT and SIGTERM itself, so that no signal falls
// between the two and kills leasehold with the lock held; what arrives before CMD
// starts is forwarded as soon as it has.
func catchSignals() chan os.Signal {
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, forwarded...)
	return sigs
}

// selfCommand is how leasehold runs itself as a hidden command: the executable and the
// arguments before the command's name, and what to add to the environment. The test
// binary replaces it.
var selfCommand = func() (argv, env []string) {
	if runtime.GOOS == "linux" {
		return []string{"/proc/self/exe"}, nil // this very binary, even if replaced on disk since
	}
	exe, err := os.Executable()
	if err != nil {
		exe = os.Args[0]
	}
	return []string{exe}, nil
}

// groupRun is how a CMD run by runGroup ended.
type groupRun struct {
	startErr error // CMD could not be started (nothing ran)
	code     int   // CMD's exit code, 128+N if signal N ended it; -1 if unknown (lost)
	lost     bool  // held ended first, and the group was killed
	pgid     int
}

// runGroup runs argv in its own process group, under a guard, with env added to
// leasehold's, stdin and stderr leasehold's and stdout the given file, while held
// lasts. sigs is from catchSignals: those signals are forwarded to the group; after
// CMD stops, leasehold stops itself, so that CMD never runs on while leasehold,
// stopped, cannot keep the lease alive or kill CMD when it ends. When held ends first,
// the whole group is killed with SIGKILL at once (lost); when CMD exits, the rest of
// its group is killed too. If leasehold dies, the guard kills the group.
func runGroup(held context.Context, ttl time.Duration, argv, env []string, stdout *os.File, sigs chan os.Signal) groupRun {
	defer signal.Stop(sigs)
	if _, err := exec.LookPath(argv[0]); err != nil {
		return groupRun{startErr: err, code: -1}
	}
	lifeR, lifeW, err := os.Pipe()
	if err != nil {
		return groupRun{startErr: err, code: -1}
	}
	defer func() { _ = lifeW.Close() }() // after the group is dead: the guard's signal to die
	reportR, reportW, err := os.Pipe()
	if err != nil {
		_ = lifeR.Close()
		return groupRun{startErr: err, code: -1}
	}
	term := openTerminal()
	defer term.close()
	start := func(foreground bool) (*exec.Cmd, error) {
		self, selfEnv := selfCommand()
		cmd := exec.Command(self[0], append(append(self[1:], runGuardCmd), argv...)...)
		cmd.Args[0] = os.Args[0] // ps shows "leasehold run-guard CMD…", not /proc/self/exe
		cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, stdout, os.Stderr
		cmd.Env = append(append(os.Environ(), env...), append(selfEnv, guardParentEnv+"="+strconv.Itoa(os.Getpid()))...)
		cmd.ExtraFiles = []*os.File{lifeR, reportW} // guardLifeFD, guardReportFD
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if foreground {
			cmd.SysProcAttr.Foreground, cmd.SysProcAttr.Ctty = true, term.fd()
		}
		return cmd, cmd.Start()
	}
	cmd, err := start(term.foreground())
	if err != nil && term != nil {
		cmd, err = start(false) // leasehold left the foreground meanwhile (bg): CMD runs in the background
	}
	_, _ = lifeR.Close(), reportW.Close()
	if err != nil {
		_ = reportR.Close()
		return groupRun{startErr: err, code: -1}
	}
	r := groupRun{pgid: cmd.Process.Pid, code: -1}
	stopFeed := make(chan struct{})
	defer close(stopFeed) // before lifeW closes
	grace := ttl / 10     // within the margin between the client's deadline and the server's expiry (TTL/5)
	if grace <= 0 {
		grace = time.Second
	}
	go feedGuard(held, lifeW, grace, stopFeed)
	reports := make(chan string, 4)
	go func() {
		defer close(reports)
		for s := bufio.NewScanner(reportR); s.Scan(); {
			reports <- s.Text()
		}
		_ = reportR.Close()
	}()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer term.take(r.pgid)
	// end kills the group, waits for the guard and reads what it reported.
	var guardErr error
	guardGone := false
	end := func() groupRun {
		_ = syscall.Kill(-r.pgid, syscall.SIGKILL)
		if !guardGone {
			guardErr = <-done
		}
		for rep := range reports {
			r.take(rep)
		}
		if r.code < 0 && r.startErr == nil && !r.lost {
			// The guard died without a word (killed by someone): pass on how.
			r.code = exitCode(guardErr)
		}
		return r
	}
	pending := reports // nil once closed; end drains reports itself
	for {
		select {
		case s := <-sigs:
			if s == syscall.SIGCONT {
				term.give(r.pgid) // if leasehold is the foreground job (again)
			}
			_ = syscall.Kill(-r.pgid, s.(syscall.Signal))
		case rep, ok := <-pending:
			switch {
			case !ok:
				pending = nil // the guard is gone; done says how
			case rep == guardStopped:
				term.take(r.pgid)
				_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP) // until SIGCONT, forwarded too
			default:
				r.take(rep)
				return end()
			}
		case <-held.Done():
			r.lost = true
			return end()
		case guardErr = <-done:
			guardGone = true
			return end()
		}
	}
}

// feedGuard writes to the guard's life pipe, ten times a second until stop or until
// held ends, how many milliseconds are left until the lease's deadline plus grace.
func feedGuard(held context.Context, w io.Writer, grace time.Duration, stop <-chan struct{}) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		deadline, ok := client.LeaseDeadline(held)
		if !ok {
			return // lost: runGroup kills the group, or the last time sent runs out
		}
		if _, err := fmt.Fprintf(w, "%d\n", time.Until(deadline.Add(grace)).Milliseconds()); err != nil {
			return
		}
		select {
		case <-stop:
			return
		case <-held.Done():
			return
		case <-tick.C:
		}
	}
}

// take records a guard's report of how CMD ended.
func (r *groupRun) take(rep string) {
	switch {
	case rep == guardLapsed:
		r.lost = true
	case strings.HasPrefix(rep, guardExit):
		if n, err := strconv.Atoi(strings.TrimPrefix(rep, guardExit)); err == nil {
			r.code = n
		}
	case strings.HasPrefix(rep, guardError):
		r.startErr = errors.New(strings.TrimPrefix(rep, guardError))
	}
}

// terminal is leasehold's controlling terminal; nil when it has none (a daemon, a
// CI job), and then every method does nothing.
type terminal struct{ f *os.File }

// openTerminal opens the controlling terminal (/dev/tty), whichever of standard
// input, output and error are redirected: a CMD that reads it (a password prompt)
// needs to be its foreground job as much as one that reads standard input.
func openTerminal() *terminal {
	f, err := os.OpenFile("/dev/tty", os.O_RDWR, 0)
	if err != nil {
		return nil
	}
	return &terminal{f}
}

func (t *terminal) close() {
	if t != nil {
		_ = t.f.Close()
	}
}

func (t *terminal) fd() int { return int(t.f.Fd()) }

// owner is the terminal's foreground process group.
func (t *terminal) owner() (int, bool) {
	if t == nil {
		return 0, false
	}
	pg, err := unix.IoctlGetInt(t.fd(), unix.TIOCGPGRP)
	return pg, err == nil
}

// foreground reports whether leasehold's process group is the terminal's foreground
// group (the shell's foreground job).
func (t *terminal) foreground() bool {
	pg, ok := t.owner()
	return ok && pg == syscall.Getpgrp()
}

// give makes pgid the terminal's foreground group if leasehold's group is.
func (t *terminal) give(pgid int) {
	if t.foreground() {
		_ = unix.IoctlSetPointerInt(t.fd(), unix.TIOCSPGRP, pgid)
	}
}

// take makes leasehold's group the terminal's foreground group again if pgid is.
// leasehold is in the background then, so it ignores SIGTTOU meanwhile: else the
// kernel would stop it for changing the terminal.
func (t *terminal) take(pgid int) {
	if pg, ok := t.owner(); !ok || pg != pgid {
		return
	}
	signal.Ignore(syscall.SIGTTOU)
	_ = unix.IoctlSetPointerInt(t.fd(), unix.TIOCSPGRP, syscall.Getpgrp())
	signal.Reset(syscall.SIGTTOU)
}

// exitCode turns a wait error into leasehold's exit code: the process's code, 128+N
// if signal N ended it.
func exitCode(err error) int {
	if err == nil {
		return exitOK
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	return exitError
}

// newRunGuardCmd is the hidden command runGroup runs the guard as:
// `leasehold run-guard CMD [ARG...]`, with the pipes at guardLifeFD and guardReportFD.
func newRunGuardCmd() *cobra.Command {
	return &cobra.Command{
		Use:                runGuardCmd + " CMD [ARG...]",
		Hidden:             true,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return errors.New("give the command to run")
			}
			return exitWith(runGuard(cmd.ErrOrStderr(), args))
		},
	}
}

// runGuard is the guard: it starts argv in its own process group (which it leads),
// reports how argv ends, and kills the group when leasehold's end of the life pipe
// closes or the lease deadline leasehold last sent passes. It returns only when it
// could not start argv.
func runGuard(stderr io.Writer, argv []string) int {
	// The guard kills its whole process group: it must be sure it leads a group of its
	// own that runGroup made, not, run by hand, the shell's.
	parent := os.Getenv(guardParentEnv)
	_ = os.Unsetenv(guardParentEnv)
	if parent != strconv.Itoa(os.Getppid()) || syscall.Getpgrp() != os.Getpid() || !isPipe(guardLifeFD) || !isPipe(guardReportFD) {
		fmt.Fprintf(stderr, "leasehold %s: is run by leasehold lock, elect and once, not by hand\n", runGuardCmd)
		return exitUsage
	}
	syscall.CloseOnExec(guardLifeFD) // CMD must not hold them: only the guard dies with leasehold
	syscall.CloseOnExec(guardReportFD)
	report := os.NewFile(guardReportFD, "leasehold-report")

	// Signals for CMD reach the guard too, a member of its group: it must neither die of
	// them nor stop, or it could not kill the group when leasehold dies. Caught (not
	// ignored), they are back to their defaults in CMD.
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, append(forwarded, syscall.SIGTTIN, syscall.SIGTTOU, syscall.SIGPIPE)...)
	go func() {
		for range sigs {
		}
	}()
	path, err := exec.LookPath(argv[0])
	var p *os.Process
	if err == nil {
		p, err = os.StartProcess(path, argv, &os.ProcAttr{Env: os.Environ(), Files: []*os.File{os.Stdin, os.Stdout, os.Stderr}})
	}
	if err != nil {
		fmt.Fprintf(report, "%s%v\n", guardError, err)
		return 127
	}
	go reportCMD(p.Pid, report)
	watchLife(report)
	return exitError // not reached: watchLife ends with the group killed
}

// isPipe reports whether fd is an open pipe.
func isPipe(fd int) bool {
	var st syscall.Stat_t
	return syscall.Fstat(fd, &st) == nil && st.Mode&syscall.S_IFMT == syscall.S_IFIFO
}

// reportCMD waits for CMD and reports its stops and its end.
func reportCMD(pid int, report io.Writer) {
	for {
		var ws syscall.WaitStatus
		_, err := syscall.Wait4(pid, &ws, syscall.WUNTRACED, nil)
		switch {
		case errors.Is(err, syscall.EINTR):
			continue
		case err != nil:
			fmt.Fprintf(report, "%s%d\n", guardExit, exitError)
		case ws.Stopped():
			fmt.Fprintln(report, guardStopped)
			continue
		case ws.Signaled():
			fmt.Fprintf(report, "%s%d\n", guardExit, 128+int(ws.Signal()))
		default:
			fmt.Fprintf(report, "%s%d\n", guardExit, ws.ExitStatus())
		}
		return // leasehold kills the group now, or the life pipe does
	}
}

// watchLife reads leasehold's lease deadlines from the life pipe and kills the guard's
// process group, the guard too, when the pipe closes (leasehold is gone) or the last
// deadline passes before leasehold sends a later one (leasehold stalled).
func watchLife(report io.Writer) {
	var lapse *time.Timer
	life := bufio.NewReader(os.NewFile(guardLifeFD, "leasehold-life"))
	for {
		line, err := life.ReadString('\n')
		if err != nil {
			_ = syscall.Kill(0, syscall.SIGKILL)
			return
		}
		ms, err := strconv.ParseInt(strings.TrimSpace(line), 10, 64)
		if err != nil {
			continue
		}
		left := time.Duration(ms) * time.Millisecond
		if lapse == nil {
			lapse = time.AfterFunc(left, func() {
				fmt.Fprintln(report, guardLapsed)
				_ = syscall.Kill(0, syscall.SIGKILL)
			})
		} else {
			lapse.Reset(left)
		}
	}
}
