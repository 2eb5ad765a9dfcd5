package fence

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

func (e *sqlEnv) newKeys(t *testing.T) *SQLKeys {
	t.Helper()
	k, err := NewSQLKeys(e.dialect, e.tableName(t, "keys"))
	if err != nil {
		t.Fatal(err)
	}
	if err := k.Migrate(context.Background(), e.db); err != nil {
		t.Fatal(err)
	}
	return k
}

func TestSQLiteKeys(t *testing.T)   { testSQLKeys(t, openSQLite(t)) }
func TestPostgresKeys(t *testing.T) { testSQLKeys(t, openPostgres(t)) }

// testSQLKeys: a key claimed in a transaction that commits is done, with its token and
// result, for every later Claim; one claimed in a transaction that rolls back stays free;
// bad keys and tokens are refused; Forget ends retention.
func testSQLKeys(t *testing.T, env *sqlEnv) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	k := env.newKeys(t)
	tx := func() *sql.Tx {
		t.Helper()
		tx, err := env.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tx.Rollback() })
		return tx
	}

	// Rolled back: free again.
	t1 := tx()
	if err := k.Claim(ctx, t1, "task/1", 33); err != nil {
		t.Fatal(err)
	}
	_ = t1.Rollback()
	if _, _, found, err := k.Lookup(ctx, env.db, "task/1"); found || err != nil {
		t.Fatalf("a rolled-back claim left a record (%v)", err)
	}

	// Committed: done.
	t2 := tx()
	if err := k.Claim(ctx, t2, "task/1", 34); err != nil {
		t.Fatal(err)
	}
	if err := k.Record(ctx, t2, "task/1", 33, []byte("x")); err == nil {
		t.Fatal("Record under another token than the claim's succeeded")
	}
	if err := k.Record(ctx, t2, "task/1", 34, []byte("invoice 7")); err != nil {
		t.Fatal(err)
	}
	if err := t2.Commit(); err != nil {
		t.Fatal(err)
	}
	t3 := tx()
	err := k.Claim(ctx, t3, "task/1", 35)
	var done *DoneError
	if !errors.As(err, &done) || !errors.Is(err, ErrDone) || done.Token != 34 || string(done.Result) != "invoice 7" {
		t.Fatalf("Claim of a done key: %v (%+v)", err, done)
	}
	_ = t3.Rollback()
	if tok, res, found, err := k.Lookup(ctx, env.db, "task/1"); !found || tok != 34 || string(res) != "invoice 7" || err != nil {
		t.Fatalf("Lookup: %d %q %v %v", tok, res, found, err)
	}

	// Done with nothing recorded.
	t4 := tx()
	if err := k.Claim(ctx, t4, "task/2", 36); err != nil {
		t.Fatal(err)
	}
	if err := t4.Commit(); err != nil {
		t.Fatal(err)
	}
	t5 := tx()
	if err := k.Claim(ctx, t5, "task/2", 37); !errors.As(err, &done) || done.Result != nil || done.Token != 36 {
		t.Fatalf("Claim of a key done without a result: %v", err)
	}
	_ = t5.Rollback()

	t6 := tx()
	for _, bad := range []struct {
		key   string
		token uint64
	}{{"", 1}, {strings.Repeat("k", MaxSQLKeyLen+1), 1}, {"k", 0}, {"k", MaxSQLToken + 1}} {
		if err := k.Claim(ctx, t6, bad.key, bad.token); err == nil {
			t.Errorf("Claim(%.10q, %d) accepted", bad.key, bad.token)
		}
	}
	_ = t6.Rollback()

	n, err := k.Forget(ctx, env.db, time.Now().Add(time.Hour))
	if err != nil || n != 2 {
		t.Fatalf("Forget: %d, %v", n, err)
	}
	t7 := tx()
	if err := k.Claim(ctx, t7, "task/1", 40); err != nil {
		t.Fatalf("Claim after Forget: %v", err)
	}
}

func TestSQLiteKeysRace(t *testing.T)   { testSQLKeysRace(t, openSQLite(t)) }
func TestPostgresKeysRace(t *testing.T) { testSQLKeysRace(t, openPostgres(t)) }

// testSQLKeysRace: owners with rising tokens — as across ownership hand-offs — run the
// same tasks at once, each in its own transaction: claim the task's key, write the
// task's effect, record, commit. Every task's effect is written exactly once, by the
// owner its key records, and every other owner is told it was done (*DoneError) or
// rolled back; nothing is left half done.
func testSQLKeysRace(t *testing.T, env *sqlEnv) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	k := env.newKeys(t)
	effects := env.tableName(t, "effects")
	if _, err := env.db.ExecContext(ctx, "CREATE TABLE "+effects+" (task TEXT NOT NULL, token BIGINT NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	insert := env.q("INSERT INTO " + effects + " (task, token) VALUES ($1, $2)")
	const owners, tasks = 12, 8
	var wg sync.WaitGroup
	for o := range owners {
		token := uint64(100 + o)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for task := range tasks {
				key := fmt.Sprintf("task/%d", task)
				err := func() error {
					tx, err := env.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
					if err != nil {
						return err
					}
					defer func() { _ = tx.Rollback() }()
					if err := k.Claim(ctx, tx, key, token); err != nil {
						return err
					}
					if _, err := tx.ExecContext(ctx, insert, key, int64(token)); err != nil {
						return err
					}
					if err := k.Record(ctx, tx, key, token, []byte(fmt.Sprint(token))); err != nil {
						return err
					}
					return tx.Commit()
				}()
				if err != nil && !errors.Is(err, ErrDone) {
					t.Errorf("owner %d, %s: %v", token, key, err)
				}
			}
		}()
	}
	wg.Wait()
	for task := range tasks {
		key := fmt.Sprintf("task/%d", task)
		var n int
		var by int64
		if err := env.db.QueryRowContext(ctx, env.q("SELECT count(*), max(token) FROM "+effects+" WHERE task = $1"), key).Scan(&n, &by); err != nil {
			t.Fatal(err)
		}
		tok, res, found, err := k.Lookup(ctx, env.db, key)
		if n != 1 || !found || err != nil || uint64(by) != tok || string(res) != fmt.Sprint(by) {
			t.Errorf("%s: %d effects (by %d); key record %d %q %v %v", key, n, by, tok, res, found, err)
		}
	}
}
