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
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/leasehold/leasehold/client"
)

// maxStoredStdout is how much of CMD's standard output `leasehold once` stores with the
// key's outcome: the first 16 KiB (the service keeps at most 32 KiB per key).
const maxStoredStdout = 16 << 10

// onceOutcome is the result `leasehold once` stores for a key: JSON, so that other
// programs can read it with `Client.Key` or IdempotencyService.Get.
type onceOutcome struct {
	ExitCode int `json:"exitCode"`
	// Stdout is the first maxStoredStdout bytes CMD wrote to its standard output (JSON:
	// base64), and StdoutTruncated says whether it wrote more.
	Stdout          []byte `json:"stdout,omitempty"`
	StdoutTruncated bool   `json:"stdoutTruncated,omitempty"`
}

// Why a run stored nothing: the key was given back, or was lost with its lease.
var (
	errNotStarted = errors.New("CMD could not be started")
	errRunLost    = errors.New("the key's lease was lost while CMD ran")
)

// newOnceCmd is `leasehold once KEY [--ttl D] [--note TEXT] -- CMD [ARG...]`: it
// runs CMD at most once per key, across every machine using the cluster (G9).
//
// The first call claims KEY and runs CMD as `leasehold lock` does — its own process
// group, signals forwarded, LEASEHOLD_KEY and LEASEHOLD_TOKEN (the key's fencing token)
// in its environment, the group killed with SIGKILL and exit 76 if the key's lease is
// lost while it runs — and stores CMD's outcome with the key when it exits: its exit
// code (128+N for a signal N) and the first 16 KiB of its standard output (which is
// also passed through as it comes; standard error is not stored). Every exit is an
// outcome, failures included: the key is then done. A later call with the same KEY does
// not run CMD: it prints the stored output to standard output, says on standard error
// that the key was done before, by whom and under which token, and exits with the
// stored code. While CMD runs elsewhere, a call exits 75 and says who runs it. A CMD
// that cannot be started, and a run whose lease was lost, store nothing: the key is free
// again (for a lost lease, TTL after the last keepalive), and the next call runs CMD.
func newOnceCmd() *cobra.Command {
	var addr string
	var note *string
	var ttl *time.Duration
	cmd := &cobra.Command{
		Use:   "once KEY [flags] -- CMD [ARG...]",
		Short: "run CMD at most once per KEY",
		Long: `Runs CMD at most once per KEY, across every machine using the cluster. The first
call runs CMD (as 'leasehold lock' does, with LEASEHOLD_KEY and LEASEHOLD_TOKEN) and
stores its exit code and the first 16 KiB of its standard output with the key. Later
calls print the stored output and exit with the stored code. While CMD runs
elsewhere, a call exits 75. Flags may come before or after KEY.`,
		Example: `  leasehold once deploy/v42 -- ./deploy.sh v42`,
		RunE: func(cmd *cobra.Command, args []string) error {
			keys, argv, err := namesAndCommand(cmd, args)
			if err != nil {
				return err
			}
			if len(keys) != 1 {
				return fmt.Errorf("give exactly one KEY before --, not %d", len(keys))
			}
			if err := notNegative("--ttl", *ttl); err != nil {
				return err
			}
			return exitWith(runOnce(addr, *ttl, *note, keys[0], argv))
		},
	}
	addrFlag(cmd.Flags(), &addr)
	ttl = cmd.Flags().Duration("ttl", 10*time.Second, "lease TTL: if this leasehold dies or stalls, the key is free again this long after its last keepalive")
	note = cmd.Flags().String("note", "", "free text shown to others while CMD runs")
	return cmd
}

// runOnce runs argv at most once for key and returns the exit code (newOnceCmd).
func runOnce(addr string, ttl time.Duration, note, key string, argv []string) int {
	// Until CMD starts, SIGINT and SIGTERM interrupt the claim; from then on they go to
	// CMD (runGroup forwards them), which must not end the key's context.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	started := make(chan struct{})
	go func() {
		select {
		case <-sigs:
			cancel()
		case <-started:
		}
	}()
	host, _ := os.Hostname()
	c, code := dial(ctx, addr, client.WithTTL(ttl), client.WithHolder(client.Holder{Host: host, PID: uint32(os.Getpid()), Note: note}))
	if c == nil {
		return code
	}
	defer func() { _ = c.Close(context.Background()) }()

	ran := false
	var outcome onceOutcome
	result, err := c.Once(ctx, key, func(kctx context.Context, token uint64) ([]byte, error) {
		ran = true
		fwd := catchSignals() // from here on, signals go to CMD; none falls in between
		signal.Stop(sigs)
		close(started)
		env := []string{"LEASEHOLD_KEY=" + key, "LEASEHOLD_TOKEN=" + strconv.FormatUint(token, 10)}
		r, stdout, truncated := runCapturing(kctx, ttl, argv, env, fwd)
		switch {
		case r.startErr != nil:
			fmt.Fprintf(os.Stderr, "leasehold once: start %s: %v\n", argv[0], r.startErr)
			return nil, errNotStarted
		case r.lost:
			fmt.Fprintf(os.Stderr, "leasehold once: lost %s (token %d): %v; killed process group %d; nothing stored, the key is free again\n",
				key, token, context.Cause(kctx), r.pgid)
			return nil, errRunLost
		}
		outcome = onceOutcome{ExitCode: r.code, Stdout: stdout, StdoutTruncated: truncated}
		return json.Marshal(outcome)
	})
	var inProgress *client.InProgressError
	switch {
	case err == nil && ran:
		return outcome.ExitCode
	case err == nil:
		return replayOutcome(c, key, result)
	case errors.As(err, &inProgress):
		fmt.Fprintf(os.Stderr, "leasehold once: %q is running elsewhere%s under token %d; not run\n", key, by(inProgress.Holder), inProgress.Token)
		return exitNotAcquired
	case errors.Is(err, errNotStarted):
		return 127
	case errors.Is(err, errRunLost):
		return exitLockLost
	case ran && errors.Is(err, client.ErrKeyLost):
		fmt.Fprintf(os.Stderr, "leasehold once: CMD exited %d, but its outcome was not stored: %v; a later run may repeat it\n", outcome.ExitCode, err)
		return exitLockLost
	case ran:
		fmt.Fprintf(os.Stderr, "leasehold once: CMD exited %d, but storing its outcome failed: %v; a later 'leasehold once %s' tells whether it was stored\n", outcome.ExitCode, err, key)
		return exitUnavailable
	case ctx.Err() != nil:
		fmt.Fprintln(os.Stderr, "leasehold once: interrupted before CMD started")
		return exitNotAcquired
	}
	return exitFor("once", err)
}

// runCapturing runs argv under kctx with runGroup, passing its standard output through
// and keeping the first maxStoredStdout bytes of it.
func runCapturing(kctx context.Context, ttl time.Duration, argv, env []string, sigs chan os.Signal) (r groupRun, stdout []byte, truncated bool) {
	pr, pw, err := os.Pipe()
	if err != nil {
		signal.Stop(sigs)
		return groupRun{startErr: err, code: -1}, nil, false
	}
	// A standard output closed under CMD (`| head -1`) must not kill leasehold with
	// SIGPIPE: CMD would run on with no claim, and the key be free for another run.
	// With SIGPIPE handled, the broken pipe is a write error: the copy ends and closes
	// the pipe, so CMD meets the broken pipe itself, as under `leasehold lock`, and its
	// outcome is stored.
	pipes := make(chan os.Signal, 1)
	signal.Notify(pipes, syscall.SIGPIPE)
	defer signal.Stop(pipes)
	keep := &prefixWriter{limit: maxStoredStdout}
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		_, _ = io.Copy(io.MultiWriter(keep, os.Stdout), pr)
		_ = pr.Close()
	}()
	r = runGroup(kctx, ttl, argv, env, pw, sigs)
	_ = pw.Close() // the group is gone: the copy ends at the pipe's end
	select {
	case <-copied:
	case <-time.After(time.Second): // a process that left the group still holds the pipe
	}
	_ = pr.Close()
	return r, keep.buf.Bytes(), keep.truncated
}

// prefixWriter keeps the first limit bytes written to it.
type prefixWriter struct {
	buf       bytes.Buffer
	limit     int
	truncated bool
}

func (w *prefixWriter) Write(p []byte) (int, error) {
	n := min(len(p), w.limit-w.buf.Len())
	w.buf.Write(p[:n])
	w.truncated = w.truncated || n < len(p)
	return len(p), nil
}

// replayOutcome prints the outcome stored for a done key and returns its exit code. A
// result that is not a `leasehold once` outcome (another program completed the key) is
// printed as it is, and the exit code is 0.
func replayOutcome(c *client.Client, key string, result []byte) int {
	who := ""
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	if k, err := c.Key(ctx, key); err == nil && k.Status == client.KeyDone {
		who = fmt.Sprintf("%s under token %d", by(k.Holder), k.Token)
	}
	cancel()
	var o onceOutcome
	dec := json.NewDecoder(bytes.NewReader(result))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&o); err != nil {
		_, _ = os.Stdout.Write(result)
		fmt.Fprintf(os.Stderr, "leasehold once: %q was done before%s, not by leasehold once; its stored result is above\n", key, who)
		return exitOK
	}
	_, _ = os.Stdout.Write(o.Stdout)
	more := ""
	if o.StdoutTruncated {
		more = " (its first 16 KiB)"
	}
	fmt.Fprintf(os.Stderr, "leasehold once: %q was done before%s: exit code %d; not run again. Its stored output%s is above.\n", key, who, o.ExitCode, more)
	return o.ExitCode
}

// by returns " by " and h, or "" when h says nothing.
func by(h client.Holder) string {
	if h == (client.Holder{}) {
		return ""
	}
	return " by " + h.String()
}
