package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/client"
)

// newWatchCmd is `leasehold watch [PREFIX] [--from REV] [-o json]`: it prints the lock
// events under PREFIX as they happen, one line each, until interrupted.
func newWatchCmd() *cobra.Command {
	var addr string
	var from string
	var start *leaseholdv1.Revision
	var output *outputFormat
	cmd := &cobra.Command{
		Use:   "watch [PREFIX]",
		Short: "stream lock events (acquired, released, expired, ...) as they happen",
		Long: `Stream the lock events under PREFIX as they happen — acquired, released, expired,
revoked, force-released, queued, wait ended, a new efficiency epoch — one line each, with
its revision (INDEX.OFFSET), token and holder, until interrupted. It resumes by itself
across leader changes, missing and repeating nothing. --from replays the node's retained
history from a revision; one older than that fails "compacted", naming the oldest held.`,
		Args:              cobra.MaximumNArgs(1),
		ValidArgsFunction: completeFromServer(&addr, lockNames),
		PreRunE: func(*cobra.Command, []string) error {
			var err error
			start, err = parseRevision(from)
			return err
		},
		RunE: clientRun(&addr, func(ctx context.Context, c *client.Client, cmd *cobra.Command, args []string) error {
			ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
			defer stop()
			var opts []client.WatchOption
			if start != nil {
				opts = append(opts, client.WatchFrom(start))
			}
			for e, err := range c.Watch(ctx, firstArg(args), opts...) {
				if err != nil {
					if ctx.Err() != nil && errors.Is(err, context.Canceled) {
						return nil // interrupted
					}
					return err
				}
				if err := printEvent(cmd.OutOrStdout(), e, output.json()); err != nil {
					return err
				}
			}
			return nil
		}),
	}
	addrFlag(cmd.Flags(), &addr)
	cmd.Flags().StringVar(&from, "from", "", "start at this revision, INDEX or INDEX.OFFSET (inclusive; the first column); default: the next event")
	output = outputFlag(cmd)
	return cmd
}

// newHistoryCmd is `leasehold history NAME [-o json]`: the lock's ledger.
func newHistoryCmd() *cobra.Command {
	var addr string
	var output *outputFormat
	cmd := &cobra.Command{
		Use:   "history NAME",
		Short: "a lock's last tenures: holder, token, from, to, how each ended",
		Long: `Show the ledger of a lock: its last tenures, oldest first — token, holder, mode,
class, from, to, and how each ended (released, expired, revoked, force-released with who
asked and why, disconnected) — then its current holds. Correctness tenures are
replicated: they survive failover and restore. Efficiency tenures live in the leader's
memory: only the current leader's are shown, after a line "lost with the leader" that
says when that leader began serving — what the lock had before is unknown.`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeFromServer(&addr, lockNames),
		RunE: clientRun(&addr, func(ctx context.Context, c *client.Client, cmd *cobra.Command, args []string) error {
			tenures, err := c.History(ctx, args[0])
			if err != nil {
				return err
			}
			if output.json() {
				return printJSON(cmd.OutOrStdout(), &leaseholdv1.HistoryResponse{Tenures: tenures})
			}
			printHistory(cmd.OutOrStdout(), tenures)
			return nil
		}),
	}
	addrFlag(cmd.Flags(), &addr)
	timeoutFlag(cmd.Flags(), 30*time.Second)
	output = outputFlag(cmd)
	return cmd
}

// printHistory prints a ledger as a table.
func printHistory(w io.Writer, tenures []*leaseholdv1.Tenure) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TOKEN\tHOLDER\tMODE\tCLASS\tFROM\tTO\tENDED")
	stamp := func(ms int64) string {
		if ms == 0 {
			return "?"
		}
		return time.UnixMilli(ms).UTC().Format("2006-01-02 15:04:05.000")
	}
	for _, t := range tenures {
		class := strings.ToLower(strings.TrimPrefix(t.GetClass().String(), "LOCK_CLASS_"))
		if t.GetEnd() == leaseholdv1.TenureEnd_TENURE_END_LEADER_LOST {
			fmt.Fprintf(tw, "-\t-\t-\t%s\t-\t%s\tlost with the leader: tenures before this are unknown (leader of epoch %s began serving)\n",
				class, stamp(t.GetEndUnixMs()), t.GetEpoch())
			continue
		}
		to, ended := stamp(t.GetEndUnixMs()), strings.ToLower(strings.TrimPrefix(t.GetEnd().String(), "TENURE_END_"))
		if t.GetEnd() == leaseholdv1.TenureEnd_TENURE_END_UNSPECIFIED {
			to, ended = "-", "held"
		}
		if t.GetReason() != "" {
			ended += " (" + t.GetReason() + ")"
		}
		mode := strings.ToLower(strings.TrimPrefix(t.GetMode().String(), "LOCK_MODE_"))
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", t.GetToken(), describeHolder(t.GetHolder()), mode, class, stamp(t.GetStartUnixMs()), to, ended)
	}
	_ = tw.Flush()
}

// parseRevision reads INDEX or INDEX.OFFSET ("" is no revision).
func parseRevision(s string) (*leaseholdv1.Revision, error) {
	if s == "" {
		return nil, nil
	}
	index, offset, _ := strings.Cut(s, ".")
	i, err := strconv.ParseUint(index, 10, 64)
	if err != nil {
		return nil, fmt.Errorf("--from %q is not INDEX or INDEX.OFFSET", s)
	}
	var o uint64
	if offset != "" {
		if o, err = strconv.ParseUint(offset, 10, 32); err != nil {
			return nil, fmt.Errorf("--from %q is not INDEX or INDEX.OFFSET", s)
		}
	}
	return &leaseholdv1.Revision{Index: i, Offset: uint32(o)}, nil
}

// printJSONLine prints m as one compact JSON object (the protobuf JSON mapping, as curl
// gets it) and a newline: a stream's line.
func printJSONLine(w io.Writer, m proto.Message) error {
	b, err := protojson.Marshal(m)
	if err != nil {
		return err
	}
	var line bytes.Buffer // protojson varies its spacing on purpose
	if err := json.Compact(&line, b); err != nil {
		return err
	}
	line.WriteByte('\n')
	_, err = w.Write(line.Bytes())
	return err
}

// printEvent prints one event: a JSON object, or a line of text.
func printEvent(w io.Writer, e *leaseholdv1.WatchEvent, asJSON bool) error {
	if asJSON {
		return printJSONLine(w, e)
	}
	kind := strings.ToLower(strings.TrimPrefix(e.GetKind().String(), "EVENT_KIND_"))
	line := fmt.Sprintf("%d.%d\t%s\t%s", e.GetRevision().GetIndex(), e.GetRevision().GetOffset(), kind, e.GetName())
	if e.GetKind() == leaseholdv1.EventKind_EVENT_KIND_EPOCH {
		line += "\tefficiency epoch " + e.GetEpoch() + " (earlier efficiency locks are gone)"
	} else {
		line += "\t" + strings.ToLower(strings.TrimPrefix(e.GetClass().String(), "LOCK_CLASS_"))
		if e.GetToken() != 0 {
			line += "\ttoken " + strconv.FormatUint(e.GetToken(), 10)
		}
		line += "\t" + describeHolder(e.GetHolder())
		if e.GetPosition() != 0 {
			line += fmt.Sprintf("\tplace %d", e.GetPosition())
		}
		if e.GetReason() != "" {
			line += "\treason " + strconv.Quote(e.GetReason())
		}
	}
	_, err := fmt.Fprintln(w, line)
	return err
}
