package etcdraft

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// Transport carries raft messages between nodes over TCP: one listener per node, one
// connection and one sending goroutine per peer. A message is a uvarint length and the
// protobuf encoding. Messages are best effort, as raft expects: a message that finds
// its peer's queue full or its connection broken is dropped, and raft sends again.
type Transport struct {
	// Direct makes Send write on the caller's goroutine (the node's loop) when the
	// peer's connection is up and nothing waits in its queue, saving the wake-up of the
	// sending goroutine; the write then gets directWriteTimeout before the connection
	// is dropped. Set it before the first Send.
	Direct bool

	ln      net.Listener
	deliver func(*pb.Message) // set once by the node before Start

	mu     sync.Mutex
	peers  map[uint64]*peer
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
	stop   chan struct{}
}

// maxMessage bounds one received message (a sender's MaxSizePerMsg is far below it).
const maxMessage = 64 << 20

// peerQueue is how many messages wait for one peer before new ones are dropped.
const peerQueue = 4096

// Listen opens a transport on addr ("127.0.0.1:0" picks a free port).
func Listen(addr string) (*Transport, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("etcdraft: listen on %s: %w", addr, err)
	}
	return &Transport{ln: ln, peers: map[uint64]*peer{}, conns: map[net.Conn]struct{}{}, stop: make(chan struct{})}, nil
}

// Addr is the address the transport listens on.
func (t *Transport) Addr() string { return t.ln.Addr().String() }

// AddPeer makes messages to id go to addr.
func (t *Transport) AddPeer(id uint64, addr string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed || t.peers[id] != nil {
		return
	}
	p := &peer{addr: addr, q: make(chan *pb.Message, peerQueue)}
	t.peers[id] = p
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		p.run(t.stop)
	}()
}

// start begins accepting connections; every message received goes to deliver.
func (t *Transport) start(deliver func(*pb.Message)) {
	t.deliver = deliver
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		t.accept()
	}()
}

// directWriteTimeout bounds a write on the loop's goroutine (Transport.Direct): a peer
// that does not take it by then loses the connection, and raft sends again.
const directWriteTimeout = 5 * time.Millisecond

// Send queues m for its peer without blocking (or, with Direct, writes it); it reports
// false if m was dropped.
func (t *Transport) Send(m *pb.Message) bool {
	t.mu.Lock()
	p := t.peers[m.GetTo()]
	t.mu.Unlock()
	if p == nil {
		return false
	}
	if t.Direct && p.sendNow(m) {
		return true
	}
	select {
	case p.q <- m:
		return true
	default:
		return false
	}
}

// Close stops the transport and waits for its goroutines.
func (t *Transport) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	close(t.stop)
	err := t.ln.Close()
	for c := range t.conns {
		_ = c.Close()
	}
	t.mu.Unlock()
	t.wg.Wait()
	return err
}

func (t *Transport) accept() {
	for {
		c, err := t.ln.Accept()
		if err != nil {
			return
		}
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			_ = c.Close()
			return
		}
		t.conns[c] = struct{}{}
		t.wg.Add(1)
		t.mu.Unlock()
		go func() {
			defer t.wg.Done()
			t.receive(c)
			t.mu.Lock()
			delete(t.conns, c)
			t.mu.Unlock()
			_ = c.Close()
		}()
	}
}

// receive reads messages from c until it fails.
func (t *Transport) receive(c net.Conn) {
	r := bufio.NewReaderSize(c, 64<<10)
	var buf []byte
	for {
		n, err := binary.ReadUvarint(r)
		if err != nil || n > maxMessage {
			return
		}
		if uint64(cap(buf)) < n {
			buf = make([]byte, n)
		}
		buf = buf[:n]
		if _, err := io.ReadFull(r, buf); err != nil {
			return
		}
		m := &pb.Message{}
		if err := proto.Unmarshal(buf, m); err != nil {
			return
		}
		t.deliver(m)
	}
}

// peer sends the messages queued for one node, in order, over one connection.
type peer struct {
	addr string
	q    chan *pb.Message

	mu   sync.Mutex // guards conn and buf, and serialises writes
	conn net.Conn   // nil until dialled, and after a write failed
	buf  []byte     // Direct's encoding scratch
}

// sendNow writes m at once if the connection is up and no message waits in the queue
// (so that m does not overtake them); it reports whether it took m.
func (p *peer) sendNow(m *pb.Message) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn == nil || len(p.q) > 0 {
		return false
	}
	var err error
	if p.buf, err = appendMessage(p.buf[:0], m); err != nil {
		return false
	}
	_ = p.conn.SetWriteDeadline(time.Now().Add(directWriteTimeout))
	if _, err := p.conn.Write(p.buf); err != nil {
		p.dropLocked()
	}
	return true
}

func (p *peer) dropLocked() {
	if p.conn != nil {
		_ = p.conn.Close()
		p.conn = nil
	}
}

// run sends until stop is closed, writing every message queued at the time in one
// write. A failed connection is dropped with the messages it held, and dialled again
// for the next message.
func (p *peer) run(stop <-chan struct{}) {
	defer func() {
		p.mu.Lock()
		p.dropLocked()
		p.mu.Unlock()
	}()
	var buf []byte
	for {
		var m *pb.Message
		select {
		case <-stop:
			return
		case m = <-p.q:
		}
		buf = buf[:0]
		for {
			var err error
			if buf, err = appendMessage(buf, m); err != nil {
				return // cannot happen: raft builds valid messages
			}
			if len(buf) > 1<<20 {
				break
			}
			select {
			case m = <-p.q:
				continue
			default:
			}
			break
		}
		if !p.write(buf) {
			pause(stop, 50*time.Millisecond)
		}
	}
}

// write writes b on the connection, dialling it first if needed; it reports false if
// the peer could not be dialled.
func (p *peer) write(b []byte) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn == nil {
		c, err := net.DialTimeout("tcp", p.addr, time.Second)
		if err != nil {
			return false
		}
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetNoDelay(true)
		}
		p.conn = c
	}
	_ = p.conn.SetWriteDeadline(time.Time{})
	if _, err := p.conn.Write(b); err != nil {
		p.dropLocked()
	}
	return true
}

func appendMessage(b []byte, m *pb.Message) ([]byte, error) {
	b = binary.AppendUvarint(b, uint64(proto.Size(m)))
	b, err := proto.MarshalOptions{UseCachedSize: true}.MarshalAppend(b, m)
	if err != nil {
		return b, errors.Join(errors.New("etcdraft: encode message"), err)
	}
	return b, nil
}

func pause(stop <-chan struct{}, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-stop:
	case <-t.C:
	}
}
