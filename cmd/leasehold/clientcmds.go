package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"connectrpc.com/connect"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/service"
)

// addrFlag registers --addr with its default from LEASEHOLD_ADDR.
func addrFlag(fs *flag.FlagSet) *string {
	def := os.Getenv("LEASEHOLD_ADDR")
	if def == "" {
		def = service.DefaultAddr
	}
	registerSecurityFlags(fs)
	return fs.String("addr", def, "server address (env LEASEHOLD_ADDR)")
}

// dial connects to the server, printing why it could not.
func dial(ctx context.Context, addr string, opts ...client.Option) (*client.Client, int) {
	sec, err := securityOptions()
	if err != nil {
		fmt.Fprintf(os.Stderr, "leasehold: %v\n", err)
		return nil, exitUsage
	}
	opts = append(sec, opts...)
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := client.Dial(dctx, addr, opts...)
	if code := connect.CodeOf(err); code == connect.CodeUnauthenticated || code == connect.CodePermissionDenied {
		fmt.Fprintf(os.Stderr, "leasehold: the server at %s refused our credentials (--auth-token-file, LEASEHOLD_AUTH_TOKEN, --cert): %v\n", addr, err)
		return nil, exitError
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "leasehold: cannot reach the server at %s: %v\n", addr, err)
		return nil, exitUnavailable
	}
	return c, exitOK
}

// exitFor prints err and returns the exit code it deserves.
func exitFor(cmd string, err error) int {
	fmt.Fprintf(os.Stderr, "leasehold %s: %v\n", cmd, err)
	switch {
	case errors.Is(err, client.ErrNotAcquired):
		return exitNotAcquired
	case errors.Is(err, client.ErrUnavailable), connect.CodeOf(err) == connect.CodeUnavailable:
		return exitUnavailable
	}
	return exitError
}

func runLocks(args []string) int {
	fs := flag.NewFlagSet("locks", flag.ContinueOnError)
	addr := addrFlag(fs)
	limit := fs.Int("limit", 1000, "show at most this many locks (max 10000)")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if fs.NArg() > 1 {
		fmt.Fprintln(os.Stderr, "usage: leasehold locks [--addr HOST:PORT] [PREFIX]")
		return exitUsage
	}
	ctx := context.Background()
	c, code := dial(ctx, *addr)
	if c == nil {
		return code
	}
	resp, err := c.List(ctx, fs.Arg(0), *limit)
	if err != nil {
		return exitFor("locks", err)
	}
	printLocks(os.Stdout, resp)
	return exitOK
}

// printLocks prints a table of locks, one line per holder: a lock held shared or a
// semaphore has a line for each of its holders after its first.
func printLocks(w io.Writer, resp *leaseholdv1.ListResponse) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tCLASS\tHOLDER\tTOKEN\tTTL LEFT\tWAITERS\tMODE")
	ttlLeft := func(ms int64) string {
		if ms < 0 {
			return "-"
		}
		return (time.Duration(ms) * time.Millisecond).String()
	}
	for _, l := range resp.GetLocks() {
		holder, token, ttl := "-", "-", "-"
		if l.GetHeld() {
			token = strconv.FormatUint(l.GetToken(), 10)
			holder = describeHolder(l.GetHolder())
			ttl = ttlLeft(l.GetTtlRemainingMs())
		} else if l.GetDelayRemainingMs() > 0 {
			holder = fmt.Sprintf("(lock-delay %v)", time.Duration(l.GetDelayRemainingMs())*time.Millisecond)
		}
		class := map[leaseholdv1.LockClass]string{
			leaseholdv1.LockClass_LOCK_CLASS_EFFICIENCY:  "efficiency",
			leaseholdv1.LockClass_LOCK_CLASS_CORRECTNESS: "correctness",
		}[l.GetClass()]
		mode := map[leaseholdv1.LockMode]string{
			leaseholdv1.LockMode_LOCK_MODE_SHARED:    "shared",
			leaseholdv1.LockMode_LOCK_MODE_SEMAPHORE: fmt.Sprintf("semaphore of %d", l.GetLimit()),
		}[l.GetMode()]
		if mode == "" {
			mode = "exclusive"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\n", l.GetName(), class, holder, token, ttl, l.GetWaiters(), mode)
		for _, h := range l.GetHolders()[min(1, len(l.GetHolders())):] {
			fmt.Fprintf(tw, "\t\t%s\t%d\t%s\t\t\n", describeHolder(h.GetHolder()), h.GetToken(), ttlLeft(h.GetTtlRemainingMs()))
		}
	}
	_ = tw.Flush()
	if resp.GetTruncated() {
		fmt.Fprintln(w, "(more locks match; raise --limit or narrow the prefix)")
	}
}

func describeHolder(h *leaseholdv1.Holder) string {
	if h == nil {
		return "?"
	}
	s := h.GetHost()
	if h.GetPid() != 0 {
		s += fmt.Sprintf(" pid %d", h.GetPid())
	}
	if h.GetNote() != "" {
		s += " (" + h.GetNote() + ")"
	}
	if s == "" {
		return "?"
	}
	return s
}

func runStatus(args []string) int {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	addr := addrFlag(fs)
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: leasehold status [--addr HOST:PORT]")
		return exitUsage
	}
	ctx := context.Background()
	c, code := dial(ctx, *addr)
	if c == nil {
		return code
	}
	st, err := c.Status(ctx)
	if err != nil {
		return exitFor("status", err)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "node\t%s\n", st.GetNodeId())
	fmt.Fprintf(tw, "cluster\t%s\n", orNone(st.GetClusterId()))
	fmt.Fprintf(tw, "role\t%s\n", st.GetRole())
	fmt.Fprintf(tw, "leader\t%s\n", st.GetLeader())
	fmt.Fprintf(tw, "term\t%d\n", st.GetTerm())
	fmt.Fprintf(tw, "commit index\t%d\n", st.GetCommitIndex())
	fmt.Fprintf(tw, "applied index\t%d\n", st.GetAppliedIndex())
	fmt.Fprintf(tw, "api addr\t%s\n", st.GetApiAddr())
	fmt.Fprintf(tw, "raft addr\t%s\n", st.GetRaftAddr())
	fmt.Fprintf(tw, "fast lane\t%s\n", orNone(st.GetFastLaneAddr()))
	fmt.Fprintf(tw, "leases\t%d\n", st.GetLeases())
	fmt.Fprintf(tw, "locks\t%d\n", st.GetLocks())
	fmt.Fprintf(tw, "last token\t%d\n", st.GetLastToken())
	fmt.Fprintf(tw, "version\t%s\n", st.GetVersion())
	fmt.Fprintf(tw, "uptime\t%v\n", time.Duration(st.GetUptimeMs())*time.Millisecond)
	_ = tw.Flush()
	return exitOK
}

// orNone shows an empty field as "-".
func orNone(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func runForceRelease(args []string) int {
	fs := flag.NewFlagSet("unlock", flag.ContinueOnError)
	addr := addrFlag(fs)
	force := fs.Bool("force", false, "required: release the lock whoever holds it")
	reason := fs.String("reason", "", "why (recorded and shown to the old holder)")
	name, rest := splitName(args)
	if err := fs.Parse(rest); err != nil {
		return exitUsage
	}
	if name == "" || !*force || fs.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: leasehold unlock NAME --force --reason TEXT\n\nReleases the lock whoever holds it. The old holder's token is fenced out: every\nlater grant carries a larger token. Its process is NOT stopped: only a resource that\nchecks tokens stops its writes.")
		return exitUsage
	}
	ctx := context.Background()
	c, code := dial(ctx, *addr)
	if c == nil {
		return code
	}
	released, fence, err := c.ForceRelease(ctx, name, *reason)
	if err != nil {
		return exitFor("unlock", err)
	}
	if released == 0 {
		fmt.Printf("%s was not held; fence token %d consumed\n", name, fence)
	} else {
		fmt.Printf("released %s (token %d); every later grant is above fence token %d\n", name, released, fence)
	}
	return exitOK
}

// splitName takes a leading NAME argument off args, so flags may come before or after it.
// splitNames returns the leading arguments that are not flags, and the rest.
func splitNames(args []string) ([]string, []string) {
	i := 0
	for i < len(args) && args[i] != "" && args[i][0] != '-' {
		i++
	}
	return args[:i], args[i:]
}

func splitName(args []string) (string, []string) {
	if len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
		return args[0], args[1:]
	}
	return "", args
}

// positionalThenFlags parses args of the form POSITIONAL... [FLAGS] [POSITIONAL...]: the
// arguments before the first flag, then fs's flags, then what follows them.
func positionalThenFlags(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		pos, args = append(pos, args[0]), args[1:]
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	return append(pos, fs.Args()...), nil
}
