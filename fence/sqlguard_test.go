package fence

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	_ "modernc.org/sqlite"             // database/sql driver "sqlite"
)

// postgresEnv is the variable holding the DSN of the PostgreSQL server for the tests.
const postgresEnv = "LEASEHOLD_TEST_POSTGRES"

// sqlEnv is one database the SQL guard is tested against.
type sqlEnv struct {
	dialect Dialect
	db      *sql.DB
	dsn     string
}

// q rewrites a test query written with $1, $2, ... placeholders for the dialect.
func (e *sqlEnv) q(query string) string {
	if e.dialect == SQLite {
		return strings.ReplaceAll(query, "$", "?")
	}
	return query
}

// tableName returns a table name unique to this run, and drops the table at cleanup.
func (e *sqlEnv) tableName(t *testing.T, prefix string) string {
	t.Helper()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "fence_test_" + prefix + "_" + hex.EncodeToString(b)
	t.Cleanup(func() {
		if _, err := e.db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+name); err != nil {
			t.Logf("drop %s: %v", name, err)
		}
	})
	return name
}

// newGuard makes a guard on a fresh table and migrates it.
func (e *sqlEnv) newGuard(t *testing.T) *SQL {
	t.Helper()
	g, err := NewSQL(e.dialect, e.tableName(t, "tokens"))
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Migrate(context.Background(), e.db); err != nil {
		t.Fatal(err)
	}
	return g
}

func openSQLite(t *testing.T) *sqlEnv {
	t.Helper()
	path := filepath.Join(t.TempDir(), "fence.db")
	// A busy timeout so that concurrent writers wait for the database lock, and IMMEDIATE
	// transactions so that none fails with SQLITE_BUSY after reading (see SQL's docs).
	dsn := "file:" + path + "?_pragma=busy_timeout(20000)&_pragma=journal_mode(WAL)&_txlock=immediate"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return &sqlEnv{dialect: SQLite, db: db, dsn: dsn}
}

// openPostgres connects to the server named by LEASEHOLD_TEST_POSTGRES. Without it the
// test fails under CI (so CI cannot skip it silently) and is skipped elsewhere.
func openPostgres(t *testing.T) *sqlEnv {
	t.Helper()
	dsn := os.Getenv(postgresEnv)
	if dsn == "" {
		msg := "\n\n*** " + postgresEnv + " is not set: the PostgreSQL tests of the SQL fence guard did NOT run. ***\n" +
			"Start a local server (Debian, as root) and point the tests at it:\n" +
			"    eval \"$(bash scripts/postgres.sh)\"    # or: make postgres\n" +
			"    go test -race ./fence/...\n"
		if os.Getenv("CI") != "" {
			t.Fatal(msg + "CI is set, so a missing server is a failure.")
		}
		t.Skip(msg)
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		t.Fatalf("%s=%q: %v (is the server up? eval \"$(bash scripts/postgres.sh)\")", postgresEnv, dsn, err)
	}
	return &sqlEnv{dialect: Postgres, db: db, dsn: dsn}
}

func TestNewSQL(t *testing.T) {
	for _, table := range []string{"fence_tokens", "Fence1", "_t", "fencing.tokens", strings.Repeat("a", 63)} {
		if _, err := NewSQL(Postgres, table); err != nil {
			t.Errorf("NewSQL(%q): %v", table, err)
		}
	}
	for _, table := range []string{"", "1tokens", "fence-tokens", "fence tokens", "t;DROP TABLE x", `"t"`,
		"a.b.c", ".t", "t.", "tökens", strings.Repeat("a", 64)} {
		if _, err := NewSQL(Postgres, table); err == nil {
			t.Errorf("NewSQL(%q) accepted an invalid table name", table)
		}
	}
	if _, err := NewSQL(Dialect(0), "t"); err == nil {
		t.Error("NewSQL accepted the zero Dialect")
	}
	g, err := NewSQL(SQLite, "t")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(g.MigrationSQL(), "CREATE TABLE IF NOT EXISTS t ") || g.Table() != "t" || g.Dialect() != SQLite {
		t.Errorf("unexpected guard: %v %q %q", g.Dialect(), g.Table(), g.MigrationSQL())
	}
	if err := g.AdmitPgx(context.Background(), nil, "r", 1); err == nil {
		t.Error("AdmitPgx on a SQLite guard did not fail")
	}
}

func TestSQLiteGuard(t *testing.T) {
	env := openSQLite(t)
	t.Run("basics", func(t *testing.T) { testSQLBasics(t, env) })
	t.Run("concurrent", func(t *testing.T) { testSQLConcurrent(t, env, sql.LevelDefault) })
}

func TestPostgresGuard(t *testing.T) {
	env := openPostgres(t)
	t.Run("basics", func(t *testing.T) { testSQLBasics(t, env) })
	t.Run("row lock", func(t *testing.T) { testPostgresRowLock(t, env) })
	t.Run("pgx", func(t *testing.T) { testPostgresPgx(t, env) })
	t.Run("concurrent read committed", func(t *testing.T) { testSQLConcurrent(t, env, sql.LevelReadCommitted) })
	t.Run("concurrent repeatable read", func(t *testing.T) { testSQLConcurrent(t, env, sql.LevelRepeatableRead) })
}

// admitTx runs Admit in its own transaction and commits it if admitted.
func admitTx(ctx context.Context, env *sqlEnv, g *SQL, resource string, token uint64) error {
	tx, err := env.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if err := g.Admit(ctx, tx, resource, token); err != nil {
		return err
	}
	return tx.Commit()
}

func testSQLBasics(t *testing.T, env *sqlEnv) {
	ctx := context.Background()
	g := env.newGuard(t)
	if err := g.Migrate(ctx, env.db); err != nil {
		t.Fatalf("second Migrate: %v", err)
	}
	if _, ok, err := g.Highest(ctx, env.db, "orders/42"); err != nil || ok {
		t.Fatalf("Highest of a new resource = %v, %v", ok, err)
	}
	for _, tok := range []uint64{5, 5, 7, MaxSQLToken - 1} {
		if err := admitTx(ctx, env, g, "orders/42", tok); err != nil {
			t.Fatalf("Admit(%d): %v", tok, err)
		}
	}
	wantStale(t, admitTx(ctx, env, g, "orders/42", 6), "orders/42", 6, MaxSQLToken-1)
	if err := admitTx(ctx, env, g, "orders/42", MaxSQLToken); err != nil {
		t.Fatalf("Admit(MaxSQLToken): %v", err)
	}
	if err := admitTx(ctx, env, g, "orders/42", MaxSQLToken+1); !errors.Is(err, ErrMalformedToken) || !strings.Contains(err.Error(), "BIGINT") {
		t.Errorf("Admit(MaxSQLToken+1) = %v; want ErrMalformedToken explaining the limit", err)
	}
	if err := admitTx(ctx, env, g, "orders/42", math.MaxUint64); !errors.Is(err, ErrMalformedToken) {
		t.Errorf("Admit(MaxUint64) = %v; want ErrMalformedToken", err)
	}
	if err := admitTx(ctx, env, g, "orders/42", 0); !errors.Is(err, ErrMalformedToken) {
		t.Errorf("Admit(0) = %v; want ErrMalformedToken", err)
	}

	// A rolled-back admission does not raise the highest token.
	if err := admitTx(ctx, env, g, "orders/43", 10); err != nil {
		t.Fatal(err)
	}
	tx, err := env.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Admit(ctx, tx, "orders/43", 20); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if h, _, err := g.Highest(ctx, env.db, "orders/43"); err != nil || h != 10 {
		t.Errorf("Highest after rollback = %d, %v; want 10", h, err)
	}
	if err := admitTx(ctx, env, g, "orders/43", 15); err != nil {
		t.Errorf("Admit(15) after a rolled-back 20: %v", err)
	}

	// Resource names are data, never SQL.
	evil := `x'); DROP TABLE ` + g.Table() + `; --`
	if err := admitTx(ctx, env, g, evil, 1); err != nil {
		t.Fatalf("Admit with a hostile resource name: %v", err)
	}
	wantStale(t, admitTx(ctx, env, g, "orders/43", 14), "orders/43", 14, 15)

	// A schema-qualified table name works in every statement.
	schema := "public"
	if env.dialect == SQLite {
		schema = "main"
	}
	qg, err := NewSQL(env.dialect, schema+"."+env.tableName(t, "qualified"))
	if err != nil {
		t.Fatal(err)
	}
	if err := qg.Migrate(ctx, env.db); err != nil {
		t.Fatal(err)
	}
	if err := admitTx(ctx, env, qg, "q", 2); err != nil {
		t.Fatal(err)
	}
	wantStale(t, admitTx(ctx, env, qg, "q", 1), "q", 1, 2)

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	tx, err = env.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	if err := g.Admit(cctx, tx, "orders/43", 16); !errors.Is(err, context.Canceled) {
		t.Errorf("Admit with a cancelled context = %v; want context.Canceled", err)
	}
}

// testPostgresRowLock checks the claim in SQL's docs that an admission holds the
// resource's row until its transaction ends, and that a waiting admission then compares
// against the committed token under READ COMMITTED.
func testPostgresRowLock(t *testing.T, env *sqlEnv) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	g := env.newGuard(t)
	if err := admitTx(ctx, env, g, "r", 5); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name        string
		first       uint64
		commitFirst bool
		second      uint64
		wantHighest uint64 // 0: second is admitted
	}{
		{"lower waits and is stale after commit", 10, true, 9, 10},
		{"higher waits and is admitted after commit", 20, true, 21, 0},
		{"lower waits and is admitted after rollback", 30, false, 22, 0},
		{"stale waits too", 30, true, 29, 30}, // a rejected admission also locks the row
	} {
		t.Run(tc.name, func(t *testing.T) {
			tx1, err := env.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx1.Rollback() }()
			if err := g.Admit(ctx, tx1, "r", tc.first); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- admitTx(ctx, env, g, "r", tc.second) }()
			select {
			case err := <-done:
				t.Fatalf("second admission returned %v while the first transaction held the row", err)
			case <-time.After(200 * time.Millisecond):
			}
			if tc.commitFirst {
				err = tx1.Commit()
			} else {
				err = tx1.Rollback()
			}
			if err != nil {
				t.Fatal(err)
			}
			err = <-done
			if tc.wantHighest == 0 {
				if err != nil {
					t.Fatalf("second admission: %v", err)
				}
				return
			}
			wantStale(t, err, "r", tc.second, tc.wantHighest)
		})
	}
}

func testPostgresPgx(t *testing.T, env *sqlEnv) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	g := env.newGuard(t)
	conn, err := pgx.Connect(ctx, env.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	admit := func(token uint64) error {
		tx, err := conn.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(ctx) }()
		if err := g.AdmitPgx(ctx, tx, "orders/42", token); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
	for _, tok := range []uint64{3, 3, 4} {
		if err := admit(tok); err != nil {
			t.Fatalf("AdmitPgx(%d): %v", tok, err)
		}
	}
	wantStale(t, admit(2), "orders/42", 2, 4)
	if err := admit(MaxSQLToken + 1); !errors.Is(err, ErrMalformedToken) {
		t.Errorf("AdmitPgx(MaxSQLToken+1) = %v; want ErrMalformedToken", err)
	}
	// database/sql sees what pgx committed: one table, two drivers.
	if h, _, err := g.Highest(ctx, env.db, "orders/42"); err != nil || h != 4 {
		t.Errorf("Highest = %d, %v; want 4", h, err)
	}
}

// testSQLConcurrent is the end-to-end check of G5 on a real database. Sixteen writers
// take tokens from one strictly increasing counter (standing in for lock grants), pause
// for a random short time (so writes arrive out of token order, as from paused clients),
// and then each runs one transaction: Admit; update the payload row with the token; append
// the token to a history table; commit. Some admitted transactions roll back instead, as
// failed writes do. A writer told its token is stale carries on writing anyway, like a
// client that has not looked at the error yet, and then rolls back.
//
// Afterwards the history, in its serial order (which is commit order, since each
// transaction appends while holding the resource's row), must have strictly increasing
// tokens; it must hold exactly the committed tokens and nothing from a stale or
// rolled-back write; and the payload and the guard must both hold the highest committed
// token.
func testSQLConcurrent(t *testing.T, env *sqlEnv, isolation sql.IsolationLevel) {
	const (
		writers   = 16
		maxWrites = 16 * 60
		runFor    = 1500 * time.Millisecond
	)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	g := env.newGuard(t)
	payload := env.tableName(t, "payload")
	history := env.tableName(t, "history")
	serial := "BIGSERIAL PRIMARY KEY"
	if env.dialect == SQLite {
		serial = "INTEGER PRIMARY KEY AUTOINCREMENT"
	}
	for _, ddl := range []string{
		"CREATE TABLE " + payload + " (resource TEXT PRIMARY KEY, token BIGINT NOT NULL, writer INT NOT NULL)",
		"CREATE TABLE " + history + " (seq " + serial + ", token BIGINT NOT NULL)",
	} {
		if _, err := env.db.ExecContext(ctx, ddl); err != nil {
			t.Fatal(err)
		}
	}
	upsertPayload := env.q("INSERT INTO " + payload + " (resource, token, writer) VALUES ($1, $2, $3) " +
		"ON CONFLICT (resource) DO UPDATE SET token = excluded.token, writer = excluded.writer")
	appendHistory := env.q("INSERT INTO " + history + " (token) VALUES ($1)")

	var (
		counter    atomic.Uint64
		writes     atomic.Int64
		mu         sync.Mutex
		committed  []uint64
		stale      []uint64
		rolledBack []uint64
		retried    atomic.Int64 // serialization failures (REPEATABLE READ)
		wg         sync.WaitGroup
	)
	stop := time.Now().Add(runFor)
	write := func(r *mrand.Rand, writer int) error {
		token := counter.Add(1)
		time.Sleep(time.Duration(r.IntN(2000)) * time.Microsecond)
		tx, err := env.db.BeginTx(ctx, &sql.TxOptions{Isolation: isolation})
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback() }()
		admitErr := g.Admit(ctx, tx, "hot", token)
		var pgErr *pgconn.PgError
		if errors.As(admitErr, &pgErr) && pgErr.Code == "40001" {
			retried.Add(1) // the caller would retry with a new transaction
			return nil
		}
		if admitErr != nil && !errors.Is(admitErr, ErrStale) {
			return fmt.Errorf("admit %d: %w", token, admitErr)
		}
		if admitErr != nil {
			var se *StaleError
			if !errors.As(admitErr, &se) || se.Highest <= token {
				return fmt.Errorf("admit %d: stale error without a higher token: %w", token, admitErr)
			}
		}
		if _, err := tx.ExecContext(ctx, upsertPayload, "hot", int64(token), writer); err != nil {
			return fmt.Errorf("payload %d: %w", token, err)
		}
		if _, err := tx.ExecContext(ctx, appendHistory, int64(token)); err != nil {
			return fmt.Errorf("history %d: %w", token, err)
		}
		switch {
		case admitErr != nil:
			if err := tx.Rollback(); err != nil {
				return err
			}
			mu.Lock()
			stale = append(stale, token)
			mu.Unlock()
		case r.IntN(8) == 0:
			if err := tx.Rollback(); err != nil {
				return err
			}
			mu.Lock()
			rolledBack = append(rolledBack, token)
			mu.Unlock()
		default:
			if err := tx.Commit(); err != nil {
				return fmt.Errorf("commit %d: %w", token, err)
			}
			mu.Lock()
			committed = append(committed, token)
			mu.Unlock()
		}
		return nil
	}
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := mrand.New(mrand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			for time.Now().Before(stop) && writes.Add(1) <= maxWrites {
				if err := write(r, w); err != nil {
					t.Errorf("writer %d: %v", w, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	t.Logf("%v: %d committed, %d stale, %d rolled back, %d serialization failures",
		isolation, len(committed), len(stale), len(rolledBack), retried.Load())
	if len(committed) < 10 || len(stale) == 0 {
		t.Fatalf("the run did not exercise the guard: %d committed, %d stale", len(committed), len(stale))
	}

	hist := readHistory(ctx, t, env, history)
	for i := 1; i < len(hist); i++ {
		if hist[i] <= hist[i-1] {
			t.Fatalf("history position %d: token %d committed after token %d", i, hist[i], hist[i-1])
		}
	}
	slices.Sort(committed)
	sortedHist := slices.Clone(hist)
	slices.Sort(sortedHist)
	if !slices.Equal(sortedHist, committed) {
		t.Fatalf("history holds %d tokens, %d writes committed; they differ", len(hist), len(committed))
	}
	inHistory := make(map[uint64]bool, len(hist))
	for _, tok := range hist {
		inHistory[tok] = true
	}
	for _, tok := range append(stale, rolledBack...) {
		if inHistory[tok] {
			t.Fatalf("token %d was stale or rolled back, yet its write is in the history", tok)
		}
	}
	maxCommitted := committed[len(committed)-1]
	var payloadToken int64
	if err := env.db.QueryRowContext(ctx, env.q("SELECT token FROM "+payload+" WHERE resource = $1"), "hot").Scan(&payloadToken); err != nil {
		t.Fatal(err)
	}
	if uint64(payloadToken) != maxCommitted {
		t.Errorf("payload holds token %d; want the highest committed %d", payloadToken, maxCommitted)
	}
	if h, _, err := g.Highest(ctx, env.db, "hot"); err != nil || h != maxCommitted {
		t.Errorf("guard's highest = %d, %v; want %d", h, err, maxCommitted)
	}
}
