package wal

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"time"

	"github.com/hashicorp/raft"
)

// On-disk record layout (all integers little-endian):
//
//	offset  size  field
//	0       4     payload length n (bytes after this 8-byte header)
//	4       4     CRC-32C (Castagnoli) of bytes [0,4) followed by the payload
//	8       8     raft index
//	16      8     raft term
//	24      1     raft log type
//	25      8     appended_at, unix nanoseconds (0 = zero time)
//	33      8     batch start: segment offset of the first record written by the same
//	              StoreLogs call
//	41      8     batch end: segment offset just past the last record of that call
//	49      4     data length d
//	53      d     data
//	53+d    rest  extensions (n - payloadFixed - d bytes)
//
// The batch bounds let recovery tell a torn final write (never acknowledged) from
// corruption of an acknowledged write: see classifyTail.
const (
	headerSize   = 8
	payloadFixed = 45
	// maxPayload bounds one record so a corrupt length cannot make a reader allocate
	// gigabytes. Raft entries are far smaller (the transport sends them whole).
	maxPayload = 1 << 30
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// errShortRecord and errBadRecord are the decoder's two ways of refusing bytes: the
// buffer ends inside the record, or the record is malformed or fails its checksum.
var (
	errShortRecord = errors.New("wal: record is cut short")
	errBadRecord   = errors.New("wal: record checksum or framing mismatch")
)

// record is one decoded log entry plus the bounds of the batch it was written in.
type record struct {
	index, term uint64
	typ         raft.LogType
	appendedAt  int64
	batchStart  int64
	batchEnd    int64
	data, ext   []byte
}

func recordSize(l *raft.Log) int {
	return headerSize + payloadFixed + len(l.Data) + len(l.Extensions)
}

// appendRecord encodes l onto dst.
func appendRecord(dst []byte, l *raft.Log, batchStart, batchEnd int64) []byte {
	n := payloadFixed + len(l.Data) + len(l.Extensions)
	start := len(dst)
	var at int64
	if !l.AppendedAt.IsZero() {
		at = l.AppendedAt.UnixNano()
	}
	dst = binary.LittleEndian.AppendUint32(dst, uint32(n))
	dst = append(dst, 0, 0, 0, 0) // CRC, filled below
	dst = binary.LittleEndian.AppendUint64(dst, l.Index)
	dst = binary.LittleEndian.AppendUint64(dst, l.Term)
	dst = append(dst, byte(l.Type))
	dst = binary.LittleEndian.AppendUint64(dst, uint64(at))
	dst = binary.LittleEndian.AppendUint64(dst, uint64(batchStart))
	dst = binary.LittleEndian.AppendUint64(dst, uint64(batchEnd))
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(l.Data)))
	dst = append(dst, l.Data...)
	dst = append(dst, l.Extensions...)
	rec := dst[start:]
	crc := crc32.Update(crc32.Checksum(rec[0:4], castagnoli), castagnoli, rec[headerSize:])
	binary.LittleEndian.PutUint32(rec[4:8], crc)
	return dst
}

// decodeRecord decodes the record at the start of b and returns it with its encoded
// length. data and ext alias b. It returns errShortRecord if b ends inside the record
// and errBadRecord if the record is malformed or its checksum does not match. It never
// panics, whatever b holds.
func decodeRecord(b []byte) (record, int, error) {
	if len(b) < headerSize {
		return record{}, 0, errShortRecord
	}
	n := binary.LittleEndian.Uint32(b[0:4])
	if n < payloadFixed || n > maxPayload {
		return record{}, 0, errBadRecord
	}
	total := headerSize + int(n)
	if len(b) < total {
		return record{}, 0, errShortRecord
	}
	p := b[headerSize:total]
	crc := crc32.Update(crc32.Checksum(b[0:4], castagnoli), castagnoli, p)
	if crc != binary.LittleEndian.Uint32(b[4:8]) {
		return record{}, 0, errBadRecord
	}
	d := binary.LittleEndian.Uint32(p[41:45])
	if uint64(d) > uint64(n-payloadFixed) {
		return record{}, 0, errBadRecord
	}
	r := record{
		index:      binary.LittleEndian.Uint64(p[0:8]),
		term:       binary.LittleEndian.Uint64(p[8:16]),
		typ:        raft.LogType(p[16]),
		appendedAt: int64(binary.LittleEndian.Uint64(p[17:25])),
		batchStart: int64(binary.LittleEndian.Uint64(p[25:33])),
		batchEnd:   int64(binary.LittleEndian.Uint64(p[33:41])),
		data:       p[payloadFixed : payloadFixed+int(d)],
		ext:        p[payloadFixed+int(d):],
	}
	return r, total, nil
}

// framedAt reports whether a record of length n found at segment offset off lies inside
// the batch bounds it claims.
func (r *record) framedAt(off int64, n int) bool {
	return r.batchStart >= 0 && r.batchStart <= off && off+int64(n) <= r.batchEnd
}

// toLog fills l from r. Empty data and extensions come back as nil; l keeps references
// into r's buffer, which the caller must not reuse.
func (r *record) toLog(l *raft.Log) {
	l.Index = r.index
	l.Term = r.term
	l.Type = r.typ
	l.Data, l.Extensions = nil, nil
	if len(r.data) > 0 {
		l.Data = r.data
	}
	if len(r.ext) > 0 {
		l.Extensions = r.ext
	}
	l.AppendedAt = time.Time{}
	if r.appendedAt != 0 {
		l.AppendedAt = time.Unix(0, r.appendedAt)
	}
}
