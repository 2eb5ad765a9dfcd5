package fence

import (
	"context"
	"database/sql"
	"errors"
	mrand "math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/internal/testnode"
)

func TestSQLiteGuardWithLeaseholdLocks(t *testing.T) { testWithLeaseholdLocks(t, openSQLite(t)) }

func TestPostgresGuardWithLeaseholdLocks(t *testing.T) { testWithLeaseholdLocks(t, openPostgres(t)) }

// testWithLeaseholdLocks is G5 end to end with tokens from real leasehold locks: sixteen
// writers, each with its own client, take the correctness lock "hot" on an in-process
// leasehold node and write the token to the database inside a guarded transaction. A
// third of the writes are made like a paused client's: after the writer has released
// its lock and paused for a random time, with its old token — by then others may have
// written with larger ones. Checks: a write made while holding the lock is never
// rejected (its token is the highest granted so far); the committed history never goes
// backwards; and no rejected write left a trace.
func testWithLeaseholdLocks(t *testing.T, env *sqlEnv) {
	if testing.Short() {
		t.Skip("runs a leasehold node")
	}
	const writers = 16
	runFor := 2 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	node := testnode.Start(t)
	g := env.newGuard(t)
	history := env.tableName(t, "lhistory")
	serial := "BIGSERIAL PRIMARY KEY"
	if env.dialect == SQLite {
		serial = "INTEGER PRIMARY KEY AUTOINCREMENT"
	}
	if _, err := env.db.ExecContext(ctx, "CREATE TABLE "+history+" (seq "+serial+", token BIGINT NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	appendHistory := env.q("INSERT INTO " + history + " (token) VALUES ($1)")

	// write runs one guarded transaction and reports whether the token was admitted.
	write := func(token uint64) (bool, error) {
		tx, err := env.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
		if err != nil {
			return false, err
		}
		defer func() { _ = tx.Rollback() }()
		if err := g.Admit(ctx, tx, "hot", token); err != nil {
			if errors.Is(err, ErrStale) {
				return false, nil
			}
			return false, err
		}
		if _, err := tx.ExecContext(ctx, appendHistory, int64(token)); err != nil {
			return false, err
		}
		return true, tx.Commit()
	}

	var (
		mu                    sync.Mutex
		admitted, rejected    []uint64
		heldWrites, lateWrite int
		wg                    sync.WaitGroup
	)
	stop := time.Now().Add(runFor)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := mrand.New(mrand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			c, err := client.Dial(ctx, node.Addr(), client.WithTTL(2*time.Second))
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close(context.Background())
			for time.Now().Before(stop) {
				l, err := c.Lock(ctx, "hot", client.Correctness, client.WaitFor(5*time.Second))
				if err != nil {
					t.Errorf("writer %d: lock: %v", w, err)
					return
				}
				late := r.IntN(3) == 0
				if late {
					// The paused client: its lock is gone (released here; expired in real
					// life) before its write reaches the database.
					if err := l.Unlock(ctx); err != nil {
						t.Errorf("writer %d: unlock: %v", w, err)
						return
					}
					time.Sleep(time.Duration(r.IntN(30)) * time.Millisecond)
				}
				ok, err := write(l.Token())
				if err != nil {
					t.Errorf("writer %d: write %d: %v", w, l.Token(), err)
					return
				}
				mu.Lock()
				if ok {
					admitted = append(admitted, l.Token())
				} else {
					rejected = append(rejected, l.Token())
				}
				if late {
					lateWrite++
				} else {
					heldWrites++
				}
				mu.Unlock()
				if !late && !ok {
					t.Errorf("writer %d: a write made while holding the lock (token %d) was rejected", w, l.Token())
				}
				if !late {
					if err := l.Unlock(ctx); err != nil {
						t.Errorf("writer %d: unlock: %v", w, err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	t.Logf("%d writes while holding, %d late writes; %d admitted, %d rejected as stale",
		heldWrites, lateWrite, len(admitted), len(rejected))
	if len(rejected) == 0 || heldWrites < writers {
		t.Fatalf("the run did not exercise the guard: %d held writes, %d rejected", heldWrites, len(rejected))
	}
	hist := readHistory(ctx, t, env, history)
	for i := 1; i < len(hist); i++ {
		if hist[i] <= hist[i-1] {
			t.Fatalf("history position %d: token %d committed after token %d", i, hist[i], hist[i-1])
		}
	}
	slices.Sort(admitted)
	sorted := slices.Clone(hist)
	slices.Sort(sorted)
	if !slices.Equal(sorted, admitted) {
		t.Fatalf("history holds %d writes, %d were admitted; they differ", len(hist), len(admitted))
	}
}

// readHistory returns the tokens of a history table in commit (serial) order.
func readHistory(ctx context.Context, t *testing.T, env *sqlEnv, table string) []uint64 {
	t.Helper()
	rows, err := env.db.QueryContext(ctx, "SELECT token FROM "+table+" ORDER BY seq")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var hist []uint64
	for rows.Next() {
		var tok int64
		if err := rows.Scan(&tok); err != nil {
			t.Fatal(err)
		}
		hist = append(hist, uint64(tok))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return hist
}
