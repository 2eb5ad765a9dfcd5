package fence

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// ErrDone is returned by SQLKeys.Claim when the key's work was done by a transaction
// that committed before: the caller must not do it again. The error is a *DoneError.
var ErrDone = errors.New("fence: idempotency key already done")

// DoneError is a key whose work was committed before. It matches ErrDone.
type DoneError struct {
	Key string
	// Token is the fencing token of the transaction that did the work. When it is the
	// caller's own token, the work was done under the caller's own grant: typically the
	// caller's earlier transaction committed although its commit's answer was lost.
	Token uint64
	// Result is what that transaction recorded with SQLKeys.Record (nil if nothing).
	Result []byte
}

func (e *DoneError) Error() string {
	return fmt.Sprintf("fence: idempotency key %q was done under token %d", e.Key, e.Token)
}

// Is makes DoneError match ErrDone.
func (e *DoneError) Is(target error) bool { return target == ErrDone }

// MaxSQLKeyLen bounds the keys SQLKeys accepts, in bytes (an index entry must fit a
// page in every database).
const MaxSQLKeyLen = 512

// SQLKeys records idempotency keys in a table of the caller's database, inside the
// caller's own transaction, so that a side effect and the record that it was done commit
// together or not at all: at-most-once side effects with no service on the write path.
//
// The table has one row per key whose work committed:
//
//	idem_key   TEXT PRIMARY KEY   -- the key, 1 to MaxSQLKeyLen bytes
//	token      BIGINT NOT NULL    -- the fencing token of the transaction that did the work
//	result     BYTEA / BLOB       -- what it recorded (Record), or NULL
//	done_at                       -- when (TIMESTAMPTZ; TEXT in SQLite), for Forget
//
// Create it with Migrate, or put MigrationSQL in your own migration tool.
//
// # Use
//
// In the transaction that does the work, Claim first, then do the work, then Record its
// result, then commit:
//
//	tx, err := db.BeginTx(ctx, nil)
//	...
//	defer tx.Rollback()
//	if err := keys.Claim(ctx, tx, "invoice/2026-05/42", token); err != nil {
//		return err // *DoneError: already done (its Result is in the error); or a database error
//	}
//	// ... the side effect, through tx ...
//	if err := keys.Record(ctx, tx, "invoice/2026-05/42", token, result); err != nil {
//		return err
//	}
//	return tx.Commit()
//
// # Why a fence alone is not enough
//
// A fencing token orders writers: the SQL guard refuses the write of an owner whose
// token a newer owner's write superseded. It does not stop a task from running twice:
// when ownership of a partition passes from token 33 to token 34 while 33's task K is in
// flight, 34 runs K again, legitimately, with a newer token, after 33 committed it. The
// key makes K's effect happen once whoever runs it: the second transaction to Claim K
// finds it done. Use both: SQL.Admit orders the owners' writes, SQLKeys.Claim dedupes
// their tasks. The token recorded with a key says which owner did the work.
//
// # What it promises, and the isolation level it needs
//
// Claim runs one statement, an insert that does nothing when the key exists
// (PostgreSQL's form; SQLite's differs only in spelling):
//
//	INSERT INTO t (idem_key, token) VALUES ($1, $2) ON CONFLICT (idem_key) DO NOTHING RETURNING token
//
// A row back means the key is the caller's: no committed transaction did the work, and
// until this transaction ends every other Claim of the key waits for it (PostgreSQL's
// unique index makes a second insert of the key wait for the first transaction; SQLite
// serializes write transactions). If it commits, the waiting Claim finds the key done;
// if it rolls back, the waiting Claim gets the key. So, among transactions that Claim a
// key, at most one commits having got it. Under READ COMMITTED (PostgreSQL's default)
// Claim then reads the committed row of a done key. Under REPEATABLE READ or
// SERIALIZABLE, a key committed after the transaction's snapshot makes the insert fail
// with a serialization failure (SQLSTATE 40001), returned wrapped: roll back and retry
// with a new transaction, which will find the key done. In SQLite open the database with
// a busy timeout and begin transactions as IMMEDIATE, as for SQL.
//
// The promise holds for side effects made in the transaction that claimed the key. An
// effect outside the database (an email, a call to another service) is not rolled back
// with it: for those use the IdempotencyService (client.Once), or make the external call
// idempotent with the same key.
//
// Rows are kept until Forget deletes them: a key's retention is the caller's choice.
// A *SQLKeys holds no connection; it is safe for concurrent use.
type SQLKeys struct {
	dialect   Dialect
	table     string
	migration string
	claim     string
	lookup    string
	record    string
	forget    string
}

// NewSQLKeys returns an SQLKeys that keeps its keys in table (an unquoted identifier,
// optionally schema-qualified, as for NewSQL). It does not touch the database.
func NewSQLKeys(dialect Dialect, table string) (*SQLKeys, error) {
	if dialect != Postgres && dialect != SQLite {
		return nil, fmt.Errorf("fence: unknown SQL dialect %v", dialect)
	}
	if err := validateTable(table); err != nil {
		return nil, err
	}
	k := &SQLKeys{dialect: dialect, table: table}
	switch dialect {
	case Postgres:
		k.migration = "CREATE TABLE IF NOT EXISTS " + table + ` (
	idem_key TEXT PRIMARY KEY,
	token    BIGINT NOT NULL CHECK (token > 0),
	result   BYTEA,
	done_at  TIMESTAMPTZ NOT NULL DEFAULT now()
)`
		k.claim = "INSERT INTO " + table + " (idem_key, token) VALUES ($1, $2) ON CONFLICT (idem_key) DO NOTHING RETURNING token"
		k.lookup = "SELECT token, result FROM " + table + " WHERE idem_key = $1"
		k.record = "UPDATE " + table + " SET result = $3, done_at = now() WHERE idem_key = $1 AND token = $2"
		k.forget = "DELETE FROM " + table + " WHERE done_at < $1"
	case SQLite:
		k.migration = "CREATE TABLE IF NOT EXISTS " + table + ` (
	idem_key TEXT NOT NULL PRIMARY KEY,
	token    BIGINT NOT NULL CHECK (token > 0),
	result   BLOB,
	done_at  TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
)`
		k.claim = "INSERT INTO " + table + " (idem_key, token) VALUES (?1, ?2) ON CONFLICT (idem_key) DO NOTHING RETURNING token"
		k.lookup = "SELECT token, result FROM " + table + " WHERE idem_key = ?1"
		k.record = "UPDATE " + table + " SET result = ?3, done_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now') WHERE idem_key = ?1 AND token = ?2"
		k.forget = "DELETE FROM " + table + " WHERE done_at < ?1"
	}
	return k, nil
}

// MigrationSQL returns the CREATE TABLE IF NOT EXISTS statement for the keys' table.
func (k *SQLKeys) MigrationSQL() string { return k.migration }

// Migrate creates the keys' table if it does not exist.
func (k *SQLKeys) Migrate(ctx context.Context, db Execer) error {
	if _, err := db.ExecContext(ctx, k.migration); err != nil {
		return passContext(err, "fence: create table "+k.table)
	}
	return nil
}

// Claim takes key for the transaction tx, recording token with it (see the type's
// documentation). It returns nil when the key is tx's: do the work in tx, Record its
// result and commit. It returns a *DoneError (matching ErrDone) with the recorded token
// and result when a committed transaction did the work: do not do it, roll back. It
// returns an error wrapping ErrMalformedToken for token 0 or above MaxSQLToken, an
// error for an empty or too long key, a context error unchanged, and any other database
// error wrapped; after any error roll back. Claim a key once per transaction.
func (k *SQLKeys) Claim(ctx context.Context, tx Querier, key string, token uint64) error {
	if err := checkSQLKey(key, token); err != nil {
		return err
	}
	var got int64
	err := tx.QueryRowContext(ctx, k.claim, key, int64(token)).Scan(&got)
	if err == nil {
		return nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return passContext(err, fmt.Sprintf("fence: claim idempotency key %q", key))
	}
	done := &DoneError{Key: key}
	var t int64
	if err := tx.QueryRowContext(ctx, k.lookup, key).Scan(&t, &done.Result); err != nil {
		return passContext(err, fmt.Sprintf("fence: idempotency key %q is done; reading its record failed", key))
	}
	done.Token = uint64(t)
	return done
}

// Record stores result with key, which tx must have claimed with token. It returns an
// error when no such claim is in the table (the key was not claimed by tx, or under
// another token), a context error unchanged, and any other database error wrapped.
func (k *SQLKeys) Record(ctx context.Context, tx Execer, key string, token uint64, result []byte) error {
	if err := checkSQLKey(key, token); err != nil {
		return err
	}
	if result == nil {
		result = []byte{} // NULL means "nothing recorded"; an empty result is something
	}
	res, err := tx.ExecContext(ctx, k.record, key, int64(token), result)
	if err != nil {
		return passContext(err, fmt.Sprintf("fence: record the result of %q", key))
	}
	n, err := res.RowsAffected()
	if err != nil {
		return passContext(err, fmt.Sprintf("fence: record the result of %q", key))
	}
	if n != 1 {
		return fmt.Errorf("fence: record the result of %q: the key is not claimed under token %d in this transaction", key, token)
	}
	return nil
}

// Lookup returns the token and result recorded for key as seen by q, and false when no
// committed (or, through q's own transaction, claimed) record exists. It is for
// inspection; the work must Claim.
func (k *SQLKeys) Lookup(ctx context.Context, q Querier, key string) (token uint64, result []byte, found bool, err error) {
	var t int64
	err = q.QueryRowContext(ctx, k.lookup, key).Scan(&t, &result)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil, false, nil
	}
	if err != nil {
		return 0, nil, false, passContext(err, "fence: look up idempotency key "+strconv.Quote(key))
	}
	return uint64(t), result, true, nil
}

// Forget deletes the keys done before before and returns how many: their work may then
// be done again. Run it as the retention policy of the table.
func (k *SQLKeys) Forget(ctx context.Context, db Execer, before time.Time) (int64, error) {
	var arg any = before
	if k.dialect == SQLite {
		arg = before.UTC().Format("2006-01-02T15:04:05.000Z")
	}
	res, err := db.ExecContext(ctx, k.forget, arg)
	if err != nil {
		return 0, passContext(err, "fence: forget idempotency keys")
	}
	return res.RowsAffected()
}

func checkSQLKey(key string, token uint64) error {
	if key == "" || len(key) > MaxSQLKeyLen {
		return fmt.Errorf("fence: idempotency key must be 1 to %d bytes, got %d", MaxSQLKeyLen, len(key))
	}
	return checkSQLToken(token)
}
