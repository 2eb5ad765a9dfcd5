//go:build !unix && !windows

package cputime

import "time"

const supported = false

func process() time.Duration { return 0 }
