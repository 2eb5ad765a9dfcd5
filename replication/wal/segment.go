package wal

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// segment is one file of records with consecutive indexes starting at base, followed by
// free space. Its fields other than fileSize change only with both Log.writeMu and
// Log.mu held, so holding either one is enough to read them.
type segment struct {
	base    uint64
	path    string
	f       *os.File
	offsets []int64 // offsets[i] is where the record of index base+i starts
	size    int64   // end of the last record: the next batch is written here
	// fileSize is the length of the file. The bytes in [size, fileSize) are zeros
	// (free space written when the segment was preallocated), except while a write is
	// in flight; a batch that fits there overwrites them in place, one that does not
	// starts a new segment (or, in a segment holding no entries, extends the file).
	// A segment cut by a truncate has fileSize == size and so takes no more batches.
	// Only writers use it: writeMu.
	fileSize int64
}

// lastIndex is the index of the segment's last record; base-1 when it has none.
func (s *segment) lastIndex() uint64 { return s.base + uint64(len(s.offsets)) - 1 }

// span returns the byte range of the record of index i, which the segment must hold.
func (s *segment) span(i uint64) (off, end int64) {
	k := i - s.base
	off = s.offsets[k]
	end = s.size
	if k+1 < uint64(len(s.offsets)) {
		end = s.offsets[k+1]
	}
	return off, end
}

const (
	segPrefix = "wal-"
	segSuffix = ".seg"
)

func segmentName(base uint64) string { return fmt.Sprintf("%s%020d%s", segPrefix, base, segSuffix) }

func parseSegmentName(name string) (uint64, bool) {
	if !strings.HasPrefix(name, segPrefix) || !strings.HasSuffix(name, segSuffix) {
		return 0, false
	}
	base, err := strconv.ParseUint(name[len(segPrefix):len(name)-len(segSuffix)], 10, 64)
	if err != nil || base == 0 {
		return 0, false
	}
	return base, true
}

// scanResult is what scanSegment found in a segment's bytes.
type scanResult struct {
	offsets []int64
	end     int64 // end of the last valid record
	// bad is set when the scan stopped at an invalid record and the bytes from there
	// to the end of the data are not all zero. (Zeros there are free space: the end
	// of the segment's log.)
	bad    bool
	badOff int64
	reason error
	// prev is the last valid record before badOff, if any.
	prev    record
	hasPrev bool
}

// scanSegment decodes the records of data in order, checking checksums, that indexes
// run base, base+1, ..., and that each record lies in the batch it claims. It stops at
// the first record that fails; if only zeros follow, that is the end of the log in
// this segment and not a failure. A record whose checksum passes but whose index or
// batch bounds are wrong is never a torn write, so it is returned as an error at once.
func scanSegment(path string, data []byte, base uint64) (scanResult, error) {
	var res scanResult
	var off int64
	for off < int64(len(data)) {
		r, n, derr := decodeRecord(data[off:])
		if derr != nil {
			if !allZero(data[off:]) {
				res.bad, res.badOff, res.reason = true, off, derr
			}
			break
		}
		want := base + uint64(len(res.offsets))
		if r.index != want {
			return res, fmt.Errorf("%w: %s offset %d: index %d where %d was expected", ErrCorrupt, path, off, r.index, want)
		}
		if !r.framedAt(off, n) {
			return res, fmt.Errorf("%w: %s offset %d: record lies outside its batch [%d, %d)", ErrCorrupt, path, off, r.batchStart, r.batchEnd)
		}
		res.offsets = append(res.offsets, off)
		res.prev, res.hasPrev = r, true
		off += int64(n)
		res.end = off
	}
	return res, nil
}

// classifyTail decides whether the invalid bytes at res.badOff in the LAST segment are
// the torn remains of the final write, which was never acknowledged and may be cut
// away, or damage to an acknowledged write, which must not be.
//
// A StoreLogs call writes its batch with one write at the end of the log and returns
// only after fdatasync; a later batch is written only after that, right behind it, so
// any batch followed by another one was acknowledged. Beyond the end of the log a
// segment holds only zeros: it was zero-filled when created, and whatever is cut from
// it (a suffix delete, a failed write) is cut by a truncate or overwritten with zeros
// before anything else is written. A crash during the final write can leave any
// subset of its pages on disk (zeros, a cut, or later records intact while earlier
// ones are not), but nothing past its end. Every record names its batch's
// [start, end), so:
//
//   - the first valid record after badOff (searched byte by byte) from a batch that
//     starts after badOff proves that a later write followed: corrupt.
//   - one from the batch at badOff gives that batch's end; otherwise, if the last valid
//     record before badOff belongs to the same batch, its end does. The batch is the
//     final one, hence torn, only if nothing but zeros follows that end.
//   - with neither, nothing shows that anything acknowledged follows: torn.
//
// What cannot be told apart is damage confined to the final batch of the log, which
// looks exactly like a torn write of it. (With preallocation this includes the final
// batch whose successor, if any, left nothing but zeros on disk: a write that never
// reached the disk leaves no trace, where it used to leave a longer file.)
func classifyTail(data []byte, res scanResult) bool {
	x := res.badOff
	// A record starts with its length, never zero, so none starts in the zeros at
	// the end.
	limit := x + int64(lastNonZero(data[x:])) + 1
	for y := x + 1; y < limit && y+headerSize+payloadFixed <= int64(len(data)); y++ {
		n := binary.LittleEndian.Uint32(data[y : y+4])
		if n < payloadFixed || int64(n) > int64(len(data))-y-headerSize {
			continue
		}
		r, rn, err := decodeRecord(data[y:])
		if err != nil || !r.framedAt(y, rn) {
			continue
		}
		if r.batchStart > x {
			return false
		}
		return zeroFrom(data, r.batchEnd)
	}
	if res.hasPrev && x < res.prev.batchEnd {
		return zeroFrom(data, res.prev.batchEnd)
	}
	return true
}

// zeroPage is a block of zeros, never written: the source of zero-fill writes and
// the reference for allZero.
var zeroPage [64 << 10]byte

// allZero reports whether every byte of b is zero.
func allZero(b []byte) bool {
	for len(b) > 0 {
		n := min(len(b), len(zeroPage))
		if !bytes.Equal(b[:n], zeroPage[:n]) {
			return false
		}
		b = b[n:]
	}
	return true
}

// zeroFrom reports whether data holds only zeros from offset off on (trivially true
// when off is at or past its end).
func zeroFrom(data []byte, off int64) bool {
	return off >= int64(len(data)) || allZero(data[off:])
}

// lastNonZero returns the index of the last non-zero byte of b, or -1 if there is none.
func lastNonZero(b []byte) int {
	for end := len(b); end > 0; {
		start := max(0, end-len(zeroPage))
		if !bytes.Equal(b[start:end], zeroPage[:end-start]) {
			for i := end - 1; ; i-- {
				if b[i] != 0 {
					return i
				}
			}
		}
		end = start
	}
	return -1
}

// writeZeros overwrites [off, end) of f with zeros.
func writeZeros(f *os.File, off, end int64) error {
	for off < end {
		n := min(end-off, int64(len(zeroPage)))
		if _, err := f.WriteAt(zeroPage[:n], off); err != nil {
			return err
		}
		off += n
	}
	return nil
}

// syncDir fsyncs a directory so that file creations, renames and removals in it are
// durable. It is a variable so that tests can watch what is made durable when.
var syncDir = fsyncDir

func fsyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("wal: fsync directory %s: %w", dir, err)
	}
	return nil
}

func segmentPath(dir string, base uint64) string { return filepath.Join(dir, segmentName(base)) }
