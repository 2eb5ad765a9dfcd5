package client_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/internal/testnode"
	"github.com/leasehold/leasehold/service"
)

// TestLazyConnect: Dial fails when no node answers, but with WithLazyConnect it
// returns at once, its calls fail with ErrUnavailable while nobody answers, and the
// same Client locks once a node listens at the address.
func TestLazyConnect(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close() // nobody listens there now

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	short, stop := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = client.Dial(short, addr)
	stop()
	if !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("Dial with no node = %v, want ErrUnavailable", err)
	}
	start := time.Now()
	c, err := client.Dial(ctx, addr, client.WithLazyConnect())
	if err != nil || time.Since(start) > 100*time.Millisecond {
		t.Fatalf("lazy Dial with no node = %v after %v, want a Client at once", err, time.Since(start))
	}
	defer func() { _ = c.Close(context.Background()) }()
	short, stop = context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = c.Lock(short, "lazy/a", client.Correctness)
	stop()
	if !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("Lock with no node = %v, want ErrUnavailable", err)
	}
	testnode.StartWith(t, func(cfg *service.Config) { cfg.Addr = addr })
	l, err := c.Lock(ctx, "lazy/a", client.Correctness)
	if err != nil {
		t.Fatalf("Lock once the node listens: %v", err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}
