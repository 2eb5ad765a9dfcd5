package client_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/api/leasehold/v1/leaseholdv1connect"
	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/fastlane"
	"github.com/leasehold/leasehold/internal/testnode"
)

// TestSessionsAreSeparateHolders: two Sessions of one Client contend for a lock like two
// clients — the second waits in the queue, is granted on the first's Unlock, and gets a
// larger token — while two Locks of one name through one Session get the same grant.
func TestSessionsAreSeparateHolders(t *testing.T) {
	_, c, ctx := startClient(t)
	defer c.Close(ctx)

	for _, tc := range []struct {
		class client.LockOption
		name  string
	}{{client.Efficiency, "sessions/efficiency"}, {client.Correctness, "sessions/correctness"}} {
		class, name := tc.class, tc.name
		a, b := c.NewSession(), c.NewSession()
		la, err := a.Lock(ctx, name, class)
		if err != nil {
			t.Fatal(err)
		}
		again, err := a.Lock(ctx, name, class, client.TryOnce)
		if err != nil || again.Token() != la.Token() {
			t.Fatalf("%s: the same Session locking again: token %d, %v; want the grant's %d", name, again.Token(), err, la.Token())
		}
		if _, err := b.Lock(ctx, name, class, client.TryOnce); !errors.Is(err, client.ErrNotAcquired) {
			t.Fatalf("%s: another Session while held: %v, want ErrNotAcquired", name, err)
		}
		if _, err := c.Lock(ctx, name, class, client.TryOnce); !errors.Is(err, client.ErrNotAcquired) {
			t.Fatalf("%s: the Client's own lease while a Session holds it: %v, want ErrNotAcquired", name, err)
		}
		granted := make(chan *client.Lock, 1)
		go func() {
			lb, err := b.Lock(ctx, name, class)
			if err != nil {
				t.Error(err)
			}
			granted <- lb
		}()
		time.Sleep(50 * time.Millisecond) // b queues
		if err := la.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		lb := <-granted
		if lb == nil || lb.Token() <= la.Token() {
			t.Fatalf("%s: the waiting Session's grant %v after token %d", name, lb, la.Token())
		}
		if err := lb.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		for _, s := range []*client.Session{a, b} {
			if err := s.Close(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestSessionClose: closing a Session releases its locks (their contexts end with
// ErrLeaseRevoked) and makes its Lock fail with ErrClosed; the Client and other Sessions
// carry on. Closing the Client closes its Sessions, and a Session made after that
// cannot lock.
func TestSessionClose(t *testing.T) {
	addr, c, ctx := startClient(t)
	a, b := c.NewSession(), c.NewSession()
	la, err := a.Lock(ctx, "close/x", client.Correctness)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if lost, cause := la.Lost(); !lost || !errors.Is(cause, client.ErrLeaseRevoked) || !errors.Is(context.Cause(la.Context()), client.ErrLeaseRevoked) {
		t.Fatalf("a lock of a closed Session: lost %v, cause %v", lost, cause)
	}
	if _, err := a.Lock(ctx, "close/y", client.Correctness); !errors.Is(err, client.ErrClosed) {
		t.Fatalf("Lock on a closed Session: %v, want ErrClosed", err)
	}
	lb, err := b.Lock(ctx, "close/x", client.Correctness, client.TryOnce)
	if err != nil {
		t.Fatalf("the lock of a closed Session is not free: %v", err)
	}
	lc, err := c.Lock(ctx, "close/z", client.Correctness)
	if err != nil {
		t.Fatalf("the Client after one of its Sessions closed: %v", err)
	}

	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for _, l := range []*client.Lock{lb, lc} {
		if lost, cause := l.Lost(); !lost || !errors.Is(cause, client.ErrLeaseRevoked) {
			t.Fatalf("%s after Client.Close: lost %v, cause %v", l.Name(), lost, cause)
		}
	}
	if _, err := b.Lock(ctx, "close/w", client.Correctness); !errors.Is(err, client.ErrClosed) {
		t.Fatalf("Lock on a Session of a closed Client: %v, want ErrClosed", err)
	}
	if _, err := c.NewSession().Lock(ctx, "close/w", client.Correctness); !errors.Is(err, client.ErrClosed) {
		t.Fatalf("Lock on a Session made after Client.Close: %v, want ErrClosed", err)
	}

	// Every lease was revoked on the server, not left to expire.
	c2, err := client.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close(ctx)
	for _, name := range []string{"close/x", "close/z"} {
		l, err := c2.Lock(ctx, name, client.Correctness, client.TryOnce)
		if err != nil {
			t.Fatalf("%s after Client.Close: %v", name, err)
		}
		_ = l.Unlock(ctx)
	}
}

// startClient starts a node and dials it; the context ends with the test.
func startClient(t *testing.T) (string, *client.Client, context.Context) {
	t.Helper()
	node := testnode.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	c, err := client.Dial(ctx, node.Addr())
	if err != nil {
		t.Fatal(err)
	}
	return node.Addr(), c, ctx
}

// TestSessionsBeyondInFlightLimit: more Sessions of one Client wait for locks at once
// than the server lets one connection have requests in flight; the ones beyond wait in
// the client for a slot instead of failing with ResourceExhausted, and all are granted
// once the locks are free.
func TestSessionsBeyondInFlightLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("thousands of sessions")
	}
	_, c, _ := startClient(t)
	// Thousands of sessions take a while under the race detector on a busy machine.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	defer c.Close(ctx)
	n := fastlane.MaxInFlight + 64
	// A minute's TTL: on a loaded machine under the race detector, 4,160 leases' keepalives
	// can queue behind the acquires for longer than the default 10 s, and a lease that
	// expires is a fair outcome there (the Unlock answers "lease expired"), not the
	// in-flight limit this test is about.
	ttl := client.LockTTL(time.Minute)
	holder := c.NewSession()
	held := make([]*client.Lock, n)
	for i := range n {
		l, err := holder.Lock(ctx, fmt.Sprintf("limit/%d", i), client.Efficiency, ttl)
		if err != nil {
			t.Fatal(err)
		}
		held[i] = l
	}
	errs := make(chan error, n)
	var queued sync.WaitGroup
	for i := range n {
		queued.Add(1)
		go func() {
			s := c.NewSession()
			queued.Done()
			l, err := s.Lock(ctx, fmt.Sprintf("limit/%d", i), client.Efficiency, ttl)
			if err == nil {
				err = l.Unlock(ctx)
			}
			errs <- err
		}()
	}
	queued.Wait()
	time.Sleep(500 * time.Millisecond) // the waiters fill the connection
	for _, l := range held {
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatalf("a waiting Session: %v", err)
		}
	}
}

// Two Lock calls for one name by one holder get one grant (one token); when either is
// unlocked, both Locks end — neither goes on believing it holds what was released.
func TestLocksOfOneGrantEndTogether(t *testing.T) {
	_, c, ctx := startClient(t)
	defer c.Close(ctx)
	a, err := c.Lock(ctx, "alias/one", client.Correctness)
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.Lock(ctx, "alias/one", client.Correctness)
	if err != nil {
		t.Fatal(err)
	}
	if a.Token() != b.Token() {
		t.Fatalf("tokens %d and %d: not one grant", a.Token(), b.Token())
	}
	if err := a.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-b.Context().Done():
	case <-time.After(time.Second):
		t.Fatal("the other Lock of the released grant is still live")
	}
	if cause := context.Cause(b.Context()); !errors.Is(cause, client.ErrUnlocked) {
		t.Fatalf("cause %v, want ErrUnlocked", cause)
	}
	if err := b.Unlock(ctx); err != nil {
		t.Fatalf("Unlock of the other Lock = %v, want nil (released)", err)
	}
}

// A Lock of a name that gives up (its context ended with the outcome unknown) takes back
// in the background what its acquire may have got — but not the grant another Lock of
// the name by the same holder holds, which is the same grant as the service sees it.
func TestAbandonedLockKeepsTheGrantOfAnother(t *testing.T) {
	addr, _, ctx := startClient(t)
	g := newHeldTransport()
	c, err := client.Dial(ctx, addr, client.WithoutFastLane(), client.WithHTTPClient(&http.Client{Transport: g}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	other, err := client.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(ctx)
	held, err := c.Lock(ctx, "alias/abandon", client.Correctness)
	if err != nil {
		t.Fatal(err)
	}
	acquire := leaseholdv1connect.LockServiceAcquireProcedure
	g.block.Store(&acquire) // the second Lock's acquire never goes out
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, err := c.Lock(short, "alias/abandon", client.Correctness); err == nil {
		t.Fatal("the Lock whose acquire never went out succeeded")
	}
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if l, err := other.Lock(ctx, "alias/abandon", client.Correctness, client.TryOnce); err == nil {
			t.Fatalf("another client was granted token %d while the first still holds %d (live: %v)", l.Token(), held.Token(), held.Context().Err() == nil)
		}
	}
	if err := held.Context().Err(); err != nil {
		t.Fatalf("the held Lock ended: %v", context.Cause(held.Context()))
	}
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Lock(ctx, "alias/abandon", client.Correctness, client.WaitFor(5*time.Second)); err != nil {
		t.Fatalf("after the Unlock: %v", err)
	}
}
