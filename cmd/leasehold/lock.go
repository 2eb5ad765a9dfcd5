package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/leasehold/leasehold/client"
)

// newLockCmd is `leasehold lock NAME... [flags] -- CMD [ARG...]`.
//
// Several names are one lock set (client.LockSet): all granted at once under one
// token, or none. --shared takes the lock(s) shared, --limit N as a semaphore of N.
//
// CMD runs in its own process group (runGroup: under a guard that kills the group if
// leasehold dies) with LEASEHOLD_LOCK (the name; for a lock set the names, sorted,
// separated by commas) and LEASEHOLD_TOKEN in its environment. Signals leasehold
// receives (INT, TERM, HUP, QUIT, USR1, USR2, TSTP, CONT) are forwarded to that group.
// If the lock is lost while CMD runs — the lease expired or was revoked, an operator
// force-released it, or keepalives went unanswered until the cautious local deadline,
// which comes before the server can expire the lease — the whole group is killed with
// SIGKILL at once and leasehold exits 76. Otherwise leasehold releases the lock when
// CMD exits and exits with CMD's code (128+N if a signal N ended it).
func newLockCmd() *cobra.Command {
	var f struct {
		addr              string
		class, wait, note *string
		ttl, delay        *time.Duration
		shared, rod       *bool
		limit             *int
	}
	cmd := &cobra.Command{
		Use:   "lock NAME... [flags] -- CMD [ARG...]",
		Short: "run CMD while holding lock NAME (several names: one lock set)",
		Long: `Runs CMD while holding lock NAME. CMD gets LEASEHOLD_TOKEN (the fencing token) and
LEASEHOLD_LOCK in its environment, runs in its own process group, and receives the
signals leasehold gets. Several names are one lock set: all at once, one token.
--shared holds the lock shared (a reader), --limit N one of N slots of a semaphore.
--release-on-disconnect binds the lease to leasehold's connection: if leasehold dies or
is cut off, the server frees the lock at once (G7), not after the TTL.
Flags may come before or after the names; everything after -- is CMD's, untouched.

If the lock is lost while CMD runs, CMD's process group is killed (SIGKILL) and
leasehold exits 76; otherwise it releases the lock and exits with CMD's code.
Exit 75: the lock was held for the whole --wait.`,
		Example: `  leasehold lock jobs/nightly -- ./nightly.sh
  leasehold lock --wait 0 --class efficiency cache/rebuild -- make cache
  leasehold lock db/a db/b --ttl 30s -- ./migrate --from a --to b`,
		RunE: func(cmd *cobra.Command, args []string) error {
			names, argv, err := namesAndCommand(cmd, args)
			if err != nil {
				return err
			}
			if err := notNegative("--ttl", *f.ttl); err != nil {
				return err
			}
			if err := notNegative("--lock-delay", *f.delay); err != nil {
				return err
			}
			opts, err := lockOptions(*f.class, *f.wait, *f.shared, *f.limit)
			if err != nil {
				return err
			}
			opts = append(opts, client.LockTTL(*f.ttl), client.WithNote(*f.note), client.LockDelay(*f.delay))
			if *f.rod {
				opts = append(opts, client.ReleaseOnDisconnect)
			}
			return exitWith(lockAndRun(f.addr, *f.ttl, names, argv, opts))
		},
	}
	fs := cmd.Flags()
	addrFlag(fs, &f.addr)
	f.class = fs.String("class", "correctness", "efficiency (avoid duplicate work) or correctness (protect data)")
	f.ttl = fs.Duration("ttl", 10*time.Second, "lease TTL; keepalives go about every TTL/3")
	f.wait = fs.String("wait", "forever", "how long to wait for the lock: a duration, 0 to try once, or forever")
	f.note = fs.String("note", "", "free text shown to others in 'leasehold locks'")
	f.delay = fs.Duration("lock-delay", 0, "after an expiry (not a clean release), keep the lock free of new holders this long")
	f.shared = fs.Bool("shared", false, "hold the lock shared (a reader): with other shared holders, never with an exclusive one")
	f.limit = fs.Int("limit", 0, "hold one of N slots of a semaphore of N (1 to 10000); every holder must give the same N")
	f.rod = fs.Bool("release-on-disconnect", false, "bind the lease to this process's connection: if it dies or is cut off, the server frees the lock at once, not after the TTL")
	completeFlag(cmd, "class", "correctness", "efficiency")
	completeFlag(cmd, "wait", "forever", "0", "10s", "1m")
	return cmd
}

// lockOptions turns lock's --class, --wait, --shared and --limit into lock options; an
// error names the flag that is wrong.
func lockOptions(class, wait string, shared bool, limit int) ([]client.LockOption, error) {
	var opts []client.LockOption
	switch {
	case shared && limit != 0:
		return nil, errors.New("--shared and --limit exclude each other")
	case limit < 0:
		return nil, fmt.Errorf("--limit must be 1 to 10000, not %d", limit)
	case shared:
		opts = append(opts, client.Shared)
	case limit != 0:
		opts = append(opts, client.Semaphore(limit))
	}
	switch class {
	case "correctness":
		opts = append(opts, client.Correctness)
	case "efficiency":
		opts = append(opts, client.Efficiency)
	default:
		return nil, fmt.Errorf("--class must be correctness or efficiency, not %q", class)
	}
	switch wait {
	case "forever":
	case "0", "0s":
		opts = append(opts, client.TryOnce)
	default:
		d, err := time.ParseDuration(wait)
		if err != nil || d < 0 {
			return nil, fmt.Errorf("--wait must be forever, 0 or a duration like 30s, not %q", wait)
		}
		opts = append(opts, client.WaitFor(d))
	}
	return opts, nil
}

// notNegative is the usage error of a negative duration flag.
func notNegative(flag string, d time.Duration) error {
	if d < 0 {
		return fmt.Errorf("%s must not be negative, not %v", flag, d)
	}
	return nil
}

// lockAndRun takes the lock (or lock set) names and runs argv while it is held; it
// returns the exit code.
func lockAndRun(addr string, ttl time.Duration, names, argv []string, opts []client.LockOption) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	c, code := dial(ctx, addr, client.WithTTL(ttl))
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
	sigs := catchSignals() // from here on, signals go to CMD; none falls in between
	interrupted := ctx.Err() != nil
	stop() // cancels ctx
	switch {
	case err != nil && interrupted:
		signal.Stop(sigs)
		fmt.Fprintln(os.Stderr, "leasehold lock: interrupted while waiting for the lock")
		return exitNotAcquired
	case err != nil:
		signal.Stop(sigs)
		return exitFor("lock", err)
	case interrupted:
		signal.Stop(sigs)
		_ = l.Unlock(context.Background())
		fmt.Fprintln(os.Stderr, "leasehold lock: interrupted as the lock was granted; released it, CMD not run")
		return exitNotAcquired
	}
	return runHolding(l, ttl, argv, sigs)
}

// namesAndCommand splits the arguments of `NAME... [flags] -- CMD [ARG...]` (cobra has
// taken the flags out, wherever they were) at the --, and returns a usage error when
// there is no NAME, no --, or nothing after it.
func namesAndCommand(cmd *cobra.Command, args []string) (names, argv []string, err error) {
	dash := cmd.ArgsLenAtDash()
	switch {
	case dash < 0:
		return nil, nil, errors.New("give the command to run after --: " + cmd.UseLine())
	case dash == len(args):
		return nil, nil, errors.New("nothing to run after --: " + cmd.UseLine())
	case dash == 0:
		return nil, nil, errors.New("give at least one NAME before --: " + cmd.UseLine())
	}
	return args[:dash], args[dash:], nil
}

// runHolding runs argv while l is held and returns the exit code; sigs is from
// catchSignals.
func runHolding(l *client.Lock, ttl time.Duration, argv []string, sigs chan os.Signal) int {
	name := strings.Join(l.Names(), ",")
	env := []string{"LEASEHOLD_LOCK=" + name, "LEASEHOLD_TOKEN=" + strconv.FormatUint(l.Token(), 10)}
	o := runGroup(l.Context(), ttl, argv, env, os.Stdout, sigs)
	switch {
	case o.startErr != nil:
		fmt.Fprintf(os.Stderr, "leasehold lock: start %s: %v\n", argv[0], o.startErr)
		_ = l.Unlock(context.Background())
		return 127
	case o.lost:
		if o.code == 0 {
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
	return o.code
}
