package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"text/tabwriter"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
)

const membersUsage = `usage:
  leasehold members list
  leasehold members add NODE_ID RAFT_ADDR API_ADDR
      the node must be running, with an empty data dir (--join, or --bootstrap=false);
      it is added as a non-voter, and promoted to voter once it has caught up
  leasehold members remove NODE_ID`

func runMembers(args []string) int {
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, membersUsage)
		return exitUsage
	}
	fs := flag.NewFlagSet("members "+args[0], flag.ContinueOnError)
	addr := addrFlag(fs)
	pos, err := positionalThenFlags(fs, args[1:])
	if err != nil {
		return exitUsage
	}
	want := map[string]int{"list": 0, "add": 3, "remove": 1}
	if n, ok := want[args[0]]; !ok || n != len(pos) {
		fmt.Fprintln(os.Stderr, membersUsage)
		return exitUsage
	}
	ctx := context.Background()
	c, code := dial(ctx, *addr)
	if c == nil {
		return code
	}
	var members []*leaseholdv1.Member
	switch args[0] {
	case "list":
		members, err = c.Members(ctx)
	case "add":
		members, err = c.AddMember(ctx, pos[0], pos[1], pos[2])
	case "remove":
		members, err = c.RemoveMember(ctx, pos[0])
	}
	if err != nil {
		return exitFor("members "+args[0], err)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tRAFT ADDR\tAPI ADDR\tFAST LANE\tSUFFRAGE\tLEADER")
	for _, m := range members {
		lead := ""
		if m.GetLeader() {
			lead = "*"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", m.GetNodeId(), m.GetRaftAddr(), orNone(m.GetApiAddr()), orNone(m.GetFastLaneAddr()), m.GetSuffrage(), lead)
	}
	_ = tw.Flush()
	return exitOK
}
