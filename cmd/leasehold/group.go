package main

import (
	"context"
	"fmt"
	"io"
	"os/signal"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/client"
)

// newGroupCmd is `leasehold group create|join|status`: partitions assigned to live
// members, each with an epoch.
func newGroupCmd() *cobra.Command {
	group := &cobra.Command{
		Use:   "group create|join|status ...",
		Short: "partitions assigned to live members, each with an epoch (its fencing token)",
		Long: `Groups: a fixed number of partitions, assigned by the service to the live members.

A partition moves only after its owner released it, its lease ended, or the group's drain
deadline passed; every assignment carries an epoch, larger than every earlier owner's:
fence the partition's writes with it.`,
		Args: cobra.NoArgs,
		RunE: usageOnly,
	}
	group.AddCommand(newGroupCreateCmd(), newGroupJoinCmd(), newGroupStatusCmd())
	return group
}

func newGroupCreateCmd() *cobra.Command {
	var addr string
	var partitions int
	var drain time.Duration
	cmd := &cobra.Command{
		Use:   "create GROUP --partitions N [--drain 10s]",
		Short: "create a group of N partitions (creating it again with the same settings succeeds)",
		Args:  cobra.ExactArgs(1),
		PreRunE: func(*cobra.Command, []string) error {
			if partitions < 1 || partitions > 4096 {
				return fmt.Errorf("--partitions must be 1 to 4096, not %d", partitions)
			}
			if drain < 0 {
				return fmt.Errorf("--drain must not be negative")
			}
			return nil
		},
		RunE: clientRun(&addr, func(ctx context.Context, c *client.Client, cmd *cobra.Command, args []string) error {
			if err := c.CreateGroup(ctx, args[0], partitions, drain); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "created group %s with %d partitions\n", args[0], partitions)
			return nil
		}),
	}
	addrFlag(cmd.Flags(), &addr)
	timeoutFlag(cmd.Flags(), 30*time.Second)
	cmd.Flags().IntVar(&partitions, "partitions", 0, "the number of partitions, 1 to 4096 (fixed for the group's life)")
	cmd.Flags().DurationVar(&drain, "drain", 0, "how long a moving partition may stay with its owner (0: the server's default, 10s)")
	return cmd
}

func newGroupJoinCmd() *cobra.Command {
	var addr string
	var weight uint32
	var ttl time.Duration
	cmd := &cobra.Command{
		Use:   "join GROUP MEMBER [--weight W] [--ttl 10s]",
		Short: "be a member until interrupted, printing each partition assigned and stopped",
		Long: `Be member MEMBER of GROUP until interrupted (SIGINT, SIGTERM: the member leaves, and its
partitions move to the other members at once). Prints, one line each:

  assigned GROUP/PARTITION epoch EPOCH
  stopped GROUP/PARTITION epoch EPOCH: CAUSE

The epoch is the partition's fencing token.`,
		Args: cobra.ExactArgs(2),
		PreRunE: func(*cobra.Command, []string) error {
			if weight < 1 || weight > 1000 {
				return fmt.Errorf("--weight must be 1 to 1000, not %d", weight)
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			return exitWith(groupJoin(cmd.OutOrStdout(), addr, ttl, args[0], args[1], weight))
		},
	}
	addrFlag(cmd.Flags(), &addr)
	cmd.Flags().Uint32Var(&weight, "weight", 1, "the member's share of the partitions, relative to the others', 1 to 1000")
	cmd.Flags().DurationVar(&ttl, "ttl", 10*time.Second, "the membership's lease TTL")
	return cmd
}

// groupJoin joins and prints every assignment and every stop, until SIGINT or SIGTERM.
func groupJoin(w io.Writer, addr string, ttl time.Duration, group, member string, weight uint32) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	c, code := dial(ctx, addr, client.WithTTL(ttl))
	if c == nil {
		return code
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), ttl)
		_ = c.Close(cctx)
		cancel()
	}()
	var mu sync.Mutex // one line at a time
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(w, format+"\n", args...)
	}
	say("joining group %s as %s", group, member)
	err := c.JoinGroup(ctx, group, member, func(pctx context.Context, p client.Partition) {
		say("assigned %s/%d epoch %d", p.Group, p.Number, p.Epoch)
		<-pctx.Done()
		say("stopped %s/%d epoch %d: %v", p.Group, p.Number, p.Epoch, context.Cause(pctx))
	}, client.WithWeight(weight))
	if err != nil {
		return exitFor("group join", err)
	}
	say("left group %s", group)
	return exitOK
}

func newGroupStatusCmd() *cobra.Command {
	var addr string
	var output *outputFormat
	cmd := &cobra.Command{
		Use:   "status GROUP",
		Short: "members and every partition's owner, epoch and whether it drains",
		Args:  cobra.ExactArgs(1),
		RunE: clientRun(&addr, func(ctx context.Context, c *client.Client, cmd *cobra.Command, args []string) error {
			st, err := c.GroupStatus(ctx, args[0])
			if err != nil {
				return err
			}
			if output.json() {
				return printJSON(cmd.OutOrStdout(), st)
			}
			printGroup(cmd.OutOrStdout(), st)
			return nil
		}),
	}
	addrFlag(cmd.Flags(), &addr)
	timeoutFlag(cmd.Flags(), 30*time.Second)
	output = outputFlag(cmd)
	return cmd
}

// printGroup prints a group's members and partitions as two tables.
func printGroup(w io.Writer, st *leaseholdv1.GroupServiceStatusResponse) {
	fmt.Fprintf(w, "group %s: %d partitions, drain deadline %v\n", st.GetGroup(), len(st.GetPartitions()), time.Duration(st.GetDrainMs())*time.Millisecond)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MEMBER\tWEIGHT\tOWNS")
	for _, m := range st.GetMembers() {
		fmt.Fprintf(tw, "%s\t%d\t%d\n", m.GetName(), m.GetWeight(), m.GetOwns())
	}
	fmt.Fprintln(tw, "\nPARTITION\tOWNER\tEPOCH\tDRAINING")
	for _, p := range st.GetPartitions() {
		draining := ""
		if p.GetDraining() {
			draining = "yes"
		}
		fmt.Fprintf(tw, "%d\t%s\t%d\t%s\n", p.GetPartition(), orNone(p.GetOwner()), p.GetEpoch(), draining)
	}
	_ = tw.Flush()
}
