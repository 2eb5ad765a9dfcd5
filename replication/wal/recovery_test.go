package wal

import (
	"math/rand/v2"
	"os"
	"slices"
	"testing"

	"github.com/hashicorp/raft"
)

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

// TestRecoveredUnsyncedBatchMadeDurable: a process crash (kill -9) between the write
// of a batch and its fdatasync leaves the batch in the page cache only. The next Open
// reads it back as valid and serves it, so raft takes it as stored (a follower
// acknowledges it to the leader). Unless Open syncs it, it stays volatile. When the next
// batch goes to a new segment, nothing syncs the old one, and a power loss then leaves a
// hole between the segments: Open refuses the directory, and the entries acknowledged
// after the restart are out of reach.
//
// Power loss is simulated: each file's durable image is its content at its last sync
// through syncHook (the segment sync), and files are put back to those images.
func TestRecoveredUnsyncedBatchMadeDurable(t *testing.T) {
	dir := t.TempDir()
	durable := map[string][]byte{}
	crash := false
	opts := Options{
		SegmentSize: 2048,
		syncHook:    recordDurable(durable),
		crashHook: func(step string) {
			if crash && step == "store: before sync" {
				crash = false
				panic(&errCrash{step})
			}
		},
	}
	l := openT(t, dir, opts)
	must(t, l.StoreLogs(entries(1, 5, 1)))
	must(t, l.StoreLogs(entries(6, 10, 1)))
	s1 := l.segs[0].path

	// Batch 11..12 is written, then the process dies before its fdatasync.
	crash = true
	func() {
		defer func() {
			if r := recover(); r == nil {
				t.Fatal("no crash")
			}
		}()
		_ = l.StoreLogs(entries(11, 12, 1))
	}()
	l.closeFiles()

	// Restart: 11..12 are back (from the page cache), and raft goes on.
	l = openT(t, dir, opts)
	if last, _ := l.LastIndex(); last != 12 {
		t.Fatalf("LastIndex after restart = %d; want 12", last)
	}
	must(t, l.StoreLogs(entries(13, 40, 2))) // acknowledged; too big for segment 1
	if s := l.segs[len(l.segs)-1]; s.path == s1 {
		t.Fatal("the test wants 13..40 in a new segment")
	}
	l.closeFiles()

	// Power loss: every segment file is what its last sync made durable.
	for _, p := range segmentFiles(t, dir) {
		b, ok := durable[p]
		if !ok {
			t.Fatalf("%s was never synced", p)
		}
		must(t, os.WriteFile(p, b, 0o640))
	}
	l2, err := Open(dir, Options{SegmentSize: 2048})
	if err != nil {
		t.Fatalf("Open after power loss: %v (acknowledged entries 13..40 lost)", err)
	}
	t.Cleanup(func() { _ = l2.Close() })
	m := newModel()
	m.store(entries(1, 12, 1))
	m.store(entries(13, 40, 2))
	m.check(t, l2, "after power loss")
}

// TestRemovalByCrashedProcessMadeDurable: a suffix delete removes segments newest
// first and only then fsyncs the directory. A process crash in between leaves a
// removal that is not yet durable. Open builds the log on the directory as it finds it,
// and raft appends the entries that replace the deleted ones to the free space of the
// segment that is now the last. Nothing fsyncs the directory, so a power loss brings
// the removed segment back: Open then finds two segments holding the same index and
// refuses to start, and the entries acknowledged after the restart are out of reach.
//
// Power loss is simulated: a segment is its content at its last sync (syncHook), and
// the directory its listing at its last fsync (syncDir).
func TestRemovalByCrashedProcessMadeDurable(t *testing.T) {
	dir := t.TempDir()
	durable := map[string][]byte{}
	var listing []string // the directory's segments at its last fsync
	defer func(orig func(string) error) { syncDir = orig }(syncDir)
	syncDir = func(d string) error {
		if d == dir {
			listing = segmentFiles(t, dir)
		}
		return fsyncDir(d)
	}
	crashAt := ""
	opts := Options{
		SegmentSize: 2048,
		syncHook:    recordDurable(durable),
		crashHook: func(step string) {
			if step == crashAt {
				crashAt = ""
				panic(&errCrash{step})
			}
		},
	}
	l := openT(t, dir, opts)
	for i := uint64(1); i <= 60; i += 10 {
		must(t, l.StoreLogs(entries(i, i+9, 1)))
	}
	if len(l.segs) < 3 {
		t.Fatalf("%d segments; the test wants 3 or more", len(l.segs))
	}
	n := len(l.segs)
	prev := l.segs[n-3] // ends the log after the delete
	if prev.fileSize-prev.size < int64(recordSize(entry(l.segs[n-2].base, 2))) {
		t.Fatalf("segment %s has no room for one more entry", prev.path)
	}
	// Delete from the start of the last but one segment: it and the last one go,
	// newest first. The process dies after both removals, before the directory fsync
	// (the crash point before the second removal, then the removal itself).
	min, second := l.segs[n-2].base, l.segs[n-2].path
	crashAt = "remove: file 1"
	func() {
		defer func() {
			if r := recover(); r == nil {
				t.Fatal("no crash")
			}
		}()
		_ = l.DeleteRange(min, 1000)
	}()
	must(t, os.Remove(second))
	l.closeFiles()

	// Restart: the log ends at min-1, where the new leader's log goes on with its own
	// term, so raft appends without deleting anything (one entry; it fits in the free
	// space of the segment that now ends the log).
	l = openT(t, dir, opts)
	if last, _ := l.LastIndex(); last != min-1 {
		t.Fatalf("LastIndex after restart = %d; want %d", last, min-1)
	}
	next := min - 1
	must(t, l.StoreLogs(entries(min, min, 2))) // acknowledged
	if s := l.segs[len(l.segs)-1]; s.path != prev.path {
		t.Fatalf("entry %d went to %s; the test wants it in %s", min, s.path, prev.path)
	}
	l.closeFiles()

	// Power loss.
	now := segmentFiles(t, dir)
	for _, p := range listing {
		if !slices.Contains(now, p) {
			must(t, os.WriteFile(p, durable[p], 0o640)) // its removal was not durable
		}
	}
	for _, p := range now {
		if !slices.Contains(listing, p) {
			must(t, os.Remove(p)) // its creation was not durable
			continue
		}
		must(t, os.WriteFile(p, durable[p], 0o640))
	}
	l2, err := Open(dir, Options{SegmentSize: 2048})
	if err != nil {
		t.Fatalf("Open after power loss: %v (acknowledged entry %d lost)", err, next+1)
	}
	t.Cleanup(func() { _ = l2.Close() })
	if last, _ := l2.LastIndex(); last != next+1 {
		t.Fatalf("LastIndex after power loss = %d; want %d", last, next+1)
	}
	var e raft.Log
	must(t, l2.GetLog(next+1, &e))
	if e.Term != 2 {
		t.Fatalf("entry %d after power loss has term %d; want 2", next+1, e.Term)
	}
}

// recordDurable is a syncHook that keeps, in durable, each file's content as of its
// last sync (its image after a power loss), then syncs it.
func recordDurable(durable map[string][]byte) func(*os.File) error {
	return func(f *os.File) error {
		b, err := os.ReadFile(f.Name())
		if err != nil {
			return err
		}
		durable[f.Name()] = b
		return f.Sync()
	}
}
