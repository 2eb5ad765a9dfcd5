// Package e2e holds leasehold's end-to-end tests: they build the real `leasehold`
// binary (and the small helper programs under test/cmd) once per run, start servers and
// clients as separate processes on loopback ports, and inject process faults — kill -9
// and restart, SIGSTOP/SIGCONT of a client or of the server, SIGTERM — to check the
// guarantees of the design (G1 tokens never go backwards, G3 acknowledged means
// durable, G4 no early expiry, G4b the holder hears first) and the CLI's contract (exit
// codes, signal forwarding, killing CMD's process group when the lock is lost).
//
// Run them with `go test ./test/...`. Every process a test starts is killed when the
// test ends; a server's log is printed only when its test fails.
package e2e
