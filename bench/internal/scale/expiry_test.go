package scale

import (
	"context"
	"testing"
	"time"

	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/internal/testnode"
)

// TestLaneGenKeepsAliveThenExpires runs the generator of the million-lease run at a
// small size against an in-process node: every lease is granted and renewed on
// schedule (none refused), and once the generator is killed the node expires every
// lease, none before the earliest its deadline can be.
func TestLaneGenKeepsAliveThenExpires(t *testing.T) {
	node := testnode.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	const n, ttl = 2000, 600 * time.Millisecond
	gen, err := newLaneGen(ctx, node.FastLaneAddr(), "", n, 4, ttl)
	if err != nil {
		t.Fatal(err)
	}
	gctx, kill := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { gen.run(gctx); close(done) }()
	time.Sleep(3 * ttl) // several renewals of every lease
	c, err := client.Dial(ctx, node.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close(context.Background()) }()
	st, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, renewed, refused := gen.granted.Load(), gen.renewals.Load(), gen.refused.Load(); got != n || st.GetLeases() != n || renewed < n || refused != 0 {
		errs, first := gen.errs.get()
		t.Fatalf("granted %d, server has %d, renewed %d, refused %d of %d leases (%d errors, first %q)", got, st.GetLeases(), renewed, refused, n, errs, first)
	}
	kill()
	<-done
	earliest, _ := deadlines(gen)
	if len(earliest) != n {
		t.Fatalf("%d leases alive at the kill, want %d", len(earliest), n)
	}
	var samples []countSample
	for deadline := time.Now().Add(5 * ttl); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		st, err := c.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		samples = append(samples, countSample{at: gen.now(), left: int(st.GetLeases())})
		if st.GetLeases() == 0 {
			break
		}
	}
	if left := samples[len(samples)-1].left; left != 0 {
		t.Fatalf("%d leases still there %v after the kill", left, 5*ttl)
	}
	early, _, p99, _ := outsideLateness(samples, earliest)
	if early != 0 {
		t.Fatalf("%d leases expired before their TTL had passed", early)
	}
	t.Logf("%d leases expired, lateness p99 from outside %v", n, p99)
}

// TestOutsideLateness checks the outside view's matching on a made-up history: four
// leases due at 10, 20, 30 and 40 ms, gone by the samples at 15 (one), 35 (three) and 45
// (all): lateness 5, 15, 5 and 5 ms; and a sample showing two gone at 15 ms, when only
// one could have been, counts one early.
func TestOutsideLateness(t *testing.T) {
	ms := func(d int64) int64 { return d * int64(time.Millisecond) }
	due := []int64{ms(10), ms(20), ms(30), ms(40)}
	early, p50, p99, maxLate := outsideLateness([]countSample{{ms(15), 3}, {ms(35), 1}, {ms(45), 0}}, due)
	if early != 0 || p50 != 5*time.Millisecond || p99 != 15*time.Millisecond || maxLate != 15*time.Millisecond {
		t.Fatalf("early %d, p50 %v, p99 %v, max %v; want 0, 5ms, 15ms, 15ms", early, p50, p99, maxLate)
	}
	if early, _, _, _ := outsideLateness([]countSample{{ms(15), 2}, {ms(45), 0}}, due); early != 1 {
		t.Fatalf("early %d, want 1", early)
	}
}

// TestLatenessQuantile reads a histogram's quantile from two expositions as
// histogram_quantile would: 100 expiries, 90 of them within 256 ms and the rest within
// 512 ms, so the 99th is nine tenths of the way through the 256–512 ms bucket.
func TestLatenessQuantile(t *testing.T) {
	before := `# TYPE leasehold_expiry_lateness_seconds histogram
leasehold_expiry_lateness_seconds_bucket{le="0.256"} 5
leasehold_expiry_lateness_seconds_bucket{le="0.512"} 5
leasehold_expiry_lateness_seconds_bucket{le="+Inf"} 5
leasehold_expiry_lateness_seconds_sum 1
leasehold_expiry_lateness_seconds_count 5
`
	after := `# HELP leasehold_expiry_lateness_seconds lateness
# TYPE leasehold_expiry_lateness_seconds histogram
leasehold_expiry_lateness_seconds_bucket{le="0.256"} 95
leasehold_expiry_lateness_seconds_bucket{le="0.512"} 105
leasehold_expiry_lateness_seconds_bucket{le="+Inf"} 105
leasehold_expiry_lateness_seconds_sum 30
leasehold_expiry_lateness_seconds_count 105
`
	n, q, bound := latenessQuantile(before, after, 0.99)
	want := time.Duration((0.256 + 0.256*0.9) * float64(time.Second))
	if n != 100 || bound != 512*time.Millisecond || q < want-time.Millisecond || q > want+time.Millisecond {
		t.Fatalf("got %v expiries, p99 %v in the bucket up to %v; want 100, about %v, 512ms", n, q, bound, want)
	}
}
