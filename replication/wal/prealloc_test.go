package wal

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	st, err := os.Stat(path)
	must(t, err)
	return st.Size()
}

// TestPreallocatedSegments: every segment is created zero-filled to SegmentSize, a
// batch that fits overwrites the zeros without changing the file's size, one that does
// not starts a new segment, and the spare is ready before it is needed and gone after
// Close.
func TestPreallocatedSegments(t *testing.T) {
	const segSize = 8 << 10
	dir := t.TempDir()
	l := openT(t, dir, Options{SegmentSize: segSize})
	next := uint64(1)
	for range 60 {
		n := len(l.segs)
		must(t, l.StoreLogs(entries(next, next+4, 1)))
		next += 5
		s := l.segs[len(l.segs)-1]
		if got := fileSize(t, s.path); got != segSize {
			t.Fatalf("after index %d, %s is %d bytes; want %d", next-1, s.path, got, segSize)
		}
		if len(l.segs) > n && n > 0 {
			prev := l.segs[n-1]
			b, err := os.ReadFile(prev.path)
			must(t, err)
			if !allZero(b[prev.size:]) {
				t.Fatalf("free space of the full segment %s is not zeros", prev.path)
			}
		}
	}
	if len(l.segs) < 3 {
		t.Fatalf("%d segments for 300 entries of 8 KiB segments; want several", len(l.segs))
	}
	// The active segment is past half full by now or soon: the spare appears.
	for s := l.segs[len(l.segs)-1]; 2*(s.fileSize-s.size) >= segSize; next += 5 {
		must(t, l.StoreLogs(entries(next, next+4, 1)))
	}
	spare := filepath.Join(dir, spareName)
	deadline := time.Now().Add(20 * time.Second)
	for {
		if st, err := os.Stat(spare); err == nil && st.Size() == segSize {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no spare segment prepared while the active one is past half full")
		}
		time.Sleep(time.Millisecond)
	}
	must(t, l.Close())
	if _, err := os.Stat(spare); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("spare left after Close: %v", err)
	}
	m := newModel()
	m.store(entries(1, next-1, 1))
	m.check(t, openT(t, dir, Options{SegmentSize: segSize}), "reopened")
}

// TestBatchLargerThanSegment: a batch is never split; one that does not fit in an empty
// segment makes the file grow, and the next batch starts a new segment.
func TestBatchLargerThanSegment(t *testing.T) {
	dir := t.TempDir()
	opts := Options{SegmentSize: 1024}
	l := openT(t, dir, opts)
	must(t, l.StoreLogs(entries(1, 2, 1)))
	must(t, l.StoreLogs(entries(3, 60, 1))) // about 5 KiB
	big := l.segs[len(l.segs)-1]
	if big.base != 3 || fileSize(t, big.path) != big.size || big.size <= 1024 {
		t.Fatalf("big batch in segment %d of %d bytes holding %d", big.base, fileSize(t, big.path), big.size)
	}
	must(t, l.StoreLogs(entries(61, 62, 1)))
	if s := l.segs[len(l.segs)-1]; s.base != 61 {
		t.Fatalf("batch after the big one went to segment %d; want a new one", s.base)
	}
	must(t, l.Close())
	m := newModel()
	m.store(entries(1, 62, 1))
	m.check(t, openT(t, dir, opts), "reopened")
}

// TestSuffixDeleteNeverResurrects: entries removed by a suffix delete must not come
// back after a reopen, even when the entries written in their place have exactly the
// same sizes (so that a stale record would start right where the new ones end).
func TestSuffixDeleteNeverResurrects(t *testing.T) {
	for _, reopenBetween := range []bool{false, true} {
		dir := t.TempDir()
		l := openT(t, dir, Options{})
		must(t, l.StoreLogs(entries(1, 7, 1)))
		must(t, l.StoreLogs(entries(8, 9, 1)))
		must(t, l.StoreLogs(entries(10, 11, 1)))
		must(t, l.DeleteRange(8, 11))
		if reopenBetween {
			must(t, l.Close())
			l = openT(t, dir, Options{})
		}
		must(t, l.StoreLogs(entries(8, 9, 2))) // same sizes as the term-1 records
		must(t, l.Close())
		l = openT(t, dir, Options{})
		m := newModel()
		m.store(entries(1, 7, 1))
		m.store(entries(8, 9, 2))
		m.check(t, l, "reopened")
		// Nothing of the deleted records is left in any file.
		for _, p := range segmentFiles(t, dir) {
			b, err := os.ReadFile(p)
			must(t, err)
			for i := uint64(10); i <= 11; i++ {
				if bytes.Contains(b, entry(i, 1).Data) {
					t.Fatalf("%s still holds deleted index %d", p, i)
				}
			}
		}
		must(t, l.Close())
	}
}

// TestOpensPreviousLayout: directories written before segments were preallocated have
// segments that end where their records do. They open as they are, and the log goes
// on in new, preallocated segments.
func TestOpensPreviousLayout(t *testing.T) {
	const segSize = 2048
	dir := t.TempDir()
	ends := fillSegments(t, dir, segSize)
	for p, end := range ends {
		must(t, os.Truncate(p, end))
	}
	last := segmentFiles(t, dir)[len(ends)-1]

	l := openT(t, dir, Options{SegmentSize: segSize})
	m := newModel()
	m.store(entries(1, 200, 1))
	m.check(t, l, "previous layout")
	must(t, l.StoreLogs(entries(201, 203, 1)))
	if s := l.segs[len(l.segs)-1]; s.base != 201 || fileSize(t, s.path) != segSize {
		t.Fatalf("append after opening the previous layout went to segment %d of %d bytes; want a new preallocated one", s.base, fileSize(t, s.path))
	}
	if got := fileSize(t, last); got != ends[last] {
		t.Fatalf("the previous layout's last segment changed size: %d, was %d", got, ends[last])
	}
	must(t, l.Close())
	m.store(entries(201, 203, 1))
	m.check(t, openT(t, dir, Options{SegmentSize: segSize}), "appended, reopened")
}

// TestFailedWrite: after a write error nothing of the batch is visible or comes back
// after a reopen, and the log goes on: in a new segment if the failed one holds entries
// (its free space is cut off with the failed bytes), in the same one otherwise.
func TestFailedWrite(t *testing.T) {
	for _, firstInSegment := range []bool{false, true} {
		dir := t.TempDir()
		fail := false
		opts := Options{SegmentSize: 4096, writeHook: func(f *os.File, b []byte, off int64) error {
			if fail {
				fail = false
				_, _ = f.WriteAt(b[:len(b)/2], off) // half of it reaches the file
				return errors.New("injected EIO")
			}
			_, err := f.WriteAt(b, off)
			return err
		}}
		l := openT(t, dir, opts)
		must(t, l.StoreLogs(entries(1, 10, 1)))
		if firstInSegment {
			for l.segs[len(l.segs)-1].size+2*int64(recordSize(entry(11, 1))) < 4096 {
				must(t, l.StoreLogs(entries(l.last+1, l.last+1, 1)))
			}
		}
		n := l.last
		fail = true
		if err := l.StoreLogs(entries(n+1, n+3, 1)); err == nil {
			t.Fatal("StoreLogs succeeded although its write failed")
		}
		if last, _ := l.LastIndex(); last != n {
			t.Fatalf("LastIndex = %d after a failed write; want %d", last, n)
		}
		failed := l.segs[len(l.segs)-1]
		if got := fileSize(t, failed.path); got != failed.size || (len(failed.offsets) == 0) != firstInSegment {
			t.Fatalf("segment of the failed write: %d bytes, %d entries, records end at %d", got, len(failed.offsets), failed.size)
		}
		must(t, l.StoreLogs(entries(n+1, n+1, 2)))
		if s := l.segs[len(l.segs)-1]; (s == failed) != firstInSegment || s.offsets[len(s.offsets)-1] != 0 {
			t.Fatalf("index %d went to segment %d offset %d", n+1, s.base, s.offsets[len(s.offsets)-1])
		}
		must(t, l.Close())
		m := newModel()
		m.store(entries(1, n, 1))
		m.store(entries(n+1, n+1, 2))
		l = openT(t, dir, opts)
		m.check(t, l, "reopened")
		must(t, l.Close())
	}
}

// fillSegments writes entries 1..200 in batches of 10 to a new log in dir with small
// segments, closes it, and returns where each segment's records end.
func fillSegments(t *testing.T, dir string, segSize int64) map[string]int64 {
	t.Helper()
	l := openT(t, dir, Options{SegmentSize: segSize})
	for i := uint64(1); i <= 200; i += 10 {
		must(t, l.StoreLogs(entries(i, i+9, 1)))
	}
	ends := map[string]int64{}
	for _, s := range l.segs {
		ends[s.path] = s.size
	}
	must(t, l.Close())
	return ends
}
