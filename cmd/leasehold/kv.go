package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/client"
)

// newKVCmd is `leasehold kv get|put|del|ls`: the fenced key-value store.
func newKVCmd() *cobra.Command {
	kv := &cobra.Command{
		Use:   "kv get|put|del|ls ...",
		Short: "the fenced key-value store (put --fence LOCK=TOKEN)",
		Long: `The fenced key-value store.

--fence makes a write carry a lock's token (e.g. --fence "jobs/nightly=$LEASEHOLD_TOKEN"):
the store rejects it if the key has accepted a higher token. --if-version 0 writes only
if the key does not exist.`,
		Args: cobra.NoArgs,
		RunE: usageOnly,
	}
	kv.AddCommand(newKVGetCmd(), newKVPutCmd(), newKVDelCmd(), newKVLsCmd())
	return kv
}

// kvKeys lists up to 100 keys under prefix, for completion.
func kvKeys(ctx context.Context, c *client.Client, prefix string) ([]string, error) {
	items, _, err := c.ListKV(ctx, prefix, 100)
	var keys []string
	for _, it := range items {
		keys = append(keys, it.GetKey())
	}
	return keys, err
}

func newKVGetCmd() *cobra.Command {
	var addr string
	var output *outputFormat
	cmd := &cobra.Command{
		Use:               "get KEY",
		Short:             "print a key's value (version and fence token on standard error); exit 1 if absent",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeFromServer(&addr, kvKeys),
		RunE: clientRun(&addr, func(ctx context.Context, c *client.Client, cmd *cobra.Command, args []string) error {
			v, err := c.Get(ctx, args[0])
			if err != nil {
				return err
			}
			if output.json() {
				if err := printJSON(cmd.OutOrStdout(), &leaseholdv1.GetResponse{Found: v.Found, Value: v.Data, Version: v.Version, FenceToken: v.FenceToken, FenceLock: v.FenceLock}); err != nil {
					return err
				}
			}
			if !v.Found {
				if !output.json() {
					fmt.Fprintf(cmd.ErrOrStderr(), "%s: not found (highest fence token %d)\n", args[0], v.FenceToken)
				}
				return exitWith(exitError)
			}
			if !output.json() {
				fmt.Fprintf(cmd.OutOrStdout(), "%s\n", v.Data)
				fmt.Fprintf(cmd.ErrOrStderr(), "version %d, fence token %d (%s)\n", v.Version, v.FenceToken, v.FenceLock)
			}
			return nil
		}),
	}
	addrFlag(cmd.Flags(), &addr)
	timeoutFlag(cmd.Flags(), 30*time.Second)
	output = outputFlag(cmd)
	return cmd
}

// writeFlags registers the conditions of a write (put, del) on cmd, and a PreRunE that
// turns them into the write options it returns, or into a usage error naming the flag.
func writeFlags(cmd *cobra.Command) *[]client.WriteOption {
	fence := cmd.Flags().String("fence", "", "LOCK=TOKEN: reject the write if the key has accepted a higher token")
	requireHolder := cmd.Flags().Bool("require-holder", false, "also reject unless TOKEN is the lock's current holder's")
	ifVersion := cmd.Flags().String("if-version", "", "write only if the key's version is N (0: only if it does not exist)")
	var opts []client.WriteOption
	cmd.PreRunE = func(*cobra.Command, []string) error {
		if *fence != "" {
			i := strings.LastIndexByte(*fence, '=')
			tok, err := strconv.ParseUint((*fence)[i+1:], 10, 64)
			if i <= 0 || err != nil || tok == 0 {
				return fmt.Errorf("--fence must be LOCK=TOKEN with a positive token, not %q", *fence)
			}
			opts = append(opts, client.FencedBy((*fence)[:i], tok))
		}
		if *requireHolder {
			opts = append(opts, client.RequireHolder)
		}
		if *ifVersion != "" {
			v, err := strconv.ParseUint(*ifVersion, 10, 64)
			if err != nil {
				return fmt.Errorf("--if-version must be a number, not %q", *ifVersion)
			}
			opts = append(opts, client.IfVersion(v))
		}
		return nil
	}
	return &opts
}

func newKVPutCmd() *cobra.Command {
	var addr string
	var opts *[]client.WriteOption
	cmd := &cobra.Command{
		Use:               "put KEY VALUE",
		Short:             "write VALUE to KEY (--fence LOCK=TOKEN, --require-holder, --if-version N)",
		Args:              cobra.ExactArgs(2),
		ValidArgsFunction: completeFromServer(&addr, kvKeys),
		RunE: clientRun(&addr, func(ctx context.Context, c *client.Client, cmd *cobra.Command, args []string) error {
			ver, err := c.Put(ctx, args[0], []byte(args[1]), *opts...)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "version %d\n", ver)
			return nil
		}),
	}
	addrFlag(cmd.Flags(), &addr)
	timeoutFlag(cmd.Flags(), 30*time.Second)
	opts = writeFlags(cmd)
	return cmd
}

func newKVDelCmd() *cobra.Command {
	var addr string
	var opts *[]client.WriteOption
	cmd := &cobra.Command{
		Use:               "del KEY",
		Short:             "delete KEY (--fence LOCK=TOKEN, --if-version N)",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeFromServer(&addr, kvKeys),
		RunE: clientRun(&addr, func(ctx context.Context, c *client.Client, cmd *cobra.Command, args []string) error {
			existed, err := c.Delete(ctx, args[0], *opts...)
			if err != nil {
				return err
			}
			if !existed {
				fmt.Fprintf(cmd.ErrOrStderr(), "%s did not exist\n", args[0])
			}
			return nil
		}),
	}
	addrFlag(cmd.Flags(), &addr)
	timeoutFlag(cmd.Flags(), 30*time.Second)
	opts = writeFlags(cmd)
	return cmd
}

func newKVLsCmd() *cobra.Command {
	var addr string
	var output *outputFormat
	cmd := &cobra.Command{
		Use:               "ls [PREFIX]",
		Short:             "list keys: key, version, fence token, value",
		Args:              cobra.MaximumNArgs(1),
		ValidArgsFunction: completeFromServer(&addr, kvKeys),
		RunE: clientRun(&addr, func(ctx context.Context, c *client.Client, cmd *cobra.Command, args []string) error {
			items, truncated, err := c.ListKV(ctx, firstArg(args), 0)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			if output.json() {
				return printJSON(w, &leaseholdv1.KVServiceListResponse{Items: items, Truncated: truncated})
			}
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
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
				fmt.Fprintln(w, "(more keys match)")
			}
			return nil
		}),
	}
	addrFlag(cmd.Flags(), &addr)
	timeoutFlag(cmd.Flags(), 30*time.Second)
	output = outputFlag(cmd)
	return cmd
}
