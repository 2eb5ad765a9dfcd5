//go:build unix

// Package peerclosed tells, without reading, whether the other end of a TCP connection
// has closed it.
package peerclosed

import (
	"errors"
	"io"
	"net"
	"syscall"
)

// Check reports, without blocking, whether the other side has closed conn: io.EOF
// when it has, the socket's error when there is one, nil when the connection is open (or
// holds data not yet read). It peeks, so it consumes nothing.
func Check(conn net.Conn) error {
	_, err := Peek(conn)
	return err
}

// Peek is Check that also tells whether data waits to be read (waiting true, err nil).
func Peek(conn net.Conn) (waiting bool, err error) {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return false, nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false, err
	}
	var (
		n    int
		rerr error
		buf  [1]byte
	)
	if err := rc.Read(func(fd uintptr) bool {
		n, _, rerr = syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		return true
	}); err != nil {
		return false, err
	}
	switch {
	case rerr == nil && n == 0:
		return false, io.EOF
	case rerr == nil:
		return true, nil
	case errors.Is(rerr, syscall.EAGAIN), errors.Is(rerr, syscall.EINTR):
		return false, nil
	default:
		return false, rerr
	}
}
