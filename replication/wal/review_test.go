package wal

import (
	"math/rand/v2"
	"os"
	"slices"
	"testing"
)

// knownBug skips a test that demonstrates an unfixed bug unless LEASEHOLD_KNOWN_BUGS=1.
func knownBug(t *testing.T) {
	t.Helper()
	if os.Getenv("LEASEHOLD_KNOWN_BUGS") != "1" {
		t.Skip("demonstrates a known bug; set LEASEHOLD_KNOWN_BUGS=1 to run")
	}
}

// tearWithGarbage returns data with [from, end) replaced by non-zero garbage: a
// write whose sectors reached the disk half-written.
func tearWithGarbage(data []byte, from, end int64) []byte {
	b := slices.Clone(data)
	rng := rand.New(rand.NewPCG(uint64(from), 11))
	for i := from; i < end; i++ {
		b[i] = byte(rng.Uint32()) | 1
	}
	return b
}

// TestTornTailAfterKeptPrefixOfTornBatch: a crash tears batch 11..14 after its first
// two records reached the disk; Open keeps 11 and 12 (their batch bounds still say
// [start of 11, end of 14)) and zeroes the rest, and appends continue in place, right
// after 12 (before the fix; now in a new segment). A second crash tears the next
// batch, 13..20, which ran past where batch 11..14 would have ended. Nothing of 13..20 was acknowledged, so Open must cut it
// and come back with 1..12; it must not refuse to start.
func TestTornTailAfterKeptPrefixOfTornBatch(t *testing.T) {
	for _, first := range []string{"garbage", "zeros"} {
		t.Run(first, func(t *testing.T) {
			dir := t.TempDir()
			l := openT(t, dir, Options{})
			must(t, l.StoreLogs(entries(1, 5, 1)))
			must(t, l.StoreLogs(entries(6, 10, 1)))
			must(t, l.StoreLogs(entries(11, 14, 2)))
			s := l.segs[len(l.segs)-1]
			path, off13, endB := s.path, s.offsets[13-s.base], s.size
			must(t, l.Close())

			// First crash: records 11 and 12 of the final batch are intact, the rest
			// of it is garbage (sectors written halfway) or zeros (pages never written).
			data, err := os.ReadFile(path)
			must(t, err)
			if first == "garbage" {
				data = tearWithGarbage(data, off13, endB)
			} else {
				clear(data[off13:endB])
			}
			must(t, os.WriteFile(path, data, 0o640))
			l = expectPrefix(t, dir, 12, "first crash")

			// Raft appends 13..20 (the leader re-sends them): they run past endB.
			must(t, l.StoreLogs(entries(13, 20, 2)))
			s = l.segs[len(l.segs)-1]
			if s.path == path && s.size <= endB {
				t.Fatalf("batch 13..20 ends at %d; the test wants it past %d", s.size, endB)
			}
			path13, off, endC := s.path, s.offsets[13-s.base], s.size
			l.closeFiles() // second crash while 13..20 was being written (never acknowledged)
			data, err = os.ReadFile(path13)
			must(t, err)
			must(t, os.WriteFile(path13, tearWithGarbage(data, off+3, endC), 0o640))

			l2, err := Open(dir, Options{})
			if err != nil {
				t.Fatalf("Open after a torn, never-acknowledged batch: %v", err)
			}
			t.Cleanup(func() { _ = l2.Close() })
			m := newModel()
			m.store(entries(1, 10, 1))
			m.store(entries(11, 12, 2))
			m.check(t, l2, "second crash")
			must(t, l2.StoreLogs(entries(13, 13, 3)))
		})
	}
}
