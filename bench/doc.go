// Package bench holds leasehold's benchmarks: a real single-node stack (raft log on
// disk, fsync on every commit) served over loopback HTTP/2, driven through the Go
// client. Run with `make bench`; the numbers go in docs/PERFORMANCE.md.
package bench
