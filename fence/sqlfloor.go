package fence

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// DB runs statements, queries and transactions of its own; *sql.DB satisfies it.
type DB interface {
	Execer
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
}

// Floors returns the Floorer of the guard's table in db, for Follow. Each Floor is one
// upsert in its own transaction (autocommit) that raises the resource's stored token to
// ended+1 unless it is higher already, and inserts the row if there is none (so under
// Follow the table gets a row for every exclusive lock of the prefix); it waits
// for a fenced transaction that holds the row (PostgreSQL) or the database (SQLite) and
// commits at once after it. From its commit on, every Admit of a token <= ended for the
// resource returns a *StaleError (naming ended+1 as the highest). A transaction that
// had already admitted such a token before the floor committed may still commit its
// write: it is ordered before the floor.
//
// When Follow has several floors to raise at once (events that arrived while it was
// writing), it writes them in one transaction, in resource order, instead.
//
// Floor returns an error wrapping ErrMalformedToken when ended+1 is above MaxSQLToken,
// a context error unchanged, and any other database error wrapped. Resources lists the
// table's resources under a prefix.
func (s *SQL) Floors(db DB) Floorer { return &sqlFloors{s: s, db: db} }

type sqlFloors struct {
	s  *SQL
	db DB
}

func (f *sqlFloors) Floor(ctx context.Context, resource string, ended uint64) error {
	if ended >= MaxSQLToken {
		return fmt.Errorf("%w: a floor above token %d is beyond %d, the largest the SQL guard can store", ErrMalformedToken, ended, int64(MaxSQLToken))
	}
	if _, err := f.db.ExecContext(ctx, f.s.floor, resource, int64(ended)+1); err != nil {
		return passContext(err, fmt.Sprintf("fence: raise the floor of %q above %d", resource, ended))
	}
	return nil
}

// floorBatch raises floors in one transaction, in resource order (so that two batches
// never wait for each other's rows in opposite orders).
func (f *sqlFloors) floorBatch(ctx context.Context, floors []Raised) error {
	for _, r := range floors {
		if r.Ended >= MaxSQLToken {
			return f.Floor(ctx, r.Resource, r.Ended) // its error
		}
	}
	sorted := slices.SortedFunc(slices.Values(floors), func(a, b Raised) int { return strings.Compare(a.Resource, b.Resource) })
	tx, err := f.db.BeginTx(ctx, nil)
	if err != nil {
		return passContext(err, "fence: begin a transaction for floors")
	}
	defer func() { _ = tx.Rollback() }()
	for _, r := range sorted {
		if _, err := tx.ExecContext(ctx, f.s.floor, r.Resource, int64(r.Ended)+1); err != nil {
			return passContext(err, fmt.Sprintf("fence: raise the floor of %q above %d", r.Resource, r.Ended))
		}
	}
	if err := tx.Commit(); err != nil {
		return passContext(err, fmt.Sprintf("fence: commit %d floors", len(floors)))
	}
	return nil
}

func (f *sqlFloors) Resources(ctx context.Context, prefix string) ([]string, error) {
	rows, err := f.db.QueryContext(ctx, f.s.resources, prefix, len(prefix))
	if err != nil {
		return nil, passContext(err, "fence: list resources under "+strconv.Quote(prefix))
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var r string
		if err := rows.Scan(&r); err != nil {
			return nil, passContext(err, "fence: list resources under "+strconv.Quote(prefix))
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, passContext(err, "fence: list resources under "+strconv.Quote(prefix))
	}
	return out, nil
}
