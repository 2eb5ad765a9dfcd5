package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/client"
)

// runWatch is `leasehold watch [PREFIX] [--from REV] [--output json]`: it prints the
// lock events under PREFIX as they happen, one line each, until interrupted.
func runWatch(args []string) int {
	fs := flag.NewFlagSet("watch", flag.ContinueOnError)
	addr := addrFlag(fs)
	from := fs.String("from", "", "start at this revision, INDEX or INDEX.OFFSET (inclusive; the REV column); default: the next event")
	output := fs.String("output", "text", "text, or json: one JSON object per event and line")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return exitUsage
	}
	start, err := parseRevision(*from)
	if len(pos) > 1 || err != nil || (*output != "text" && *output != "json") {
		if err != nil {
			fmt.Fprintf(os.Stderr, "leasehold watch: --from: %v\n", err)
		}
		fmt.Fprintln(os.Stderr, "usage: leasehold watch [--addr HOST:PORT] [PREFIX] [--from REV] [--output json]")
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	c, code := dial(ctx, *addr)
	if c == nil {
		return code
	}
	var opts []client.WatchOption
	if start != nil {
		opts = append(opts, client.WatchFrom(start))
	}
	prefix := ""
	if len(pos) == 1 {
		prefix = pos[0]
	}
	for e, err := range c.Watch(ctx, prefix, opts...) {
		if err != nil {
			if ctx.Err() != nil && errors.Is(err, context.Canceled) {
				return exitOK // interrupted
			}
			return exitFor("watch", err)
		}
		if err := printEvent(os.Stdout, e, *output == "json"); err != nil {
			return exitFor("watch", err)
		}
	}
	return exitOK
}

// parseInterleaved parses args with fs, flags before and after the positional
// arguments alike (`leasehold watch jobs/ --from 5`), and returns the positional ones.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos, args = append(pos, fs.Arg(0)), fs.Args()[1:]
	}
}

// parseRevision reads INDEX or INDEX.OFFSET ("" is no revision).
func parseRevision(s string) (*leaseholdv1.Revision, error) {
	if s == "" {
		return nil, nil
	}
	index, offset, _ := strings.Cut(s, ".")
	i, err := strconv.ParseUint(index, 10, 64)
	if err != nil {
		return nil, fmt.Errorf("%q is not INDEX or INDEX.OFFSET", s)
	}
	var o uint64
	if offset != "" {
		if o, err = strconv.ParseUint(offset, 10, 32); err != nil {
			return nil, fmt.Errorf("%q is not INDEX or INDEX.OFFSET", s)
		}
	}
	return &leaseholdv1.Revision{Index: i, Offset: uint32(o)}, nil
}

// printJSONLine prints m as one compact JSON object (protojson, field names as in the
// .proto file) and a newline.
func printJSONLine(w io.Writer, m proto.Message) error {
	b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(m)
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

// printEvent prints one event: a JSON object (protojson, field names as in the .proto
// file) or a line of text.
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

// runHistory is `leasehold history NAME [--output json]`: the lock's ledger.
func runHistory(args []string) int {
	fs := flag.NewFlagSet("history", flag.ContinueOnError)
	addr := addrFlag(fs)
	output := fs.String("output", "text", "text, or json: one JSON object per tenure and line")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return exitUsage
	}
	if len(pos) != 1 || (*output != "text" && *output != "json") {
		fmt.Fprintln(os.Stderr, "usage: leasehold history [--addr HOST:PORT] NAME [--output json]")
		return exitUsage
	}
	ctx := context.Background()
	c, code := dial(ctx, *addr)
	if c == nil {
		return code
	}
	tenures, err := c.History(ctx, pos[0])
	if err != nil {
		return exitFor("history", err)
	}
	if *output == "json" {
		for _, t := range tenures {
			if err := printJSONLine(os.Stdout, t); err != nil {
				return exitFor("history", err)
			}
		}
		return exitOK
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TOKEN\tHOLDER\tMODE\tFROM\tTO\tENDED")
	stamp := func(ms int64) string {
		if ms == 0 {
			return "?"
		}
		return time.UnixMilli(ms).UTC().Format("2006-01-02 15:04:05.000")
	}
	for _, t := range tenures {
		to, ended := stamp(t.GetEndUnixMs()), strings.ToLower(strings.TrimPrefix(t.GetEnd().String(), "TENURE_END_"))
		if t.GetEnd() == leaseholdv1.TenureEnd_TENURE_END_UNSPECIFIED {
			to, ended = "-", "held"
		}
		if t.GetReason() != "" {
			ended += " (" + t.GetReason() + ")"
		}
		mode := strings.ToLower(strings.TrimPrefix(t.GetMode().String(), "LOCK_MODE_"))
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", t.GetToken(), describeHolder(t.GetHolder()), mode, stamp(t.GetStartUnixMs()), to, ended)
	}
	_ = tw.Flush()
	return exitOK
}
