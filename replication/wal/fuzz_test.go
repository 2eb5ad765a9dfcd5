package wal

import (
	"bytes"
	"errors"
	"os"
	"slices"
	"testing"

	"github.com/hashicorp/raft"
)

func seedRecords(f *testing.F) {
	for _, l := range []*raft.Log{entry(1, 1), entry(3, 2), entry(7, 9), {Index: 1 << 40, Term: 3, Data: bytes.Repeat([]byte{0}, 300)}} {
		b := appendRecord(nil, l, 0, int64(recordSize(l)))
		f.Add(b)
		f.Add(b[:len(b)/2])
		f.Add(append(b, b...))
		f.Add(append(slices.Clone(b), make([]byte, 200)...))             // preallocated
		f.Add(append(append(slices.Clone(b), b[:len(b)/2]...), 0, 0, 0)) // torn, then zeros
	}
	f.Add([]byte{})
	f.Add(make([]byte, 64))
}

// FuzzDecodeRecord: the decoder never panics or reads out of bounds, whatever the bytes;
// what it accepts re-encodes to exactly the bytes it consumed.
func FuzzDecodeRecord(f *testing.F) {
	seedRecords(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		r, n, err := decodeRecord(b)
		if err != nil {
			if n != 0 || !errors.Is(err, errShortRecord) && !errors.Is(err, errBadRecord) {
				t.Fatalf("error %v with n=%d", err, n)
			}
			return
		}
		if n < headerSize+payloadFixed || n > len(b) {
			t.Fatalf("n = %d for %d bytes", n, len(b))
		}
		var l raft.Log
		r.toLog(&l)
		again := appendRecord(nil, &l, r.batchStart, r.batchEnd)
		if !bytes.Equal(again, b[:n]) {
			t.Fatalf("re-encoding differs:\n%x\n%x", again, b[:n])
		}
	})
}

// FuzzOpenSegment: Open of a directory whose only segment holds arbitrary bytes never
// panics, and either fails or yields a log whose every entry reads back. (Slow: each
// input costs a directory and, when a tail is cut, an fsync.)
func FuzzOpenSegment(f *testing.F) {
	seedRecords(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		dir := t.TempDir()
		if err := os.WriteFile(segmentPath(dir, 1), b, 0o640); err != nil {
			t.Fatal(err)
		}
		l, err := Open(dir, Options{})
		if err != nil {
			return
		}
		defer l.Close()
		first, _ := l.FirstIndex()
		last, _ := l.LastIndex()
		for i := first; i <= last && last != 0; i++ {
			var e raft.Log
			if err := l.GetLog(i, &e); err != nil {
				t.Fatalf("GetLog(%d) in [%d, %d]: %v", i, first, last, err)
			}
		}
	})
}
