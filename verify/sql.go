package verify

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	_ "modernc.org/sqlite"             // database/sql driver "sqlite"

	"github.com/leasehold/leasehold/fence"
)

// The database/sql drivers a SQL target can use.
const (
	// DriverPgx is PostgreSQL through github.com/jackc/pgx/v5/stdlib.
	DriverPgx = "pgx"
	// DriverSQLite is SQLite through modernc.org/sqlite (no cgo).
	DriverSQLite = "sqlite"
)

// DefaultGuardTable is the fence.SQL guard's token table when Config.GuardTable is empty.
const DefaultGuardTable = "leasehold_fence"

// sqlTarget is where a writer's SQL writes go: one row of the user's table, keyed by the
// lock name, written in a transaction that first passes the token through the guard
// (unless guard is nil: the unguarded negative control).
type sqlTarget struct {
	db     *sql.DB
	guard  *fence.SQL
	key    string
	upsert string
}

// dialectOf returns the fence dialect of a driver.
func dialectOf(driver string) fence.Dialect {
	if driver == DriverSQLite {
		return fence.SQLite
	}
	return fence.Postgres
}

// sqlDefaults fills and checks the SQL half of a Config.
func (c Config) sqlDefaults() (Config, error) {
	if c.Driver == "" {
		switch {
		case strings.HasPrefix(c.DSN, "postgres://"), strings.HasPrefix(c.DSN, "postgresql://"):
			c.Driver = DriverPgx
		case strings.HasPrefix(c.DSN, "file:"):
			c.Driver = DriverSQLite
		default:
			return c, fmt.Errorf("%w: Driver: cannot tell it from the DSN; say %q or %q", ErrConfig, DriverPgx, DriverSQLite)
		}
	}
	if c.Driver != DriverPgx && c.Driver != DriverSQLite {
		return c, fmt.Errorf("%w: Driver %q: want %q or %q", ErrConfig, c.Driver, DriverPgx, DriverSQLite)
	}
	if c.Table == "" {
		return c, fmt.Errorf("%w: Table is required with DSN", ErrConfig)
	}
	if c.GuardTable == "" {
		c.GuardTable = DefaultGuardTable
	}
	// fence.NewSQL checks an identifier the same way for both tables.
	for _, t := range []string{c.Table, c.GuardTable} {
		if _, err := fence.NewSQL(dialectOf(c.Driver), t); err != nil {
			return c, fmt.Errorf("%w: %w", ErrConfig, err)
		}
	}
	if strings.EqualFold(c.Table, c.GuardTable) {
		return c, fmt.Errorf("%w: Table and GuardTable are both %q", ErrConfig, c.Table)
	}
	return c, nil
}

// openSQL opens the database. A SQLite database gets one connection with a busy
// timeout, so that writer processes wait for each other's write transactions instead
// of failing with SQLITE_BUSY.
func openSQL(ctx context.Context, driver, dsn string) (*sql.DB, error) {
	db, err := sql.Open(driver, dsn)
	if err != nil {
		return nil, err
	}
	if driver == DriverSQLite {
		db.SetMaxOpenConns(1)
		if _, err := db.ExecContext(ctx, "PRAGMA busy_timeout = 10000"); err != nil {
			_ = db.Close()
			return nil, err
		}
	}
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		return nil, err
	}
	return db, nil
}

// createTableSQL is the statement Create runs for the table verify writes.
func createTableSQL(table string) string {
	return "CREATE TABLE IF NOT EXISTS " + table + " (key TEXT NOT NULL PRIMARY KEY, value TEXT NOT NULL, token BIGINT NOT NULL)"
}

// prepareSQL runs in Run before the writers start: it creates the tables if asked, and
// checks that they exist and have the columns verify uses.
func prepareSQL(ctx context.Context, cfg Config) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	db, err := openSQL(ctx, cfg.Driver, cfg.DSN)
	if err != nil {
		return fmt.Errorf("%w: open %s database: %w", ErrResource, cfg.Driver, err)
	}
	defer func() { _ = db.Close() }()
	guard, err := fence.NewSQL(dialectOf(cfg.Driver), cfg.GuardTable)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if cfg.Create {
		if _, err := db.ExecContext(ctx, createTableSQL(cfg.Table)); err != nil {
			return fmt.Errorf("%w: create table %s: %w", ErrResource, cfg.Table, err)
		}
		if !cfg.Unguarded {
			if err := guard.Migrate(ctx, db); err != nil {
				return fmt.Errorf("%w: %w", ErrResource, err)
			}
		}
	}
	checks := []string{"SELECT key, value, token FROM " + cfg.Table + " WHERE 1 = 0"}
	if !cfg.Unguarded {
		checks = append(checks, "SELECT resource, token FROM "+cfg.GuardTable+" WHERE 1 = 0")
	}
	for _, q := range checks {
		rows, err := db.QueryContext(ctx, q)
		if err != nil {
			return fmt.Errorf("%w: %s: %w (create the tables, or pass --create)", ErrResource, q, err)
		}
		_ = rows.Close()
	}
	return nil
}

// newSQLTarget opens a writer's connection to the database.
func newSQLTarget(ctx context.Context, cfg writerConfig) (*sqlTarget, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	db, err := openSQL(ctx, cfg.Driver, cfg.DSN)
	if err != nil {
		return nil, fmt.Errorf("open %s database: %w", cfg.Driver, err)
	}
	t := &sqlTarget{db: db, key: cfg.Lock,
		upsert: "INSERT INTO " + cfg.Table + " (key, value, token) VALUES ($1, $2, $3) " +
			"ON CONFLICT (key) DO UPDATE SET value = excluded.value, token = excluded.token"}
	if cfg.Driver == DriverSQLite {
		t.upsert = strings.NewReplacer("$1", "?1", "$2", "?2", "$3", "?3").Replace(t.upsert)
	}
	if !cfg.Unguarded {
		if t.guard, err = fence.NewSQL(dialectOf(cfg.Driver), cfg.GuardTable); err != nil {
			_ = db.Close()
			return nil, err
		}
	}
	return t, nil
}

// write runs one fenced write: in one transaction, the guard's Admit of token for the
// lock, then the upsert of the row. It returns nil when the transaction committed, an
// error matching fence.ErrStale when the guard refused the token, and any other error
// when the outcome is not known to be either.
func (t *sqlTarget) write(ctx context.Context, token uint64, value string) error {
	tx, err := t.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if t.guard != nil {
		if err := t.guard.Admit(ctx, tx, t.key, token); err != nil {
			return err
		}
	}
	if _, err := tx.ExecContext(ctx, t.upsert, t.key, value, int64(token)); err != nil {
		return err
	}
	return tx.Commit()
}

// writeSQL sends one write to the SQL target and records it.
func (w *writer) writeSQL(ctx context.Context, token uint64, seq int) {
	e := event{Ev: "write", Token: token, Seq: seq, Call: time.Now().UnixNano()}
	err := w.sql.write(ctx, token, fmt.Sprintf("writer %d seq %d", w.cfg.ID, seq))
	switch {
	case err == nil:
		e.Ret, e.Out = time.Now().UnixNano(), Accepted
	case errors.Is(err, fence.ErrStale):
		e.Ret, e.Out, e.Detail = time.Now().UnixNano(), Rejected, err.Error()
	default:
		// A failed commit may have committed: no answer, as for an HTTP write that got none.
		e.Out, e.Detail = Unknown, err.Error()
	}
	w.emit(e)
}
