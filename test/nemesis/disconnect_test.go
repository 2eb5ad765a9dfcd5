package nemesis

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/leasehold/leasehold/client"
)

// rodHolder dials node i only (so that it cannot move to another node) with a 30 s TTL
// and takes name with release on disconnect.
func rodHolder(t *testing.T, ctx context.Context, c *Cluster, i int, name string, opts ...client.Option) (*client.Client, *client.Lock) {
	t.Helper()
	cl, err := client.Dial(ctx, c.Nodes[i].API, append([]client.Option{client.WithTTL(30 * time.Second)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close(context.Background()) })
	l, err := cl.Lock(ctx, name, client.Correctness, client.ReleaseOnDisconnect)
	if err != nil {
		t.Fatal(err)
	}
	return cl, l
}

// others dials every node but skip.
func others(t *testing.T, ctx context.Context, c *Cluster, skip int) *client.Client {
	t.Helper()
	addrs := ""
	for j, n := range c.Nodes {
		if j != skip {
			if addrs != "" {
				addrs += ","
			}
			addrs += n.API
		}
	}
	cl, err := client.Dial(ctx, addrs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close(context.Background()) })
	return cl
}

// TestReleaseOnDisconnectSurvivesLeaderChange (G7): a release-on-disconnect lock whose
// holder is connected to a follower stays held when the leader is killed with SIGKILL:
// the binding lives with the follower's connection, which did not end. Its context stays
// alive, another client is refused it, and the holder unlocks it afterwards. Over
// Connect (no fast lane) the lease is bound to a Bind stream that the follower relays
// from the leader: the relay breaks with the leader, and the client binds again.
func TestReleaseOnDisconnectSurvivesLeaderChange(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real cluster; skipped with -short")
	}
	c := NewCluster(t, false)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	leader := settle(t, c)
	f := (leader + 1) % 3
	_, fast := rodHolder(t, ctx, c, f, "rod/leader-change/fast-lane")
	_, viaConnect := rodHolder(t, ctx, c, f, "rod/leader-change/connect", client.WithoutFastLane())
	if err := c.Nodes[leader].Kill9(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitNewLeader(ctx, leader); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second) // a keepalive (every 10 s) may well fall in; the binding must not care
	other := others(t, ctx, c, leader)
	for _, l := range []*client.Lock{fast, viaConnect} {
		if err := l.Context().Err(); err != nil {
			t.Fatalf("%s was lost over a leader change elsewhere: %v", l.Name(), context.Cause(l.Context()))
		}
		if _, err := other.Lock(ctx, l.Name(), client.Correctness, client.TryOnce); !errors.Is(err, client.ErrNotAcquired) {
			t.Fatalf("another client's Lock of %s after the leader change = %v, want ErrNotAcquired (still held)", l.Name(), err)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatalf("Unlock of %s after the leader change: %v", l.Name(), err)
		}
	}
}

// TestReleaseOnDisconnectNetnsCut (G7): a release-on-disconnect lock (TTL 30 s) whose
// holder's path to its node is cut (network namespaces: the node still reaches its
// peers, the holder reaches nothing) is free for another client well within the TTL —
// the node closes the silent bound connection after BoundIdleTimeout (5 s) and revokes
// the lease through the leader — and the holder's context is cancelled with
// ErrDisconnected before the server frees it.
func TestReleaseOnDisconnectNetnsCut(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real cluster; skipped with -short")
	}
	if why := netnsUnavailable(); why != "" {
		if os.Getenv("CI") != "" {
			t.Fatalf("needs network namespaces: %s", why)
		}
		t.Skipf("needs network namespaces to cut the holder off: %s", why)
	}
	c := NewCluster(t, true)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	leader := settle(t, c)
	f := (leader + 1) % 3
	_, l := rodHolder(t, ctx, c, f, "rod/cut")
	other := others(t, ctx, c, f)
	if err := c.lab.IsolateClients(f); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Heal(f) }()
	cut := time.Now()
	lost := make(chan time.Duration, 1)
	go func() {
		<-l.Context().Done()
		lost <- time.Since(cut)
	}()
	got, err := other.Lock(ctx, l.Name(), client.Correctness, client.WaitFor(20*time.Second))
	if err != nil {
		t.Fatalf("the lock was not freed within 20s of the cut (TTL 30s): %v", err)
	}
	freed := time.Since(cut)
	if got.Token() <= l.Token() {
		t.Errorf("G1: token %d after %d", got.Token(), l.Token())
	}
	var heard time.Duration
	select {
	case heard = <-lost:
	case <-time.After(5 * time.Second):
		t.Fatal("the holder's context is alive after the server freed the lock")
	}
	t.Logf("holder heard %v after the cut (%v); the lock was free for another client %v after it", heard.Round(time.Millisecond), context.Cause(l.Context()), freed.Round(time.Millisecond))
	if !errors.Is(context.Cause(l.Context()), client.ErrDisconnected) && !errors.Is(context.Cause(l.Context()), client.ErrLeaseDeadline) {
		t.Errorf("cause %v, want ErrDisconnected", context.Cause(l.Context()))
	}
	if heard > freed {
		t.Errorf("the holder heard %v after the cut, after the server freed the lock (%v)", heard, freed)
	}
	if freed > 12*time.Second {
		t.Errorf("freed %v after the cut, want about BoundIdleTimeout (5 s) plus a revoke", freed)
	}
}
