package service_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"

	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/fastlane"
	"github.com/leasehold/leasehold/replication"
	"github.com/leasehold/leasehold/server"
	"github.com/leasehold/leasehold/service"
)

// startNode starts a node on loopback ports with the given request bounds and waits
// until it serves (for a node that joins: until it is ready).
func startNode(t *testing.T, id string, sc server.Config, join string) *service.Node {
	t.Helper()
	n, err := service.Start(service.Config{
		Addr:         "127.0.0.1:0",
		FastLaneAddr: "127.0.0.1:0",
		Server:       sc,
		Join:         join,
		Raft: replication.Config{
			NodeID: id, DataDir: t.TempDir(), RaftAddr: "127.0.0.1:0", Bootstrap: join == "",
			HeartbeatTimeout: 200 * time.Millisecond, ElectionTimeout: 200 * time.Millisecond, LeaderLeaseTimeout: 100 * time.Millisecond,
		},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close(context.Background()) })
	if join == "" {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := n.WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

// openFDs counts this process's open file descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("cannot count file descriptors: %v", err)
	}
	return len(ents)
}

// goodClient locks and unlocks through a real client (fast lane and Connect) from
// 127.0.0.1 until stop is closed, and counts failed calls.
func goodClient(t *testing.T, addr string, stop <-chan struct{}) (calls, failed *atomic.Int64, done <-chan struct{}) {
	t.Helper()
	ctx := context.Background()
	c, err := client.Dial(ctx, addr, client.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	calls, failed = new(atomic.Int64), new(atomic.Int64)
	ch := make(chan struct{})
	go func() {
		defer close(ch)
		defer func() { _ = c.Close(context.Background()) }()
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			l, err := c.Lock(cctx, "good/client", client.Efficiency)
			if err == nil {
				err = l.Unlock(cctx)
			}
			if err == nil {
				_, err = c.Status(cctx)
			}
			cancel()
			calls.Add(1)
			if err != nil {
				failed.Add(1)
				t.Logf("good client: %v", err)
			}
		}
	}()
	return calls, failed, ch
}

// dialFrom dials addr from the loopback address local (127.0.0.2, …), as another
// client host would.
func dialFrom(t *testing.T, local, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}, Timeout: 2 * time.Second}
	conn, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// closedWithin reads conn until the server closes it, and reports how long that took,
// or fails when it stays open for max.
func closedWithin(conn net.Conn, max time.Duration) (time.Duration, error) {
	start := time.Now()
	_ = conn.SetReadDeadline(start.Add(max))
	_, err := io.Copy(io.Discard, conn)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return 0, fmt.Errorf("still open after %v", max)
	}
	return time.Since(start), nil
}

// TestSlowClients checks G6's slow-client clause: idle connections, connections that
// stall in their headers or in a request body, over HTTP/1.1, HTTP/2 and the fast lane,
// are all closed by the server after their timeout while another client is served
// without a failure, and the file descriptors come back.
func TestSlowClients(t *testing.T) {
	const rt, idle = 300 * time.Millisecond, 500 * time.Millisecond
	n := startNode(t, "n1", server.Config{ReadHeaderTimeout: rt, ReadTimeout: rt, WriteTimeout: rt, IdleTimeout: idle, MaxConnsPerClient: 100}, "")
	stop := make(chan struct{})
	calls, failed, done := goodClient(t, n.Addr(), stop)
	time.Sleep(200 * time.Millisecond) // the good client's connections are up
	fds := openFDs(t)

	const each = 8
	kinds := []struct {
		name  string
		after time.Duration // the timeout that should close it
		open  func(t *testing.T) net.Conn
	}{
		{"silent TCP", rt, func(t *testing.T) net.Conn { return dialFrom(t, "127.0.0.3", n.Addr()) }},
		{"HTTP/1.1 headers cut short", rt, func(t *testing.T) net.Conn {
			c := dialFrom(t, "127.0.0.3", n.Addr())
			_, _ = c.Write([]byte("POST /leasehold.v1.ClusterService/Status HTTP/1.1\r\nHost: 127.0.0.1\r\n"))
			return c
		}},
		{"HTTP/1.1 body stalled", rt, func(t *testing.T) net.Conn {
			c := dialFrom(t, "127.0.0.3", n.Addr())
			_, _ = c.Write([]byte("POST /leasehold.v1.ClusterService/Status HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"))
			return c
		}},
		{"HTTP/1.1 keep-alive, idle", idle, func(t *testing.T) net.Conn {
			c := dialFrom(t, "127.0.0.3", n.Addr())
			_, _ = c.Write([]byte("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"))
			buf := make([]byte, 512)
			_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
			if _, err := c.Read(buf); err != nil || !bytes.HasPrefix(buf, []byte("HTTP/1.1 200")) {
				t.Fatalf("GET /healthz: %q, %v", buf, err)
			}
			return c
		}},
		{"HTTP/2, idle after the preface", idle, func(t *testing.T) net.Conn {
			c := dialFrom(t, "127.0.0.3", n.Addr())
			_, _ = c.Write(append([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), 0, 0, 0, 4, 0, 0, 0, 0, 0)) // and an empty SETTINGS
			return c
		}},
		{"fast lane, silent before its handshake", fastlane.HandshakeTimeout, func(t *testing.T) net.Conn {
			return dialFrom(t, "127.0.0.3", n.FastLaneAddr())
		}},
		{"fast lane, idle after its handshake", idle, func(t *testing.T) net.Conn {
			c := dialFrom(t, "127.0.0.3", n.FastLaneAddr())
			if _, err := fastlane.ClientHello(c, "", fastlane.Extensions{}); err != nil {
				t.Fatal(err)
			}
			return c
		}},
		{"fast lane, half a frame", idle, func(t *testing.T) net.Conn {
			c := dialFrom(t, "127.0.0.3", n.FastLaneAddr())
			if _, err := fastlane.ClientHello(c, "", fastlane.Extensions{}); err != nil {
				t.Fatal(err)
			}
			_, _ = c.Write([]byte{0, 0, 0, 40, byte(fastlane.KindRequest)})
			return c
		}},
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(kinds)*each)
	for _, k := range kinds {
		for range each {
			conn := k.open(t)
			wg.Go(func() {
				took, err := closedWithin(conn, k.after+3*time.Second)
				switch {
				case err != nil:
					errs <- fmt.Errorf("%s: %w", k.name, err)
				case took < k.after/2:
					errs <- fmt.Errorf("%s: closed after %v, before its timeout of %v", k.name, took, k.after)
				}
				_ = conn.Close()
			})
		}
	}

	// An HTTP/2 request whose body never comes: the stream ends after ReadTimeout, the
	// idle connection after IdleTimeout.
	h2 := &http.Transport{Protocols: new(http.Protocols), DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.3")}}).DialContext}
	h2.Protocols.SetUnencryptedHTTP2(true)
	pr, pw := io.Pipe()
	defer pw.Close()
	req, _ := http.NewRequest(http.MethodPost, "http://"+n.Addr()+"/leasehold.v1.ClusterService/Status", pr)
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := (&http.Client{Transport: h2, Timeout: 5 * time.Second}).Do(req)
	if err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	if took := time.Since(start); took > rt+2*time.Second {
		t.Errorf("HTTP/2 stalled body: answered after %v, ReadTimeout is %v (%v)", took, rt, err)
	}
	h2.CloseIdleConnections()

	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	close(stop)
	<-done
	if calls.Load() == 0 || failed.Load() != 0 {
		t.Errorf("the good client made %d calls, %d failed", calls.Load(), failed.Load())
	}
	deadline := time.Now().Add(5 * time.Second)
	for openFDs(t) > fds && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if now := openFDs(t); now > fds {
		t.Errorf("%d file descriptors open, %d before the slow clients", now, fds)
	}
	t.Logf("%d slow connections; the good client made %d calls meanwhile", len(kinds)*each+1, calls.Load())
}

// TestConnectionsPerClient checks that one client address holds at most
// MaxConnsPerClient connections over the API port and the fast lane together; the
// others are closed at once, other clients are served, and the bound frees up as the
// connections close.
func TestConnectionsPerClient(t *testing.T) {
	const bound = 20
	n := startNode(t, "n1", server.Config{MaxConnsPerClient: bound}, "")
	stop := make(chan struct{})
	calls, failed, done := goodClient(t, n.Addr(), stop)

	// Hold the bound, half on each port; each is used once, so it was accepted.
	var held []net.Conn
	for i := range bound {
		if i%2 == 1 {
			c := dialFrom(t, "127.0.0.2", n.FastLaneAddr())
			if _, err := fastlane.ClientHello(c, "", fastlane.Extensions{}); err != nil {
				t.Fatalf("fast-lane connection %d: %v", i, err)
			}
			held = append(held, c)
			continue
		}
		c := dialFrom(t, "127.0.0.2", n.Addr())
		_, _ = c.Write([]byte("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"))
		buf := make([]byte, 512)
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Read(buf); err != nil || !bytes.HasPrefix(buf, []byte("HTTP/1.1 200")) {
			t.Fatalf("API connection %d: %q, %v", i, buf, err)
		}
		held = append(held, c)
	}
	// One more, on either port, is closed at once; the held ones stay open.
	for _, addr := range []string{n.Addr(), n.FastLaneAddr()} {
		if _, err := closedWithin(dialFrom(t, "127.0.0.2", addr), 3*time.Second); err != nil {
			t.Fatalf("connection %d from one address to %s: %v, want it closed at once", bound+1, addr, err)
		}
	}
	for i, c := range held {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
		var ne net.Error
		if _, err := c.Read(make([]byte, 1)); !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("held connection %d: %v, want it open", i, err)
		}
	}
	// Another address is served meanwhile.
	health := grpchealth.NewClient(http.DefaultClient, "http://"+n.Addr())
	if res, err := health.Check(context.Background(), &grpchealth.CheckRequest{}); err != nil || res.Status != grpchealth.StatusServing {
		t.Fatalf("health from another address: %v %v", res, err)
	}
	// Closing one frees a place.
	_ = held[0].Close()
	deadline := time.Now().Add(3 * time.Second)
	for {
		c := dialFrom(t, "127.0.0.2", n.Addr())
		_ = c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		_, err := c.Read(make([]byte, 1))
		_ = c.Close()
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			break // accepted: the server waits for its headers
		}
		if time.Now().After(deadline) {
			t.Fatal("no connection accepted after one of the held ones closed")
		}
	}
	close(stop)
	<-done
	if calls.Load() == 0 || failed.Load() != 0 {
		t.Errorf("the good client made %d calls, %d failed", calls.Load(), failed.Load())
	}
}

// TestReadyOnFollower checks /healthz, /readyz and grpc.health.v1 on a follower: ready
// while it knows the leader, not ready once the leader is gone (and no new one can be
// elected), alive all along.
func TestReadyOnFollower(t *testing.T) {
	n1 := startNode(t, "n1", server.Config{}, "")
	n2 := startNode(t, "n2", server.Config{}, n1.Addr())
	get := func(path string) int {
		resp, err := http.Get("http://" + n2.Addr() + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	health := grpchealth.NewClient(http.DefaultClient, "http://"+n2.Addr(), connect.WithGRPCWeb())
	status := func() grpchealth.Status {
		res, err := health.Check(context.Background(), &grpchealth.CheckRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return res.Status
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not after 30s", what)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitFor("follower ready", func() bool { return get("/readyz") == http.StatusOK })
	if get("/healthz") != http.StatusOK || status() != grpchealth.StatusServing {
		t.Fatalf("ready follower: /healthz %d, health %v", get("/healthz"), status())
	}
	if ok, why := n2.Server.Ready(); !ok || n2.Leader.Active() {
		t.Fatalf("n2 Ready = %v (%s), leading %v: want a ready follower", ok, why, n2.Leader.Active())
	}
	_ = n1.Close(context.Background())
	waitFor("follower not ready without a leader", func() bool { return get("/readyz") == http.StatusServiceUnavailable })
	if get("/healthz") != http.StatusOK || status() != grpchealth.StatusNotServing {
		t.Fatalf("follower without a leader: /healthz %d, health %v", get("/healthz"), status())
	}
}
