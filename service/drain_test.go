package service_test

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/api/leasehold/v1/leaseholdv1connect"
	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/fastlane"
	"github.com/leasehold/leasehold/internal/reason"
	"github.com/leasehold/leasehold/internal/testnode"
)

// rawLane is a fast-lane connection that sends frames and reads answers as they come.
type rawLane struct {
	t    *testing.T
	conn net.Conn
	r    *fastlane.Reader
	next uint64
}

func dialRawLane(t *testing.T, addr string) *rawLane {
	t.Helper()
	return dialRawLaneWith(t, addr, fastlane.Extensions{})
}

func dialRawLaneWith(t *testing.T, addr string, ext fastlane.Extensions) *rawLane {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := fastlane.ClientHello(conn, "", ext); err != nil {
		t.Fatal(err)
	}
	return &rawLane{t: t, conn: conn, r: fastlane.NewReader(conn)}
}

func (l *rawLane) send(procedure string, req proto.Message) uint64 {
	l.t.Helper()
	l.next++
	b, err := fastlane.AppendFrame(nil, fastlane.KindRequest, fastlane.MustMethodOf(procedure), l.next,
		func(b []byte) ([]byte, error) { return proto.MarshalOptions{}.MarshalAppend(b, req) })
	if err != nil {
		l.t.Fatal(err)
	}
	if _, err := l.conn.Write(b); err != nil {
		l.t.Fatal(err)
	}
	return l.next
}

// answer reads the next frame: the request id it answers, and its error's reason ("" for
// a response).
func (l *rawLane) answer(resp proto.Message) (id uint64, why string, err error) {
	f, err := l.r.Read()
	if err != nil {
		return 0, "", err
	}
	if f.Kind == fastlane.KindError {
		var fe leaseholdv1.FastLaneError
		if err := proto.Unmarshal(f.Payload, &fe); err != nil {
			l.t.Fatal(err)
		}
		return f.ID, fe.GetDetail().GetReason(), nil
	}
	if resp != nil {
		if err := proto.Unmarshal(f.Payload, resp); err != nil {
			l.t.Fatal(err)
		}
	}
	return f.ID, "", nil
}

func (l *rawLane) call(procedure string, req, resp proto.Message) {
	l.t.Helper()
	id := l.send(procedure, req)
	got, why, err := l.answer(resp)
	if err != nil || got != id || why != "" {
		l.t.Fatalf("%s: answer to %d, reason %q, err %v", procedure, got, why, err)
	}
}

// TestDrainFastLane: a node that shuts down answers the fast-lane requests in flight
// before it closes their connections, and refuses the ones that arrive meanwhile with
// "shutting_down" (not started: the client sends them elsewhere), so that a restart
// leaves no request with an unknown outcome. Before the drain existed, closing the
// process cut off every answer in flight.
func TestDrainFastLane(t *testing.T) {
	n := testnode.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, n.Addr(), client.WithoutFastLane()) // Connect: still served during the drain
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close(context.Background()) }()
	holder := dialRawLane(t, n.FastLaneAddr())
	waiter := dialRawLane(t, n.FastLaneAddr())
	grant := func(l *rawLane) string {
		var g leaseholdv1.GrantResponse
		l.call(leaseholdv1connect.LeaseServiceGrantProcedure, &leaseholdv1.GrantRequest{TtlMs: 30_000}, &g)
		return g.GetLeaseId()
	}
	const name = "drain/lock"
	correctness := leaseholdv1.LockClass_LOCK_CLASS_CORRECTNESS
	holder.call(leaseholdv1connect.LockServiceAcquireProcedure,
		&leaseholdv1.AcquireRequest{Name: name, Class: correctness, LeaseId: grant(holder)}, &leaseholdv1.AcquireResponse{})

	// In flight when the drain begins: an acquire that waits 400 ms in the queue.
	const wait = 400 * time.Millisecond
	queued := waiter.send(leaseholdv1connect.LockServiceAcquireProcedure,
		&leaseholdv1.AcquireRequest{Name: name, Class: correctness, LeaseId: grant(waiter), WaitMs: wait.Milliseconds()})
	for deadline := time.Now().Add(5 * time.Second); ; {
		if info, _ := c.Describe(ctx, name); info.GetWaiters() == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the second acquire is not queued after 5 s")
		}
		time.Sleep(5 * time.Millisecond)
	}

	began := time.Now()
	drained := make(chan error, 1)
	go func() {
		dctx, dcancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer dcancel()
		drained <- n.Server.DrainFastLane(dctx)
	}()
	time.Sleep(20 * time.Millisecond)
	refused := waiter.send(leaseholdv1connect.KVServicePutProcedure, &leaseholdv1.PutRequest{Key: "drain/k", Value: []byte("v")})
	if id, why, err := waiter.answer(nil); err != nil || id != refused || why != reason.ShuttingDown {
		t.Fatalf("a Put sent during the drain: answer to %d, reason %q, err %v; want %d refused with %q", id, why, err, refused, reason.ShuttingDown)
	}
	if id, why, err := waiter.answer(nil); err != nil || id != queued || why != reason.LockHeld {
		t.Fatalf("the acquire in flight: answer to %d, reason %q, err %v; want %d answered %q after its wait", id, why, err, queued, reason.LockHeld)
	}
	if since := time.Since(began); since < wait-50*time.Millisecond {
		t.Fatalf("the acquire in flight was answered %v after the drain began, before its %v wait ended", since, wait)
	}
	for _, l := range []*rawLane{waiter, holder} {
		if _, _, err := l.answer(nil); !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && !isReset(err) {
			t.Fatalf("after the drain the connection should be closed, read: %v", err)
		}
	}
	waitDrained(t, drained)
	// The refused Put was not carried out.
	if v, err := c.Get(ctx, "drain/k"); err != nil || v.Found {
		t.Fatalf("the refused Put: Get = %+v, %v; want not found", v, err)
	}
}

// TestDrainSendsGoAway: a node that shuts down first sends a GOAWAY frame on each
// connection whose client asked for it in its hello (fastlane.FlagGoAway), and none on
// the others; a client that then sends nothing more has its connection closed once it
// has been quiet for a moment, as any.
func TestDrainSendsGoAway(t *testing.T) {
	n := testnode.Start(t)
	asked := dialRawLaneWith(t, n.FastLaneAddr(), fastlane.Extensions{GoAway: true})
	plain := dialRawLane(t, n.FastLaneAddr())
	for _, l := range []*rawLane{asked, plain} { // both connections served, so registered
		l.call(leaseholdv1connect.LeaseServiceGrantProcedure, &leaseholdv1.GrantRequest{TtlMs: 30_000}, &leaseholdv1.GrantResponse{})
	}
	drained := make(chan error, 1)
	go func() {
		dctx, dcancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer dcancel()
		drained <- n.Server.DrainFastLane(dctx)
	}()
	f, err := asked.r.Read()
	if err != nil || f.Kind != fastlane.KindGoAway || f.ID != 0 || len(f.Payload) != 0 {
		t.Fatalf("the connection that asked for GOAWAY read %+v, %v; want a GOAWAY frame (kind %d, id 0, empty)", f, err, fastlane.KindGoAway)
	}
	for name, l := range map[string]*rawLane{"asked": asked, "plain": plain} {
		if f, err := l.r.Read(); !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && !isReset(err) {
			t.Fatalf("%s: after the drain the connection should be closed, read %+v, %v", name, f, err)
		}
	}
	waitDrained(t, drained)
}

// waitDrained waits for DrainFastLane's result on drained, which must come soon after
// the connections were closed, and be nil.
func waitDrained(t *testing.T, drained <-chan error) {
	t.Helper()
	select {
	case err := <-drained:
		if err != nil {
			t.Fatalf("DrainFastLane: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("DrainFastLane did not return 5 s after its connections were closed")
	}
}

func isReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op)
}
