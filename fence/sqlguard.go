package fence

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Dialect names the SQL database a SQL guard talks to.
type Dialect int

// The supported dialects. The zero Dialect is invalid.
const (
	// Postgres is PostgreSQL 9.5 or later (INSERT ... ON CONFLICT ... RETURNING).
	Postgres Dialect = iota + 1
	// SQLite is SQLite 3.35 or later (RETURNING), for example modernc.org/sqlite.
	SQLite
)

// String returns "postgres", "sqlite" or "Dialect(N)".
func (d Dialect) String() string {
	switch d {
	case Postgres:
		return "postgres"
	case SQLite:
		return "sqlite"
	}
	return "Dialect(" + strconv.Itoa(int(d)) + ")"
}

// MaxSQLToken is the largest token the SQL guard can store. Tokens are kept in a signed
// 64-bit BIGINT column so that the column reads as a plain number in every tool; tokens
// above math.MaxInt64 are rejected with an error wrapping ErrMalformedToken rather than
// stored wrongly. The lock service issues tokens from 1 upward, one per grant: at a
// billion grants a second it would take 292 years to get there.
const MaxSQLToken = math.MaxInt64

// Querier runs one query that returns at most one row. *sql.DB, *sql.Tx and *sql.Conn
// satisfy it. Pass the *sql.Tx of the transaction that performs the fenced write.
type Querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Execer runs a statement that returns no rows. *sql.DB, *sql.Tx and *sql.Conn satisfy
// it.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// PgxQuerier is the pgx counterpart of Querier: pgx.Tx, *pgx.Conn, *pgxpool.Pool and
// *pgxpool.Tx satisfy it. Pass the pgx.Tx of the transaction that performs the write.
type PgxQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// SQL is a guard that keeps the highest accepted token of each resource in a table of
// the caller's database, and checks and raises it inside the caller's own transaction,
// so that the token check and the write it protects commit or roll back together.
//
// The table has one row per resource:
//
//	resource   TEXT PRIMARY KEY  -- the resource key (a lock name by default)
//	token      BIGINT NOT NULL   -- the highest token committed for it, 1..MaxSQLToken
//	updated_at                   -- when it was last raised (TIMESTAMPTZ; TEXT in SQLite)
//
// Create it with Migrate, or put MigrationSQL in your own migration tool.
//
// # Use
//
// In every transaction that writes a fenced resource, call Admit first, before the
// write, with the transaction itself:
//
//	tx, err := db.BeginTx(ctx, nil)
//	...
//	defer tx.Rollback()
//	if err := guard.Admit(ctx, tx, "orders/42", token); err != nil {
//		return err // stale, malformed, or a database error: do not write
//	}
//	// ... the write ...
//	return tx.Commit()
//
// On any error from Admit the caller must roll back (a stale token is not an SQL error,
// so the transaction is still open and could commit anything written before Admit).
// If the transaction rolls back, the raised token is rolled back with it.
//
// # What it promises, and the isolation level it needs
//
// Admit runs one statement, an upsert that raises the stored token only if the new one is
// not lower (the PostgreSQL form; SQLite's differs only in spelling):
//
//	INSERT INTO t AS f (resource, token, updated_at) VALUES ($1, $2, now())
//	ON CONFLICT (resource) DO UPDATE SET token = excluded.token, updated_at = excluded.updated_at
//	WHERE f.token <= excluded.token
//	RETURNING f.token
//
// In PostgreSQL this statement locks the resource's row whether or not the WHERE clause
// holds (documented for ON CONFLICT DO UPDATE), and the lock is held until the transaction
// ends. A second transaction admitting the same resource waits at its own upsert until the
// first commits or rolls back, and then — under READ COMMITTED, PostgreSQL's default —
// compares against the latest committed token, not against its snapshot. A new resource
// is the same: the second insert waits for the first and then takes the conflict path. So
// for each resource, fenced transactions commit one at a time, each holding the row from
// Admit to commit, and the tokens of committed transactions never decrease in commit
// order. READ COMMITTED is therefore enough, and is what the guard is tested with.
// REPEATABLE READ and SERIALIZABLE also keep the promise, but when the row was changed by
// a transaction that committed after this transaction's snapshot, PostgreSQL aborts the
// upsert with a serialization failure (SQLSTATE 40001); Admit returns that error wrapped
// and the caller must roll back and retry with a new transaction.
//
// In SQLite, write transactions are serialized by the database lock, so any isolation is
// serializable. Open the database with a busy timeout (modernc.org/sqlite:
// "_pragma=busy_timeout(5000)") and begin fenced transactions as IMMEDIATE
// ("_txlock=immediate"), or make Admit the first statement of the transaction, so that a
// transaction that read before it writes does not fail with SQLITE_BUSY.
//
// The guarantee holds only for writes made through Admit in the same transaction: a write
// to the resource that skips Admit, or that commits in another transaction, is not
// ordered. Like every Guard, SQL does not know whether a token's lease is still alive.
//
// A *SQL holds no connection and no state besides the prepared query text; it is safe for
// concurrent use. It does not implement Guard, because it needs the transaction: Admit
// takes it as an argument.
type SQL struct {
	dialect   Dialect
	table     string
	migration string
	admit     string
	highest   string
	floor     string // raises a floor (sqlfloor.go)
	resources string // lists resources under a prefix (sqlfloor.go)
}

// NewSQL returns a SQL guard that keeps its tokens in table. table is an unquoted SQL
// identifier — ASCII letters, digits and '_', not starting with a digit, at most 63 bytes
// — optionally prefixed by a schema identifier and a dot ("fencing.tokens"). PostgreSQL
// folds unquoted identifiers to lower case. NewSQL returns an error for an unknown
// dialect or an invalid table name; it does not touch the database.
func NewSQL(dialect Dialect, table string) (*SQL, error) {
	if dialect != Postgres && dialect != SQLite {
		return nil, fmt.Errorf("fence: unknown SQL dialect %v", dialect)
	}
	if err := validateTable(table); err != nil {
		return nil, err
	}
	s := &SQL{dialect: dialect, table: table}
	switch dialect {
	case Postgres:
		s.migration = "CREATE TABLE IF NOT EXISTS " + table + ` (
	resource   TEXT PRIMARY KEY,
	token      BIGINT NOT NULL CHECK (token > 0),
	updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
)`
		s.admit = "INSERT INTO " + table + ` AS f (resource, token, updated_at) VALUES ($1, $2, now())
ON CONFLICT (resource) DO UPDATE SET token = excluded.token, updated_at = excluded.updated_at
WHERE f.token <= excluded.token
RETURNING f.token`
		s.highest = "SELECT token FROM " + table + " WHERE resource = $1"
		s.floor = "INSERT INTO " + table + ` AS f (resource, token, updated_at) VALUES ($1, $2, now())
ON CONFLICT (resource) DO UPDATE SET token = excluded.token, updated_at = excluded.updated_at
WHERE f.token < excluded.token`
		s.resources = "SELECT resource FROM " + table + " WHERE substr(resource, 1, $2) = $1"
	case SQLite:
		s.migration = "CREATE TABLE IF NOT EXISTS " + table + ` (
	resource   TEXT NOT NULL PRIMARY KEY,
	token      BIGINT NOT NULL CHECK (token > 0),
	updated_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
)`
		// SQLite does not resolve an INSERT alias inside the upsert, so name the table.
		s.admit = "INSERT INTO " + table + ` (resource, token, updated_at) VALUES (?1, ?2, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
ON CONFLICT (resource) DO UPDATE SET token = excluded.token, updated_at = excluded.updated_at
WHERE ` + table + `.token <= excluded.token
RETURNING token`
		s.highest = "SELECT token FROM " + table + " WHERE resource = ?1"
		s.floor = "INSERT INTO " + table + ` (resource, token, updated_at) VALUES (?1, ?2, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
ON CONFLICT (resource) DO UPDATE SET token = excluded.token, updated_at = excluded.updated_at
WHERE ` + table + `.token < excluded.token`
		s.resources = "SELECT resource FROM " + table + " WHERE substr(resource, 1, ?2) = ?1"
	}
	return s, nil
}

// validateTable checks an optionally schema-qualified unquoted identifier.
func validateTable(table string) error {
	parts := strings.Split(table, ".")
	ok := len(parts) <= 2
	for _, p := range parts {
		ok = ok && validIdent(p)
	}
	if !ok {
		return fmt.Errorf("fence: table name %q: want an unquoted identifier (letters, digits, '_', not starting with a digit, at most 63 bytes), optionally schema-qualified", table)
	}
	return nil
}

func validIdent(s string) bool {
	if s == "" || len(s) > 63 || s[0] >= '0' && s[0] <= '9' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_'
		if !ok {
			return false
		}
	}
	return true
}

// Dialect returns the dialect the guard was made for.
func (s *SQL) Dialect() Dialect { return s.dialect }

// Table returns the table name the guard was made with.
func (s *SQL) Table() string { return s.table }

// MigrationSQL returns the CREATE TABLE IF NOT EXISTS statement for the guard's table, to
// be run by Migrate or copied into a migration tool. Running it again is harmless; it
// never alters an existing table.
func (s *SQL) MigrationSQL() string { return s.migration }

// Migrate creates the guard's table if it does not exist (see MigrationSQL). It does not
// check or change a table that already exists.
func (s *SQL) Migrate(ctx context.Context, db Execer) error {
	if _, err := db.ExecContext(ctx, s.migration); err != nil {
		return passContext(err, "fence: create table "+s.table)
	}
	return nil
}

// Admit checks token against the highest token committed for resource and raises it,
// with one statement run through tx, which must be the transaction that performs the
// fenced write (see the type's documentation for the order of calls and the isolation
// level). It returns nil when token is not lower than the highest (equal is admitted);
// a *StaleError (matching ErrStale) naming the highest when it is lower; an error
// wrapping ErrMalformedToken for token 0 or a token above MaxSQLToken; a context error
// unchanged; and any other database error wrapped. After any error the caller must roll
// the transaction back.
func (s *SQL) Admit(ctx context.Context, tx Querier, resource string, token uint64) error {
	return s.admitWith(ctx, func(ctx context.Context, q string, args ...any) scanner {
		return tx.QueryRowContext(ctx, q, args...)
	}, resource, token)
}

// AdmitPgx is Admit for a pgx transaction (pgx.Tx), for programs that use pgx directly
// rather than through database/sql. It promises and returns the same as Admit. The guard
// must have been made with the Postgres dialect.
func (s *SQL) AdmitPgx(ctx context.Context, tx PgxQuerier, resource string, token uint64) error {
	if s.dialect != Postgres {
		return fmt.Errorf("fence: AdmitPgx needs the postgres dialect, the guard is %v", s.dialect)
	}
	return s.admitWith(ctx, func(ctx context.Context, q string, args ...any) scanner {
		return tx.QueryRow(ctx, q, args...)
	}, resource, token)
}

// Highest returns the highest token committed for resource as seen by q, and false if
// the resource has none. It is for inspection and tests; a write must use Admit.
func (s *SQL) Highest(ctx context.Context, q Querier, resource string) (uint64, bool, error) {
	var t int64
	err := q.QueryRowContext(ctx, s.highest, resource).Scan(&t)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, passContext(err, "fence: read highest token for "+strconv.Quote(resource))
	}
	return uint64(t), true, nil
}

type scanner interface{ Scan(dest ...any) error }

type queryRowFunc func(ctx context.Context, query string, args ...any) scanner

func (s *SQL) admitWith(ctx context.Context, queryRow queryRowFunc, resource string, token uint64) error {
	if err := checkSQLToken(token); err != nil {
		return err
	}
	var got int64
	err := queryRow(ctx, s.admit, resource, int64(token)).Scan(&got)
	if err == nil {
		return nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return passContext(err, fmt.Sprintf("fence: admit token %d for %q", token, resource))
	}
	// No row back: the row exists and its token is higher. The upsert locked that row
	// (PostgreSQL) or the database (SQLite), so the value read now is the one that
	// made the token stale.
	var highest int64
	if err := queryRow(ctx, s.highest, resource).Scan(&highest); err != nil {
		return passContext(err, fmt.Sprintf("fence: token %d for %q is stale; reading the highest failed", token, resource))
	}
	if uint64(highest) <= token {
		// Only possible if something writes the table without Admit.
		return fmt.Errorf("fence: token %d for %q was not admitted, yet the highest stored is %d; is the table written outside the guard?", token, resource, highest)
	}
	return &StaleError{Resource: resource, Token: token, Highest: uint64(highest)}
}

// checkSQLToken rejects token 0 and tokens a BIGINT column cannot hold.
func checkSQLToken(token uint64) error {
	if err := checkToken(token); err != nil {
		return err
	}
	if token > MaxSQLToken {
		return fmt.Errorf("%w: token %d is above %d, the largest the SQL guard can store (BIGINT)", ErrMalformedToken, token, int64(MaxSQLToken))
	}
	return nil
}

// passContext returns context errors unchanged and wraps every other error with msg.
func passContext(err error, msg string) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return fmt.Errorf("%s: %w", msg, err)
}
