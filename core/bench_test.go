package core

import (
	"fmt"
	"testing"
)

// BenchmarkAcquireRelease measures State.Apply of an uncontended acquire and its
// release: the replicated hot path, without encoding or consensus.
func BenchmarkAcquireRelease(b *testing.B) {
	s := NewState(Limits{})
	if r := s.Apply(Command{Op: OpGrant, Lease: leaseA, TTLMillis: 10_000}); r.Err != nil {
		b.Fatal(r.Err)
	}
	acquire := Command{Op: OpAcquire, Lease: leaseA, Name: "orders/42", Class: Correctness, Holder: Holder{Host: "web-1", PID: 42}}
	release := Command{Op: OpRelease, Lease: leaseA, Name: "orders/42"}
	b.ReportAllocs()
	for b.Loop() {
		r := s.Apply(acquire)
		if r.Err != nil || r.Queued {
			b.Fatalf("acquire: %+v", r)
		}
		release.Token = r.Token
		if r := s.Apply(release); r.Err != nil {
			b.Fatal(r.Err)
		}
	}
}

// BenchmarkLocksAcquireRelease is the same on the leader's bare efficiency table.
func BenchmarkLocksAcquireRelease(b *testing.B) {
	t := NewLocks(Limits{})
	var seq counterSeq
	a := AcquireArgs{Lease: leaseA, Name: "cache/rebuild", Class: Efficiency}
	b.ReportAllocs()
	for b.Loop() {
		r := t.Acquire(a, &seq)
		if r.Err != nil {
			b.Fatal(r.Err)
		}
		if r := t.Release(leaseA, a.Name, r.Token, &seq); r.Err != nil {
			b.Fatal(r.Err)
		}
	}
}

// BenchmarkCodecCommand measures the log encoding of one acquire, both ways.
func BenchmarkCodecCommand(b *testing.B) {
	c := Command{Op: OpAcquire, Lease: leaseA, Name: "orders/42", Class: Correctness, Holder: Holder{Host: "web-1", PID: 42}, Wait: true}
	b.ReportAllocs()
	for b.Loop() {
		e, err := EncodeCommand(c)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := DecodeCommand(e); err != nil {
			b.Fatal(err)
		}
	}
}

// bigState returns a State with n correctness locks held by n/100 leases (100 locks each,
// under the default MaxLocksPerLease), every tenth lock with two waiters.
func bigState(b *testing.B, n int) *State {
	b.Helper()
	s := NewState(Limits{})
	leases := max(n/100, 3)
	for i := range leases {
		if r := s.Apply(Command{Op: OpGrant, Lease: lid(uint32(i + 1)), TTLMillis: 10_000}); r.Err != nil {
			b.Fatal(r.Err)
		}
	}
	for i := range n {
		name := fmt.Sprintf("tenant-%03d/orders/%07d", i%1000, i)
		holder := lid(uint32(i%leases + 1))
		c := Command{Op: OpAcquire, Lease: holder, Name: name, Class: Correctness, Holder: Holder{Host: "worker-17.example.internal", PID: uint32(i)}}
		if r := s.Apply(c); r.Err != nil {
			b.Fatal(r.Err)
		}
		if i%10 == 0 {
			for k := 1; k <= 2; k++ {
				c.Lease, c.Wait = lid(uint32((i+k)%leases+1)), true
				if r := s.Apply(c); r.Err != nil || !r.Queued {
					b.Fatalf("%+v", r)
				}
			}
		}
	}
	return s
}

// BenchmarkSnapshot100k measures MarshalSnapshot of 100k held locks (10k with waiters);
// bytes/snapshot is the snapshot's size.
func BenchmarkSnapshot100k(b *testing.B) {
	s := bigState(b, 100_000)
	var size int
	b.ReportAllocs()
	for b.Loop() {
		buf, err := s.MarshalSnapshot()
		if err != nil {
			b.Fatal(err)
		}
		size = len(buf)
	}
	b.SetBytes(int64(size))
	b.ReportMetric(float64(size), "bytes/snapshot")
}

// BenchmarkRestore100k measures RestoreState of the same snapshot.
func BenchmarkRestore100k(b *testing.B) {
	buf, err := bigState(b, 100_000).MarshalSnapshot()
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := RestoreState(buf, Limits{}); err != nil {
			b.Fatal(err)
		}
	}
}
