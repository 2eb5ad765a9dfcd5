//go:build !unix

package peerclosed

import "net"

// Check cannot look at the socket on this platform; a closed connection shows up
// when the call reads its answer.
func Check(net.Conn) error { return nil }
