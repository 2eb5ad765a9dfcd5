package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/leasehold/leasehold/verify"
)

// runVerify implements `leasehold verify --url URL`: the conformance kit of package
// verify against the user's own resource. Exit codes: 0 PASS, 1 FAIL, 2 INCONCLUSIVE,
// 64 usage, 69 the server or the writers could not run.
func runVerify(args []string) int {
	fs := flag.NewFlagSet("verify", flag.ContinueOnError)
	addr := addrFlag(fs)
	url := fs.String("url", "", "the resource's HTTP endpoint: each write is a POST with the Fencing-Token header (required)")
	lock := fs.String("lock", "", "the lock the writers take (default verify/RANDOM)")
	writers := fs.Int("writers", 3, "writer processes (2 to 64)")
	duration := fs.Duration("duration", 20*time.Second, "how long the writers write")
	ttl := fs.Duration("ttl", time.Second, "the writers' lease TTL; pauses last 1.5 to 3 TTLs")
	chance := fs.Float64("pause-chance", 0.15, "chance that a writer is stopped with SIGSTOP after one of its writes")
	seed := fs.Uint64("seed", 0, "pause schedule seed (0 picks one; the report prints it)")
	output := fs.String("output", "text", "text or json")
	verbose := fs.Bool("v", false, "print every pause as it happens")
	fs.Usage = func() {
		fmt.Fprint(os.Stderr, `usage: leasehold verify --url URL [flags]

Checks that a resource refuses stale fencing tokens. Writer processes take one
correctness lock in turn and POST writes to URL with "Fencing-Token: LOCK=TOKEN";
holders are stopped with SIGSTOP past their TTL, so that a newer holder writes, and
resumed to write with their old token. Every write is recorded and the history
checked with porcupine: the resource must never accept a token lower than one it
accepted before. 2xx means accepted, 409 and 412 rejected, anything else unknown.

Exit codes: 0 PASS, 1 FAIL (the offending writes are printed), 2 INCONCLUSIVE (no
stale write was attempted), 64 usage, 69 the server or the writers could not run.

Flags:
`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if *url == "" || fs.NArg() > 0 || (*output != "text" && *output != "json") {
		fs.Usage()
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	cfg := verify.Config{Addr: *addr, URL: *url, Lock: *lock, Writers: *writers, Duration: *duration,
		TTL: *ttl, PauseChance: *chance, Seed: *seed}
	if *verbose {
		cfg.Log = os.Stderr
	}
	r, err := verify.Run(ctx, cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "leasehold verify: %v\n", err)
		if errors.Is(err, verify.ErrConfig) {
			return exitUsage
		}
		return exitUnavailable
	}
	if *output == "json" {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(r)
	} else {
		r.Print(os.Stdout)
	}
	switch r.Verdict {
	case verify.Pass:
		return exitOK
	case verify.Inconclusive:
		return 2
	}
	return exitError
}

// runDemoResource implements `leasehold demo-resource [--fenced] [--listen ADDR]`: an
// HTTP resource to try `leasehold verify` on (verify.DemoResource).
func runDemoResource(args []string) int {
	fs := flag.NewFlagSet("demo-resource", flag.ContinueOnError)
	fenced := fs.Bool("fenced", false, "check fencing tokens (package fence); without it every write is accepted")
	listen := fs.String("listen", "127.0.0.1:8089", "address to serve on")
	if err := fs.Parse(args); err != nil || fs.NArg() > 0 {
		return exitUsage
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintf(os.Stderr, "leasehold demo-resource: %v\n", err)
		return exitError
	}
	kind := "unfenced: it accepts every write"
	if *fenced {
		kind = "fenced: it refuses stale tokens with 409"
	}
	fmt.Fprintf(os.Stderr, "demo resource on http://%s/write, %s\n", ln.Addr(), kind)
	srv := &http.Server{Handler: verify.DemoResource(*fenced), ReadHeaderTimeout: 5 * time.Second}
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
