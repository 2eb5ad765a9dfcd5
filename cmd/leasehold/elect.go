package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/leasehold/leasehold/client"
)

// runElect is `leasehold elect NAME [--value V] [--ttl D] [--release-on-disconnect] --
// CMD [ARG...]`: it campaigns for election NAME and, once it leads, runs CMD in its own
// process group with LEASEHOLD_ELECTION=NAME and LEASEHOLD_TOKEN=the epoch (a fencing
// token: every later leader's is larger). Signals are forwarded to the group. If the
// leadership is lost while CMD runs — as for `leasehold lock`, at the cautious local
// deadline at the latest, before the server can hand it over — the whole group is
// killed with SIGKILL and leasehold exits 76. When CMD exits, leasehold resigns (the
// next candidate leads at once) and exits with CMD's code.
func runElect(args []string) int {
	fs := flag.NewFlagSet("elect", flag.ContinueOnError)
	addr := addrFlag(fs)
	value := fs.String("value", "", "the value the election shows while this process leads (an address, say)")
	ttl := fs.Duration("ttl", 10*time.Second, "lease TTL: a leader that dies is replaced after this long at most")
	note := fs.String("note", "", "free text shown by 'leasehold leader'")
	rod := fs.Bool("release-on-disconnect", false, "bind the candidacy to this process's connection: if it dies or is cut off, the next candidate leads at once")
	names, argv, ok := namesAndCommand(fs, args, "elect NAME [--value V] [--ttl 10s] [--release-on-disconnect]")
	if !ok {
		return exitUsage
	}
	if len(names) != 1 {
		fmt.Fprintln(os.Stderr, "leasehold elect: give one election NAME before --")
		return exitUsage
	}
	name := names[0]
	opts := []client.ElectOption{client.ElectTTL(*ttl), client.ElectNote(*note)}
	if *rod {
		opts = append(opts, client.ElectReleaseOnDisconnect)
	}
	sigCtx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	c, code := dial(sigCtx, *addr, client.WithTTL(*ttl))
	if c == nil {
		stop()
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
	err := c.Elect(ctx, name, []byte(*value), func(lctx context.Context, l client.Leadership) error {
		leading.Store(true)
		stop() // from here on, signals go to CMD
		env := []string{"LEASEHOLD_ELECTION=" + name, "LEASEHOLD_TOKEN=" + strconv.FormatUint(l.Epoch(), 10)}
		o := runGroup(lctx, argv, env, os.Stdout)
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
			exit = exitCode(o.waitErr)
		}
		return nil
	}, opts...)
	stop()
	switch {
	case interrupted.Load():
		fmt.Fprintln(os.Stderr, "leasehold elect: interrupted while campaigning")
		return exitNotAcquired
	case err != nil && ctx.Err() == nil:
		return exitFor("elect", err)
	}
	return exit
}

// runLeader is `leasehold leader NAME [--output json]`: who leads election NAME.
func runLeader(args []string) int {
	fs := flag.NewFlagSet("leader", flag.ContinueOnError)
	addr := addrFlag(fs)
	output := fs.String("output", "text", "text or json")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	var name string
	if fs.NArg() > 0 { // flags may come after NAME too
		name = fs.Arg(0)
		if err := fs.Parse(fs.Args()[1:]); err != nil {
			return exitUsage
		}
	}
	if name == "" || fs.NArg() != 0 || (*output != "text" && *output != "json") {
		fmt.Fprintln(os.Stderr, "usage: leasehold leader NAME [--addr HOST:PORT] [--output text|json]")
		return exitUsage
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, code := dial(ctx, *addr)
	if c == nil {
		return code
	}
	defer func() { _ = c.Close(context.Background()) }()
	ld, ok, err := c.Leader(ctx, name)
	if err != nil {
		return exitFor("leader", err)
	}
	if *output == "json" {
		out := map[string]any{"name": name, "has_leader": ok}
		if ok {
			out["epoch"], out["value"], out["holder"] = ld.Epoch, string(ld.Value), ld.Holder
		}
		b, _ := json.Marshal(out)
		fmt.Println(string(b))
	} else if ok {
		fmt.Printf("%s\tepoch %d\tvalue %q\theld by %s pid %d %s\n", name, ld.Epoch, ld.Value, ld.Holder.Host, ld.Holder.PID, ld.Holder.Note)
	}
	if !ok {
		fmt.Fprintf(os.Stderr, "leasehold leader: nobody leads %s\n", name)
		return exitNotAcquired
	}
	return exitOK
}
