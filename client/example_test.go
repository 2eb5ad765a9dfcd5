package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/leasehold/leasehold/client"
)

// Example_fencedKV writes to leasehold's own fenced key-value store: the store rejects a
// write whose token is lower than one it has accepted for the key.
func Example_fencedKV() {
	ctx := context.Background()
	c, err := client.Dial(ctx, "127.0.0.1:7740")
	if err != nil {
		log.Fatal(err)
	}
	l, err := c.Lock(ctx, "accounts/7", client.Correctness)
	if err != nil {
		log.Fatal(err)
	}
	defer l.Unlock(context.Background())

	_, err = c.Put(ctx, "accounts/7/balance", []byte("80"), client.Fenced(l))
	var stale *client.StaleTokenError
	if errors.As(err, &stale) {
		log.Printf("token %d is stale: the key has accepted %d", stale.Token, stale.Highest)
	}
}

// Example_checkToken asks the lock service whether a token is still the holder's, for a
// resource that can call out before it commits.
func Example_checkToken() {
	ctx := context.Background()
	c, err := client.Dial(ctx, "127.0.0.1:7740")
	if err != nil {
		log.Fatal(err)
	}
	current, err := c.CheckToken(ctx, "accounts/7", 34)
	if err == nil && !current {
		log.Print("token 34 no longer holds accounts/7: refuse the write")
	}
}

// ExampleClient_NewSession gives each worker of a pool a lease of its own on one Client:
// the workers contend for a lock as separate clients would, and their requests share
// the Client's connection.
func ExampleClient_NewSession() {
	ctx := context.Background()
	c, err := client.Dial(ctx, "127.0.0.1:7740")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close(ctx)
	for range 4 {
		go func() {
			s := c.NewSession()
			defer s.Close(context.Background())
			l, err := s.Lock(ctx, "reports/daily", client.Efficiency)
			if err != nil {
				return
			}
			defer l.Unlock(context.Background())
			// Only one worker at a time gets here; the others wait in line.
		}()
	}
}

// ExampleClient_JoinGroup consumes a group's partitions: one handler per partition this
// process owns, each fencing its writes with the partition's epoch in the built-in
// store, until the process is told to stop (then it leaves and its partitions move at
// once).
func ExampleClient_JoinGroup() {
	ctx, stop := context.WithCancel(context.Background()) // cancel to leave the group
	defer stop()
	c, err := client.Dial(ctx, "127.0.0.1:7740")
	if err != nil {
		log.Fatal(err)
	}
	if err := c.CreateGroup(ctx, "orders", 16, 10*time.Second); err != nil {
		log.Fatal(err)
	}
	err = c.JoinGroup(ctx, "orders", "worker-1", func(ctx context.Context, p client.Partition) {
		fence := client.FencedBy(fmt.Sprintf("orders/%d", p.Number), p.Epoch)
		for ctx.Err() == nil { // cancelled before the partition can move
			key := fmt.Sprintf("orders/%d/cursor", p.Number)
			if _, err := c.Put(ctx, key, []byte("next"), fence); errors.Is(err, client.ErrStaleToken) {
				return // a newer owner has written
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	if err != nil {
		log.Fatal(err)
	}
}

// ExampleClient_Elect runs a primary while this process leads the election, fencing
// every write with the leadership's epoch; Elect campaigns again after a loss.
func ExampleClient_Elect() {
	ctx := context.Background()
	c, derr := client.Dial(ctx, "127.0.0.1:7740")
	if derr != nil {
		log.Fatal(derr)
	}
	defer c.Close(ctx)
	myAddr := "10.0.0.7:5432"
	// serve does the leader's work until ctx ends; every write it makes carries epoch.
	serve := func(ctx context.Context, epoch uint64) error {
		<-ctx.Done()
		return ctx.Err()
	}
	err := c.Elect(ctx, "db/primary", []byte(myAddr), func(ctx context.Context, l client.Leadership) error {
		return serve(ctx, l.Epoch()) // every write carries l.Epoch(); the store rejects lower ones
	})
	if err != nil {
		log.Print(err)
	}
}
