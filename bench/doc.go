// Package bench holds leasehold's benchmarks. It is a module of its own
// (github.com/leasehold/leasehold/bench) so that the peer clients it compares against —
// go-redis, the etcd client, go-zookeeper — never enter the main module.
//
// Two kinds live here:
//
//   - Go benchmarks (this package): BenchmarkAcquireRelease drives a real single-node
//     stack started in-process (raft log on disk, fsync on every commit) through the Go
//     client; BenchmarkFsync measures the disk's floor under every correctness commit.
//   - cmd/lockbench: leasehold against Redis, etcd and ZooKeeper on one machine in one
//     run, every server a separate process on loopback, each driven by the lock recipe
//     its users write (internal/peers), plus leasehold's scale runs (internal/scale). It
//     writes a markdown table, an SVG chart and JSON for docs/PERFORMANCE.md.
//
// From the repository root: `make bench` (everything), `make bench-quick` (about a
// minute), `make bench-peers-install` (the Debian packages of the peers).
package bench
