package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/client"
)

// newElectCmd is `leasehold elect NAME [--value V] [--ttl D] [--release-on-disconnect]
// -- CMD [ARG...]`.
func newElectCmd() *cobra.Command {
	var f struct {
		addr        string
		value, note *string
		ttl         *time.Duration
		rod         *bool
	}
	cmd := &cobra.Command{
		Use:   "elect NAME [flags] -- CMD [ARG...]",
		Short: "campaign for election NAME and run CMD while leading it",
		Long: `Campaigns for election NAME (FIFO behind the other candidates) and, once it leads,
runs CMD in its own process group with LEASEHOLD_ELECTION=NAME and LEASEHOLD_TOKEN=the
epoch: a fencing token, larger for every later leader. Signals are forwarded to CMD.
'leasehold leader NAME' shows the leader and its --value.

If the leadership is lost while CMD runs (at the cautious local deadline at the latest,
before the server can hand it over), CMD's process group is killed (SIGKILL) and
leasehold exits 76. When CMD exits, leasehold resigns — the next candidate leads at
once — and exits with CMD's code. With --release-on-disconnect a leader that dies or
is cut off is replaced at once, not after the TTL.`,
		Example: `  leasehold elect db/primary --value 10.0.0.7:5432 -- ./run-primary.sh
  leasehold elect jobs/scheduler --ttl 5s --release-on-disconnect -- ./scheduler`,
		RunE: func(cmd *cobra.Command, args []string) error {
			names, argv, err := namesAndCommand(cmd, args)
			if err != nil {
				return err
			}
			if len(names) != 1 {
				return errors.New("give one election NAME before --: " + cmd.UseLine())
			}
			if err := notNegative("--ttl", *f.ttl); err != nil {
				return err
			}
			opts := []client.ElectOption{client.ElectTTL(*f.ttl), client.ElectNote(*f.note)}
			if *f.rod {
				opts = append(opts, client.ElectReleaseOnDisconnect)
			}
			return exitWith(electAndRun(f.addr, *f.ttl, names[0], []byte(*f.value), argv, opts))
		},
	}
	fs := cmd.Flags()
	addrFlag(fs, &f.addr)
	f.value = fs.String("value", "", "the value the election shows while this process leads (an address, say)")
	f.ttl = fs.Duration("ttl", 10*time.Second, "lease TTL: a leader that dies is replaced after this long at most")
	f.note = fs.String("note", "", "free text shown by 'leasehold leader'")
	f.rod = fs.Bool("release-on-disconnect", false, "bind the candidacy to this process's connection: if it dies or is cut off, the next candidate leads at once")
	return cmd
}

// electAndRun campaigns for election name and runs argv while it leads; it returns the
// exit code.
func electAndRun(addr string, ttl time.Duration, name string, value []byte, argv []string, opts []client.ElectOption) int {
	sigCtx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	c, code := dial(sigCtx, addr, client.WithTTL(ttl))
	if c == nil {
		return code
	}
	defer func() { _ = c.Close(context.Background()) }()
	// Not derived from sigCtx: stop cancels that, and from the first leadership on,
	// signals go to CMD.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var leading, interrupted atomic.Bool
	go func() {
		<-sigCtx.Done()
		if !leading.Load() {
			interrupted.Store(true)
			cancel()
		}
	}()
	exit := exitOK
	err := c.Elect(ctx, name, value, func(lctx context.Context, l client.Leadership) error {
		leading.Store(true)
		sigs := catchSignals() // from here on, signals go to CMD; none falls in between
		stop()
		env := []string{"LEASEHOLD_ELECTION=" + name, "LEASEHOLD_TOKEN=" + strconv.FormatUint(l.Epoch(), 10)}
		o := runGroup(lctx, ttl, argv, env, os.Stdout, sigs)
		switch {
		case o.startErr != nil:
			fmt.Fprintf(os.Stderr, "leasehold elect: start %s: %v\n", argv[0], o.startErr)
			exit = 127
		case o.lost && ctx.Err() == nil:
			fmt.Fprintf(os.Stderr, "leasehold elect: lost the leadership of %s (epoch %d): %v; killed process group %d\n",
				name, l.Epoch(), context.Cause(lctx), o.pgid)
			exit = exitLockLost
			cancel() // do not campaign again: a supervisor restarts us if it wants
		default:
			exit = o.code
		}
		return nil
	}, opts...)
	switch {
	case interrupted.Load():
		fmt.Fprintln(os.Stderr, "leasehold elect: interrupted while campaigning")
		return exitNotAcquired
	case err != nil && ctx.Err() == nil:
		return exitFor("elect", err)
	}
	return exit
}

// newLeaderCmd is `leasehold leader NAME [--output json]`: who leads election NAME.
// Exit 75 when nobody does.
func newLeaderCmd() *cobra.Command {
	var addr string
	cmd := &cobra.Command{
		Use:   "leader NAME",
		Short: "show who leads election NAME: epoch, value, holder (exit 75: nobody)",
		Args:  cobra.ExactArgs(1),
	}
	output := outputFlag(cmd)
	addrFlag(cmd.Flags(), &addr)
	timeoutFlag(cmd.Flags(), 30*time.Second)
	cmd.RunE = clientRun(&addr, func(ctx context.Context, c *client.Client, cmd *cobra.Command, args []string) error {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		ld, ok, err := c.Leader(ctx, args[0])
		if err != nil {
			return err
		}
		w := cmd.OutOrStdout()
		switch {
		case *output == "json":
			resp := &leaseholdv1.LeaderResponse{HasLeader: ok, Epoch: ld.Epoch, Value: ld.Value}
			if ok {
				resp.Holder = &leaseholdv1.Holder{Host: ld.Holder.Host, Pid: ld.Holder.PID, Note: ld.Holder.Note}
			}
			if err := printJSON(w, resp); err != nil {
				return err
			}
		case ok:
			fmt.Fprintf(w, "%s\tepoch %d\tvalue %q\theld by %s pid %d %s\n", args[0], ld.Epoch, ld.Value, ld.Holder.Host, ld.Holder.PID, ld.Holder.Note)
		}
		if !ok {
			fmt.Fprintf(cmd.ErrOrStderr(), "leasehold leader: nobody leads %s\n", args[0])
			return exitWith(exitNotAcquired)
		}
		return nil
	})
	return cmd
}

// newObserveCmd is `leasehold observe NAME [--after REV] [--count N] [--output json]`:
// who leads election NAME, then every change, one line each, until interrupted.
func newObserveCmd() *cobra.Command {
	var addr string
	var after int64
	var count int
	cmd := &cobra.Command{
		Use:   "observe NAME",
		Short: "show who leads election NAME, then every change (leader, value, nobody), one line each",
		Long: `Prints who leads election NAME, then each change as the cluster applies it — a new
leader, a new value it proclaimed, nobody leading — one line each, until interrupted:
"REV epoch N value V held by HOST pid PID", or "REV no leader (epoch N ended)", with how
the leadership before ended (resigned, expired, revoked, disconnected). REV is the
change's revision. Every change comes once and in order, also across broken streams:
it resumes from the cluster's replicated election history after the last change shown.
--after REV starts after an earlier REV instead of from who leads now (0: from the oldest
change held). When the changes to resume from are no longer held, it fails "compacted",
naming the oldest revision held, rather than skip them. --count N exits after N lines.
--output json prints one compact protobuf-JSON ObserveResponse per line.`,
		Args: cobra.ExactArgs(1),
		PreRunE: func(*cobra.Command, []string) error {
			if after < -1 || count < 0 {
				return errors.New("--after and --count must not be negative")
			}
			return nil
		},
	}
	output := outputFlag(cmd)
	addrFlag(cmd.Flags(), &addr)
	cmd.Flags().Int64Var(&after, "after", -1, "start after this revision (a REV shown earlier; 0: the oldest held); default: who leads now")
	cmd.Flags().IntVar(&count, "count", 0, "exit after this many lines (0: until interrupted)")
	cmd.RunE = clientRun(&addr, func(ctx context.Context, c *client.Client, cmd *cobra.Command, args []string) error {
		ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
		defer stop()
		var opts []client.ObserveOption
		if after >= 0 {
			opts = append(opts, client.ObserveAfter(uint64(after)))
		}
		w := cmd.OutOrStdout()
		errEnough := errors.New("enough lines")
		lines := 0
		err := c.Observe(ctx, args[0], func(l client.ElectionLeader, ok bool) error {
			if err := printChange(w, l, ok, output.json()); err != nil {
				return err
			}
			if lines++; count > 0 && lines >= count {
				return errEnough
			}
			return nil
		}, opts...)
		if ctx.Err() != nil || errors.Is(err, errEnough) {
			return nil // interrupted, or --count reached: the normal ends
		}
		return err
	})
	return cmd
}

// printChange prints one change Observe showed: a line of text, or one ObserveResponse
// in compact JSON.
func printChange(w io.Writer, l client.ElectionLeader, ok, asJSON bool) error {
	if asJSON {
		resp := &leaseholdv1.ObserveResponse{HasLeader: ok, Epoch: l.Epoch, Value: l.Value, Revision: l.Revision, Ended: l.Ended}
		if !l.Time.IsZero() {
			resp.UnixMs = l.Time.UnixMilli()
		}
		if ok {
			resp.Holder = &leaseholdv1.Holder{Host: l.Holder.Host, Pid: l.Holder.PID, Note: l.Holder.Note}
		}
		return printJSONLine(w, resp)
	}
	ended := ""
	if l.Ended != leaseholdv1.TenureEnd_TENURE_END_UNSPECIFIED {
		ended = "\t(the leadership before " + endedWord(l.Ended) + ")"
	}
	var err error
	if ok {
		_, err = fmt.Fprintf(w, "%d\tepoch %d\tvalue %q\theld by %s pid %d %s%s\n", l.Revision, l.Epoch, l.Value, l.Holder.Host, l.Holder.PID, l.Holder.Note, ended)
	} else {
		_, err = fmt.Fprintf(w, "%d\tno leader (epoch %d ended)%s\n", l.Revision, l.Epoch, ended)
	}
	return err
}

// endedWord says how a leadership ended.
func endedWord(e leaseholdv1.TenureEnd) string {
	switch e {
	case leaseholdv1.TenureEnd_TENURE_END_RELEASED:
		return "resigned"
	case leaseholdv1.TenureEnd_TENURE_END_EXPIRED:
		return "expired"
	case leaseholdv1.TenureEnd_TENURE_END_REVOKED:
		return "was revoked"
	case leaseholdv1.TenureEnd_TENURE_END_DISCONNECTED:
		return "was disconnected"
	}
	return "ended"
}
