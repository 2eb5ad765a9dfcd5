// Package verify is a conformance kit for a resource that says it checks fencing tokens:
// it attacks the resource the way a real failure would, and tells whether the resource
// let a stale writer through.
//
// Run starts several writer processes. Each takes the same correctness lock from a
// leasehold server, in turn, and while it holds it sends writes to the resource with its
// fencing token (over HTTP: the Fencing-Token header, see package fence). While a writer
// holds the lock, Run stops it with SIGSTOP for longer than the lease's TTL — a GC pause,
// a VM migration, a laptop lid — so that the lease expires and the next writer takes the
// lock with a larger token and writes. Then the stopped writer is resumed, and it goes on
// writing with its old token, as a real paused process would: it does not look at its
// lock before the write (the pause could as well have come between the look and the
// write). A fenced resource rejects those writes; one that does not check, accepts them.
//
// Every write is recorded with the moment it was sent and the moment its answer came,
// and the history is checked with porcupine against the one rule a fenced resource must
// keep: a write is accepted only if its token is not lower than that of any write the
// resource accepted before. The Report says whether the resource kept it, shows the
// offending writes, and carries the seed that drove the pauses, to run the same schedule
// again.
//
// What it does not prove: a run that passes saw the resource hold under the schedules it
// tried, nothing more. A run in which no stale write was even attempted proves nothing,
// and its verdict says so (Inconclusive). Times are read from the machine's wall clock in
// every process; run the kit, its writers and the leasehold server on one machine.
package verify

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Errors returned by Run.
var (
	// ErrConfig is returned for a Config that cannot run; the message names the field.
	ErrConfig = errors.New("verify: invalid configuration")
	// ErrWriter is returned when a writer process failed to start or could not reach the
	// leasehold server or take the lock at all.
	ErrWriter = errors.New("verify: writer failed")
	// ErrResource is returned when the SQL target cannot be opened, or its tables do not
	// exist or lack the columns verify writes (and Create was not set, or failed).
	ErrResource = errors.New("verify: SQL target unusable")
)

// Config configures a run. Addr and one target (URL, or DSN and Table) are required;
// everything else has a default.
type Config struct {
	// Addr is the leasehold server (one or more host:port, comma-separated).
	Addr string
	// URL is the resource's HTTP endpoint. Each write is a POST with the header
	// Fencing-Token: LOCK=TOKEN and a JSON body {"writer":W,"seq":N,"token":T}.
	URL string
	// DSN is a SQL database to write to instead of an HTTP URL (set one of the two).
	// Each write is one transaction: the fence.SQL guard's Admit of the writer's token
	// for the lock name (in GuardTable), then
	//	INSERT INTO Table (key, value, token) VALUES (LOCK, 'writer W seq N', TOKEN)
	//	ON CONFLICT (key) DO UPDATE SET value = excluded.value, token = excluded.token
	// and the commit. A commit is accepted; the guard's fence.ErrStale is rejected; any
	// other error leaves the write's outcome unknown.
	DSN string
	// Driver is the database/sql driver for DSN: DriverPgx or DriverSQLite. Default:
	// pgx for a postgres:// or postgresql:// DSN, sqlite for a file: DSN.
	Driver string
	// Table is the table the SQL writes go to, shaped
	// (key TEXT PRIMARY KEY, value TEXT, token BIGINT); verify writes one row, keyed by
	// the lock name. An unquoted identifier, optionally schema-qualified.
	Table string
	// GuardTable is the guard's token table (see fence.SQL). Default DefaultGuardTable.
	GuardTable string
	// Create makes Table and GuardTable if they do not exist (CREATE TABLE IF NOT
	// EXISTS); without it they must exist.
	Create bool
	// Unguarded writes the row without the guard: no Admit, only the upsert. It is the
	// negative control, what a table without fencing does; Run must fail it.
	Unguarded bool
	// Accepted and Rejected are the HTTP statuses that mean the resource applied the
	// write, or refused it because of its token. Defaults: every 2xx; 409 and 412.
	// Any other answer, and no answer, leaves the write's outcome unknown.
	Accepted, Rejected []int
	// Lock is the lock the writers take. Default "verify/" plus a random suffix.
	Lock string
	// Writers is how many writer processes run. Default 3.
	Writers int
	// Duration is how long writers write. Default 20s.
	Duration time.Duration
	// TTL is the writers' lease TTL. Default 1s. Pauses last 1.5 to 3 TTLs.
	TTL time.Duration
	// WritesPerTenure is how many writes a writer sends each time it holds the lock.
	// Default 6.
	WritesPerTenure int
	// Spacing is the time between a writer's writes. Default 20ms.
	Spacing time.Duration
	// PauseChance is the chance that a writer is stopped after one of its writes (not
	// the last of a tenure). Default 0.15.
	PauseChance float64
	// Seed drives the pause schedule. 0 picks one; the Report says which.
	Seed uint64
	// WriterCommand starts a writer: the program and its first arguments; Run adds
	// nothing but an environment variable (WriterMain reads it). Default: this
	// program's own executable with the argument "verify-writer" (the leasehold CLI).
	WriterCommand []string
	// Log, if set, receives one line per pause and per writer event worth noting.
	Log io.Writer
}

// writerEnv is the environment variable that carries a writer's configuration.
const writerEnv = "LEASEHOLD_VERIFY_WRITER"

func (c Config) withDefaults() (Config, error) {
	if c.Addr == "" {
		return c, fmt.Errorf("%w: Addr (the leasehold server) is required", ErrConfig)
	}
	switch {
	case c.URL == "" && c.DSN == "":
		return c, fmt.Errorf("%w: URL or DSN (the resource) is required", ErrConfig)
	case c.URL != "" && c.DSN != "":
		return c, fmt.Errorf("%w: set URL or DSN, not both", ErrConfig)
	case c.URL != "" && !strings.HasPrefix(c.URL, "http://") && !strings.HasPrefix(c.URL, "https://"):
		return c, fmt.Errorf("%w: URL %q must start with http:// or https://", ErrConfig, c.URL)
	case c.DSN != "":
		var err error
		if c, err = c.sqlDefaults(); err != nil {
			return c, err
		}
	}
	if c.Lock == "" {
		c.Lock = fmt.Sprintf("verify/%08x", rand.Uint32())
	}
	if c.Writers == 0 {
		c.Writers = 3
	}
	if c.Duration == 0 {
		c.Duration = 20 * time.Second
	}
	if c.TTL == 0 {
		c.TTL = time.Second
	}
	if c.WritesPerTenure == 0 {
		c.WritesPerTenure = 6
	}
	if c.Spacing == 0 {
		c.Spacing = 20 * time.Millisecond
	}
	if c.PauseChance == 0 {
		c.PauseChance = 0.15
	}
	if c.Seed == 0 {
		c.Seed = rand.Uint64()
	}
	if len(c.Accepted) == 0 {
		for s := 200; s < 300; s++ {
			c.Accepted = append(c.Accepted, s)
		}
	}
	if len(c.Rejected) == 0 {
		c.Rejected = []int{409, 412}
	}
	switch {
	case c.Writers < 2 || c.Writers > 64:
		return c, fmt.Errorf("%w: Writers is %d, it must be 2 to 64", ErrConfig, c.Writers)
	case c.TTL < 100*time.Millisecond:
		return c, fmt.Errorf("%w: TTL is %v, the least is 100ms", ErrConfig, c.TTL)
	case c.Duration < 2*c.TTL:
		return c, fmt.Errorf("%w: Duration %v is shorter than two TTLs", ErrConfig, c.Duration)
	case c.WritesPerTenure < 2:
		return c, fmt.Errorf("%w: WritesPerTenure must be at least 2", ErrConfig)
	case c.PauseChance < 0 || c.PauseChance > 1:
		return c, fmt.Errorf("%w: PauseChance must be 0 to 1", ErrConfig)
	}
	if len(c.WriterCommand) == 0 {
		exe, err := os.Executable()
		if err != nil {
			return c, fmt.Errorf("%w: WriterCommand: %w", ErrConfig, err)
		}
		c.WriterCommand = []string{exe, "verify-writer"}
	}
	return c, nil
}

// writerConfig is what one writer process is told.
type writerConfig struct {
	ID              int           `json:"id"`
	Addr            string        `json:"addr"`
	URL             string        `json:"url"`
	Accepted        []int         `json:"accepted"`
	Rejected        []int         `json:"rejected"`
	Lock            string        `json:"lock"`
	TTL             time.Duration `json:"ttl"`
	WritesPerTenure int           `json:"writesPerTenure"`
	Spacing         time.Duration `json:"spacing"`
	DSN             string        `json:"dsn,omitempty"`
	Driver          string        `json:"driver,omitempty"`
	Table           string        `json:"table,omitempty"`
	GuardTable      string        `json:"guardTable,omitempty"`
	Unguarded       bool          `json:"unguarded,omitempty"`
}

// event is one line a writer prints on its standard output.
type event struct {
	Ev     string  `json:"ev"` // "grant", "write", "release", "fatal"
	Writer int     `json:"w"`
	Token  uint64  `json:"token,omitempty"`
	Seq    int     `json:"seq,omitempty"`
	Call   int64   `json:"call,omitempty"` // wall clock, ns
	Ret    int64   `json:"ret,omitempty"`  // wall clock, ns; 0: no answer
	Out    Outcome `json:"out,omitempty"`
	Detail string  `json:"detail,omitempty"`
}

// Run attacks the resource for cfg.Duration and checks what it accepted. It returns an
// error only when the run could not be made (ErrConfig, ErrWriter, ctx's error); a
// resource that let a stale write through is a Report with Verdict Fail.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	logf := func(format string, args ...any) {
		if cfg.Log != nil {
			fmt.Fprintf(cfg.Log, format+"\n", args...)
		}
	}
	if cfg.DSN != "" {
		if err := prepareSQL(ctx, cfg); err != nil {
			return nil, err
		}
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15))
	runCtx, cancel := context.WithTimeout(ctx, cfg.Duration+10*cfg.TTL+30*time.Second)
	defer cancel()

	type writerProc struct {
		cmd    *exec.Cmd
		mu     sync.Mutex // guards paused
		paused bool
	}
	events := make(chan event, 1024)
	procs := make([]*writerProc, cfg.Writers)
	var readers sync.WaitGroup
	for i := range procs {
		wc := writerConfig{ID: i + 1, Addr: cfg.Addr, URL: cfg.URL, Accepted: cfg.Accepted, Rejected: cfg.Rejected,
			Lock: cfg.Lock, TTL: cfg.TTL, WritesPerTenure: cfg.WritesPerTenure, Spacing: cfg.Spacing,
			DSN: cfg.DSN, Driver: cfg.Driver, Table: cfg.Table, GuardTable: cfg.GuardTable, Unguarded: cfg.Unguarded}
		b, _ := json.Marshal(wc)
		cmd := exec.CommandContext(runCtx, cfg.WriterCommand[0], cfg.WriterCommand[1:]...)
		cmd.Env = append(os.Environ(), writerEnv+"="+string(b))
		cmd.Stderr = os.Stderr
		cmd.Cancel = func() error { return cmd.Process.Kill() }
		out, err := cmd.StdoutPipe()
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrWriter, err)
		}
		if err := cmd.Start(); err != nil {
			for _, p := range procs[:i] {
				_ = p.cmd.Process.Kill()
			}
			return nil, fmt.Errorf("%w: start %v: %w", ErrWriter, cfg.WriterCommand, err)
		}
		procs[i] = &writerProc{cmd: cmd}
		readers.Add(1)
		go func(id int) {
			defer readers.Done()
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				var e event
				if json.Unmarshal(sc.Bytes(), &e) == nil {
					e.Writer = id
					events <- e
				}
			}
		}(i + 1)
	}
	go func() { readers.Wait(); close(events) }()

	stopWriters := time.AfterFunc(cfg.Duration, func() {
		for _, p := range procs {
			p.mu.Lock()
			if p.paused {
				_ = p.cmd.Process.Signal(syscall.SIGCONT)
				p.paused = false
			}
			p.mu.Unlock()
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
		}
	})
	defer stopWriters.Stop()

	var (
		history []event
		fatal   []string
		pauses  int
		timers  sync.WaitGroup
		start   = time.Now()
	)
	for e := range events {
		switch e.Ev {
		case "fatal":
			fatal = append(fatal, fmt.Sprintf("writer %d: %s", e.Writer, e.Detail))
		case "grant", "release":
			history = append(history, e)
		case "write":
			history = append(history, e)
			if e.Seq >= cfg.WritesPerTenure-1 || time.Since(start) > cfg.Duration-2*cfg.TTL || rng.Float64() >= cfg.PauseChance {
				continue
			}
			p := procs[e.Writer-1]
			p.mu.Lock()
			if !p.paused && p.cmd.Process.Signal(syscall.SIGSTOP) == nil {
				p.paused = true
				pauses++
				d := cfg.TTL*3/2 + time.Duration(rng.Int64N(int64(cfg.TTL*3/2)))
				logf("paused writer %d (token %d) for %v", e.Writer, e.Token, d.Round(time.Millisecond))
				timers.Add(1)
				time.AfterFunc(d, func() {
					defer timers.Done()
					p.mu.Lock()
					defer p.mu.Unlock()
					if p.paused {
						_ = p.cmd.Process.Signal(syscall.SIGCONT)
						p.paused = false
					}
				})
			}
			p.mu.Unlock()
		}
	}
	timers.Wait()
	for _, p := range procs {
		_ = p.cmd.Wait()
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	grants := 0
	for _, e := range history {
		if e.Ev == "grant" {
			grants++
		}
	}
	if grants == 0 {
		return nil, fmt.Errorf("%w: no writer took the lock %q at %s: %s", ErrWriter, cfg.Lock, cfg.Addr, strings.Join(fatal, "; "))
	}
	r := check(history)
	r.Seed, r.Pauses, r.Lock, r.Writers, r.Grants = cfg.Seed, pauses, cfg.Lock, cfg.Writers, grants
	r.WriterErrors = fatal
	r.Target = cfg.target()
	return r, nil
}

// target describes the resource for the report.
func (c Config) target() string {
	if c.DSN == "" {
		return c.URL
	}
	guard := "behind the fence.SQL guard (" + c.GuardTable + ")"
	if c.Unguarded {
		guard = "without the guard"
	}
	return fmt.Sprintf("%s table %s, %s", c.Driver, c.Table, guard)
}
