package server_test

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync/atomic"
	"testing"

	"google.golang.org/protobuf/proto"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/fastlane"
	"github.com/leasehold/leasehold/internal/testnode"
)

// countingListener counts the writes on the connections it accepts.
type countingListener struct {
	net.Listener
	writes atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	conn, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: conn, writes: &l.writes}, nil
}

type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// TestFastLaneAnswersOneReadInOneWrite: requests the server reads in one go and answers
// at once are answered in one write, not one write each; a lone request is answered
// without waiting for more.
func TestFastLaneAnswersOneReadInOneWrite(t *testing.T) {
	n := testnode.Start(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	counted := &countingListener{Listener: ln}
	served := make(chan error, 1)
	go func() { served <- n.Server.ServeFastLane(counted, slog.New(slog.NewTextHandler(io.Discard, nil))) }()
	t.Cleanup(func() {
		_ = ln.Close()
		if err := <-served; err != nil && !errors.Is(err, net.ErrClosed) {
			t.Error(err)
		}
	})
	l := dialLane(t, ln.Addr().String())
	lease := l.lease()

	// A lone request: its answer comes although nothing follows it, in one write.
	before := counted.writes.Load()
	acquire := func(name string) *leaseholdv1.AcquireRequest {
		return &leaseholdv1.AcquireRequest{Name: name, LeaseId: lease, Class: leaseholdv1.LockClass_LOCK_CLASS_EFFICIENCY}
	}
	var resp leaseholdv1.AcquireResponse
	if kind := l.roundTrip(methodAcquire, acquire("lone"), &resp); kind != fastlane.KindResponse {
		t.Fatalf("lone acquire: answer kind %d", kind)
	}
	if got := counted.writes.Load() - before; got != 1 {
		t.Fatalf("lone acquire: %d writes, want 1", got)
	}

	// N acquires in one write, so one read: one write answers them all (two at most,
	// should the kernel split the read).
	const requests = 32
	var batch []byte
	ids := make(map[uint64]bool)
	for i := range requests {
		l.next++
		ids[l.next] = true
		b, err := fastlane.AppendFrame(batch, fastlane.KindRequest, methodAcquire, l.next, func(b []byte) ([]byte, error) {
			return proto.MarshalOptions{}.MarshalAppend(b, acquire(fmt.Sprint("batch/", i)))
		})
		if err != nil {
			t.Fatal(err)
		}
		batch = b
	}
	before = counted.writes.Load()
	if _, err := l.conn.Write(batch); err != nil {
		t.Fatal(err)
	}
	for range requests {
		f, err := l.r.Read()
		if err != nil {
			t.Fatal(err)
		}
		if !ids[f.ID] || f.Kind != fastlane.KindResponse {
			t.Fatalf("unexpected frame %d kind %d", f.ID, f.Kind)
		}
		delete(ids, f.ID)
	}
	if got := counted.writes.Load() - before; got > 2 {
		t.Fatalf("%d requests read in one go were answered in %d writes, want 1", requests, got)
	}
}
