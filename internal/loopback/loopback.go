// Package loopback gives tests the two ends of a real TCP connection on the loopback
// interface: unlike a net.Pipe it has socket buffers, so a peer that reads less than
// was written does not block the writer until they fill, and the ends have file
// descriptors.
package loopback

import (
	"net"
	"testing"
)

// Pair returns the two ends of a loopback TCP connection, closed when the test ends.
func Pair(t testing.TB) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server = <-accepted
	if server == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { _ = client.Close(); _ = server.Close() })
	return client, server
}
