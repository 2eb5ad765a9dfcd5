// Command pauseclient is the lock holder of the end-to-end pause tests (test/e2e): the
// process that the test stops with SIGSTOP or kills with SIGKILL while it holds a lock.
//
// It dials the server, takes a correctness lock, prints
//
//	TOKEN <token>
//
// and then, every 10ms, checks its lock's Context and "writes" if the lock is still
// held. A loop iteration that comes more than --gap after the previous one means the
// process was paused; from then on a write is a bug (the lock must be known lost the
// moment the process runs again), reported as
//
//	WROTE-AFTER-RESUME <ms since the first instant seen after the pause>
//
// A pause that falls between the check and the write itself is the window that only a
// fencing resource can close; it is reported as LATE-WRITE and is not a client bug.
// When the Context reports the loss the program prints
//
//	LOST <ms since the first instant seen after the pause, or -1> <deadline|expired|revoked|other> <cause>
//
// and exits 0. Other failures exit 1.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/leasehold/leasehold/client"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:7740", "server address")
	name := flag.String("name", "e2e/pause", "lock name")
	ttl := flag.Duration("ttl", time.Second, "lease TTL")
	gap := flag.Duration("gap", 500*time.Millisecond, "a loop iteration later than this after the previous one counts as a pause")
	flag.Parse()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, *addr, client.WithTTL(*ttl))
	if err != nil {
		fmt.Fprintln(os.Stderr, "pauseclient:", err)
		os.Exit(1)
	}
	l, err := c.Lock(ctx, *name, client.Correctness, client.LockTTL(*ttl))
	if err != nil {
		fmt.Fprintln(os.Stderr, "pauseclient: lock:", err)
		os.Exit(1)
	}
	fmt.Printf("TOKEN %d\n", l.Token())

	var resumed time.Time // first instant seen after a pause
	since := func() int64 {
		if resumed.IsZero() {
			return -1
		}
		return time.Since(resumed).Milliseconds()
	}
	prev := time.Now()
	for writes := 0; ; writes++ {
		time.Sleep(10 * time.Millisecond)
		t0 := time.Now()
		if d := t0.Sub(prev); d > *gap && resumed.IsZero() {
			resumed = t0
			fmt.Printf("PAUSED %d\n", d.Milliseconds())
		}
		if err := l.Context().Err(); err != nil {
			if resumed.IsZero() && time.Since(t0) > *gap {
				resumed = t0 // paused between reading the clock and the check
			}
			cause := context.Cause(l.Context())
			fmt.Printf("LOST %d %s %v\n", since(), kind(cause), cause)
			os.Exit(0)
		}
		// The "write" the lock protects.
		t1 := time.Now()
		switch {
		case t1.Sub(t0) > *gap:
			fmt.Printf("LATE-WRITE %d\n", t1.Sub(t0).Milliseconds())
		case !resumed.IsZero():
			fmt.Printf("WROTE-AFTER-RESUME %d\n", since())
		}
		prev = t1
	}
}

func kind(cause error) string {
	switch {
	case errors.Is(cause, client.ErrLeaseDeadline):
		return "deadline"
	case errors.Is(cause, client.ErrLeaseExpired):
		return "expired"
	case errors.Is(cause, client.ErrLeaseRevoked):
		return "revoked"
	}
	return "other"
}
