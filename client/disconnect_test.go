package client_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/internal/testnode"
)

// TestReleaseOnDisconnect: a lock with ReleaseOnDisconnect, TTL 30 s, is free for
// another client within a second of its holder's connections going away without a
// word (Close is never called: a crash, as the server sees it); a lock without the
// option stays held. The holder's Context is cancelled with ErrDisconnected when its
// own connection breaks. Over Connect alone (no fast lane) the same holds, through a
// Bind stream.
func TestReleaseOnDisconnect(t *testing.T) {
	n := testnode.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	holder, err := client.Dial(ctx, n.Addr(), client.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	other, err := client.Dial(ctx, n.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Close(context.Background()) }()

	bound, err := holder.Lock(ctx, "rod/bound", client.Correctness, client.ReleaseOnDisconnect)
	if err != nil {
		t.Fatal(err)
	}
	plain, err := holder.Lock(ctx, "rod/plain", client.Correctness)
	if err != nil {
		t.Fatal(err)
	}
	client.BreakFastLaneForTest(holder)
	start := time.Now()
	select {
	case <-bound.Context().Done():
	case <-time.After(time.Second):
		t.Fatal("the bound lock's context is alive a second after its connection broke")
	}
	if cause := context.Cause(bound.Context()); !errors.Is(cause, client.ErrDisconnected) {
		t.Fatalf("cause %v, want ErrDisconnected", cause)
	}
	l, err := other.Lock(ctx, "rod/bound", client.Correctness, client.WaitFor(5*time.Second))
	if err != nil {
		t.Fatalf("the bound lock was not freed: %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("the bound lock was freed %v after the disconnect, want under 1s", d)
	}
	if l.Token() <= bound.Token() {
		t.Fatalf("G1: token %d after %d", l.Token(), bound.Token())
	}
	if _, err := other.Lock(ctx, "rod/plain", client.Correctness, client.TryOnce); !errors.Is(err, client.ErrNotAcquired) {
		t.Fatalf("the plain lock after the disconnect: %v, want still held", err)
	}
	if err := plain.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	_ = holder.Close(ctx)

	// Over Connect alone the lease is bound to a Bind stream: the same.
	breakable, breakConnect := client.WithBreakableConnectForTest()
	noLane, err := client.Dial(ctx, n.Addr(), client.WithoutFastLane(), client.WithTTL(30*time.Second), breakable)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = noLane.Close(context.Background()) }()
	viaConnect, err := noLane.Lock(ctx, "rod/connect", client.Correctness, client.ReleaseOnDisconnect)
	if err != nil {
		t.Fatal(err)
	}
	breakConnect()
	start = time.Now()
	select {
	case <-viaConnect.Context().Done():
	case <-time.After(3 * time.Second):
		t.Fatal("the Connect-bound lock's context is alive 3s after its connection broke")
	}
	if cause := context.Cause(viaConnect.Context()); !errors.Is(cause, client.ErrDisconnected) {
		t.Fatalf("cause %v, want ErrDisconnected", cause)
	}
	if _, err := other.Lock(ctx, "rod/connect", client.Correctness, client.WaitFor(5*time.Second)); err != nil {
		t.Fatalf("the Connect-bound lock was not freed: %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("the Connect-bound lock was freed %v after the disconnect, want within 2s", d)
	}
}
