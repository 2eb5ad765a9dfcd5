//go:build unix

package server

import (
	"errors"
	"syscall"
)

// tryWrite writes as much of p as the socket's buffer takes now, in one write system
// call that never waits (a full buffer writes 0 bytes, with no error). It reports
// false, having written nothing, when the connection has no file descriptor to try on
// (TLS, a net.Pipe in tests).
func (c *laneConn) tryWrite(p []byte) (n int, tried bool, err error) {
	if c.raw == nil {
		return 0, false, nil
	}
	werr := c.raw.Write(func(fd uintptr) bool {
		n, err = syscall.Write(int(fd), p)
		return true // one attempt: a socket that would block is the caller's to wait on
	})
	if errors.Is(err, syscall.EAGAIN) {
		n, err = 0, nil
	}
	if n < 0 {
		n = 0
	}
	if err == nil {
		err = werr
	}
	if err != nil {
		_ = c.Close() // as Write: the reader fails too, and the connection ends
	}
	return n, true, err
}
