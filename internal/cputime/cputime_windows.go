//go:build windows

package cputime

import (
	"syscall"
	"time"
)

const supported = true

func process() time.Duration {
	h, err := syscall.GetCurrentProcess()
	if err != nil {
		return 0
	}
	var created, exited, kernel, user syscall.Filetime
	if syscall.GetProcessTimes(h, &created, &exited, &kernel, &user) != nil {
		return 0
	}
	return span(kernel) + span(user)
}

// span converts a FILETIME that holds a duration (in 100 ns units) — not a point in
// time, which Filetime.Nanoseconds would shift to the Unix epoch.
func span(f syscall.Filetime) time.Duration {
	return time.Duration(uint64(f.HighDateTime)<<32|uint64(f.LowDateTime)) * 100
}
