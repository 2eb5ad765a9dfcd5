package fence_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"net/http"
	"time"

	"connectrpc.com/connect"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver
	_ "modernc.org/sqlite"             // registers the "sqlite" database/sql driver

	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/fence"
)

// The bodies of these examples are the snippets of docs/FENCING.md; TestFencingDoc
// checks that every snippet there appears here, so the documentation compiles.

func Example_postgres() {
	ctx := context.Background()
	db, err := sql.Open("pgx", "postgres://app@db/app")
	if err != nil {
		log.Fatal(err)
	}
	guard, err := fence.NewSQL(fence.Postgres, "leasehold_fence")
	if err != nil {
		log.Fatal(err)
	}
	if err := guard.Migrate(ctx, db); err != nil { // or put guard.MigrationSQL() in your migrations
		log.Fatal(err)
	}

	// lock is a held *client.Lock; its token travels with the write.
	var lock *client.Lock
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback()
	if err := guard.Admit(ctx, tx, "orders/42", lock.Token()); err != nil {
		var stale *fence.StaleError
		if errors.As(err, &stale) {
			log.Printf("a newer holder (token %d) has written; stopping", stale.Highest)
		}
		return
	}
	if _, err := tx.ExecContext(ctx, `UPDATE orders SET status = 'paid' WHERE id = 42`); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
}

func Example_sqlite() {
	ctx := context.Background()
	db, err := sql.Open("sqlite", "file:app.db")
	if err != nil {
		log.Fatal(err)
	}
	guard, err := fence.NewSQL(fence.SQLite, "leasehold_fence")
	if err != nil {
		log.Fatal(err)
	}
	if err := guard.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	var token uint64 = 34 // from lock.Token()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback()
	if err := guard.Admit(ctx, tx, "inventory/sku-7", token); err != nil {
		return // fence.ErrStale: someone with a newer token has written
	}
	_, _ = tx.ExecContext(ctx, `UPDATE inventory SET count = count - 1 WHERE sku = 'sku-7'`)
	_ = tx.Commit()
}

func ExampleMiddleware() {
	// The service that owns the data checks every write's Fencing-Token header.
	guard := fence.NewMemory() // or a SQL guard, checked inside the handler's transaction
	write := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		lock, token, _ := fence.FromContext(r.Context())
		log.Printf("write admitted for %s with token %d", lock, token)
	})
	mux := http.NewServeMux()
	mux.Handle("POST /orders/", fence.Middleware(guard)(write))
	// Stale tokens get 409 with a problem+json body naming the highest token; malformed
	// ones 400; missing ones 428. The handler never runs for them.
	_ = http.ListenAndServe("127.0.0.1:8080", mux)
}

func ExampleTransport() {
	// The client that holds the lock sends its token with every request.
	var lock *client.Lock // held
	httpClient := &http.Client{Transport: &fence.Transport{
		Token: func() (string, uint64, bool) { return lock.Name(), lock.Token(), true },
	}}
	resp, err := httpClient.Post("http://127.0.0.1:8080/orders/42", "application/json", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	if err := fence.ProblemFromResponse(resp); errors.Is(err, fence.ErrStale) {
		log.Print("the service has seen a newer holder: stop working")
	}
}

func ExampleServerInterceptor() {
	// A Connect/gRPC service checks the fencing-token metadata of every call.
	guard := fence.NewMemory()
	interceptors := connect.WithInterceptors(fence.ServerInterceptor(guard))
	_ = interceptors // pass to your generated New...Handler(svc, interceptors)

	// Its clients attach their token:
	var lock *client.Lock // held
	clientInterceptors := connect.WithInterceptors(fence.ClientInterceptor(
		func() (string, uint64, bool) { return lock.Name(), lock.Token(), true }))
	_ = clientInterceptors // pass to your generated New...Client(httpClient, url, clientInterceptors)
}

// Example_sqlKeys is a task done at most once by whichever partition owner runs it: the
// guard orders the owners' writes, the key dedupes the task, both in one transaction.
func Example_sqlKeys() {
	ctx := context.Background()
	db, err := sql.Open("pgx", "postgres://app@db/app")
	if err != nil {
		log.Fatal(err)
	}
	guard, err := fence.NewSQL(fence.Postgres, "leasehold_fence")
	if err != nil {
		log.Fatal(err)
	}
	keys, err := fence.NewSQLKeys(fence.Postgres, "leasehold_keys")
	if err != nil {
		log.Fatal(err)
	}
	var token uint64 // the owner's epoch (a partition's) or a lock's token
	const invoiceID = "INV-1"
	run := func() error {
		tx, _ := db.BeginTx(ctx, nil)
		defer tx.Rollback()
		if err := guard.Admit(ctx, tx, "partition/7", token); err != nil {
			return err // a newer owner has written: stop
		}
		if err := keys.Claim(ctx, tx, "invoice/2026-05/K", token); errors.Is(err, fence.ErrDone) {
			return nil // done already, by the owner the error names
		} else if err != nil {
			return err
		}
		// ... insert the invoice through tx ...
		_ = keys.Record(ctx, tx, "invoice/2026-05/K", token, []byte(invoiceID))
		return tx.Commit()
	}
	if err := run(); err != nil {
		log.Print(err)
	}
}

// ExampleIdempotency serves POST /payments at most once per Idempotency-Key: a retry
// gets the stored answer, a request while the first runs gets 409.
func ExampleIdempotency() {
	ctx := context.Background()
	var payments http.Handler // the application's handler
	c, _ := client.Dial(ctx, "127.0.0.1:7740")
	http.Handle("POST /payments", fence.Idempotency(c, fence.WithKeyPrefix("payments/"))(payments))
}

func Example_partitions() {
	ctx := context.Background()
	db, err := sql.Open("pgx", "postgres://app@db/app")
	if err != nil {
		log.Fatal(err)
	}
	guard, err := fence.NewSQL(fence.Postgres, "leasehold_fence")
	if err != nil {
		log.Fatal(err)
	}
	c, err := client.Dial(ctx, "127.0.0.1:7740")
	if err != nil {
		log.Fatal(err)
	}
	if err := c.CreateGroup(ctx, "orders", 64, 10*time.Second); err != nil {
		log.Fatal(err)
	}
	err = c.JoinGroup(ctx, "orders", "worker-1", func(ctx context.Context, p client.Partition) {
		resource := fmt.Sprintf("orders/partition/%d", p.Number)
		for ctx.Err() == nil { // cancelled before the partition can move
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return
			}
			if err := guard.Admit(ctx, tx, resource, p.Epoch); err != nil {
				_ = tx.Rollback()
				return // a newer owner of the partition has written: stop
			}
			// ... process the partition's next batch through tx ...
			_ = tx.Commit()
		}
	})
	if err != nil {
		log.Fatal(err)
	}
}

func ExampleFollow() {
	ctx := context.Background()
	c, err := client.Dial(ctx, "127.0.0.1:7740")
	if err != nil {
		log.Fatal(err)
	}
	guard := fence.NewMemory()
	go func() {
		// Blocks until ctx ends; resumes by itself across leader changes.
		err := fence.Follow(ctx, c, "orders/", guard)
		log.Printf("fence.Follow stopped: %v", err)
	}()
}

func ExampleSQL_Floors() {
	ctx := context.Background()
	var c *client.Client // dialled
	var db *sql.DB       // opened
	sqlGuard, err := fence.NewSQL(fence.Postgres, "leasehold_fence")
	if err != nil {
		log.Fatal(err)
	}
	go fence.Follow(ctx, c, "orders/", sqlGuard.Floors(db))
}
