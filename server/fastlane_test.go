package server_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/api/leasehold/v1/leaseholdv1connect"
	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/fastlane"
	"github.com/leasehold/leasehold/internal/testnode"
)

// The fast-lane numbers of the RPCs these tests send (the .proto file's fast_lane options).
var (
	methodAcquire    = fastlane.MustMethodOf(leaseholdv1connect.LockServiceAcquireProcedure)
	methodCheckToken = fastlane.MustMethodOf(leaseholdv1connect.LockServiceCheckTokenProcedure)
	methodGrant      = fastlane.MustMethodOf(leaseholdv1connect.LeaseServiceGrantProcedure)
	methodKeepAlive  = fastlane.MustMethodOf(leaseholdv1connect.LeaseServiceKeepAliveProcedure)
	methodRelease    = fastlane.MustMethodOf(leaseholdv1connect.LockServiceReleaseProcedure)
)

// startFastLaneNode starts an in-process node and returns its fast-lane address.
func startFastLaneNode(tb testing.TB) string {
	tb.Helper()
	return testnode.Start(tb).FastLaneAddr()
}

// FuzzFastLane feeds arbitrary bytes after a valid handshake (and, for some inputs,
// instead of it) and checks the server survives: it keeps accepting connections and
// answers a well-formed request afterwards. It never panics, hangs or dies.
func FuzzFastLane(f *testing.F) {
	frame := func(kind fastlane.Kind, m fastlane.Method, id uint64, payload []byte) []byte {
		b, _ := fastlane.AppendFrame(nil, kind, m, id, func(b []byte) ([]byte, error) { return append(b, payload...), nil })
		return b
	}
	f.Add(false, frame(fastlane.KindRequest, methodGrant, 1, nil))
	f.Add(false, frame(fastlane.KindRequest, methodAcquire, 2, []byte{0x0a, 0x03, 'a', '/', 'b'}))
	f.Add(false, frame(fastlane.KindRequest, 200, 3, []byte{1, 2, 3}))
	f.Add(false, frame(fastlane.KindCancel, methodAcquire, 9, nil))
	f.Add(false, frame(fastlane.KindGoAway, 0, 0, nil)) // only a server sends it
	f.Add(false, []byte{0xff, 0xff, 0xff, 0xff, 1, 1})
	f.Add(false, []byte{0, 0, 0, 1, 1})
	f.Add(true, []byte("GET / HTTP/1.1\r\n\r\n"))
	f.Add(true, []byte("LHFL\x00\x02\x00\x00"))
	addr := startFastLaneNode(f)
	f.Fuzz(func(t *testing.T, skipHello bool, data []byte) {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			t.Fatalf("server stopped accepting: %v", err)
		}
		_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
		if !skipHello {
			if _, err := fastlane.ClientHello(conn, "", fastlane.Extensions{}); err != nil {
				t.Fatalf("handshake: %v", err)
			}
		}
		_, _ = conn.Write(data)
		_ = conn.Close()

		// The server still serves a fresh, well-formed request.
		ok, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			t.Fatalf("server stopped accepting after %q: %v", data, err)
		}
		defer ok.Close()
		_ = ok.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := fastlane.ClientHello(ok, "", fastlane.Extensions{}); err != nil {
			t.Fatalf("handshake after garbage: %v", err)
		}
		if _, err := ok.Write(frame(fastlane.KindRequest, methodCheckToken, 7, []byte{0x0a, 0x01, 'x', 0x10, 0x01})); err != nil {
			t.Fatal(err)
		}
		r := fastlane.NewReader(ok)
		resp, err := r.Read()
		if err != nil {
			t.Fatalf("no answer after garbage %q: %v", data, err)
		}
		if resp.ID != 7 || resp.Kind != fastlane.KindResponse {
			t.Fatalf("answer after garbage: kind %d id %d", resp.Kind, resp.ID)
		}
	})
}

// TestFastLaneErrors checks the protocol's error rules on a live server: an unknown
// method and an undecodable payload are answered on the connection, which stays open; a
// bad frame length closes it; a wrong version is refused in the handshake.
func TestFastLaneErrors(t *testing.T) {
	addr := startFastLaneNode(t)
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fastlane.ClientHello(conn, "", fastlane.Extensions{}); err != nil {
		t.Fatal(err)
	}
	send := func(kind fastlane.Kind, m fastlane.Method, id uint64, payload []byte) {
		b, _ := fastlane.AppendFrame(nil, kind, m, id, func(b []byte) ([]byte, error) { return append(b, payload...), nil })
		if _, err := conn.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	r := fastlane.NewReader(conn)
	send(fastlane.KindRequest, 99, 1, nil)
	if f, err := r.Read(); err != nil || f.Kind != fastlane.KindError || f.ID != 1 {
		t.Fatalf("unknown method: %+v %v", f, err)
	}
	send(fastlane.KindRequest, methodAcquire, 2, []byte{0xff, 0xff, 0xff})
	if f, err := r.Read(); err != nil || f.Kind != fastlane.KindError || f.ID != 2 {
		t.Fatalf("undecodable payload: %+v %v", f, err)
	}
	// An invalid name is InvalidArgument (code 3) naming the field, as over Connect.
	send(fastlane.KindRequest, methodCheckToken, 3, []byte{0x0a, 0x03, 'a', ' ', 'b', 0x10, 0x01})
	f, err := r.Read()
	if err != nil || f.Kind != fastlane.KindError || f.ID != 3 {
		t.Fatalf("invalid name: %+v %v", f, err)
	}
	if len(f.Payload) < 2 || f.Payload[0] != 0x08 || f.Payload[1] != 3 {
		t.Fatalf("invalid name: want code 3 first in the error payload, got % x", f.Payload)
	}
	// A frame length above the limit closes the connection.
	var bad [4]byte
	binary.BigEndian.PutUint32(bad[:], fastlane.MaxFrame+1)
	_, _ = conn.Write(bad[:])
	if _, err := r.Read(); err == nil {
		t.Fatal("connection still open after an oversized frame length")
	}

	// A client of another version is refused in the handshake.
	c2, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	_ = c2.SetDeadline(time.Now().Add(5 * time.Second))
	_, _ = c2.Write([]byte("LHFL\x00\x09\x00\x00"))
	var resp [16]byte
	if _, err := io.ReadFull(c2, resp[:]); err != nil {
		t.Fatal(err)
	}
	if v := binary.BigEndian.Uint16(resp[4:6]); v != fastlane.Version {
		t.Fatalf("server announced version %d", v)
	}
	if _, err := c2.Read(resp[:1]); err == nil {
		t.Fatal("connection of a wrong-version client stayed open")
	}
}

// TestFastLaneWaitKeepsConnectionServing: requests the reader serves itself (efficiency
// try-once acquires and releases), requests that wait for a commit (correctness) and
// requests that wait in a queue share one connection, for either class; a waiting
// acquire must never hold the reader, or the release that would grant it, and the
// cancel that would end it, could not be read.
func TestFastLaneWaitKeepsConnectionServing(t *testing.T) {
	addr := startFastLaneNode(t)
	for _, class := range []leaseholdv1.LockClass{leaseholdv1.LockClass_LOCK_CLASS_EFFICIENCY, leaseholdv1.LockClass_LOCK_CLASS_CORRECTNESS} {
		t.Run(class.String(), func(t *testing.T) { waitKeepsConnectionServing(t, addr, class) })
	}
}

func waitKeepsConnectionServing(t *testing.T, addr string, class leaseholdv1.LockClass) {
	x, free := class.String()+"/x", class.String()+"/free"
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fastlane.ClientHello(conn, "", fastlane.Extensions{}); err != nil {
		t.Fatal(err)
	}
	r := fastlane.NewReader(conn)
	var next uint64
	send := func(kind fastlane.Kind, m fastlane.Method, msg proto.Message) uint64 {
		next++
		b, err := fastlane.AppendFrame(nil, kind, m, next, func(b []byte) ([]byte, error) { return proto.MarshalOptions{}.MarshalAppend(b, msg) })
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Write(b); err != nil {
			t.Fatal(err)
		}
		return next
	}
	read := func(id uint64, kind fastlane.Kind, resp proto.Message) {
		t.Helper()
		f, err := r.Read()
		if err != nil {
			t.Fatalf("waiting for answer %d: %v", id, err)
		}
		if f.ID != id || f.Kind != kind {
			t.Fatalf("got frame %d kind %d, want %d kind %d", f.ID, f.Kind, id, kind)
		}
		if resp != nil {
			if err := proto.Unmarshal(f.Payload, resp); err != nil {
				t.Fatal(err)
			}
		}
	}
	lease := func() string {
		var g leaseholdv1.GrantResponse
		read(send(fastlane.KindRequest, methodGrant, &leaseholdv1.GrantRequest{TtlMs: 10_000}), fastlane.KindResponse, &g)
		return g.GetLeaseId()
	}
	a, b := lease(), lease()
	var held leaseholdv1.AcquireResponse
	read(send(fastlane.KindRequest, methodAcquire, &leaseholdv1.AcquireRequest{Name: x, Class: class, LeaseId: a}), fastlane.KindResponse, &held)

	// b waits; a's release on the same connection is read, answered, and grants b.
	waiting := send(fastlane.KindRequest, methodAcquire, &leaseholdv1.AcquireRequest{Name: x, Class: class, LeaseId: b, WaitMs: -1})
	release := send(fastlane.KindRequest, methodRelease, &leaseholdv1.ReleaseRequest{Name: x, LeaseId: a, Token: held.GetToken()})
	got := map[uint64]bool{}
	for range 2 {
		f, err := r.Read()
		if err != nil {
			t.Fatalf("release and grant: %v (got %v)", err, got)
		}
		if f.Kind != fastlane.KindResponse {
			t.Fatalf("frame %d: kind %d", f.ID, f.Kind)
		}
		got[f.ID] = true
	}
	if !got[waiting] || !got[release] {
		t.Fatalf("answers %v, want %d and %d", got, waiting, release)
	}

	// a now waits behind b; a cancel frame on the same connection ends the wait.
	waiting = send(fastlane.KindRequest, methodAcquire, &leaseholdv1.AcquireRequest{Name: x, Class: class, LeaseId: a, WaitMs: -1})
	time.Sleep(50 * time.Millisecond)
	b2, err := fastlane.AppendFrame(nil, fastlane.KindCancel, methodAcquire, waiting, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write(b2); err != nil {
		t.Fatal(err)
	}
	read(waiting, fastlane.KindError, nil)

	// An acquire that may wait, of a free lock, is granted at once (by the reader).
	var got1 leaseholdv1.AcquireResponse
	read(send(fastlane.KindRequest, methodAcquire, &leaseholdv1.AcquireRequest{Name: free, Class: class, LeaseId: a, WaitMs: -1}), fastlane.KindResponse, &got1)
	if got1.GetToken() <= held.GetToken() {
		t.Fatalf("grant of a free lock: token %d, want above %d", got1.GetToken(), held.GetToken())
	}
}

// TestFastLaneCloseCancelsWaits: closing a connection cancels the requests still in
// flight on it, so an acquire waiting in a lock's queue leaves it (either class), and
// when the holder releases, the lock is free. (A grant that beats the cancel stays with
// the lease: a request in flight on a broken connection has an unknown outcome, which
// the client settles by retrying or abandoning. So the test waits for the queue to
// empty before the release.)
func TestFastLaneCloseCancelsWaits(t *testing.T) {
	node := testnode.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, node.Addr(), client.WithoutFastLane())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	for _, class := range []leaseholdv1.LockClass{leaseholdv1.LockClass_LOCK_CLASS_EFFICIENCY, leaseholdv1.LockClass_LOCK_CLASS_CORRECTNESS} {
		t.Run(class.String(), func(t *testing.T) {
			holder, waiter := dialLane(t, node.FastLaneAddr()), dialLane(t, node.FastLaneAddr())
			a, b := holder.lease(), waiter.lease()
			name := class.String() + "/closed"
			var held leaseholdv1.AcquireResponse
			holder.roundTrip(methodAcquire, &leaseholdv1.AcquireRequest{Name: name, Class: class, LeaseId: a}, &held)
			waiter.send(fastlane.KindRequest, methodAcquire, &leaseholdv1.AcquireRequest{Name: name, Class: class, LeaseId: b, WaitMs: -1})
			waiters := func() uint32 {
				info, err := c.Describe(ctx, name)
				if err != nil {
					t.Fatal(err)
				}
				return info.GetWaiters()
			}
			for waiters() != 1 {
				time.Sleep(5 * time.Millisecond)
			}
			_ = waiter.conn.Close()
			deadline := time.Now().Add(5 * time.Second)
			for waiters() != 0 {
				if time.Now().After(deadline) {
					t.Fatal("the acquire of a closed connection still waits in the queue after 5 s")
				}
				time.Sleep(5 * time.Millisecond)
			}
			holder.roundTrip(methodRelease, &leaseholdv1.ReleaseRequest{Name: name, LeaseId: a, Token: held.GetToken()}, &leaseholdv1.ReleaseResponse{})
			var again leaseholdv1.AcquireResponse
			if kind := holder.roundTrip(methodAcquire, &leaseholdv1.AcquireRequest{Name: name, Class: class, LeaseId: a}, &again); kind != fastlane.KindResponse {
				t.Fatalf("the lock after its only waiter's connection closed: answer kind %d, want it free", kind)
			}
		})
	}
}

// lane is a raw fast-lane connection for tests.
type lane struct {
	t         testing.TB
	conn      net.Conn
	r         *fastlane.Reader
	next      uint64
	lastError leaseholdv1.FastLaneError // the last error frame roundTrip read
}

func dialLane(t testing.TB, addr string) *lane {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fastlane.ClientHello(conn, "", fastlane.Extensions{}); err != nil {
		t.Fatal(err)
	}
	return &lane{t: t, conn: conn, r: fastlane.NewReader(conn)}
}

func (l *lane) send(kind fastlane.Kind, m fastlane.Method, msg proto.Message) uint64 {
	l.t.Helper()
	l.next++
	b, err := fastlane.AppendFrame(nil, kind, m, l.next, func(b []byte) ([]byte, error) { return proto.MarshalOptions{}.MarshalAppend(b, msg) })
	if err != nil {
		l.t.Fatal(err)
	}
	if _, err := l.conn.Write(b); err != nil {
		l.t.Fatal(err)
	}
	return l.next
}

// roundTrip sends one request and reads its answer into resp (when it is a response),
// returning the answer's kind.
func (l *lane) roundTrip(m fastlane.Method, req, resp proto.Message) fastlane.Kind {
	l.t.Helper()
	id := l.send(fastlane.KindRequest, m, req)
	f, err := l.r.Read()
	if err != nil {
		l.t.Fatalf("waiting for answer %d: %v", id, err)
	}
	if f.ID != id {
		l.t.Fatalf("got frame %d, want %d", f.ID, id)
	}
	switch f.Kind {
	case fastlane.KindResponse:
		if err := proto.Unmarshal(f.Payload, resp); err != nil {
			l.t.Fatal(err)
		}
	case fastlane.KindError:
		l.lastError.Reset()
		if err := proto.Unmarshal(f.Payload, &l.lastError); err != nil {
			l.t.Fatal(err)
		}
	}
	return f.Kind
}

// keepAlive renews lease and waits up to d for the answer: nil for an acknowledgment,
// an error for an error frame or no answer in time (the connection is then of no more
// use: an answer may still come).
func (l *lane) keepAlive(lease string, d time.Duration) error {
	l.t.Helper()
	id := l.send(fastlane.KindRequest, methodKeepAlive, &leaseholdv1.KeepAliveRequest{LeaseId: lease})
	_ = l.conn.SetReadDeadline(time.Now().Add(d))
	defer func() { _ = l.conn.SetReadDeadline(time.Time{}) }()
	for {
		f, err := l.r.Read()
		if err != nil {
			return err
		}
		if f.ID != id {
			continue // the late answer to an earlier keepalive
		}
		if f.Kind != fastlane.KindResponse {
			var fe leaseholdv1.FastLaneError
			_ = proto.Unmarshal(f.Payload, &fe)
			return fmt.Errorf("keepalive refused: code %d: %s", fe.GetCode(), fe.GetMessage())
		}
		return nil
	}
}

func (l *lane) lease() string {
	l.t.Helper()
	var g leaseholdv1.GrantResponse
	if kind := l.roundTrip(methodGrant, &leaseholdv1.GrantRequest{TtlMs: 10_000}, &g); kind != fastlane.KindResponse {
		l.t.Fatalf("grant: answer kind %d", kind)
	}
	return g.GetLeaseId()
}

// failingOnce is a listener whose first Accept fails as a process out of descriptors
// does (EMFILE).
type failingOnce struct {
	net.Listener
	failed bool
}

func (f *failingOnce) Accept() (net.Conn, error) {
	if !f.failed {
		f.failed = true
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	}
	return f.Listener.Accept()
}

// A transient Accept error (out of descriptors for a moment) does not stop the fast
// lane: it goes on accepting, as net/http's Serve does, instead of leaving a fast lane
// advertised that nothing serves until the node restarts.
func TestFastLaneSurvivesATransientAcceptError(t *testing.T) {
	n := testnode.Start(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- n.Server.ServeFastLane(&failingOnce{Listener: ln}, slog.New(slog.DiscardHandler)) }()
	lane := dialLane(t, ln.Addr().String()) // the hello is answered
	_ = lane.lease()
	select {
	case err := <-done:
		t.Fatalf("ServeFastLane returned: %v", err)
	default:
	}
	_ = lane.conn.Close()
	_ = ln.Close()
	if err := <-done; err != nil {
		t.Fatalf("ServeFastLane after its listener closed: %v", err)
	}
}
