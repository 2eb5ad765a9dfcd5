//go:build race

package core

// raceEnabled: this test binary runs under the race detector. The core is pure and
// single-threaded, so the detector adds nothing to its long property runs but time (ten
// times as much); they run fewer seeds then, and `make test` runs them in full without
// it.
const raceEnabled = true
