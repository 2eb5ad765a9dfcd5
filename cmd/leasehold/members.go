package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/client"
)

// newMembersCmd is `leasehold members list|add|remove`: cluster membership.
func newMembersCmd() *cobra.Command {
	members := &cobra.Command{
		Use:   "members list|add|remove",
		Short: "cluster membership",
		Args:  cobra.NoArgs,
		RunE:  usageOnly,
	}
	members.AddCommand(
		membersCmd("list", "list the cluster's members", cobra.NoArgs,
			func(ctx context.Context, c *client.Client, _ []string) ([]*leaseholdv1.Member, error) {
				return c.Members(ctx)
			}),
		membersCmd("add NODE_ID RAFT_ADDR API_ADDR", `add a running node: it must have an empty data dir (--join, or --bootstrap=false);
it is added as a non-voter, and promoted to voter once it has caught up`, cobra.ExactArgs(3),
			func(ctx context.Context, c *client.Client, args []string) ([]*leaseholdv1.Member, error) {
				return c.AddMember(ctx, args[0], args[1], args[2])
			}),
		membersCmd("remove NODE_ID", "remove a node from the cluster", cobra.ExactArgs(1),
			func(ctx context.Context, c *client.Client, args []string) ([]*leaseholdv1.Member, error) {
				return c.RemoveMember(ctx, args[0])
			}),
	)
	return members
}

// membersCmd is one members subcommand: it calls do and prints the membership do
// returns, as a table or (--output json) a MembersResponse.
func membersCmd(use, short string, nargs cobra.PositionalArgs, do func(context.Context, *client.Client, []string) ([]*leaseholdv1.Member, error)) *cobra.Command {
	var addr string
	var output *outputFormat
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  nargs,
		RunE: clientRun(&addr, func(ctx context.Context, c *client.Client, cmd *cobra.Command, args []string) error {
			members, err := do(ctx, c, args)
			if err != nil {
				return err
			}
			if output.json() {
				return printJSON(cmd.OutOrStdout(), &leaseholdv1.MembersResponse{Members: members})
			}
			printMembers(cmd.OutOrStdout(), members)
			return nil
		}),
	}
	addrFlag(cmd.Flags(), &addr)
	timeoutFlag(cmd.Flags(), time.Minute)
	output = outputFlag(cmd)
	return cmd
}

// printMembers prints the membership as a table; the leader is marked with a *.
func printMembers(w io.Writer, members []*leaseholdv1.Member) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tRAFT ADDR\tAPI ADDR\tFAST LANE\tSUFFRAGE\tLEADER")
	for _, m := range members {
		lead := ""
		if m.GetLeader() {
			lead = "*"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", m.GetNodeId(), m.GetRaftAddr(), orNone(m.GetApiAddr()), orNone(m.GetFastLaneAddr()), m.GetSuffrage(), lead)
	}
	_ = tw.Flush()
}
