//go:build linux

package client

import (
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// tcpAcked tells, from the kernel's TCP state of conn, whether data sent on it waits to
// be acknowledged by the peer's TCP (unacked) and how long ago the last acknowledgement
// arrived (sinceAck). A peer whose TCP acknowledges is reachable, however busy (or
// stopped) its application. ok is false when the kernel cannot tell. A TLS connection
// is looked through to its TCP connection.
func tcpAcked(conn net.Conn) (unacked bool, sinceAck time.Duration, ok bool) {
	sc, isSys := rawConn(conn).(syscall.Conn)
	if !isSys {
		return false, 0, false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false, 0, false
	}
	var info *unix.TCPInfo
	var ierr error
	if err := rc.Control(func(fd uintptr) {
		info, ierr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	}); err != nil || ierr != nil {
		return false, 0, false
	}
	return info.Unacked > 0, time.Duration(info.Last_ack_recv) * time.Millisecond, true
}
