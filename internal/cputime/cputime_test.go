package cputime_test

import (
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/cputime"
)

// TestProcessCounts: spinning for 50 ms of wall time adds CPU time, not more than the
// wall time passed times the CPUs, and never goes backwards.
func TestProcessCounts(t *testing.T) {
	if !cputime.Supported() {
		t.Skip("no CPU time count on this system")
	}
	before, start := cputime.Process(), time.Now()
	for time.Since(start) < 50*time.Millisecond {
	}
	used := cputime.Process() - before
	if used <= 0 || used > 10*time.Since(start) {
		t.Fatalf("50 ms of spinning counted as %v of CPU", used)
	}
}
