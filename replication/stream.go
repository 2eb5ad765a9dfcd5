package replication

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/leasehold/leasehold/internal/peerclosed"
)

// stream is the raft.StreamLayer of a node's network transport, over plain TCP or TLS.
// It reports the end of every connection it accepted to ended (see leaderWatch): a
// follower's connections from its leader end the moment the leader's process dies.
type stream struct {
	net.Listener
	advertise net.Addr
	dial      func(address string, timeout time.Duration) (c, raw net.Conn, err error)
	ended     func()
}

// netTransport is raft's network transport on cfg.RaftAddr (advertised as
// cfg.RaftAdvertise when set), over TLS when cfg.PeerTLS is set, with the settings of tc;
// ended is called whenever a connection from another node ends.
func netTransport(cfg Config, tc *raft.NetworkTransportConfig, ended func()) (*raft.NetworkTransport, error) {
	var advertise net.Addr
	if cfg.RaftAdvertise != "" {
		a, err := net.ResolveTCPAddr("tcp", cfg.RaftAdvertise)
		if err != nil {
			return nil, fmt.Errorf("replication: raft advertise address %q: %w", cfg.RaftAdvertise, err)
		}
		advertise = a
	}
	ln, err := net.Listen("tcp", cfg.RaftAddr)
	if err != nil {
		return nil, fmt.Errorf("replication: raft transport on %s: %w", cfg.RaftAddr, err)
	}
	s := &stream{Listener: ln, advertise: advertise, ended: ended, dial: dialTCP}
	if cfg.PeerTLS != nil {
		s.Listener, s.dial = tls.NewListener(ln, cfg.PeerTLS.Listen), cfg.PeerTLS.dialer()
	}
	if a, ok := s.Addr().(*net.TCPAddr); !ok || a.IP == nil || a.IP.IsUnspecified() {
		_ = ln.Close()
		return nil, fmt.Errorf("replication: raft transport on %s: %w", cfg.RaftAddr, errNotAdvertisable)
	}
	c := *tc
	c.Stream = s
	return raft.NewNetworkTransportWithConfig(&c), nil
}

// errNotAdvertisable is returned for a raft address other nodes could not dial.
var errNotAdvertisable = errors.New("raft address is not advertisable: set RaftAdvertise")

// dialTCP dials a plain TCP connection (c and raw are the same).
func dialTCP(address string, timeout time.Duration) (c, raw net.Conn, err error) {
	c, err = net.DialTimeout("tcp", address, timeout)
	return c, c, err
}

// Accept waits for the next connection from another node.
func (s *stream) Accept() (net.Conn, error) {
	c, err := s.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &watchedConn{Conn: c, ended: s.ended}, nil
}

// Dial opens a connection to another node's raft port within timeout.
func (s *stream) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	c, raw, err := s.dial(string(address), timeout)
	if err != nil {
		return nil, err
	}
	return &dialedConn{Conn: c, raw: raw, redial: func() (net.Conn, net.Conn, error) { return s.dial(string(address), timeout) }}, nil
}

// dialedConn is a connection this node opened to another. Raft keeps these in a pool
// between RPCs and sends the next RPC on one without looking: if the other node's process
// ended meanwhile (it was restarted), that RPC fails — and a vote request is not sent
// again, so the election waits out a whole election timeout. So when a request starts on
// the connection (its first write, or a write after a read: raft reads each answer whole
// before it sends again), dialedConn checks that the other end has not closed it, and if
// it has, dials again and carries on on the new connection, with the deadlines set.
// Raft uses a connection from one goroutine at a time.
type dialedConn struct {
	net.Conn
	raw      net.Conn // the TCP connection (under TLS, if any), to look at
	redial   func() (c, raw net.Conn, err error)
	started  bool // a request is being written: its answer is not read yet
	rdl, wdl time.Time
}

func (c *dialedConn) Write(p []byte) (int, error) {
	if !c.started {
		c.started = true
		if peerclosed.Check(c.raw) != nil {
			nc, raw, err := c.redial()
			if err != nil {
				return 0, err
			}
			_ = c.Close() // the old connection
			c.Conn, c.raw = nc, raw
			_ = nc.SetReadDeadline(c.rdl)
			_ = nc.SetWriteDeadline(c.wdl)
		}
	}
	return c.Conn.Write(p)
}

func (c *dialedConn) Read(p []byte) (int, error) {
	c.started = false
	return c.Conn.Read(p)
}

func (c *dialedConn) SetDeadline(t time.Time) error {
	c.rdl, c.wdl = t, t
	return c.Conn.SetDeadline(t)
}

func (c *dialedConn) SetReadDeadline(t time.Time) error {
	c.rdl = t
	return c.Conn.SetReadDeadline(t)
}

func (c *dialedConn) SetWriteDeadline(t time.Time) error {
	c.wdl = t
	return c.Conn.SetWriteDeadline(t)
}

// Addr is the address other nodes reach this one at.
func (s *stream) Addr() net.Addr {
	if s.advertise != nil {
		return s.advertise
	}
	return s.Listener.Addr()
}

// watchedConn calls ended once, when a read fails: the other end closed or reset the
// connection, or this node closed it.
type watchedConn struct {
	net.Conn
	ended func()
	once  sync.Once
}

func (c *watchedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if err != nil {
		c.once.Do(c.ended)
	}
	return n, err
}

// transportConfig is the configuration of the network transport for cfg.
func transportConfig(cfg Config, hlog hclog.Logger) *raft.NetworkTransportConfig {
	// MaxRPCsInFlight 1 turns raft's pipelined replication off: its pipeline can deadlock
	// (the sender blocked on inprogressCh while the response decoder waits on doneCh,
	// hashicorp/raft#612), which the nemesis suite hit as a node hanging on shutdown and a
	// follower no longer receiving entries. Synchronous AppendEntries cost little on the
	// small batches a lock service sends.
	return &raft.NetworkTransportConfig{
		MaxPool: 3,
		// Timeout bounds every dial and every RPC's I/O (InstallSnapshot scales it by
		// size). It is twice the election timeout (at least 1 s, for a loaded machine): a
		// peer that has not answered by then has been given up by the cluster anyway, and
		// a short dial is what brings a node back soon after a partition heals. With the
		// former 10 s, a dial begun during a partition went on waiting out TCP's SYN
		// backoff after the heal (3.4 s once, long enough for the leader to lose its
		// majority when the next node was cut off).
		Timeout:         max(2*cfg.ElectionTimeout, time.Second),
		Logger:          hlog,
		MaxRPCsInFlight: 1,
	}
}
