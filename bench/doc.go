// Package bench holds leasehold's benchmarks. It is a module of its own
// (github.com/leasehold/leasehold/bench) so that the peers it compares against — the
// clients go-redis, rueidis, the etcd client and go-zookeeper, and the raft log store
// hashicorp/raft-wal — never enter the main module.
//
// Two kinds live here:
//
//   - Go benchmarks (this package): BenchmarkAcquireRelease drives a real single-node
//     stack started in-process (raft log on disk, fsync on every commit) through the Go
//     client; BenchmarkFsync measures the disk's floor under every correctness commit;
//     BenchmarkLogStores* compare raft log store engines: replication/wal,
//     hashicorp/raft-wal and raft-boltdb.
//   - cmd/lockbench: leasehold against Redis, etcd and ZooKeeper on one machine in one
//     run, every server a separate process on loopback, each driven by the lock recipe
//     its users write (internal/peers), plus leasehold's scale runs (internal/scale). It
//     writes a markdown table, an SVG chart and JSON for docs/PERFORMANCE.md.
//
// From the repository root: `make bench` (everything), `make bench-quick` (about
// three minutes), `make bench-peers-install` (the Debian packages of the peers).
package bench
