package e2e

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	_ "modernc.org/sqlite"             // database/sql driver "sqlite"

	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/fence"
)

// windowGuard is a guard TestPushedFencingWindow measures: new makes a fresh one.
type windowGuard struct {
	name string
	new  func(t *testing.T) (fence.Floorer, func(ctx context.Context, resource string, token uint64) error)
}

func windowGuards() []windowGuard {
	gs := []windowGuard{
		{"memory", func(*testing.T) (fence.Floorer, func(context.Context, string, uint64) error) {
			m := fence.NewMemory()
			return m, m.Admit
		}},
		{"sqlite", func(t *testing.T) (fence.Floorer, func(context.Context, string, uint64) error) {
			dsn := "file:" + filepath.Join(t.TempDir(), "fence.db") + "?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_txlock=immediate"
			return sqlWindowGuard(t, fence.SQLite, "sqlite", dsn)
		}},
	}
	if dsn := os.Getenv("LEASEHOLD_TEST_POSTGRES"); dsn != "" {
		gs = append(gs, windowGuard{"postgres", func(t *testing.T) (fence.Floorer, func(context.Context, string, uint64) error) {
			return sqlWindowGuard(t, fence.Postgres, "pgx", dsn)
		}})
	}
	return gs
}

// sqlWindowGuard is a SQL guard on a fresh table; a write is one transaction that admits.
func sqlWindowGuard(t *testing.T, d fence.Dialect, driver, dsn string) (fence.Floorer, func(context.Context, string, uint64) error) {
	t.Helper()
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	table := "e2e_fence_" + hex.EncodeToString(b)
	g, err := fence.NewSQL(d, table)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Migrate(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = db.Exec("DROP TABLE " + table) })
	return g.Floors(db), func(ctx context.Context, resource string, token uint64) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback() }()
		if err := g.Admit(ctx, tx, resource, token); err != nil {
			return err
		}
		return tx.Commit()
	}
}

// staleWindow is what one try of TestPushedFencingWindow saw.
type staleWindow struct {
	expired  time.Time // the service's first "not current" answer for the old token
	rejected time.Time // the guard's first rejection of the old token (zero: none)
	floored  time.Time // Follow's floor in place (zero: none, or not following)
	late     int       // writes with the old token admitted after the floor was in place
}

// TestPushedFencingWindow measures the stale-write window with a paused holder, with and
// without server-pushed fencing (fence.Follow), and fails if, with it, a write by the old
// token is admitted after its floor was in place.
//
// Each try: a real process (pauseclient) takes a correctness lock with a 300 ms TTL and
// "writes" once (the guard admits its token); it is stopped with
// SIGSTOP; its lease expires. From then on the test writes with the old token every
// millisecond — what the paused holder would do the moment it ran again — and polls
// CheckToken to see when the service expires the lease. Nobody else writes. The window
// is from the service's first "not current" answer to the guard's first rejection.
// Without Follow the old token is admitted for as long as nobody else writes (the test
// watches for 1 s); with Follow it is bounded by the delivery of the expiry event.
//
// It runs with the in-memory guard, the SQL guard on SQLite, and on PostgreSQL when
// LEASEHOLD_TEST_POSTGRES is set (scripts/postgres.sh).
func TestPushedFencingWindow(t *testing.T) {
	s := StartServer(t)
	c := s.Client(t)
	for _, g := range windowGuards() {
		t.Run(g.name, func(t *testing.T) { testPushedFencingWindow(t, s, c, g) })
	}
}

func testPushedFencingWindow(t *testing.T, s *Server, c *client.Client, g windowGuard) {
	const (
		ttl     = 300 * time.Millisecond
		pushed  = 10
		without = 3
		watch   = time.Second // how long an unpushed try watches for a rejection
	)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// With pushing: one guard follows the service for the whole run.
	floors, admit := g.new(t)
	prefix := "pw-" + g.name + "/"
	var (
		mu      sync.Mutex
		floored = map[string]fence.Raised{}
		at      = map[string]time.Time{}
	)
	fctx, fcancel := context.WithCancel(ctx)
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- fence.Follow(fctx, c, prefix, floors, fence.OnReady(func() { close(ready) }), fence.OnFloor(func(r fence.Raised) {
			mu.Lock()
			defer mu.Unlock()
			if r.Ended > floored[r.Resource].Ended {
				floored[r.Resource], at[r.Resource] = r, time.Now()
			}
		}))
	}()
	defer func() {
		fcancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Follow ended with %v", err)
		}
	}()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("Follow: %v", err)
	}
	flooredAt := func(name string, tok uint64) time.Time {
		mu.Lock()
		defer mu.Unlock()
		if floored[name].Ended >= tok {
			return at[name]
		}
		return time.Time{}
	}

	var withPush, floorIn []time.Duration
	for i := range pushed {
		name := fmt.Sprintf("%s%d", prefix, i)
		w := pauseAndProbe(ctx, t, s, c, admit, name, ttl, watch, func(tok uint64) time.Time { return flooredAt(name, tok) })
		if w.rejected.IsZero() {
			t.Fatalf("%s: with Follow, the old token was still admitted %v after the service expired it", name, watch)
		}
		if w.late > 0 {
			t.Errorf("%s: %d writes with the old token were admitted after its floor was in place", name, w.late)
		}
		withPush = append(withPush, w.rejected.Sub(w.expired))
		floorIn = append(floorIn, w.floored.Sub(w.expired))
		t.Logf("%s: rejected %v after expiry (floor in place at %v)", name,
			w.rejected.Sub(w.expired).Round(100*time.Microsecond), w.floored.Sub(w.expired).Round(100*time.Microsecond))
	}

	// Without pushing: a guard nobody tells.
	_, plain := g.new(t)
	for i := range without {
		name := fmt.Sprintf("plain-%s/%d", g.name, i)
		w := pauseAndProbe(ctx, t, s, c, plain, name, ttl, watch, func(uint64) time.Time { return time.Time{} })
		if !w.rejected.IsZero() {
			t.Errorf("%s: without Follow and with nobody else writing, the old token was rejected %v after expiry", name, w.rejected.Sub(w.expired))
		}
	}
	t.Logf("%s guard, %d tries: with pushed fencing, rejected after expiry p50 %s (floor in place p50 %s); without: still admitted %v after expiry in %d of %d tries (until the next holder writes)",
		g.name, len(withPush), p50max(withPush), p50max(floorIn), watch, without, without)
}

// p50max formats the median and the largest of ds.
func p50max(ds []time.Duration) string {
	ds = slices.Sorted(slices.Values(ds))
	return fmt.Sprintf("%v, max %v", ds[len(ds)/2].Round(100*time.Microsecond), ds[len(ds)-1].Round(100*time.Microsecond))
}

// pauseAndProbe runs one try: a holder process takes name, its token is admitted, it is
// stopped; then the old token is written every millisecond until the guard rejects it or
// watch has passed since the service expired it.
func pauseAndProbe(ctx context.Context, t *testing.T, s *Server, c *client.Client, admit func(context.Context, string, uint64) error, name string,
	ttl, watch time.Duration, flooredAt func(tok uint64) time.Time) staleWindow {
	t.Helper()
	a, tok, _ := startHolder(t, s, name, ttl)
	defer a.Kill()
	if err := admit(ctx, name, tok); err != nil {
		t.Fatalf("%s: the holder's own write: %v", name, err)
	}
	time.Sleep(2 * ttl / 3) // a keepalive or two in its steady state
	a.Signal(syscall.SIGSTOP)
	defer func() { _ = syscall.Kill(a.Pid(), syscall.SIGCONT) }()

	var w staleWindow
	expired := make(chan time.Time, 1)
	go func() { // when does the service say the token is no longer current?
		for ctx.Err() == nil {
			cur, err := c.CheckToken(ctx, name, tok)
			if err == nil && !cur {
				expired <- time.Now()
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	var deadline <-chan time.Time
	for {
		select {
		case w.expired = <-expired:
			deadline = time.After(watch)
		case <-deadline:
			return w
		case <-ctx.Done():
			t.Fatalf("%s: %v", name, ctx.Err())
		default:
		}
		t0 := time.Now()
		err := admit(ctx, name, tok)
		if f := flooredAt(tok); !f.IsZero() && w.floored.IsZero() {
			w.floored = f
		}
		switch {
		case err == nil:
			if !w.floored.IsZero() && t0.After(w.floored) {
				w.late++
			}
		case errors.Is(err, fence.ErrStale):
			w.rejected = time.Now()
			if w.expired.IsZero() { // the floor came before the CheckToken answer
				w.expired = <-expired
			}
			return w
		default:
			t.Fatalf("%s: admit: %v", name, err)
		}
		time.Sleep(time.Millisecond)
	}
}
