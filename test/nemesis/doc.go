// Package nemesis is leasehold's fault-injection suite: a real three-node cluster (the
// `leasehold` binary, built once per run, as separate processes), a mixed workload of
// correctness locks, fenced writes, plain and compare-and-set writes from several
// clients, and named faults one at a time — kill -9 of the leader or of a follower,
// SIGSTOP of the leader past the election timeout, a partition isolating the leader
// (network namespaces), a rolling restart — in an order drawn from a seeded RNG.
//
// After each run the recorded history is checked: the KV store with porcupine (a model
// per key: versions, compare-and-set, fence tokens; operations whose outcome is unknown
// get an infinite return time), and the lock invariants — one holder at a time as the
// holders see it (G2, G4b), tokens that never go backwards and are never reused (G1), no
// acknowledged grant lost, fenced writes ordered by token (G5), no lease reported gone
// sooner than its TTL after the last acknowledged keepalive (G4).
//
//	go test -run TestNemesisShort ./test/nemesis/    about two minutes, every fault once
//	make nemesis                                      NEMESIS_DURATION (default 10m)
//	make failover-bench                               kill -9 of the leader → next grant
//
// NEMESIS_SEED reproduces a run's fault schedule (printed at the start and on failure).
// Partitions need root (network namespaces); without it they are left out with a
// warning, and in CI (CI set) that is a failure.
package nemesis
