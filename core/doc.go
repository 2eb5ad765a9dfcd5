// Package core is leasehold's state machine: leases, exclusive locks with FIFO waiters,
// and the fencing-token sequence.
//
// The package is deterministic and pure. It starts no goroutines, reads no clock and does
// no I/O: time never enters it (lease countdowns live with the leader, which proposes an
// Expire command when one runs out), so every replica that applies the same commands in
// the same order reaches byte-identical state. Effects of a command — a waiter granted, a
// lease ended, a lock entering its lock-delay — are returned to the caller in a sorted,
// deterministic order instead of being acted on here.
//
// Two instances of the lock table exist on a leader: the replicated one inside State,
// which holds correctness locks, and the leader's in-memory one for efficiency locks.
// Both take tokens from the same cluster-wide sequence (see State.Apply with OpReserve).
//
// None of the types here are safe for concurrent use; their owners serialise access.
package core
