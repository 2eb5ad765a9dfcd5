package service

import (
	"errors"
	"log/slog"
	"net"
	"sync"
	"syscall"
)

// connLimit bounds the connections each client IP address holds open, over every
// listener it wraps (the API port and the fast lane share one bound, G6): a connection
// beyond the bound is closed as soon as it is accepted, before anything is read from
// it, so that one client cannot take all of the process's file descriptors. The first
// refusal from an address is logged, and again after the address has had no
// connection.
type connLimit struct {
	max int
	log *slog.Logger

	mu    sync.Mutex
	conns map[string]*addrConns
}

type addrConns struct {
	open    int
	refused bool // logged
}

func newConnLimit(maxPerAddr int, log *slog.Logger) *connLimit {
	return &connLimit{max: maxPerAddr, log: log, conns: make(map[string]*addrConns)}
}

// wrap returns ln with the bound applied; ln itself when there is no bound.
func (l *connLimit) wrap(ln net.Listener) net.Listener {
	if l.max <= 0 {
		return ln
	}
	return &limitedListener{Listener: ln, limit: l}
}

// take counts a new connection from host, or reports false when host has its fill.
func (l *connLimit) take(host string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	a := l.conns[host]
	if a == nil {
		a = new(addrConns)
		l.conns[host] = a
	}
	if a.open >= l.max {
		if !a.refused {
			a.refused = true
			l.log.Warn("refusing connections from a client over the per-address bound", "client", host, "bound", l.max)
		}
		return false
	}
	a.open++
	return true
}

func (l *connLimit) release(host string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if a := l.conns[host]; a != nil {
		if a.open--; a.open <= 0 {
			delete(l.conns, host)
		}
	}
}

type limitedListener struct {
	net.Listener
	limit *connLimit
}

// Accept returns the next connection whose address is under its bound; it closes the
// others on the way.
func (ln *limitedListener) Accept() (net.Conn, error) {
	for {
		conn, err := ln.Listener.Accept()
		if err != nil {
			return nil, err
		}
		host := conn.RemoteAddr().String()
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		if !ln.limit.take(host) {
			_ = conn.Close()
			continue
		}
		return &limitedConn{Conn: conn, release: sync.OnceFunc(func() { ln.limit.release(host) })}, nil
	}
}

// limitedConn is an accepted connection counted against its address's bound until it
// is closed. It passes the socket through (syscall.Conn) as the TCP connection it wraps
// does: code that takes the socket for a system call of its own (a write that never
// waits, a look at what the peer sent) must not find it gone because a bound is on, and
// fall back without a word — session 12 found a fast-lane shortcut that had never run
// for that reason.
type limitedConn struct {
	net.Conn
	release func()
}

// errNoSocket: the wrapped connection has no socket to hand out.
var errNoSocket = errors.New("service: connection has no socket")

// SyscallConn returns the wrapped connection's raw socket.
func (c *limitedConn) SyscallConn() (syscall.RawConn, error) {
	if sc, ok := c.Conn.(syscall.Conn); ok {
		return sc.SyscallConn()
	}
	return nil, errNoSocket
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.release()
	return err
}
