package bench

import (
	"testing"

	"github.com/leasehold/leasehold/internal/testnode"
)

// startStack runs a single-node server in this process on a temporary data dir and
// returns its API address. Everything stops at the end of the benchmark.
func startStack(tb testing.TB) string {
	tb.Helper()
	return testnode.Start(tb).Addr()
}
