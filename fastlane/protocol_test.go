package fastlane_test

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold/api/leasehold/v1/leaseholdv1connect"
	"github.com/leasehold/leasehold/fastlane"
)

// The fast-lane numbers of the RPCs these tests send (the .proto file's fast_lane options).
var (
	methodAcquire = fastlane.MustMethodOf(leaseholdv1connect.LockServiceAcquireProcedure)
)

// chunkReader hands out its data a few bytes at a time, and fails every other read
// with a deadline error, as a connection does when a reader is interrupted.
type chunkReader struct {
	data      []byte
	step      int
	interrupt bool
	calls     int
}

func (r *chunkReader) Read(p []byte) (int, error) {
	r.calls++
	if r.interrupt && r.calls%2 == 0 {
		return 0, os.ErrDeadlineExceeded
	}
	if len(r.data) == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), r.step)], r.data)
	r.data = r.data[n:]
	return n, nil
}

func testFrames(t *testing.T) ([]fastlane.Frame, []byte) {
	t.Helper()
	var (
		frames []fastlane.Frame
		stream []byte
	)
	for i, size := range []int{0, 1, 100, 40 << 10, 7, fastlane.MaxFrame - fastlane.HeaderLen, 3} {
		payload := bytes.Repeat([]byte{byte(i + 1)}, size)
		f := fastlane.Frame{Kind: fastlane.KindResponse, Method: methodAcquire, ID: uint64(i) << 40, Payload: payload}
		var err error
		stream, err = fastlane.AppendFrame(stream, f.Kind, f.Method, f.ID, func(b []byte) ([]byte, error) { return append(b, payload...), nil })
		if err != nil {
			t.Fatal(err)
		}
		frames = append(frames, f)
	}
	return frames, stream
}

// TestReaderResumes: frames come out whole and in order however the stream is cut into
// reads, and a read that fails with a deadline loses nothing: the next Read carries on.
func TestReaderResumes(t *testing.T) {
	frames, stream := testFrames(t)
	for _, step := range []int{1, 3, 4, 11, 4096, 1 << 20} {
		for _, interrupt := range []bool{false, true} {
			r := fastlane.NewReader(&chunkReader{data: stream, step: step, interrupt: interrupt})
			for i := 0; i < len(frames); {
				f, err := r.Read()
				if errors.Is(err, os.ErrDeadlineExceeded) && interrupt {
					continue
				}
				if err != nil {
					t.Fatalf("step %d interrupt %v: frame %d: %v", step, interrupt, i, err)
				}
				want := frames[i]
				if f.Kind != want.Kind || f.Method != want.Method || f.ID != want.ID || !bytes.Equal(f.Payload, want.Payload) {
					t.Fatalf("step %d interrupt %v: frame %d: got id %d with %d bytes, want id %d with %d", step, interrupt, i, f.ID, len(f.Payload), want.ID, len(want.Payload))
				}
				i++
			}
			for {
				_, err := r.Read()
				if errors.Is(err, os.ErrDeadlineExceeded) && interrupt {
					continue
				}
				if !errors.Is(err, io.EOF) {
					t.Fatalf("step %d interrupt %v: after the last frame: %v, want io.EOF", step, interrupt, err)
				}
				break
			}
		}
	}
}

// TestReaderErrors: a stream that ends inside a frame is io.ErrUnexpectedEOF; a length
// out of bounds or an unknown kind is ErrProtocol.
func TestReaderErrors(t *testing.T) {
	_, stream := testFrames(t)
	for _, cut := range []int{1, 3, 4, 5, 13, len(stream) - 1} {
		r := fastlane.NewReader(bytes.NewReader(stream[:cut]))
		var err error
		for err == nil {
			_, err = r.Read()
		}
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("stream cut at %d: %v, want io.ErrUnexpectedEOF", cut, err)
		}
	}
	for name, b := range map[string][]byte{
		"too long":     {0, 2, 0, 0, 1, 1},
		"too short":    {0, 0, 0, 2, 1, 1},
		"unknown kind": append([]byte{0, 0, 0, fastlane.HeaderLen, 9, 1}, make([]byte, 8)...),
	} {
		if _, err := fastlane.NewReader(bytes.NewReader(b)).Read(); !errors.Is(err, fastlane.ErrProtocol) {
			t.Errorf("%s: %v, want ErrProtocol", name, err)
		}
	}
}

// TestOfferNeverBlocks: Offer returns at once even while the peer reads nothing — on a
// net.Pipe (which blocks every write until it is read) and on a TCP socket whose
// buffers fill up — the frames arrive whole and in order once the peer reads, and after
// a failed write Offer reports false.
func TestOfferNeverBlocks(t *testing.T) {
	t.Run("pipe", func(t *testing.T) {
		client, server := net.Pipe()
		offerNeverBlocks(t, client, server, 1)
	})
	t.Run("tcp", func(t *testing.T) {
		client, server := tcpPair(t)
		// Megabytes in all: more than the socket buffers of both ends hold.
		offerNeverBlocks(t, client, server, 40)
	})
}

func offerNeverBlocks(t *testing.T, client, server net.Conn, repeat int) {
	defer client.Close()
	w := fastlane.NewWriter(server)
	var frames []fastlane.Frame
	for range repeat {
		f, _ := testFrames(t)
		frames = append(frames, f...)
	}
	offered := make(chan struct{})
	go func() {
		defer close(offered)
		for i, f := range frames {
			b, err := fastlane.AppendFrame(nil, f.Kind, f.Method, uint64(i), func(b []byte) ([]byte, error) { return append(b, f.Payload...), nil })
			if err != nil {
				t.Error(err)
				return
			}
			if !w.Offer(b) {
				t.Error("Offer failed on a live connection")
			}
		}
	}()
	select {
	case <-offered:
	case <-time.After(10 * time.Second):
		t.Fatal("Offer blocked on a peer that does not read")
	}
	r := fastlane.NewReader(client)
	for i, want := range frames {
		got, err := r.Read()
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if got.ID != uint64(i) || !bytes.Equal(got.Payload, want.Payload) {
			t.Fatalf("frame %d: id %d with %d bytes, want %d bytes", i, got.ID, len(got.Payload), len(want.Payload))
		}
	}

	_ = client.Close()
	deadline := time.Now().Add(5 * time.Second)
	for w.Offer([]byte{0, 0, 0, 10, 2, 1, 0, 0, 0, 0, 0, 0, 0, 1}) {
		if time.Now().After(deadline) {
			t.Fatal("Offer still succeeds after the connection failed")
		}
		time.Sleep(time.Millisecond)
	}
}

// countingWriter records each write.
type countingWriter struct{ writes [][]byte }

func (w *countingWriter) Write(p []byte) (int, error) {
	w.writes = append(w.writes, bytes.Clone(p))
	return len(p), nil
}

// TestQueueFlush: queued frames wait for Flush and leave in one write, in order; a
// Flush with nothing queued writes nothing; Queue writes by itself once QueueLimit bytes
// wait, so what waits is bounded; Buffered tells whether a whole frame is buffered.
func TestQueueFlush(t *testing.T) {
	frame := func(id uint64, size int) []byte {
		b, err := fastlane.AppendFrame(nil, fastlane.KindResponse, methodAcquire, id, func(b []byte) ([]byte, error) { return append(b, make([]byte, size)...), nil })
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	cw := new(countingWriter)
	w := fastlane.NewWriter(cw)
	var want []byte
	for id := range uint64(10) {
		f := frame(id, 20)
		want = append(want, f...)
		if !w.Queue(f) {
			t.Fatal("Queue failed")
		}
	}
	if len(cw.writes) != 0 {
		t.Fatalf("Queue wrote %d times before Flush", len(cw.writes))
	}
	if !w.Flush(false) || len(cw.writes) != 1 || !bytes.Equal(cw.writes[0], want) {
		t.Fatalf("Flush: %d writes, want one of the queued frames", len(cw.writes))
	}
	if !w.Flush(false) || len(cw.writes) != 1 {
		t.Fatalf("Flush with nothing queued wrote: %d writes", len(cw.writes))
	}

	big := frame(99, 4<<10)
	for range fastlane.QueueLimit / len(big) {
		w.Queue(big)
	}
	if len(cw.writes) != 1 {
		t.Fatalf("Queue wrote below QueueLimit: %d writes", len(cw.writes))
	}
	w.Queue(big)
	if len(cw.writes) != 2 {
		t.Fatalf("Queue past QueueLimit: %d writes, want it written", len(cw.writes)-1)
	}

	// Buffered: not before a whole frame is read, yes while one is left, no after.
	stream := append(append(frame(1, 5), frame(2, 5)...), frame(3, 5)[:7]...)
	r := fastlane.NewReader(bytes.NewReader(stream))
	if r.Buffered() {
		t.Fatal("Buffered before any read")
	}
	if _, err := r.Read(); err != nil {
		t.Fatal(err)
	}
	if !r.Buffered() {
		t.Fatal("not Buffered with a whole frame left")
	}
	if _, err := r.Read(); err != nil {
		t.Fatal(err)
	}
	if r.Buffered() {
		t.Fatal("Buffered with only part of a frame left")
	}
}

// stuckWriter blocks every write until release is closed, then fails it.
type stuckWriter struct {
	started chan struct{} // closed by the first write
	once    sync.Once
	release chan struct{}
}

func (w *stuckWriter) Write(p []byte) (int, error) {
	w.once.Do(func() { close(w.started) })
	<-w.release
	return 0, errors.New("peer gone")
}

// TestSendWaitsBehindAStuckWrite: while one sender's write does not return (a peer that
// reads nothing), other senders' Sends add to what waits only up to PendingLimit, then
// wait; when the write fails they return false. Offer still never waits.
func TestSendWaitsBehindAStuckWrite(t *testing.T) {
	sw := &stuckWriter{started: make(chan struct{}), release: make(chan struct{})}
	w := fastlane.NewWriter(sw)
	frame := make([]byte, 64<<10)
	go w.Send(frame, false) // becomes the writer, and stays in its write
	<-sw.started
	sent := make(chan bool, 1)
	var sends atomic.Int64
	go func() {
		for {
			if !w.Send(frame, false) {
				sent <- false
				return
			}
			sends.Add(1)
		}
	}()
	time.Sleep(200 * time.Millisecond)
	if n := sends.Load(); n > fastlane.PendingLimit/int64(len(frame))+1 {
		t.Fatalf("%d Sends returned behind a write that never ends, want at most %d", n, fastlane.PendingLimit/len(frame)+1)
	}
	if q := w.Queued(); q > fastlane.PendingLimit+len(frame) {
		t.Fatalf("%d bytes wait behind the stuck write, want at most %d", q, fastlane.PendingLimit+len(frame))
	}
	offered := make(chan bool, 1)
	go func() { offered <- w.Offer(frame) }()
	select {
	case ok := <-offered:
		if !ok {
			t.Fatal("Offer failed before any write did")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Offer waited behind the stuck write")
	}
	close(sw.release)
	select {
	case ok := <-sent:
		if ok {
			t.Fatal("a Send succeeded after the write failed")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a Send waiting behind the write did not return when it failed")
	}
}

// gatedWriter is an io.Writer whose every Write waits for gate.
type gatedWriter struct {
	gate chan struct{}
	n    atomic.Int64
}

func (g *gatedWriter) Write(p []byte) (int, error) {
	<-g.gate
	g.n.Add(int64(len(p)))
	return len(p), nil
}

// TestWriterIdle: a Writer is idle only once every frame handed to it is written — not
// while one is pending, nor while its write is in progress (a server draining its
// connections closes one only when it is idle, or an answer already taken out of the
// requests in flight would be lost).
func TestWriterIdle(t *testing.T) {
	g := &gatedWriter{gate: make(chan struct{})}
	w := fastlane.NewWriter(g)
	if !w.Idle() {
		t.Fatal("a new Writer is not idle")
	}
	w.Offer([]byte("answer"))
	if w.Idle() {
		t.Fatal("idle with a frame offered and its write waiting")
	}
	close(g.gate)
	deadline := time.Now().Add(5 * time.Second)
	for !w.Idle() {
		if time.Now().After(deadline) {
			t.Fatal("not idle 5 s after the write could go")
		}
		time.Sleep(time.Millisecond)
	}
	if g.n.Load() != int64(len("answer")) {
		t.Fatalf("idle with %d bytes written, want %d", g.n.Load(), len("answer"))
	}
}
