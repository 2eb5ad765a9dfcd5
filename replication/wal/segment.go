package wal

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// segment is one append-only file of records with consecutive indexes starting at base.
// Its fields change only with both Log.writeMu and Log.mu held, so holding either one is
// enough to read them.
type segment struct {
	base    uint64
	path    string
	f       *os.File
	offsets []int64 // offsets[i] is where the record of index base+i starts
	size    int64   // end of the last record; the file may be longer only while a write is in flight
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
	// bad is set when the scan stopped at an invalid record before the end of the data.
	bad    bool
	badOff int64
	reason error
	// prev is the last valid record before badOff, if any.
	prev    record
	hasPrev bool
}

// scanSegment decodes the records of data in order, checking checksums, that indexes
// run base, base+1, ..., and that each record lies in the batch it claims. It stops at
// the first record that fails. A record whose checksum passes but whose index or batch
// bounds are wrong is never a torn write, so it is returned as an error at once.
func scanSegment(path string, data []byte, base uint64) (scanResult, error) {
	var res scanResult
	var off int64
	for off < int64(len(data)) {
		r, n, derr := decodeRecord(data[off:])
		if derr != nil {
			res.bad, res.badOff, res.reason = true, off, derr
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

// classifyTail decides whether the invalid record at res.badOff in the LAST segment is
// the torn remains of the final write, which was never acknowledged and may be cut
// away, or damage to an acknowledged write, which must not be.
//
// A StoreLogs call writes its batch with one write at the end of the file and returns
// only after fsync; a later batch is written only after that, so any batch followed
// by another one was acknowledged. A crash during the final write can leave any subset
// of its pages on disk (zeros, a cut, or later records intact while earlier ones are
// not). Every record names its batch's [start, end), so:
//
//   - if the last valid record before badOff belongs to the same batch, the batch's end
//     tells whether anything follows it: nothing (end >= file size) means it is the
//     final batch, hence torn; otherwise it was acknowledged, hence corrupt.
//   - otherwise badOff starts a batch. The first valid record after it (searched byte by
//     byte) settles it: none means nothing acknowledged follows; one from the same
//     batch reports that batch's end as above; one from a later batch means the batch
//     at badOff was acknowledged.
//
// What cannot be told apart is damage confined to the final batch of the log, which
// looks exactly like a torn write of it.
func classifyTail(data []byte, res scanResult) bool {
	size := int64(len(data))
	x := res.badOff
	if res.hasPrev && x < res.prev.batchEnd {
		return res.prev.batchEnd >= size
	}
	for y := x + 1; y+headerSize+payloadFixed <= size; y++ {
		n := binary.LittleEndian.Uint32(data[y : y+4])
		if n < payloadFixed || int64(n) > size-y-headerSize {
			continue
		}
		r, rn, err := decodeRecord(data[y:])
		if err != nil || !r.framedAt(y, rn) {
			continue
		}
		if r.batchStart <= x {
			return r.batchEnd >= size
		}
		return false
	}
	return true
}

// syncDir fsyncs a directory so that file creations, renames and removals in it are
// durable.
func syncDir(dir string) error {
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
