package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/leasehold/leasehold/client"
)

const groupUsage = `usage:
  leasehold group create GROUP --partitions N [--drain 10s]
  leasehold group join GROUP MEMBER [--weight W] [--ttl 10s]
      runs until interrupted, printing each partition it is assigned and each it stops
      working on, with its epoch (the partition's fencing token)
  leasehold group status GROUP [--output json]`

// runGroupCmd implements 'leasehold group create|join|status'.
func runGroupCmd(args []string) int {
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, groupUsage)
		return exitUsage
	}
	sub := args[0]
	fs := flag.NewFlagSet("group "+sub, flag.ContinueOnError)
	addr := addrFlag(fs)
	partitions := fs.Int("partitions", 0, "create: the number of partitions, 1 to 4096")
	drain := fs.Duration("drain", 0, "create: how long a moving partition may stay with its owner (0: the server's default, 10s)")
	weight := fs.Uint("weight", 1, "join: the member's share of the partitions, 1 to 1000")
	ttl := fs.Duration("ttl", 10*time.Second, "join: the membership's lease TTL")
	output := fs.String("output", "text", "status: text or json")
	pos, err := positionalThenFlags(fs, args[1:])
	if err != nil {
		return exitUsage
	}
	want := map[string]int{"create": 1, "join": 2, "status": 1}
	if n, ok := want[sub]; !ok || n != len(pos) || (*output != "text" && *output != "json") {
		fmt.Fprintln(os.Stderr, groupUsage)
		return exitUsage
	}
	if sub == "create" && (*partitions < 1 || *partitions > 4096) {
		fmt.Fprintln(os.Stderr, "leasehold group create: --partitions must be 1 to 4096")
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	c, code := dial(ctx, *addr, client.WithTTL(*ttl))
	if c == nil {
		return code
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), *ttl)
		_ = c.Close(cctx)
		cancel()
	}()
	switch sub {
	case "create":
		if err := c.CreateGroup(ctx, pos[0], *partitions, *drain); err != nil {
			return exitFor("group create", err)
		}
		fmt.Printf("created group %s with %d partitions\n", pos[0], *partitions)
	case "join":
		return groupJoin(ctx, c, pos[0], pos[1], uint32(min(*weight, 1<<31)))
	case "status":
		return groupStatus(ctx, c, pos[0], *output == "json")
	}
	return exitOK
}

// groupJoin joins and prints, one line each, every assignment and every stop:
//
//	assigned GROUP/PARTITION epoch EPOCH
//	stopped GROUP/PARTITION epoch EPOCH: CAUSE
func groupJoin(ctx context.Context, c *client.Client, group, member string, weight uint32) int {
	var mu sync.Mutex // one line at a time
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Printf(format+"\n", args...)
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

// groupStatus prints the members and every partition's owner.
func groupStatus(ctx context.Context, c *client.Client, group string, asJSON bool) int {
	st, err := c.GroupStatus(ctx, group)
	if err != nil {
		return exitFor("group status", err)
	}
	if asJSON {
		type member struct {
			Name   string `json:"name"`
			Weight uint32 `json:"weight"`
			Owns   uint32 `json:"owns"`
		}
		type partition struct {
			Partition uint32 `json:"partition"`
			Owner     string `json:"owner"`
			Epoch     uint64 `json:"epoch"`
			Draining  bool   `json:"draining"`
		}
		out := struct {
			Group      string      `json:"group"`
			DrainMs    int64       `json:"drainMs"`
			Members    []member    `json:"members"`
			Partitions []partition `json:"partitions"`
		}{Group: st.GetGroup(), DrainMs: st.GetDrainMs(), Members: []member{}}
		for _, m := range st.GetMembers() {
			out.Members = append(out.Members, member{m.GetName(), m.GetWeight(), m.GetOwns()})
		}
		for _, p := range st.GetPartitions() {
			out.Partitions = append(out.Partitions, partition{p.GetPartition(), p.GetOwner(), p.GetEpoch(), p.GetDraining()})
		}
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(out)
		return exitOK
	}
	fmt.Printf("group %s: %d partitions, drain deadline %v\n", st.GetGroup(), len(st.GetPartitions()), time.Duration(st.GetDrainMs())*time.Millisecond)
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
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
	return exitOK
}
