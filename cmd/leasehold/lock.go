package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/leasehold/leasehold/client"
)

// runLock implements `leasehold lock NAME... [flags] -- CMD [ARG...]`.
//
// Several names are one lock set (client.LockSet): all granted at once under one
// token, or none. --shared takes the lock(s) shared, --limit N as a semaphore of N.
//
// CMD runs in its own process group with LEASEHOLD_LOCK (the name; for a lock set the
// names, sorted, separated by commas) and LEASEHOLD_TOKEN in its environment. Signals leasehold receives (INT, TERM, HUP, QUIT, USR1, USR2) are
// forwarded to that group. If the lock is lost while CMD runs — the lease expired or was
// revoked, an operator force-released it, or keepalives went unanswered until the
// cautious local deadline, which comes before the server can expire the lease — the
// whole group is killed with SIGKILL at once and leasehold exits 76. Otherwise leasehold
// releases the lock when CMD exits and exits with CMD's code (128+N if a signal N ended
// it).
func runLock(args []string) int {
	fs := flag.NewFlagSet("lock", flag.ContinueOnError)
	addr := addrFlag(fs)
	class := fs.String("class", "correctness", "efficiency (avoid duplicate work) or correctness (protect data)")
	ttl := fs.Duration("ttl", 10*time.Second, "lease TTL; keepalives go about every TTL/3")
	wait := fs.String("wait", "forever", "how long to wait for the lock: a duration, 0 to try once, or forever")
	note := fs.String("note", "", "free text shown to others in 'leasehold locks'")
	delay := fs.Duration("lock-delay", 0, "after an expiry (not a clean release), keep the lock free of new holders this long")
	shared := fs.Bool("shared", false, "hold the lock shared (a reader): with other shared holders, never with an exclusive one")
	limit := fs.Int("limit", 0, "hold one of N slots of a semaphore of N (1 to 10000); every holder must give the same N")
	rod := fs.Bool("release-on-disconnect", false, "bind the lease to this process's connection: if it dies or is cut off, the server frees the lock at once, not after the TTL")
	names, argv, ok := namesAndCommand(fs, args, "lock NAME... [--class correctness|efficiency] [--ttl 10s] [--wait forever|0|DURATION] [--shared | --limit N] [--release-on-disconnect]")
	if !ok {
		return exitUsage
	}
	if len(names) == 0 {
		fmt.Fprintln(os.Stderr, "leasehold lock: give at least one lock NAME before --")
		return exitUsage
	}
	opts := []client.LockOption{client.LockTTL(*ttl), client.WithNote(*note), client.LockDelay(*delay)}
	if *rod {
		opts = append(opts, client.ReleaseOnDisconnect)
	}
	switch {
	case *shared && *limit != 0:
		fmt.Fprintln(os.Stderr, "leasehold lock: --shared and --limit exclude each other")
		return exitUsage
	case *shared:
		opts = append(opts, client.Shared)
	case *limit != 0:
		opts = append(opts, client.Semaphore(*limit))
	}
	switch *class {
	case "correctness":
		opts = append(opts, client.Correctness)
	case "efficiency":
		opts = append(opts, client.Efficiency)
	default:
		fmt.Fprintf(os.Stderr, "leasehold lock: --class must be correctness or efficiency, not %q\n", *class)
		return exitUsage
	}
	switch *wait {
	case "forever":
	case "0", "0s":
		opts = append(opts, client.TryOnce)
	default:
		d, err := time.ParseDuration(*wait)
		if err != nil || d < 0 {
			fmt.Fprintf(os.Stderr, "leasehold lock: --wait must be forever, 0 or a duration like 30s, not %q\n", *wait)
			return exitUsage
		}
		opts = append(opts, client.WaitFor(d))
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	c, code := dial(ctx, *addr, client.WithTTL(*ttl))
	if c == nil {
		stop()
		return code
	}
	defer func() { _ = c.Close(context.Background()) }()
	var l *client.Lock
	var err error
	if len(names) == 1 {
		l, err = c.Lock(ctx, names[0], opts...)
	} else {
		l, err = c.LockSet(ctx, names, opts...)
	}
	interrupted := ctx.Err() != nil
	stop() // from here on, signals go to CMD
	if err != nil {
		if interrupted {
			fmt.Fprintln(os.Stderr, "leasehold lock: interrupted while waiting for the lock")
			return exitNotAcquired
		}
		return exitFor("lock", err)
	}
	return runHolding(l, argv)
}

// namesAndCommand parses `NAME... [flags] -- CMD [ARG...]` (flags may also come before
// the names) with fs, and reports false, having printed the usage or what is wrong, when
// the arguments do not fit. usage is the command line to show before "-- CMD [ARG...]".
func namesAndCommand(fs *flag.FlagSet, args []string, usage string) (names, argv []string, ok bool) {
	sep := -1
	for i, a := range args {
		if a == "--" {
			sep = i
			break
		}
	}
	if sep < 0 || sep == len(args)-1 {
		fmt.Fprintf(os.Stderr, "usage: leasehold %s -- CMD [ARG...] (flags may also come before the names)\n", usage)
		return nil, nil, false
	}
	names, rest := splitNames(args[:sep])
	if err := fs.Parse(rest); err != nil {
		return nil, nil, false
	}
	names = append(names, fs.Args()...) // flags first: leasehold lock --class efficiency A B -- CMD
	return names, args[sep+1:], true
}

// runHolding runs argv while l is held and returns the exit code.
func runHolding(l *client.Lock, argv []string) int {
	name := strings.Join(l.Names(), ",")
	env := []string{"LEASEHOLD_LOCK=" + name, "LEASEHOLD_TOKEN=" + strconv.FormatUint(l.Token(), 10)}
	o := runGroup(l.Context(), argv, env, os.Stdout)
	switch {
	case o.startErr != nil:
		fmt.Fprintf(os.Stderr, "leasehold lock: start %s: %v\n", argv[0], o.startErr)
		_ = l.Unlock(context.Background())
		return 127
	case o.lost:
		if o.waitErr == nil {
			// CMD finished its work just as the lock was lost; report the loss anyway.
			fmt.Fprintln(os.Stderr, "leasehold lock: CMD exited 0 as the lock was lost")
		}
		fmt.Fprintf(os.Stderr, "leasehold lock: lost %s (token %d): %v; killed process group %d\n",
			name, l.Token(), context.Cause(l.Context()), o.pgid)
		return exitLockLost
	}
	uctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	uerr := l.Unlock(uctx)
	cancel()
	if errors.Is(uerr, client.ErrLockLost) {
		fmt.Fprintf(os.Stderr, "leasehold lock: %v\n", uerr)
		return exitLockLost
	}
	return exitCode(o.waitErr)
}

// groupRun is how a CMD run by runGroup ended.
type groupRun struct {
	startErr error // CMD could not be started (nothing ran)
	waitErr  error // CMD's wait error: nil for exit 0
	lost     bool  // held ended first, and the group was killed
	pgid     int
}

// runGroup runs argv in its own process group, with env added to leasehold's, stdin
// and stderr leasehold's and stdout the given file, while held lasts. Signals leasehold
// receives (INT, TERM, HUP, QUIT, USR1, USR2) are forwarded to the group. When held
// ends first, the whole group is killed with SIGKILL at once (lost); when CMD exits,
// the rest of its group is killed too: nothing may outlive the claim it ran under.
func runGroup(held context.Context, argv, env []string, stdout *os.File) groupRun {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, stdout, os.Stderr
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}

	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2)
	defer signal.Stop(sigs)

	if err := cmd.Start(); err != nil {
		return groupRun{startErr: err}
	}
	r := groupRun{pgid: cmd.Process.Pid}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	for {
		select {
		case s := <-sigs:
			_ = syscall.Kill(-r.pgid, s.(syscall.Signal))
		case <-held.Done():
			_ = syscall.Kill(-r.pgid, syscall.SIGKILL)
			r.waitErr, r.lost = <-done, true
			return r
		case r.waitErr = <-done:
			_ = syscall.Kill(-r.pgid, syscall.SIGKILL)
			return r
		}
	}
}

// exitCode turns CMD's wait error into leasehold's exit code.
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
