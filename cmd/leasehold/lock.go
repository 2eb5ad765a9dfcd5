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
	sep := -1
	for i, a := range args {
		if a == "--" {
			sep = i
			break
		}
	}
	if sep < 0 || sep == len(args)-1 {
		fmt.Fprintln(os.Stderr, "usage: leasehold lock NAME... [--class correctness|efficiency] [--ttl 10s] [--wait forever|0|DURATION] [--shared | --limit N] -- CMD [ARG...] (flags may also come before the names)")
		return exitUsage
	}
	names, rest := splitNames(args[:sep])
	if err := fs.Parse(rest); err != nil {
		return exitUsage
	}
	names = append(names, fs.Args()...) // flags first: leasehold lock --class efficiency A B -- CMD
	if len(names) == 0 {
		fmt.Fprintln(os.Stderr, "leasehold lock: give at least one lock NAME before --")
		return exitUsage
	}
	opts := []client.LockOption{client.LockTTL(*ttl), client.WithNote(*note), client.LockDelay(*delay)}
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
	return runHolding(l, args[sep+1:])
}

// runHolding runs argv while l is held and returns the exit code.
func runHolding(l *client.Lock, argv []string) int {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), "LEASEHOLD_LOCK="+strings.Join(l.Names(), ","), "LEASEHOLD_TOKEN="+strconv.FormatUint(l.Token(), 10))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}

	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2)
	defer signal.Stop(sigs)

	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "leasehold lock: start %s: %v\n", argv[0], err)
		_ = l.Unlock(context.Background())
		return 127
	}
	pgid := cmd.Process.Pid
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()

	for {
		select {
		case s := <-sigs:
			_ = syscall.Kill(-pgid, s.(syscall.Signal))
		case <-l.Context().Done():
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			if werr := <-done; werr == nil {
				// CMD finished its work just as the lock was lost; report the loss anyway.
				fmt.Fprintln(os.Stderr, "leasehold lock: CMD exited 0 as the lock was lost")
			}
			fmt.Fprintf(os.Stderr, "leasehold lock: lost %s (token %d): %v; killed process group %d\n",
				strings.Join(l.Names(), ","), l.Token(), context.Cause(l.Context()), pgid)
			return exitLockLost
		case err := <-done:
			// Take the rest of the group down too: nothing may outlive the lock.
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			uctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			uerr := l.Unlock(uctx)
			cancel()
			if errors.Is(uerr, client.ErrLockLost) {
				fmt.Fprintf(os.Stderr, "leasehold lock: %v\n", uerr)
				return exitLockLost
			}
			return exitCode(err)
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
