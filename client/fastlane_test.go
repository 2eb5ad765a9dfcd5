package client

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/api/leasehold/v1/leaseholdv1connect"
	"github.com/leasehold/leasehold/fastlane"
)

// The fast-lane numbers of the RPCs these tests send (the .proto file's fast_lane options).
var (
	methodCheckToken = fastlane.MustMethodOf(leaseholdv1connect.LockServiceCheckTokenProcedure)
)

// fakeLane is a scripted fast-lane server for one connection: it hands every frame it
// reads to the test, and the test answers CheckToken requests with answer.
type fakeLane struct {
	t      *testing.T
	conn   net.Conn
	frames chan fastlane.Frame
	w      *fastlane.Writer
	hello  fastlane.Extensions // what the client's hello offered
}

func startFakeLane(t *testing.T) (*flConn, *fakeLane) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	accepted := make(chan *fakeLane, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		hello, err := fastlane.ServerHello(conn, "")
		if err != nil {
			_ = conn.Close()
			return
		}
		f := &fakeLane{t: t, conn: conn, frames: make(chan fastlane.Frame, 64), w: fastlane.NewWriter(conn), hello: hello}
		accepted <- f
		r := fastlane.NewReader(conn)
		for {
			fr, err := r.Read()
			if err != nil {
				close(f.frames)
				return
			}
			fr.Payload = append([]byte(nil), fr.Payload...)
			f.frames <- fr
		}
	}()
	c, err := dialFastLane(context.Background(), ln.Addr().String(), &clusterID{}, &options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.fail(errors.New("test over")) })
	f := <-accepted
	t.Cleanup(func() { _ = f.conn.Close() })
	return c, f
}

// next returns the next frame the client sent.
func (f *fakeLane) next() fastlane.Frame {
	f.t.Helper()
	select {
	case fr, ok := <-f.frames:
		if !ok {
			f.t.Fatal("client closed the connection")
		}
		return fr
	case <-time.After(5 * time.Second):
		f.t.Fatal("no frame from the client")
	}
	return fastlane.Frame{}
}

// closedWithNothingMore waits for the client to close the connection, failing the test
// if it sends a frame first.
func (f *fakeLane) closedWithNothingMore() {
	f.t.Helper()
	select {
	case fr, ok := <-f.frames:
		if ok {
			f.t.Fatalf("the client sent %+v after the GOAWAY", fr)
		}
	case <-time.After(5 * time.Second):
		f.t.Fatal("the client did not close the connection")
	}
}

// answer answers a CheckToken request with its own token as the holder's token.
func (f *fakeLane) answer(req fastlane.Frame) {
	f.t.Helper()
	var in leaseholdv1.CheckTokenRequest
	if err := proto.Unmarshal(req.Payload, &in); err != nil {
		f.t.Fatal(err)
	}
	frame, err := fastlane.AppendFrame(nil, fastlane.KindResponse, req.Method, req.ID, func(b []byte) ([]byte, error) {
		return proto.MarshalOptions{}.MarshalAppend(b, &leaseholdv1.CheckTokenResponse{HolderToken: in.GetToken()})
	})
	if err != nil {
		f.t.Fatal(err)
	}
	f.w.Send(frame, false)
}

// check makes one CheckToken call for token and reports the holder token it got back.
func check(ctx context.Context, c *flConn, token uint64) (uint64, error) {
	var resp leaseholdv1.CheckTokenResponse
	err := c.call(ctx, methodCheckToken, &leaseholdv1.CheckTokenRequest{Name: "a", Token: token}, &resp)
	return resp.GetHolderToken(), err
}

// TestFastLaneAnswersInAnyOrder: calls in flight together each get their own answer,
// whichever caller happens to be reading the connection and in whatever order the
// server answers, including when the reading caller's own answer comes first and the
// others arrive only later (the reading passes on).
func TestFastLaneAnswersInAnyOrder(t *testing.T) {
	for _, order := range [][]int{{2, 1, 0}, {0, 1, 2}, {1, 0, 2}} {
		c, f := startFakeLane(t)
		var wg sync.WaitGroup
		errs := make(chan error, 3)
		for i := range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				got, err := check(context.Background(), c, uint64(100+i))
				if err == nil && got != uint64(100+i) {
					err = errors.New("got another call's answer")
				}
				errs <- err
			}()
		}
		reqs := make([]fastlane.Frame, 3)
		for range 3 {
			fr := f.next()
			var in leaseholdv1.CheckTokenRequest
			if err := proto.Unmarshal(fr.Payload, &in); err != nil {
				t.Fatal(err)
			}
			reqs[in.GetToken()-100] = fr
		}
		for _, i := range order {
			f.answer(reqs[i])
			time.Sleep(20 * time.Millisecond)
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatalf("order %v: %v", order, err)
			}
		}
	}
}

// TestFastLaneReadingCallerCancelled: a caller that is reading the connection itself
// and gets no answer returns when its context ends (it is not stuck in a read), tells
// the server it gave up, and leaves the connection working for the next call.
func TestFastLaneReadingCallerCancelled(t *testing.T) {
	c, f := startFakeLane(t)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := check(ctx, c, 1)
	if connect.CodeOf(err) != connect.CodeDeadlineExceeded {
		t.Fatalf("unanswered call: %v, want DeadlineExceeded", err)
	}
	if waited := time.Since(start); waited > 2*time.Second {
		t.Fatalf("unanswered call returned after %v", waited)
	}
	req := f.next()
	if cancelFrame := f.next(); cancelFrame.Kind != fastlane.KindCancel || cancelFrame.ID != req.ID {
		t.Fatalf("after giving up the client sent kind %d id %d, want a cancel of %d", cancelFrame.Kind, cancelFrame.ID, req.ID)
	}
	// The late answer to the abandoned call, then the next call's answer.
	f.answer(req)
	done := make(chan error, 1)
	go func() {
		got, err := check(context.Background(), c, 2)
		if err == nil && got != 2 {
			err = errors.New("got the abandoned call's answer")
		}
		done <- err
	}()
	f.answer(f.next())
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the call after a cancelled reading call got no answer")
	}
}

// TestFastLaneClosedWhileIdle: when the server closed a connection nobody was reading,
// the next call finds out before sending and says the request was not sent, so that
// it can be sent again on a new connection.
func TestFastLaneClosedWhileIdle(t *testing.T) {
	c, f := startFakeLane(t)
	done := make(chan error, 1)
	go func() {
		_, err := check(context.Background(), c, 1)
		done <- err
	}()
	f.answer(f.next())
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	_ = f.conn.Close()
	time.Sleep(50 * time.Millisecond) // let the close reach the client
	_, err := check(context.Background(), c, 2)
	if !errors.Is(err, errFastLaneClosed) || connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("call on a connection the server closed: %v, want Unavailable wrapping errFastLaneClosed", err)
	}
}

// TestFastLaneInFlightLimit: a call beyond the connection's in-flight limit is not sent
// (the server would refuse it) and reports errFastLaneFull, for fastCall to send it
// through Connect; a slot is freed by the server's answer, not by a caller giving up:
// a call abandoned by its context keeps its slot until the answer to it arrives.
func TestFastLaneInFlightLimit(t *testing.T) {
	c, f := startFakeLane(t)
	c.slots = make(chan struct{}, 2)
	results := make(chan error, 8)
	call := func(ctx context.Context, token uint64) {
		go func() {
			got, err := check(ctx, c, token)
			if err == nil && got != token {
				err = errors.New("got another call's answer")
			}
			results <- err
		}()
	}
	full := func(what string) {
		t.Helper()
		if _, err := check(context.Background(), c, 99); !errors.Is(err, errFastLaneFull) {
			t.Fatalf("%s: %v, want errFastLaneFull", what, err)
		}
		select {
		case fr := <-f.frames:
			t.Fatalf("%s: the client sent kind %d id %d", what, fr.Kind, fr.ID)
		case <-time.After(50 * time.Millisecond):
		}
	}
	abandoned, giveUp := context.WithCancel(context.Background())
	call(abandoned, 1)
	first := f.next()
	call(context.Background(), 2)
	second := f.next()
	full("a third call with two in flight")

	giveUp()
	if err := <-results; connect.CodeOf(err) != connect.CodeCanceled {
		t.Fatalf("the abandoned call: %v, want Canceled", err)
	}
	if fr := f.next(); fr.Kind != fastlane.KindCancel || fr.ID != first.ID {
		t.Fatalf("after giving up the client sent kind %d id %d, want a cancel of %d", fr.Kind, fr.ID, first.ID)
	}
	full("a third call while the abandoned one is unanswered")

	f.answer(first) // the server's answer to the abandoned call frees its slot
	for deadline := time.Now().Add(5 * time.Second); len(c.slots) == cap(c.slots); {
		if time.Now().After(deadline) {
			t.Fatal("the answer to the abandoned call did not free its slot")
		}
		time.Sleep(time.Millisecond)
	}
	call(context.Background(), 3)
	third := f.next()
	if third.Kind != fastlane.KindRequest {
		t.Fatalf("after the abandoned call's answer the client sent kind %d, want the third request", third.Kind)
	}
	f.answer(second)
	f.answer(third)
	for range 2 {
		select {
		case err := <-results:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a call got no answer")
		}
	}
}

// TestFastLaneGoAway: the client asks for GOAWAY in its hello. A GOAWAY that arrives
// while a call waits leaves that call to its answer, tells the client's node list once,
// and the client closes the connection when nothing is pending any more; one that
// arrives while the connection is idle keeps the next call from being sent on it (the
// call fails as not sent, so it is sent again elsewhere).
func TestFastLaneGoAway(t *testing.T) {
	t.Run("pending", func(t *testing.T) {
		c, f := startFakeLane(t)
		if !f.hello.GoAway {
			t.Fatal("the client's hello did not ask for GOAWAY")
		}
		var told atomic.Int32
		c.onGoAway = func() { told.Add(1) }
		got := make(chan error, 1)
		go func() {
			tok, err := check(context.Background(), c, 7)
			if err == nil && tok != 7 {
				err = errors.New("wrong answer")
			}
			got <- err
		}()
		req := f.next()
		f.w.Send(fastlane.GoAwayFrame(), false)
		f.w.Send(fastlane.GoAwayFrame(), false) // a second one changes nothing
		f.answer(req)
		if err := <-got; err != nil {
			t.Fatalf("the call in flight at the GOAWAY: %v", err)
		}
		f.closedWithNothingMore()
		if !c.goneAway.Load() || told.Load() != 1 {
			t.Fatalf("goneAway %v, node list told %d times; want true, once", c.goneAway.Load(), told.Load())
		}
	})
	t.Run("idle", func(t *testing.T) {
		c, f := startFakeLane(t)
		var told atomic.Int32
		c.onGoAway = func() { told.Add(1) }
		go func() { f.answer(f.next()) }()
		if _, err := check(context.Background(), c, 1); err != nil {
			t.Fatal(err)
		}
		f.w.Send(fastlane.GoAwayFrame(), false)
		time.Sleep(20 * time.Millisecond) // in the client's socket, the connection idle
		_, err := check(context.Background(), c, 2)
		if !errors.Is(err, errFastLaneClosed) || !errors.Is(err, errFastLaneGoingAway) {
			t.Fatalf("a call after a GOAWAY on an idle connection: %v; want errFastLaneClosed (not sent), errFastLaneGoingAway", err)
		}
		f.closedWithNothingMore()
		if told.Load() != 1 {
			t.Fatalf("node list told %d times, want once", told.Load())
		}
	})
}
