// Package fastlane is leasehold's lean binary protocol for the hot calls: length-prefixed
// frames carrying the same protobuf messages as the Connect API, a request id per frame,
// many requests in flight on one TCP connection, responses in any order, and writes
// batched per connection. docs/PROTOCOL.md specifies it; this package holds the framing
// shared by the server (server.ServeFastLane) and the Go client.
//
// Why it exists: on a small machine a trivial unary call costs the server tens of
// microseconds of CPU through HTTP/2 and Connect, and a few through a multiplexed TCP
// protocol. The fast lane is how a lock service built on Connect serves as many locks per
// second as Redis. Connect stays for every other caller (curl, grpcurl, browsers).
package fastlane

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"time"
)

// Protocol constants. See docs/PROTOCOL.md.
const (
	Magic = "LHFL"
	// Version is the protocol version this package speaks: 2, whose handshake carries
	// the cluster ID. A server still serves version-1 clients (without the check).
	Version = 2
	// version1 is the handshake without cluster IDs.
	version1 = 1

	// HeaderLen is the frame header after the 4-byte length: kind, method, id.
	HeaderLen = 1 + 1 + 8
	// MaxFrame is the largest frame (header plus payload) either side sends or accepts.
	MaxFrame = 80 << 10
	// MaxInFlight is how many requests a client may have outstanding on one connection;
	// more are answered with a ResourceExhausted error frame.
	MaxInFlight = 4096
	// HandshakeTimeout bounds the handshake.
	HandshakeTimeout = 5 * time.Second
)

// Kind is a frame's kind.
type Kind uint8

// Frame kinds.
const (
	KindRequest  Kind = 1 // client → server: method, id, request message
	KindResponse Kind = 2 // server → client: id, response message
	KindError    Kind = 3 // server → client: id, FastLaneError message
	KindCancel   Kind = 4 // client → server: id; the server cancels that request's context
	// KindGoAway (server → client, id 0, no payload): the server is shutting down. The
	// client sends no new request on the connection; the requests it already sent are
	// answered (or refused as shutting_down, not started). Only sent to a client whose
	// hello set FlagGoAway.
	KindGoAway Kind = 5
)

// GoAwayFrame is the one GOAWAY frame (KindGoAway).
func GoAwayFrame() []byte {
	f, _ := AppendFrame(nil, KindGoAway, 0, 0, nil)
	return f
}

// Errors of the framing layer.
var (
	// ErrProtocol is returned for a malformed frame or handshake; the connection must be
	// closed.
	ErrProtocol = errors.New("fastlane: protocol error")
	// ErrVersion is returned by the handshake when the peer speaks another version.
	ErrVersion = errors.New("fastlane: unsupported protocol version")
	// ErrWrongCluster is returned by the handshake when the server belongs to another
	// cluster than the client expects (or to none).
	ErrWrongCluster = errors.New("fastlane: the server belongs to another cluster")
)

// Frame is one decoded frame. Payload aliases the reader's buffer until the next Read.
type Frame struct {
	Kind    Kind
	Method  Method
	ID      uint64
	Payload []byte
}

// Reader reads frames from a connection. It keeps a partly read frame across a failed
// read, so a read interrupted by a deadline (net.Conn.SetReadDeadline) can simply be
// retried: the Go client interrupts a caller that reads for its connection this way
// when the caller's context ends.
type Reader struct {
	r          io.Reader
	buf        []byte
	start, end int // buf[start:end] is read but not yet returned
}

// readerBuffer is the Reader's initial buffer: many small frames per read syscall.
const readerBuffer = 32 << 10

// NewReader returns a Reader on r.
func NewReader(r io.Reader) *Reader {
	return &Reader{r: r, buf: make([]byte, readerBuffer)}
}

// Read reads the next frame. A frame larger than MaxFrame or shorter than a header is
// ErrProtocol. A read error is returned as it is, except that a connection that ends
// inside a frame is io.ErrUnexpectedEOF; after an error other than these, Read may be
// called again and carries on where it stopped. The returned Payload is valid until the
// next call.
func (r *Reader) Read() (Frame, error) {
	for {
		if f, ok, err := r.next(); ok || err != nil {
			return f, err
		}
		if r.end == len(r.buf) {
			r.makeRoom()
		}
		n, err := r.r.Read(r.buf[r.end:])
		r.end += n
		if err != nil {
			if n > 0 {
				continue // return the frames this read completed; the error comes again
			}
			if errors.Is(err, io.EOF) && r.end > r.start {
				err = io.ErrUnexpectedEOF
			}
			return Frame{}, err
		}
	}
}

// next returns the first whole frame in the buffer, if there is one.
func (r *Reader) next() (Frame, bool, error) {
	b := r.buf[r.start:r.end]
	if len(b) < 4 {
		return Frame{}, false, nil
	}
	n := binary.BigEndian.Uint32(b)
	if n < HeaderLen || n > MaxFrame {
		return Frame{}, false, fmt.Errorf("%w: frame length %d (must be %d to %d)", ErrProtocol, n, HeaderLen, MaxFrame)
	}
	if len(b) < 4+int(n) {
		return Frame{}, false, nil
	}
	b = b[4 : 4+n]
	r.start += 4 + int(n)
	f := Frame{Kind: Kind(b[0]), Method: Method(b[1]), ID: binary.BigEndian.Uint64(b[2:10]), Payload: b[HeaderLen:]}
	if f.Kind < KindRequest || f.Kind > KindGoAway {
		return Frame{}, false, fmt.Errorf("%w: frame kind %d", ErrProtocol, f.Kind)
	}
	return f, true, nil
}

// Buffered reports whether the next Read returns without reading the connection: a
// whole frame (or a malformed length, which Read reports) is already buffered. A
// reader that holds answers back while requests are still buffered (Writer.Queue)
// flushes them once Buffered is false, before Read may block.
func (r *Reader) Buffered() bool {
	b := r.buf[r.start:r.end]
	if len(b) < 4 {
		return false
	}
	n := binary.BigEndian.Uint32(b)
	return n < HeaderLen || n > MaxFrame || len(b) >= 4+int(n)
}

// makeRoom makes space after r.end, which is at the end of the buffer: it moves the
// unread bytes to the front, and grows the buffer when a frame longer than it waits.
func (r *Reader) makeRoom() {
	need := readerBuffer
	if r.end-r.start >= 4 {
		need = max(need, 4+int(binary.BigEndian.Uint32(r.buf[r.start:])))
	}
	buf := r.buf
	if len(buf) < need {
		buf = make([]byte, need)
	}
	r.end = copy(buf, r.buf[r.start:r.end])
	r.start, r.buf = 0, buf
}

// AppendFrame appends a frame with the given header to dst, followed by the payload
// that appendPayload appends (it may be nil), and fills in the length.
func AppendFrame(dst []byte, kind Kind, method Method, id uint64, appendPayload func([]byte) ([]byte, error)) ([]byte, error) {
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0, byte(kind), byte(method))
	dst = binary.BigEndian.AppendUint64(dst, id)
	if appendPayload != nil {
		var err error
		if dst, err = appendPayload(dst); err != nil {
			return dst[:start], err
		}
	}
	n := len(dst) - start - 4
	if n > MaxFrame {
		return dst[:start], fmt.Errorf("%w: frame of %d bytes exceeds %d", ErrProtocol, n, MaxFrame)
	}
	binary.BigEndian.PutUint32(dst[start:], uint32(n))
	return dst, nil
}

// framePool holds buffers for frames that live only until Writer.Send has copied them.
var framePool = sync.Pool{New: func() any { b := make([]byte, 0, 256); return &b }}

// maxPooledFrame is the largest buffer PutBuffer keeps; bigger ones go to the GC.
const maxPooledFrame = 16 << 10

// GetBuffer returns an empty buffer to build a frame in (AppendFrame((*buf)[:0], …)).
// Give it back with PutBuffer once Send has returned: Send copies the frame, so the
// buffer is free again then. Reusing buffers saves the allocations of a frame per
// request and per answer on the hot path.
func GetBuffer() *[]byte { return framePool.Get().(*[]byte) }

// PutBuffer gives back a buffer from GetBuffer, with the frame built in it (so that a
// grown buffer is kept). The caller must not use either afterwards.
func PutBuffer(buf *[]byte, frame []byte) {
	if cap(frame) > maxPooledFrame {
		return
	}
	*buf = frame[:0]
	framePool.Put(buf)
}

// Writer batches frames onto a connection without a goroutine of its own: Send appends
// the frame to a pending buffer, and the sender that finds no write in progress writes
// everything pending — its own frame and whatever others appended meanwhile — until
// nothing is left. A lone frame goes out at once from its sender's goroutine; under load
// many frames share one write. Safe for concurrent use.
//
// What waits is bounded: a Send, Queue or Flush that finds PendingLimit bytes pending
// while another sender's write is in progress waits for that write to take them (or to
// fail), so a peer that stops reading stops its sender instead of making it buffer
// without end. Offer never waits.
type Writer struct {
	w        io.Writer
	mu       sync.Mutex
	drained  sync.Cond // on mu: signalled after every write, done or failed
	pending  []byte
	spare    []byte
	flushing bool
	err      error
}

// PendingLimit is how many bytes may wait behind a write in progress before Send,
// Queue and Flush wait for it. Offer's frames do not wait: its callers answer requests
// in flight, which MaxInFlight bounds.
const PendingLimit = 1 << 20

// NewWriter returns a Writer on w.
func NewWriter(w io.Writer) *Writer {
	wr := &Writer{w: w}
	wr.drained.L = &wr.mu
	return wr
}

// Send writes frame, or leaves it to the sender already writing. With yield (the caller
// knows other requests are in flight on the connection), a sender about to write lets
// the other ready goroutines run once first, so that answers finished by the same event
// (a commit, a quorum round, one read of many requests) join its write instead of each
// paying for a write of its own; alone on the connection it writes at once. Send
// returns false once a write has failed; the connection is then unusable.
func (w *Writer) Send(frame []byte, yield bool) bool {
	w.mu.Lock()
	if w.err != nil {
		w.mu.Unlock()
		return false
	}
	w.pending = append(w.pending, frame...)
	return w.writeLocked(yield)
}

// writeLocked leaves what is pending to the sender already writing, if there is one, or
// else becomes the writer: with yield it lets the other ready goroutines run once
// first, then writes until nothing is pending. w.mu is held on entry and unlocked on
// return; it reports whether the connection is still usable.
func (w *Writer) writeLocked(yield bool) bool {
	for w.flushing {
		if len(w.pending) < PendingLimit || w.err != nil {
			ok := w.err == nil
			w.mu.Unlock()
			return ok
		}
		w.drained.Wait() // the write in progress is slow (a peer that does not read)
	}
	w.flushing = true
	if yield {
		w.mu.Unlock()
		runtime.Gosched()
		w.mu.Lock()
	}
	return w.flushLocked()
}

// QueueLimit is how many bytes Writer.Queue lets wait for a Flush: a Queue that finds
// this much pending writes it at once.
const QueueLimit = 64 << 10

// Queue appends frame to what is pending without writing it, unless QueueLimit bytes
// are pending: a sender already writing, the next Send or Offer, or Flush takes it
// along. It is for a goroutine that answers, one after another, requests it read in
// one go (the server's reader): queued answers leave together in one write when it
// calls Flush, which it must do before it may block (before a Read that would wait).
// Queue returns false once a write has failed.
func (w *Writer) Queue(frame []byte) bool {
	w.mu.Lock()
	if w.err != nil {
		w.mu.Unlock()
		return false
	}
	w.pending = append(w.pending, frame...)
	if len(w.pending) < QueueLimit {
		w.mu.Unlock()
		return true
	}
	return w.writeLocked(false)
}

// Idle reports whether nothing waits to be written and no write is in progress (or a
// write has failed: nothing more will be): every frame handed to the Writer has been
// written to the connection.
func (w *Writer) Idle() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err != nil || !w.flushing && len(w.pending) == 0
}

// Queued reports how many bytes wait to be written.
func (w *Writer) Queued() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.pending)
}

// Flush writes what Queue left pending, unless a sender is already writing it. With
// yield, as for Send, it first lets the other ready goroutines run once, so that answers
// they are about to send (a waiter granted by a release just answered, say) join the
// write. It returns false once a write has failed.
func (w *Writer) Flush(yield bool) bool {
	w.mu.Lock()
	if w.err != nil {
		w.mu.Unlock()
		return false
	}
	if len(w.pending) == 0 {
		w.mu.Unlock()
		return true
	}
	return w.writeLocked(yield)
}

// Offer queues frame and returns without writing: a sender already writing takes it
// along, or else a goroutine started for the purpose writes everything pending. For
// callers that must never block on the connection (a goroutine that answers the
// requests of many connections); frames offered together leave in one write. Offer
// returns false once a write has failed.
func (w *Writer) Offer(frame []byte) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return false
	}
	w.offerLocked(frame)
	return true
}

func (w *Writer) offerLocked(frame []byte) {
	w.pending = append(w.pending, frame...)
	if !w.flushing {
		w.flushing = true
		go func() {
			w.mu.Lock()
			w.flushLocked()
		}()
	}
}

// flushLocked writes until nothing is pending, then stops being the flusher and unlocks
// w.mu (held on entry). It reports whether the connection is still usable.
func (w *Writer) flushLocked() bool {
	for len(w.pending) > 0 && w.err == nil {
		out := w.pending
		// The spare buffer becomes pending; it must not stay spare too, or after a write
		// too large to keep (below) the next round would append to the very buffer it is
		// writing.
		w.pending, w.spare = w.spare[:0], nil
		w.mu.Unlock()
		_, err := w.w.Write(out)
		w.mu.Lock()
		if cap(out) <= 1<<20 {
			w.spare = out[:0]
		}
		if err != nil {
			w.err = err
		}
		w.drained.Broadcast()
	}
	w.flushing = false
	ok := w.err == nil
	w.mu.Unlock()
	return ok
}

// ClientHello performs the client side of the handshake on conn (version 2). expect is
// the cluster ID the client expects (32 hex characters), or "" when it does not know it
// yet; ClientHello returns the server's cluster ID ("" when the server has none). A
// server that belongs to another cluster than expect (or to none) is ErrWrongCluster,
// and a server of version 1, which cannot say, is ErrVersion: close the connection
// then, nothing having been sent on it. ext (hello extensions, hello.go) is sent only
// to a server of the expected cluster that accepts extensions.
func ClientHello(conn net.Conn, expect string, ext Extensions) (string, error) {
	want, err := parseClusterID(expect)
	if err != nil {
		return "", err
	}
	_ = conn.SetDeadline(time.Now().Add(HandshakeTimeout))
	defer func() { _ = conn.SetDeadline(time.Time{}) }()
	hello := binary.BigEndian.AppendUint16([]byte(Magic), Version)
	hello = binary.BigEndian.AppendUint16(hello, ext.flags())
	hello = append(hello, want[:]...)
	if _, err := conn.Write(hello); err != nil {
		return "", err
	}
	var resp [serverHelloLen]byte
	if _, err := io.ReadFull(conn, resp[:serverHelloV1Len]); err != nil {
		return "", err
	}
	if string(resp[:4]) != Magic {
		return "", fmt.Errorf("%w: bad magic from server", ErrProtocol)
	}
	if v := binary.BigEndian.Uint16(resp[4:6]); v != Version {
		return "", fmt.Errorf("%w: server speaks %d, we speak %d", ErrVersion, v, Version)
	}
	if _, err := io.ReadFull(conn, resp[serverHelloV1Len:]); err != nil {
		return "", err
	}
	got := formatClusterID(resp[serverHelloV1Len:])
	if expect != "" && got != expect {
		return got, fmt.Errorf("%w: expected cluster %s, the server is of %s", ErrWrongCluster, expect, clusterName(got))
	}
	return got, ext.send(conn, binary.BigEndian.Uint16(resp[6:8]))
}

// ServerHello performs the server side of the handshake on conn: it reads the client's
// hello and answers with the server's version, limits and (version 2) cluster ID own
// ("" when the node has none), and returns the client's hello extensions (hello.go). A
// version-2 client that expects another cluster gets the answer and ErrWrongCluster
// here; a version-1 client is answered in version 1 and served without a cluster check
// (it cannot make one); a client speaking another version gets the version-1 answer
// with the server's version and ErrVersion here. Close the connection on any error.
func ServerHello(conn net.Conn, own string) (Extensions, error) {
	id, err := parseClusterID(own)
	if err != nil {
		return Extensions{}, err
	}
	_ = conn.SetDeadline(time.Now().Add(HandshakeTimeout))
	defer func() { _ = conn.SetDeadline(time.Time{}) }()
	var hello [clientHelloLen]byte
	if _, err := io.ReadFull(conn, hello[:clientHelloV1Len]); err != nil {
		return Extensions{}, err
	}
	if string(hello[:4]) != Magic {
		return Extensions{}, fmt.Errorf("%w: bad magic %q", ErrProtocol, hello[:4])
	}
	v := binary.BigEndian.Uint16(hello[4:6])
	if v == Version {
		if _, err := io.ReadFull(conn, hello[clientHelloV1Len:]); err != nil {
			return Extensions{}, err
		}
	}
	answer := uint16(Version)
	if v == version1 {
		answer = version1
	}
	accept := binary.BigEndian.Uint16(hello[6:8]) & (FlagExtensions | FlagGoAway)
	if v == version1 {
		accept &= FlagExtensions // a version-1 client never asked for GOAWAY
	}
	resp := binary.BigEndian.AppendUint16([]byte(Magic), answer)
	resp = binary.BigEndian.AppendUint16(resp, accept)
	resp = binary.BigEndian.AppendUint32(resp, MaxFrame)
	resp = binary.BigEndian.AppendUint32(resp, MaxInFlight)
	if v == Version {
		resp = append(resp, id[:]...)
	}
	if _, err := conn.Write(resp); err != nil {
		return Extensions{}, err
	}
	switch want := formatClusterID(hello[clientHelloV1Len:]); {
	case v == version1:
	case v != Version:
		return Extensions{}, fmt.Errorf("%w: client speaks %d", ErrVersion, v)
	case want != "" && want != own:
		return Extensions{}, fmt.Errorf("%w: the client expects cluster %s, this node is of %s", ErrWrongCluster, want, clusterName(own))
	}
	ext, err := receiveExtensions(conn, accept)
	ext.GoAway = accept&FlagGoAway != 0
	return ext, err
}

// Handshake sizes: version 2 appends a cluster ID to each version-1 hello.
const (
	clientHelloV1Len = 8
	clientHelloLen   = clientHelloV1Len + clusterIDLen
	serverHelloV1Len = 16
	serverHelloLen   = serverHelloV1Len + clusterIDLen
	clusterIDLen     = 16
)

// parseClusterID decodes a cluster ID's 32 hex characters ("" is all zeros: none).
func parseClusterID(s string) ([clusterIDLen]byte, error) {
	var id [clusterIDLen]byte
	if s == "" {
		return id, nil
	}
	if len(s) != 2*clusterIDLen {
		return id, fmt.Errorf("fastlane: cluster ID must be %d hex characters, got %d", 2*clusterIDLen, len(s))
	}
	if _, err := hex.Decode(id[:], []byte(s)); err != nil {
		return id, fmt.Errorf("fastlane: cluster ID is not hex: %w", err)
	}
	return id, nil
}

// formatClusterID encodes a cluster ID in lowercase hex; all zeros is "".
func formatClusterID(b []byte) string {
	for _, c := range b {
		if c != 0 {
			return hex.EncodeToString(b)
		}
	}
	return ""
}

func clusterName(id string) string {
	if id == "" {
		return "no cluster"
	}
	return "cluster " + id
}
