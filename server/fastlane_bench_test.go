package server_test

import (
	"net"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/fastlane"
)

// BenchmarkFastLaneKeepAlive measures the server's cost of a keepalive on the fast lane:
// one connection, keepalives of one lease sent 64 to a write (as a client renewing many
// leases sends them) and every answer read before the next 64 go. The node runs in this
// process, so allocs/op are the server's allocations per keepalive (the sender's own are
// none per op: its frames are encoded once).
func BenchmarkFastLaneKeepAlive(b *testing.B) {
	addr := startFastLaneNode(b)
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	if _, err := fastlane.ClientHello(conn, "", fastlane.Extensions{}); err != nil {
		b.Fatal(err)
	}
	r := fastlane.NewReader(conn)
	frame := func(m fastlane.Method, id uint64, msg proto.Message) []byte {
		f, err := fastlane.AppendFrame(nil, fastlane.KindRequest, m, id, func(p []byte) ([]byte, error) {
			return proto.MarshalOptions{}.MarshalAppend(p, msg)
		})
		if err != nil {
			b.Fatal(err)
		}
		return f
	}
	answer := func() fastlane.Frame {
		f, err := r.Read()
		if err != nil {
			b.Fatal(err)
		}
		if f.Kind != fastlane.KindResponse {
			b.Fatalf("answer of kind %d", f.Kind)
		}
		return f
	}
	if _, err := conn.Write(frame(methodGrant, 1, &leaseholdv1.GrantRequest{TtlMs: 60_000})); err != nil {
		b.Fatal(err)
	}
	var g leaseholdv1.GrantResponse
	if err := proto.Unmarshal(answer().Payload, &g); err != nil {
		b.Fatal(err)
	}
	const perWrite = 64
	// Ids 2..65 repeat: each batch is answered in full before the next is sent, so no id
	// is ever in flight twice.
	var batch []byte
	for i := range perWrite {
		batch = append(batch, frame(methodKeepAlive, uint64(2+i), &leaseholdv1.KeepAliveRequest{LeaseId: g.GetLeaseId()})...)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for sent := 0; sent < b.N; sent += perWrite {
		if _, err := conn.Write(batch); err != nil {
			b.Fatal(err)
		}
		for range perWrite {
			answer()
		}
	}
}
