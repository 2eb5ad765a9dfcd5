package server_test

import (
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
	l := dialLane(b, startFastLaneNode(b))
	_ = l.conn.SetDeadline(time.Time{}) // however long -benchtime makes the run
	lease := l.lease()
	const perWrite = 64
	// The batch's ids repeat: each batch is answered in full before the next is sent,
	// so no id is ever in flight twice.
	var batch []byte
	for i := range perWrite {
		f, err := fastlane.AppendFrame(nil, fastlane.KindRequest, methodKeepAlive, l.next+1+uint64(i), func(p []byte) ([]byte, error) {
			return proto.MarshalOptions{}.MarshalAppend(p, &leaseholdv1.KeepAliveRequest{LeaseId: lease})
		})
		if err != nil {
			b.Fatal(err)
		}
		batch = append(batch, f...)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for sent := 0; sent < b.N; sent += perWrite {
		if _, err := l.conn.Write(batch); err != nil {
			b.Fatal(err)
		}
		for range perWrite {
			if f, err := l.r.Read(); err != nil || f.Kind != fastlane.KindResponse {
				b.Fatalf("answer: kind %d, %v", f.Kind, err)
			}
		}
	}
}
