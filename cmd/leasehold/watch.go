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

	"google.golang.org/protobuf/encoding/protojson"

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

// printEvent prints one event: a JSON object (protojson, field names as in the .proto
// file) or a line of text.
func printEvent(w io.Writer, e *leaseholdv1.WatchEvent, asJSON bool) error {
	if asJSON {
		b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(e)
		if err != nil {
			return err
		}
		var line bytes.Buffer // protojson varies its spacing on purpose; one object per line, compact
		if err := json.Compact(&line, b); err != nil {
			return err
		}
		line.WriteByte('\n')
		_, err = w.Write(line.Bytes())
		return err
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
