package run

import (
	"math"
	"os"
	"slices"
	"time"
)

var selfPID = os.Getpid()

// Percentile returns the p-quantile (0 < p < 1) of d by the nearest-rank method; it
// sorts d in place. Zero when d is empty.
func Percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	if !slices.IsSorted(d) {
		slices.Sort(d)
	}
	i := int(math.Ceil(p*float64(len(d)))) - 1
	return d[min(max(i, 0), len(d)-1)]
}

// Ratio is a/b, +Inf when b is 0 and a is not, NaN when both are.
func Ratio(a, b float64) float64 {
	if b == 0 {
		if a == 0 {
			return math.NaN()
		}
		return math.Inf(1)
	}
	return a / b
}
