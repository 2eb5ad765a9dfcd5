package verify_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/testnode"
	"github.com/leasehold/leasehold/verify"
)

// postgresEnv names the PostgreSQL server for the tests, as in package fence.
const postgresEnv = "LEASEHOLD_TEST_POSTGRES"

// TestVerifySQLite runs the kit against a SQLite table, written through the fence.SQL
// guard (it must pass) and without it (it must fail), with real writer processes
// SIGSTOPped past their TTL.
func TestVerifySQLite(t *testing.T) {
	if testing.Short() {
		t.Skip("runs writer processes for several seconds")
	}
	dsn := "file:" + filepath.Join(t.TempDir(), "verify.db") + "?_pragma=journal_mode(WAL)"
	testVerifySQL(t, verify.DriverSQLite, dsn)
}

// TestVerifyPostgres is TestVerifySQLite against the PostgreSQL server named by
// LEASEHOLD_TEST_POSTGRES. Without it the test is skipped, but fails when CI is set.
func TestVerifyPostgres(t *testing.T) {
	if testing.Short() {
		t.Skip("runs writer processes for several seconds")
	}
	dsn := os.Getenv(postgresEnv)
	if dsn == "" {
		msg := postgresEnv + " is not set: the PostgreSQL tests of leasehold verify did NOT run; " +
			"eval \"$(bash scripts/postgres.sh)\" starts a server and prints the export."
		if os.Getenv("CI") != "" {
			t.Fatal(msg + " CI is set, so a missing server is a failure.")
		}
		t.Skip(msg)
	}
	testVerifySQL(t, verify.DriverPgx, dsn)
}

func testVerifySQL(t *testing.T, driver, dsn string) {
	n := testnode.Start(t)
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	for _, c := range []struct {
		unguarded bool
		want      verify.Verdict
	}{{true, verify.Fail}, {false, verify.Pass}} {
		name := map[bool]string{true: "unguarded", false: "guarded"}[c.unguarded]
		t.Run(name, func(t *testing.T) {
			b := make([]byte, 4)
			_, _ = rand.Read(b)
			table, guard := "verify_test_"+hex.EncodeToString(b), "verify_test_fence_"+hex.EncodeToString(b)
			t.Cleanup(func() {
				for _, tb := range []string{table, guard} {
					_, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+tb)
				}
			})
			cfg := verify.Config{
				Addr: n.Addr(), DSN: dsn, Driver: driver, Table: table, GuardTable: guard, Unguarded: c.unguarded,
				Writers: 3, Duration: 5 * time.Second, TTL: 300 * time.Millisecond, PauseChance: 0.3,
				Seed: 42, WriterCommand: []string{os.Args[0]},
			}
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			// Without Create the tables must exist.
			if _, err := verify.Run(ctx, cfg); err == nil || !strings.Contains(err.Error(), "--create") {
				t.Fatalf("run without Create on missing tables: %v, want ErrResource naming --create", err)
			}
			cfg.Create = true
			r, err := verify.Run(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			var out strings.Builder
			r.Print(&out)
			t.Logf("\n%s", out.String())
			if r.Verdict != c.want {
				t.Fatalf("verdict %s, want %s", r.Verdict, c.want)
			}
			if c.want == verify.Fail && len(r.Violations) == 0 {
				t.Errorf("a failed run should show the offending writes")
			}
			if r.Pauses == 0 || r.StaleAttempts == 0 || r.Accepted == 0 {
				t.Errorf("pauses %d, stale attempts %d, accepted %d: the run did not exercise fencing", r.Pauses, r.StaleAttempts, r.Accepted)
			}
			// The row holds the last committed write; guarded, its token is the highest accepted.
			var token int64
			if err := db.QueryRowContext(ctx, "SELECT token FROM "+table+" WHERE key = '"+r.Lock+"'").Scan(&token); err != nil {
				t.Fatal(err)
			}
			var highest uint64
			for _, w := range r.Writes {
				if w.Outcome == verify.Accepted {
					highest = max(highest, w.Token)
				}
			}
			if !c.unguarded && uint64(token) != highest {
				t.Errorf("row token %d, highest accepted %d", token, highest)
			}
		})
	}
}

// TestSQLConfig: a SQL target that cannot run is refused with ErrConfig before any writer
// starts, naming what is wrong.
func TestSQLConfig(t *testing.T) {
	for _, c := range []struct {
		cfg  verify.Config
		want string
	}{
		{verify.Config{Addr: "x"}, "URL or DSN"},
		{verify.Config{Addr: "x", URL: "http://x", DSN: "file:x.db", Table: "t"}, "not both"},
		{verify.Config{Addr: "x", DSN: "file:x.db"}, "Table"},
		{verify.Config{Addr: "x", DSN: "mysql://x", Table: "t"}, "Driver"},
		{verify.Config{Addr: "x", DSN: "file:x.db", Driver: "mysql", Table: "t"}, `"mysql"`},
		{verify.Config{Addr: "x", DSN: "file:x.db", Table: "t; DROP TABLE t"}, "table name"},
		{verify.Config{Addr: "x", DSN: "file:x.db", Table: "t", GuardTable: "T"}, "both"},
	} {
		_, err := verify.Run(t.Context(), c.cfg)
		if !errors.Is(err, verify.ErrConfig) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want ErrConfig naming %q", c.cfg, err, c.want)
		}
	}
}
