package client_test

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/internal/testnode"
)

// sockets counts this process's open sockets (the in-process node's ends included).
func sockets(t *testing.T) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	n := 0
	for _, fd := range fds {
		if target, err := os.Readlink("/proc/self/fd/" + fd.Name()); err == nil && strings.HasPrefix(target, "socket:") {
			n++
		}
	}
	return n
}

// Close closes the client's connections — its HTTP/2 one too, which otherwise stayed
// open for its idle timeout (90 s): a program that dials and closes clients in a loop
// piled them up until the server's per-address bound refused the next Dial (seen in
// BenchmarkTransport, whose sub-benchmarks dial 64 clients per run).
func TestCloseClosesConnections(t *testing.T) {
	n := testnode.Start(t)
	ctx := t.Context()
	warm, err := client.Dial(ctx, n.Addr())
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Close(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	before := sockets(t)
	for i := range 20 {
		c, err := client.Dial(ctx, n.Addr())
		if err != nil {
			t.Fatalf("Dial %d: %v", i, err)
		}
		l, err := c.Lock(ctx, "close/test", client.Correctness, client.TryOnce)
		if err != nil {
			t.Fatalf("Lock %d: %v", i, err)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatalf("Unlock %d: %v", i, err)
		}
		if err := c.Close(ctx); err != nil {
			t.Fatalf("Close %d: %v", i, err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		after := sockets(t)
		if after <= before+4 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d sockets open after 20 clients were dialled and closed, %d before", after, before)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
