package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/leasehold/leasehold/client"
)

const kvUsage = `usage:
  leasehold kv get KEY
  leasehold kv put KEY VALUE [--fence LOCK=TOKEN] [--require-holder] [--if-version N]
  leasehold kv del KEY [--fence LOCK=TOKEN] [--if-version N]
  leasehold kv ls [PREFIX]

--fence makes the write carry a lock's token (e.g. --fence "jobs/nightly=$LEASEHOLD_TOKEN"):
the store rejects it if the key has accepted a higher token. --if-version 0 writes only
if the key does not exist.`

func runKV(args []string) int {
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, kvUsage)
		return exitUsage
	}
	sub := args[0]
	fs := flag.NewFlagSet("kv "+sub, flag.ContinueOnError)
	addr := addrFlag(fs)
	fence := fs.String("fence", "", "LOCK=TOKEN: reject the write if the key has accepted a higher token")
	requireHolder := fs.Bool("require-holder", false, "also reject unless TOKEN is the lock's current holder's")
	ifVersion := fs.String("if-version", "", "write only if the key's version is N (0: only if it does not exist)")
	pos, err := positionalThenFlags(fs, args[1:])
	if err != nil {
		return exitUsage
	}
	var opts []client.WriteOption
	if *fence != "" {
		i := strings.LastIndexByte(*fence, '=')
		tok, err := strconv.ParseUint((*fence)[i+1:], 10, 64)
		if i <= 0 || err != nil || tok == 0 {
			fmt.Fprintf(os.Stderr, "leasehold kv: --fence must be LOCK=TOKEN with a positive token, not %q\n", *fence)
			return exitUsage
		}
		opts = append(opts, client.FencedBy((*fence)[:i], tok))
	}
	if *requireHolder {
		opts = append(opts, client.RequireHolder)
	}
	if *ifVersion != "" {
		v, err := strconv.ParseUint(*ifVersion, 10, 64)
		if err != nil {
			fmt.Fprintf(os.Stderr, "leasehold kv: --if-version must be a number, not %q\n", *ifVersion)
			return exitUsage
		}
		opts = append(opts, client.IfVersion(v))
	}
	want := map[string]int{"get": 1, "put": 2, "del": 1, "ls": -1}
	n, ok := want[sub]
	if !ok || (n >= 0 && len(pos) != n) || (n < 0 && len(pos) > 1) {
		fmt.Fprintln(os.Stderr, kvUsage)
		return exitUsage
	}
	ctx := context.Background()
	c, code := dial(ctx, *addr)
	if c == nil {
		return code
	}
	switch sub {
	case "get":
		v, err := c.Get(ctx, pos[0])
		if err != nil {
			return exitFor("kv get", err)
		}
		if !v.Found {
			fmt.Fprintf(os.Stderr, "%s: not found (highest fence token %d)\n", pos[0], v.FenceToken)
			return exitError
		}
		fmt.Printf("%s\n", v.Data)
		fmt.Fprintf(os.Stderr, "version %d, fence token %d (%s)\n", v.Version, v.FenceToken, v.FenceLock)
	case "put":
		ver, err := c.Put(ctx, pos[0], []byte(pos[1]), opts...)
		if err != nil {
			return exitFor("kv put", err)
		}
		fmt.Printf("version %d\n", ver)
	case "del":
		existed, err := c.Delete(ctx, pos[0], opts...)
		if err != nil {
			return exitFor("kv del", err)
		}
		if !existed {
			fmt.Fprintf(os.Stderr, "%s did not exist\n", pos[0])
		}
	case "ls":
		prefix := ""
		if len(pos) == 1 {
			prefix = pos[0]
		}
		items, truncated, err := c.ListKV(ctx, prefix, 0)
		if err != nil {
			return exitFor("kv ls", err)
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "KEY\tVERSION\tFENCE TOKEN\tVALUE")
		for _, it := range items {
			v := string(it.GetValue())
			if len(v) > 60 {
				v = v[:57] + "..."
			}
			fmt.Fprintf(tw, "%s\t%d\t%d\t%q\n", it.GetKey(), it.GetVersion(), it.GetFenceToken(), v)
		}
		_ = tw.Flush()
		if truncated {
			fmt.Println("(more keys match)")
		}
	}
	return exitOK
}
