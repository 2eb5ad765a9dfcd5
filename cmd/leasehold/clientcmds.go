package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/service"
)

// addrFlag registers --addr, bound to addr, with its default from LEASEHOLD_ADDR, and
// the security flags (registerSecurityFlags).
func addrFlag(fs *pflag.FlagSet, addr *string) {
	def := os.Getenv("LEASEHOLD_ADDR")
	if def == "" {
		def = service.DefaultAddr
	}
	registerSecurityFlags(fs)
	fs.StringVar(addr, "addr", def, "server address (env LEASEHOLD_ADDR)")
}

// timeoutFlag registers --timeout on a command that makes its calls and exits: how long
// they may take, retries included. The client retries while no node can answer (no
// leader, every node down), so without a bound such a command would wait for ever;
// with it, it gives up with the last error (exit 69 when no server answered). 0 waits
// for ever. clientRun applies it.
func timeoutFlag(fs *pflag.FlagSet, def time.Duration) {
	fs.Duration("timeout", def, "give up after this long, retries included (0: wait for ever)")
}

// outputFormat is the value of --output: text or json.
type outputFormat string

func (o *outputFormat) String() string { return string(*o) }
func (o *outputFormat) Type() string   { return "text|json" }

func (o *outputFormat) Set(v string) error {
	if v != "text" && v != "json" {
		return errors.New("want text or json")
	}
	*o = outputFormat(v)
	return nil
}

// json reports whether the output is JSON.
func (o *outputFormat) json() bool { return *o == "json" }

// outputFlag registers --output (-o) on cmd, text by default, with its completions.
func outputFlag(cmd *cobra.Command) *outputFormat {
	fs := cmd.Flags()
	o := outputFormat("text")
	fs.VarP(&o, "output", "o", "text, or json: the API's response as one JSON document (the protobuf JSON mapping, as curl gets it)")
	completeFlag(cmd, "output", "text", "json")
	return &o
}

// completeFlag makes shell completion offer values for the flag name of cmd.
func completeFlag(cmd *cobra.Command, name string, values ...string) {
	_ = cmd.RegisterFlagCompletionFunc(name, cobra.FixedCompletions(values, cobra.ShellCompDirectiveNoFileComp))
}

// printJSON writes m as one indented JSON document in the protobuf JSON mapping, with
// every field present (zero values too): 64-bit integers are strings, bytes base64.
func printJSON(w io.Writer, m proto.Message) error {
	b, err := protojson.MarshalOptions{EmitUnpopulated: true}.Marshal(m)
	if err != nil {
		return err
	}
	var out bytes.Buffer
	if err := json.Indent(&out, b, "", "  "); err != nil {
		return err
	}
	out.WriteByte('\n')
	_, err = out.WriteTo(w)
	return err
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

// clientRun makes the RunE of a client command from do: it dials the server at *addr
// and calls do with the client. An error do returns is the service's answer, unless it
// is an exit code (exitWith): it is printed, after the command's name, and the exit code
// is the one exitFor gives it.
func clientRun(addr *string, do func(ctx context.Context, c *client.Client, cmd *cobra.Command, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		ctx := context.Background()
		if d, err := cmd.Flags().GetDuration("timeout"); err == nil && d != 0 {
			if d < 0 {
				return notNegative("--timeout", d)
			}
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, d)
			defer cancel()
		}
		c, code := dial(ctx, *addr)
		if c == nil {
			return exitWith(code)
		}
		err := do(ctx, c, cmd, args)
		var ec *exitCodeError
		if err == nil || errors.As(err, &ec) {
			return err
		}
		if errors.Is(ctx.Err(), context.DeadlineExceeded) && !errors.Is(err, client.ErrUnavailable) {
			// --timeout ran out: whatever the last attempt answered (a node's own
			// DeadlineExceeded, say), no server gave an answer in time.
			err = fmt.Errorf("%w: gave up after --timeout: %w", client.ErrUnavailable, err)
		}
		return exitWith(exitFor(strings.TrimPrefix(cmd.CommandPath(), cmd.Root().Name()+" "), err))
	}
}

// completeFromServer is a ValidArgsFunction that offers, for a command's first
// argument, the names list finds under what was typed so far on the server at *addr:
// lock names, or keys. It waits at most a second, says nothing when the server cannot
// be reached, and offers no files.
func completeFromServer(addr *string, list func(ctx context.Context, c *client.Client, prefix string) ([]string, error)) cobra.CompletionFunc {
	return func(_ *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		opts, err := securityOptions()
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		c, err := client.Dial(ctx, *addr, opts...)
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		defer func() { _ = c.Close(context.Background()) }()
		names, _ := list(ctx, c, toComplete)
		return names, cobra.ShellCompDirectiveNoFileComp
	}
}

// lockNames lists up to 100 lock names under prefix, for completion.
func lockNames(ctx context.Context, c *client.Client, prefix string) ([]string, error) {
	resp, err := c.List(ctx, prefix, 100)
	var names []string
	for _, l := range resp.GetLocks() {
		names = append(names, l.GetName())
	}
	return names, err
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

func newLocksCmd() *cobra.Command {
	var addr string
	var limit *int
	var output *outputFormat
	cmd := &cobra.Command{
		Use:               "locks [PREFIX]",
		Short:             "list locks: name, class, holder, token, TTL left",
		Args:              cobra.MaximumNArgs(1),
		ValidArgsFunction: completeFromServer(&addr, lockNames),
		RunE: clientRun(&addr, func(ctx context.Context, c *client.Client, cmd *cobra.Command, args []string) error {
			resp, err := c.List(ctx, firstArg(args), *limit)
			if err != nil {
				return err
			}
			if output.json() {
				return printJSON(cmd.OutOrStdout(), resp)
			}
			printLocks(cmd.OutOrStdout(), resp)
			return nil
		}),
	}
	addrFlag(cmd.Flags(), &addr)
	timeoutFlag(cmd.Flags(), 30*time.Second)
	limit = cmd.Flags().Int("limit", 1000, "show at most this many locks (max 10000)")
	output = outputFlag(cmd)
	return cmd
}

// firstArg is args[0], or "" when there is none.
func firstArg(args []string) string {
	if len(args) == 0 {
		return ""
	}
	return args[0]
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

func newStatusCmd() *cobra.Command {
	var addr string
	var output *outputFormat
	cmd := &cobra.Command{
		Use:   "status",
		Short: "show the node's role, leader and counts",
		Args:  cobra.NoArgs,
		RunE: clientRun(&addr, func(ctx context.Context, c *client.Client, cmd *cobra.Command, _ []string) error {
			st, err := c.Status(ctx)
			if err != nil {
				return err
			}
			if output.json() {
				return printJSON(cmd.OutOrStdout(), st)
			}
			printStatus(cmd.OutOrStdout(), st)
			return nil
		}),
	}
	addrFlag(cmd.Flags(), &addr)
	timeoutFlag(cmd.Flags(), 30*time.Second)
	output = outputFlag(cmd)
	return cmd
}

// printStatus prints a node's status as a table of names and values.
func printStatus(w io.Writer, st *leaseholdv1.StatusResponse) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
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
}

// orNone shows an empty field as "-".
func orNone(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func newUnlockCmd() *cobra.Command {
	var addr string
	var reason *string
	var force *bool
	cmd := &cobra.Command{
		Use:   "unlock NAME --force --reason TEXT",
		Short: "operator release: fences the old holder out",
		Long: `Releases the lock whoever holds it. The old holder's token is fenced out: every
later grant carries a larger token. Its process is NOT stopped: only a resource that
checks tokens stops its writes.`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeFromServer(&addr, lockNames),
		PreRunE: func(*cobra.Command, []string) error {
			if !*force {
				return errors.New("--force is required: it releases the lock whoever holds it")
			}
			return nil
		},
		RunE: clientRun(&addr, func(ctx context.Context, c *client.Client, cmd *cobra.Command, args []string) error {
			name := args[0]
			released, fence, err := c.ForceRelease(ctx, name, *reason)
			if err != nil {
				return err
			}
			if released == 0 {
				fmt.Fprintf(cmd.OutOrStdout(), "%s was not held; fence token %d consumed\n", name, fence)
			} else {
				fmt.Fprintf(cmd.OutOrStdout(), "released %s (token %d); every later grant is above fence token %d\n", name, released, fence)
			}
			return nil
		}),
	}
	addrFlag(cmd.Flags(), &addr)
	timeoutFlag(cmd.Flags(), 30*time.Second)
	force = cmd.Flags().Bool("force", false, "required: release the lock whoever holds it")
	reason = cmd.Flags().String("reason", "", "why (recorded and shown to the old holder)")
	return cmd
}
