package fastlane_test

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/leasehold/leasehold/fastlane"
	"github.com/leasehold/leasehold/internal/loopback"
)

const (
	clusterA = "0123456789abcdef0123456789abcdef"
	clusterB = "fedcba9876543210fedcba9876543210"
)

// tcpPair returns the two ends of a loopback TCP connection (a net.Pipe has no buffer,
// and a peer that reads less than was written would block the writer).
func tcpPair(t *testing.T) (client, server net.Conn) { return loopback.Pair(t) }

// TestHelloClusterID: the version-2 handshake carries the cluster ID both ways; a client
// learns the server's, and a server of another cluster (or of none) than the client
// expects is refused by both sides.
func TestHelloClusterID(t *testing.T) {
	for _, tc := range []struct {
		name, expect, own string
		wrong             bool
	}{
		{"same cluster", clusterA, clusterA, false},
		{"client learns", "", clusterA, false},
		{"neither knows", "", "", false},
		{"other cluster", clusterA, clusterB, true},
		{"server has none", clusterA, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, s := tcpPair(t)
			serr := make(chan error, 1)
			go func() { _, err := fastlane.ServerHello(s, tc.own); serr <- err }()
			got, err := fastlane.ClientHello(c, tc.expect, fastlane.Extensions{})
			if tc.wrong != errors.Is(err, fastlane.ErrWrongCluster) {
				t.Fatalf("client: %v", err)
			}
			if err := <-serr; tc.wrong != errors.Is(err, fastlane.ErrWrongCluster) {
				t.Fatalf("server: %v", err)
			}
			if !tc.wrong && got != tc.own {
				t.Fatalf("client got cluster %q, the server is of %q", got, tc.own)
			}
		})
	}
}

// TestHelloVersion1Client: a client of version 1 (8-byte hello, no cluster ID) gets the
// version-1 answer and is served, without a check.
func TestHelloVersion1Client(t *testing.T) {
	c, s := tcpPair(t)
	serr := make(chan error, 1)
	go func() { _, err := fastlane.ServerHello(s, clusterA); serr <- err }()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("LHFL\x00\x01\x00\x00")); err != nil {
		t.Fatal(err)
	}
	var resp [16]byte // the version-1 answer
	if _, err := io.ReadFull(c, resp[:]); err != nil {
		t.Fatal(err)
	}
	if v := binary.BigEndian.Uint16(resp[4:6]); string(resp[:4]) != fastlane.Magic || v != 1 {
		t.Fatalf("answer %q, version %d", resp[:4], v)
	}
	if err := <-serr; err != nil {
		t.Fatalf("a version-1 client is refused: %v", err)
	}
	// The connection carries frames now: nothing else comes from the server.
	_ = c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if n, err := c.Read(resp[:1]); n != 0 || err == nil {
		t.Fatalf("more bytes after the version-1 answer (%d, %v)", n, err)
	}
}

// TestHelloVersion1Server: a server of version 1 answers a version-2 hello with its own
// version and closes; the client reports fastlane.ErrVersion (and falls back to Connect).
func TestHelloVersion1Server(t *testing.T) {
	c, s := tcpPair(t)
	go func() {
		var hello [8]byte // the version-1 hello
		if _, err := io.ReadFull(s, hello[:]); err != nil {
			return
		}
		resp := binary.BigEndian.AppendUint16([]byte(fastlane.Magic), 1)
		resp = binary.BigEndian.AppendUint16(resp, 0)
		resp = binary.BigEndian.AppendUint32(resp, fastlane.MaxFrame)
		resp = binary.BigEndian.AppendUint32(resp, fastlane.MaxInFlight)
		_, _ = s.Write(resp)
		_ = s.Close()
	}()
	if _, err := fastlane.ClientHello(c, clusterA, fastlane.Extensions{}); !errors.Is(err, fastlane.ErrVersion) {
		t.Fatalf("hello to a version-1 server: %v, want fastlane.ErrVersion", err)
	}
}

func TestHelloRejectsBadClusterID(t *testing.T) {
	c, _ := tcpPair(t)
	if _, err := fastlane.ClientHello(c, "not hex", fastlane.Extensions{}); err == nil {
		t.Fatal("a malformed cluster ID was sent")
	}
}

// TestHelloGoAway: a client that sets FlagGoAway is answered with it, and ServerHello
// reports it (the server then sends a GOAWAY before it closes the connection to shut
// down); a client that does not set it is not, with or without a token; the flag does
// not make the client send an extension block, and a token still arrives beside it.
func TestHelloGoAway(t *testing.T) {
	for _, ext := range []fastlane.Extensions{{}, {GoAway: true}, {Token: "t"}, {Token: "t", GoAway: true}} {
		c, s := tcpPair(t)
		got := make(chan fastlane.Extensions, 1)
		serr := make(chan error, 1)
		go func() {
			e, err := fastlane.ServerHello(s, clusterA)
			got <- e
			serr <- err
		}()
		if _, err := fastlane.ClientHello(c, clusterA, ext); err != nil {
			t.Fatalf("%+v: client: %v", ext, err)
		}
		if err := <-serr; err != nil {
			t.Fatalf("%+v: server: %v", ext, err)
		}
		if e := <-got; e != ext {
			t.Fatalf("the server took %+v from a client offering %+v", e, ext)
		}
		// Nothing more follows the handshake (no stray extension block).
		_ = s.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		var b [1]byte
		if n, err := s.Read(b[:]); n != 0 || err == nil {
			t.Fatalf("%+v: %d more bytes after the handshake (%v)", ext, n, err)
		}
	}
	if f := fastlane.GoAwayFrame(); len(f) != 4+fastlane.HeaderLen || fastlane.Kind(f[4]) != fastlane.KindGoAway {
		t.Fatalf("GoAwayFrame = %x", f)
	}
}
