package server

import (
	"errors"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// TestObserveCounts checks that observe counts every call under its procedure and
// code, through the cached series for successes and the labelled ones for errors.
func TestObserveCounts(t *testing.T) {
	m := newMetrics(&Server{})
	const proc = "/leasehold.v1.LockService/Acquire"
	acquire, release := m.series(proc), m.series("/leasehold.v1.LockService/Release")
	for range 3 {
		m.observe(acquire, time.Now(), nil)
	}
	m.observe(acquire, time.Now(), connect.NewError(connect.CodeInvalidArgument, errors.New("bad name")))
	m.observe(release, time.Now(), nil)

	for _, c := range []struct {
		proc, code string
		want       float64
	}{
		{proc, "ok", 3},
		{proc, "invalid_argument", 1},
		{"/leasehold.v1.LockService/Release", "ok", 1},
	} {
		var got dto.Metric
		if err := m.requests.WithLabelValues(c.proc, c.code).Write(&got); err != nil {
			t.Fatal(err)
		}
		if got.GetCounter().GetValue() != c.want {
			t.Errorf("requests{%s,%s} = %v, want %v", c.proc, c.code, got.GetCounter().GetValue(), c.want)
		}
	}
	ch := make(chan prometheus.Metric, 8)
	m.latency.Collect(ch)
	close(ch)
	if got := len(ch); got != 2 {
		t.Errorf("latency series = %d, want 2 (one per procedure)", got)
	}
}

// BenchmarkObserve is the metrics cost of one successful call.
func BenchmarkObserve(b *testing.B) {
	m := newMetrics(&Server{})
	start := time.Now()
	p := m.series("/leasehold.v1.LockService/Acquire")
	b.ReportAllocs()
	for b.Loop() {
		m.observe(p, start, nil)
	}
}
