package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/leasehold/leasehold/verify"
)

// newVerifyCmd is `leasehold verify --url URL` or `leasehold verify --dsn DSN --table T`: the conformance kit of package verify
// against the user's own resource. Exit codes: 0 PASS, 1 FAIL, 2 INCONCLUSIVE, 64
// usage, 69 the server or the writers could not run.
func newVerifyCmd() *cobra.Command {
	var f verifyFlags
	cmd := &cobra.Command{
		Use:   "verify (--url URL | --dsn DSN --table T) [flags]",
		Short: "check that YOUR resource refuses stale tokens: paused writers, porcupine over the history",
		Long: `Checks that a resource refuses stale fencing tokens. Writer processes take one
correctness lock in turn and write with their token; holders are stopped with SIGSTOP
past their TTL, so that a newer holder writes, and resumed to write with their old
token. Every write is recorded and the history checked with porcupine: the resource
must never accept a token lower than one it accepted before.

HTTP (--url): each write is a POST to URL with "Fencing-Token: LOCK=TOKEN" and the
body {"writer":W,"seq":N,"token":T}. 2xx means accepted, 409 and 412 rejected,
anything else unknown.

SQL (--dsn, --table): each write is one transaction on the database: the fence SQL
guard's check-and-raise of the token for the lock name, in the guard table
(--guard-table, default leasehold_fence), then
    INSERT INTO T (key, value, token) VALUES (LOCK, 'writer W seq N', TOKEN)
    ON CONFLICT (key) DO UPDATE SET value = excluded.value, token = excluded.token
and COMMIT. T must be shaped (key TEXT PRIMARY KEY, value TEXT, token BIGINT);
--create makes T and the guard table if they do not exist. A commit means accepted,
the guard's stale-token answer rejected, any other error unknown. --unguarded skips
the guard: the table unfenced, which verify must fail.

Exit codes: 0 PASS, 1 FAIL (the offending writes are printed), 2 INCONCLUSIVE (no
stale write was attempted), 64 usage, 69 the server or the writers could not run.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case f.url == "" && f.dsn == "":
				return errors.New("--url or --dsn is required")
			case f.url != "" && f.dsn != "":
				return errors.New("--url and --dsn exclude each other")
			case f.dsn != "" && f.table == "":
				return errors.New("--table is required with --dsn")
			case f.dsn == "" && (f.table != "" || f.driver != "" || f.guardTable != "" || f.create || f.unguarded):
				return errors.New("--table, --driver, --guard-table, --create and --unguarded need --dsn")
			}
			return exitWith(runVerify(cmd.OutOrStdout(), cmd.ErrOrStderr(), f))
		},
	}
	fs := cmd.Flags()
	addrFlag(fs, &f.addr)
	fs.StringVar(&f.url, "url", "", "the resource's HTTP endpoint: each write is a POST with the Fencing-Token header (required)")
	fs.StringVar(&f.dsn, "dsn", "", "a SQL database to write to instead of --url (postgres://... or file:PATH)")
	fs.StringVar(&f.table, "table", "", "with --dsn: the table written, shaped (key TEXT PRIMARY KEY, value TEXT, token BIGINT)")
	fs.StringVar(&f.driver, "driver", "", "with --dsn: pgx or sqlite (default: from the DSN, postgres:// is pgx, file: is sqlite)")
	fs.StringVar(&f.guardTable, "guard-table", "", "with --dsn: the fence SQL guard's token table (default "+verify.DefaultGuardTable+")")
	fs.BoolVar(&f.create, "create", false, "with --dsn: create the table and the guard table if they do not exist")
	fs.BoolVar(&f.unguarded, "unguarded", false, "with --dsn: write without the guard (the negative control: verify must fail it)")
	fs.StringVar(&f.lock, "lock", "", "the lock the writers take (default verify/RANDOM)")
	fs.IntVar(&f.writers, "writers", 3, "writer processes (2 to 64)")
	fs.DurationVar(&f.duration, "duration", 20*time.Second, "how long the writers write")
	fs.DurationVar(&f.ttl, "ttl", time.Second, "the writers' lease TTL; pauses last 1.5 to 3 TTLs")
	fs.Float64Var(&f.chance, "pause-chance", 0.15, "chance that a writer is stopped with SIGSTOP after one of its writes")
	fs.Uint64Var(&f.seed, "seed", 0, "pause schedule seed (0 picks one; the report prints it)")
	f.output = outputFlag(cmd)
	fs.BoolVarP(&f.verbose, "verbose", "v", false, "print every pause as it happens")
	return cmd
}

// verifyFlags are the flags of `leasehold verify`.
type verifyFlags struct {
	addr          string
	url, lock     string
	dsn, table    string
	driver        string
	guardTable    string
	create        bool
	unguarded     bool
	writers       int
	duration, ttl time.Duration
	chance        float64
	seed          uint64
	output        *outputFormat
	verbose       bool
}

// runVerify runs the kit as the flags say, prints its report to w (errors and, with
// --verbose, the pauses to errW) and returns the exit code.
func runVerify(w, errW io.Writer, f verifyFlags) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	cfg := verify.Config{Addr: f.addr, URL: f.url, Lock: f.lock, Writers: f.writers, Duration: f.duration,
		TTL: f.ttl, PauseChance: f.chance, Seed: f.seed,
		DSN: f.dsn, Driver: f.driver, Table: f.table, GuardTable: f.guardTable, Create: f.create, Unguarded: f.unguarded}
	if f.verbose {
		cfg.Log = errW
	}
	r, err := verify.Run(ctx, cfg)
	if err != nil {
		fmt.Fprintf(errW, "leasehold verify: %v\n", err)
		if errors.Is(err, verify.ErrConfig) {
			return exitUsage
		}
		return exitUnavailable
	}
	if f.output.json() {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(r)
	} else {
		r.Print(w)
	}
	switch r.Verdict {
	case verify.Pass:
		return exitOK
	case verify.Inconclusive:
		return 2
	}
	return exitError
}

// newDemoResourceCmd is `leasehold demo-resource [--fenced] [--listen ADDR]`: an HTTP
// resource to try `leasehold verify` on (verify.DemoResource).
func newDemoResourceCmd() *cobra.Command {
	var fenced *bool
	var listen *string
	cmd := &cobra.Command{
		Use:   "demo-resource [--fenced] [--listen ADDR]",
		Short: "an HTTP resource to try verify on",
		Args:  cobra.NoArgs,
		RunE:  func(*cobra.Command, []string) error { return exitWith(runDemoResource(*fenced, *listen)) },
	}
	fenced = cmd.Flags().Bool("fenced", false, "check fencing tokens (package fence); without it every write is accepted")
	listen = cmd.Flags().String("listen", "127.0.0.1:8089", "address to serve on")
	return cmd
}

// runDemoResource serves the demo resource on listen until SIGINT or SIGTERM.
func runDemoResource(fenced bool, listen string) int {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		fmt.Fprintf(os.Stderr, "leasehold demo-resource: %v\n", err)
		return exitError
	}
	kind := "unfenced: it accepts every write"
	if fenced {
		kind = "fenced: it refuses stale tokens with 409"
	}
	fmt.Fprintf(os.Stderr, "demo resource on http://%s/write, %s\n", ln.Addr(), kind)
	srv := &http.Server{Handler: verify.DemoResource(fenced), ReadHeaderTimeout: 5 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintf(os.Stderr, "leasehold demo-resource: %v\n", err)
		return exitError
	}
	return exitOK
}
