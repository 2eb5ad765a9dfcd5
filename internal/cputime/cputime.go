// Package cputime reads the CPU time the process has used, for the benchmarks that
// report it beside wall time: CPU time is steadier on a machine others share, because it
// leaves out the time the process waited for a CPU.
package cputime

import "time"

// Process returns the CPU time (user and system, all threads) the process has used so
// far; only differences between two calls mean anything. Where the system gives no
// such count it returns 0, and Supported reports false.
func Process() time.Duration { return process() }

// Supported reports whether Process counts on this system.
func Supported() bool { return supported }
