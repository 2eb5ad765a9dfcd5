package scale

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/api/leasehold/v1/leaseholdv1connect"
	"github.com/leasehold/leasehold/fastlane"
)

// laneGen plays the part of many independent clients, each holding one lease and
// renewing it on the Go client's schedule, for the million-lease runs: the Go client
// costs its process about as much CPU per keepalive as the server (it keeps timers,
// contexts and a lock per lease), so a million of them do not fit beside the server on
// the benchmark machine. laneGen speaks the fast lane itself (docs/PROTOCOL.md): a few
// connections, Grant and KeepAlive frames pipelined on each, every lease renewed every
// interval after the answer to its last renewal, as a client does. What the server
// sees per lease is what it sees from a real client, except that many leases share a
// connection (a million connections do not fit on one machine either).
//
// Request IDs are lease indexes: a lease has at most one request in flight.
type laneGen struct {
	ttl, every time.Duration
	start      time.Time
	leases     []genLease
	conns      []*genConn

	granted, renewals, refused atomic.Int64
	errs                       errNote
}

// genLease is one lease's state in the generator. Times are offsets from laneGen.start.
type genLease struct {
	payload []byte // the encoded KeepAliveRequest, once granted
	sent    int64  // when the request in flight (or the last one) was sent
	// ackSent and ackRecv are when the last acknowledged request (grant or keepalive)
	// was sent and when its answer arrived: the server restarted the countdown at full
	// TTL between the two.
	ackSent, ackRecv int64
	gone             bool // a keepalive was refused: the server no longer has the lease
}

// genConn is one fast-lane connection and the leases on it.
type genConn struct {
	g        *laneGen
	conn     net.Conn
	r        *fastlane.Reader
	first, n int // its leases are g.leases[first : first+n]

	inFlight atomic.Int64
	mu       sync.Mutex
	due      []genDue // renewals due, in order of when
	head     int
	regrant  []int // leases whose grant was refused (e.g. the log was busy): granted again
}

type genDue struct {
	lease int
	at    int64
}

// maxGenInFlight bounds the requests in flight per connection, under the server's
// fastlane.MaxInFlight.
const maxGenInFlight = 2048

// newLaneGen dials conns fast-lane connections to addr (a node's fast-lane address, of
// cluster clusterID) for n leases of ttl, renewed every ttl/3 as the Go client does.
func newLaneGen(ctx context.Context, addr, clusterID string, n, conns int, ttl time.Duration) (*laneGen, error) {
	g := &laneGen{ttl: ttl, every: ttl / 3, leases: make([]genLease, n)}
	per := (n + conns - 1) / conns
	var d net.Dialer
	for first := 0; first < n; first += per {
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			g.close()
			return nil, fmt.Errorf("fast lane %s: %w", addr, err)
		}
		if _, err := fastlane.ClientHello(conn, clusterID, fastlane.Extensions{}); err != nil {
			_ = conn.Close()
			g.close()
			return nil, fmt.Errorf("fast lane %s: %w", addr, err)
		}
		g.conns = append(g.conns, &genConn{g: g, conn: conn, r: fastlane.NewReader(conn), first: first, n: min(per, n-first)})
	}
	return g, nil
}

// now is the time since the generator started, in nanoseconds.
func (g *laneGen) now() int64 { return int64(time.Since(g.start)) }

// run grants every lease and keeps each alive until ctx ends, then closes the
// connections at once (as if every client were killed) and returns when all of its
// goroutines are done.
func (g *laneGen) run(ctx context.Context) {
	g.start = time.Now()
	var wg sync.WaitGroup
	for _, c := range g.conns {
		wg.Go(c.readLoop)
		wg.Go(func() { c.writeLoop(ctx) })
	}
	<-ctx.Done()
	g.close()
	wg.Wait()
}

func (g *laneGen) close() {
	for _, c := range g.conns {
		_ = c.conn.Close()
	}
}

// writeLoop sends the connection's grants, as fast as the in-flight bound lets it,
// then every renewal when it falls due, a batch of frames per write.
func (c *genConn) writeLoop(ctx context.Context) {
	g := c.g
	grant, err := proto.Marshal(&leaseholdv1.GrantRequest{TtlMs: g.ttl.Milliseconds()})
	if err != nil {
		panic(err) // a constant message
	}
	grantMethod := fastlane.MustMethodOf(leaseholdv1connect.LeaseServiceGrantProcedure)
	kaMethod := fastlane.MustMethodOf(leaseholdv1connect.LeaseServiceKeepAliveProcedure)
	next := c.first // the next lease to grant
	var buf []byte
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for {
		buf = buf[:0]
		now := g.now()
		room := maxGenInFlight - c.inFlight.Load()
		c.mu.Lock()
		for ; room > 0 && len(c.regrant) > 0; room-- {
			i := c.regrant[len(c.regrant)-1]
			c.regrant = c.regrant[:len(c.regrant)-1]
			g.leases[i].sent = now
			buf = appendFrame(buf, grantMethod, i, grant)
			c.inFlight.Add(1)
		}
		for ; room > 0 && next < c.first+c.n; room-- {
			g.leases[next].sent = now
			buf = appendFrame(buf, grantMethod, next, grant)
			next++
			c.inFlight.Add(1)
		}
		for ; room > 0 && c.head < len(c.due) && c.due[c.head].at <= now; room-- {
			i := c.due[c.head].lease
			c.head++
			l := &g.leases[i]
			l.sent = now
			buf = appendFrame(buf, kaMethod, i, l.payload)
			c.inFlight.Add(1)
		}
		if c.head > 4096 && c.head*2 > len(c.due) {
			c.due = c.due[:copy(c.due, c.due[c.head:])]
			c.head = 0
		}
		c.mu.Unlock()
		if len(buf) > 0 {
			if _, err := c.conn.Write(buf); err != nil {
				return
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func appendFrame(dst []byte, m fastlane.Method, lease int, payload []byte) []byte {
	dst, err := fastlane.AppendFrame(dst, fastlane.KindRequest, m, uint64(lease), func(b []byte) ([]byte, error) {
		return append(b, payload...), nil
	})
	if err != nil {
		panic(err) // frames of tens of bytes
	}
	return dst
}

// readLoop takes the answers: a grant's lease ID becomes the lease's keepalive request,
// an acknowledged request schedules the next renewal, a refused keepalive marks the
// lease gone.
func (c *genConn) readLoop() {
	g := c.g
	for {
		f, err := c.r.Read()
		if err != nil {
			return
		}
		c.inFlight.Add(-1)
		i := int(f.ID)
		if i < c.first || i >= c.first+c.n {
			g.errs.note(fmt.Errorf("answer for request %d, not one of this connection's", f.ID))
			continue
		}
		if err := c.answer(f, i); err != nil {
			g.errs.note(err)
		}
	}
}

// answer takes the answer f to lease i's request in flight.
func (c *genConn) answer(f fastlane.Frame, i int) error {
	g := c.g
	now := g.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	l := &g.leases[i]
	what := "keepalive"
	if l.payload == nil {
		what = "grant"
	}
	if f.Kind != fastlane.KindResponse {
		var fe leaseholdv1.FastLaneError
		_ = proto.Unmarshal(f.Payload, &fe)
		if l.payload != nil {
			l.gone = true
			g.refused.Add(1)
		} else {
			c.regrant = append(c.regrant, i)
		}
		return fmt.Errorf("%s: code %d: %s", what, fe.GetCode(), fe.GetMessage())
	}
	if l.payload == nil {
		var resp leaseholdv1.GrantResponse
		if err := proto.Unmarshal(f.Payload, &resp); err != nil || resp.GetLeaseId() == "" {
			return errors.Join(errors.New("grant: undecodable answer"), err)
		}
		l.payload, _ = proto.Marshal(&leaseholdv1.KeepAliveRequest{LeaseId: resp.GetLeaseId()})
		g.granted.Add(1)
	} else {
		g.renewals.Add(1)
	}
	l.ackSent, l.ackRecv = l.sent, now
	c.due = append(c.due, genDue{lease: i, at: now + int64(g.every)})
	return nil
}
