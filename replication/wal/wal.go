// Package wal is a raft log store and stable store for hashicorp/raft that makes every
// StoreLogs call durable with one write and one fdatasync.
//
// # Files
//
// A directory holds segment files named wal-<first index>.seg, a meta file with the
// StableStore keys and the first-index marker, a LOCK file, and wal.spare, the next
// segment being prepared. Segments are preallocated: each is created Options.SegmentSize
// bytes long and filled with zeros, and records are written over the zeros in order,
// so the end of a segment's log is where its valid records stop, not the end of the
// file (see spare.go). Each record carries its own CRC-32C; see record.go for the
// layout. Directories written by earlier versions, whose segments end where their
// records do, are read the same way.
//
// # Guarantees
//
//   - StoreLogs returns nil only after every entry of the batch is on stable storage
//     (one write, one fdatasync; plus a rename and an fsync of the directory when it
//     starts a new segment). If it returns an error, none of the batch is visible to
//     readers; after a crash some prefix of it may reappear, which raft tolerates (the
//     entries were never acknowledged, so a leader reports their outcome as unknown).
//   - DeleteRange is durable when it returns. A prefix delete (compaction) and a delete
//     of everything are atomic across a crash: the first-index marker is written before
//     any file is touched. A suffix delete interrupted by a crash leaves a prefix of the
//     old log (as if fewer entries had been deleted), never a log with holes.
//   - Open validates every record. The log ends at the first record that fails its
//     checks if only zeros follow. A torn final write (the one StoreLogs was doing when
//     the process or machine died) is cut away (overwritten with zeros), and appends
//     continue right after the last valid record — in a new segment if the records
//     kept are a prefix of the torn batch, whose segment is then cut by a truncate;
//     any other damage fails Open with ErrCorrupt naming the file and offset, rather
//     than silently losing acknowledged entries. Damage confined to the final batch of the log cannot be told from a torn
//     write and is cut away like one. Entries once deleted never come back: a suffix
//     delete truncates the file, and records must carry consecutive indexes. Before it
//     returns, Open makes what it recovered durable (an fdatasync of the last segment,
//     an fsync of the directory): the crashed process may have written a batch or
//     removed files without syncing them.
//   - After an fsync, truncate or unlink fails, the Log refuses all further writes
//     (ErrFailed): after a failed fsync the kernel may have dropped the dirty pages, so
//     what is on disk is unknown until the directory is reopened and re-validated.
//
// # Concurrency
//
// All methods are safe for concurrent use. Lock order: writeMu, then metaMu, then mu;
// methods whose names end in Locked need writeMu held.
// Writers (StoreLogs, DeleteRange) are serialised by writeMu and do their write and
// fdatasync without holding mu, so GetLog, FirstIndex and LastIndex — which take mu for
// reading — wait for a writer only while it publishes the new index entries, never for
// its fdatasync. One background goroutine at a time zero-fills the next segment (see
// spare.go); it shares nothing with the Log but a channel, and Close stops it.
package wal

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// Errors returned by Log.
var (
	// ErrCorrupt is returned (wrapped, with the file and offset) by Open when a record
	// other than the torn tail of the last segment fails its checks, or segments do not
	// join up, and by GetLog when a stored record no longer matches its checksum.
	ErrCorrupt = errors.New("wal: corrupt log")
	// ErrOutOfOrder is returned by StoreLogs when the batch does not continue the log
	// exactly (a gap, an overwrite, or indexes not consecutive). Nothing was written.
	ErrOutOfOrder = errors.New("wal: entries out of order")
	// ErrMiddleDelete is returned by DeleteRange for a range that keeps entries on both
	// sides of it; raft only deletes a prefix, a suffix, or everything.
	ErrMiddleDelete = errors.New("wal: cannot delete from the middle of the log")
	// ErrFailed is returned (wrapped with the original cause) by every write after an
	// fsync, truncate or unlink failed. Reads still work; reopen to recover.
	ErrFailed = errors.New("wal: an earlier write failed; reopen the log")
	// ErrClosed is returned by every method after Close.
	ErrClosed = errors.New("wal: log is closed")
	// ErrLocked is returned by Open when another Log (in this or another process) has
	// the directory open.
	ErrLocked = errors.New("wal: directory is locked by another process")
)

// DefaultSegmentSize is the segment size used when Options.SegmentSize is zero. A lock
// service's entries are small (about 100 bytes), so 16 MiB holds well over 100,000 of
// them, while a new node zero-fills its first segment (before its first commit) in a
// fraction of the time 64 MiB would take.
const DefaultSegmentSize = 16 << 20

// defaultSegmentSize is what a zero Options.SegmentSize means. Tests lower it so that
// the many logs they create do not each zero-fill full-size segments.
var defaultSegmentSize int64 = DefaultSegmentSize

// Options configures a Log. The zero value is a valid configuration.
type Options struct {
	// SegmentSize is the size of a segment file: each is created this long, filled with
	// zeros, and a batch that does not fit in the rest of the current segment starts a
	// new one. A batch is never split, so a batch larger than a segment is written to a
	// new segment of its own, which grows to hold it. The directory holds up to one
	// segment more than the log needs (the spare). Zero means DefaultSegmentSize.
	SegmentSize int64
	// Logger receives a line when Open cuts a torn tail. Nil means no logging.
	Logger *slog.Logger
	// ObserveSync, if set, gets how long each segment sync of StoreLogs took (for
	// metrics; it must be cheap and not block). Nil means none.
	ObserveSync func(time.Duration)

	// fullSync makes StoreLogs call fsync instead of fdatasync. Benchmarks only: it
	// shows what fdatasync saves on preallocated segments (see sync_linux.go).
	fullSync bool
	// syncHook, if set, replaces the segment sync (tests inject failures with it).
	syncHook func(*os.File) error
	// writeHook, if set, replaces the write of a batch (tests inject failures with it).
	writeHook func(f *os.File, b []byte, off int64) error
	// crashHook, if set, is called at each step of a write that a crash could
	// interrupt (tests panic in it to stop the operation there).
	crashHook func(step string)
}

// Log is a raft.LogStore and raft.StableStore backed by a directory. Create it with Open.
type Log struct {
	dir  string
	opts Options
	lock *os.File

	writeMu sync.Mutex // serialises StoreLogs, DeleteRange and Close
	buf     []byte     // encoding scratch; writeMu
	failed  error      // sticky; writeMu

	// The spare segment (see spare.go); writeMu, except that the goroutine preparing
	// the spare reads nothing of the Log but its arguments.
	spare     chan error    // capacity 1: the outcome of the preparation started last
	spareBusy bool          // a preparation started and its outcome was not yet taken
	stop      chan struct{} // closed to stop the preparation; nil once stopped
	bg        sync.WaitGroup

	metaMu sync.Mutex // guards meta and the meta file
	meta   metaState

	mu     sync.RWMutex // guards the fields below (see segment for its fields)
	segs   []*segment
	first  uint64 // 0 when the log is empty
	last   uint64 // 0 when the log is empty
	closed bool

	syncs atomic.Uint64
}

var (
	_ raft.LogStore          = (*Log)(nil)
	_ raft.StableStore       = (*Log)(nil)
	_ raft.MonotonicLogStore = (*Log)(nil)
)

// Open opens the log in dir, creating the directory if needed, validates every record
// and cuts a torn tail (see the package comment). It fails with ErrLocked if the
// directory is already open and with ErrCorrupt if acknowledged data is damaged.
func Open(dir string, opts Options) (*Log, error) {
	if opts.SegmentSize <= 0 {
		opts.SegmentSize = defaultSegmentSize
	}
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return nil, fmt.Errorf("wal: create %s: %w", dir, err)
		}
		if err := syncDir(filepath.Dir(filepath.Clean(dir))); err != nil {
			return nil, err
		}
	}
	lock, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	l := &Log{dir: dir, opts: opts, lock: lock}
	if err := l.recover(); err != nil {
		l.closeFiles()
		return nil, err
	}
	// A crashed process may have removed or renamed files (a suffix delete's segments,
	// the meta file) without the directory fsync that makes it durable. The log Open
	// found is built on those changes, so they must be made durable before anything
	// is added to it.
	if err := syncDir(dir); err != nil {
		l.closeFiles()
		return nil, err
	}
	l.spare = make(chan error, 1)
	l.stop = make(chan struct{})
	l.spareDueLocked()
	return l, nil
}

// recover loads the meta file and the segments and validates them.
func (l *Log) recover() error {
	meta, err := loadMeta(l.dir)
	if err != nil {
		return err
	}
	l.meta = meta
	if err := removeSpare(l.dir); err != nil {
		return err
	}
	entries, err := os.ReadDir(l.dir)
	if err != nil {
		return fmt.Errorf("wal: read %s: %w", l.dir, err)
	}
	var bases []uint64
	for _, e := range entries {
		if base, ok := parseSegmentName(e.Name()); ok && e.Type().IsRegular() {
			bases = append(bases, base)
		}
	}
	slices.Sort(bases)

	// Segments wholly below the marker are left over from a compaction that crashed
	// after writing the marker: finish it without reading them.
	var stale []*segment
	for len(bases) > 1 && bases[1] <= meta.marker {
		stale = append(stale, &segment{path: segmentPath(l.dir, bases[0])})
		bases = bases[1:]
	}
	if err := l.removeSegmentsLocked(stale); err != nil {
		return err
	}

	for i, base := range bases {
		s, err := l.loadSegment(base, i == len(bases)-1)
		if err != nil {
			return err
		}
		if s == nil { // empty last segment, removed
			continue
		}
		if n := len(l.segs); n > 0 && l.segs[n-1].lastIndex()+1 != base {
			return fmt.Errorf("%w: %s ends at index %d but %s starts at %d", ErrCorrupt,
				l.segs[n-1].path, l.segs[n-1].lastIndex(), s.path, base)
		}
		l.segs = append(l.segs, s)
	}
	if len(l.segs) == 0 {
		return nil
	}
	last := l.segs[len(l.segs)-1].lastIndex()
	if base := l.segs[0].base; base > max(meta.marker, 1) && meta.marker <= last {
		return fmt.Errorf("%w: the log starts at index %d but its first segment %s starts at %d: a segment file is missing",
			ErrCorrupt, max(meta.marker, 1), l.segs[0].path, base)
	}
	if meta.marker > last {
		// A delete of everything crashed after writing its marker.
		segs := l.segs
		l.segs = nil
		return l.removeSegmentsLocked(segs)
	}
	l.first = max(meta.marker, l.segs[0].base)
	l.last = last
	return nil
}

// loadSegment reads and validates one segment. For the last segment a torn tail is
// overwritten with zeros, making it free space again, and nil is returned (after
// removing the file) if no record is left.
func (l *Log) loadSegment(base uint64, isLast bool) (*segment, error) {
	path := segmentPath(l.dir, base)
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("wal: read %s: %w", path, err)
	}
	res, err := scanSegment(path, data, base)
	if err != nil {
		return nil, err
	}
	if res.bad {
		if !isLast || !classifyTail(data, res) {
			return nil, fmt.Errorf("%w: %s offset %d: %w", ErrCorrupt, path, res.badOff, res.reason)
		}
		if l.opts.Logger != nil {
			l.opts.Logger.Warn("wal: cutting torn tail of last segment (never acknowledged)",
				"file", path, "offset", res.badOff, "bytes", lastNonZero(data[res.badOff:])+1,
				"entries_kept", len(res.offsets))
		}
	}
	if len(res.offsets) == 0 {
		if !isLast {
			return nil, fmt.Errorf("%w: %s offset 0: segment before the last one holds no entries", ErrCorrupt, path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("wal: remove empty %s: %w", path, err)
		}
		return nil, syncDir(l.dir)
	}
	// Every segment is opened for writing: a suffix delete can make any of them the
	// one appended to.
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("wal: open %s: %w", path, err)
	}
	fileSize := int64(len(data))
	switch {
	case isLast && res.prev.batchEnd > res.end && fileSize > res.end:
		// The records kept are a prefix of a torn batch: they claim a batch that runs
		// on past res.end. A batch appended at res.end would start inside those
		// bounds, and if it were torn in turn, classifyTail would take it for a
		// batch written after theirs and refuse to open. So the segment is cut here
		// by a truncate, which takes effect whole or not at all, and takes no more
		// batches (as after a failed write or a suffix delete).
		if l.opts.Logger != nil {
			l.opts.Logger.Warn("wal: cutting the segment after a kept prefix of a torn batch (never acknowledged)",
				"file", path, "offset", res.end, "entries_kept", len(res.offsets))
		}
		if err := f.Truncate(res.end); err != nil {
			_ = f.Close()
			return nil, fmt.Errorf("wal: cut torn batch of %s: %w", path, err)
		}
		fileSize = res.end
	case res.bad:
		// Zeros rather than a truncate keep the space preallocated. A crash while
		// they are written leaves a part of the same torn write, which the next Open
		// classifies the same way.
		end := res.badOff + int64(lastNonZero(data[res.badOff:])) + 1
		if err := writeZeros(f, res.end, end); err != nil {
			_ = f.Close()
			return nil, fmt.Errorf("wal: cut torn tail of %s: %w", path, err)
		}
	}
	if isLast {
		// The last segment may hold a batch the crashed process wrote but never
		// synced (it died between the write and the fdatasync): Open read it back
		// from the page cache and serves it, so it must be made durable now. Nothing
		// else would sync it if the next batch starts a new segment. (A segment before
		// the last was synced before its successor was created.) The sync also makes
		// the cut above durable.
		if err := l.sync(f); err != nil {
			_ = f.Close()
			return nil, fmt.Errorf("wal: sync %s: %w", path, err)
		}
	}
	return &segment{base: base, path: path, f: f, offsets: res.offsets, size: res.end, fileSize: fileSize}, nil
}

// FirstIndex returns the first index in the log, or 0 if it is empty.
func (l *Log) FirstIndex() (uint64, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.closed {
		return 0, ErrClosed
	}
	return l.first, nil
}

// LastIndex returns the last index in the log, or 0 if it is empty.
func (l *Log) LastIndex() (uint64, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.closed {
		return 0, ErrClosed
	}
	return l.last, nil
}

// GetLog reads the entry at index into log. It returns raft.ErrLogNotFound itself (not
// wrapped: raft's replication compares it with ==) when the index is outside
// [FirstIndex, LastIndex], and an ErrCorrupt error if the record fails its checksum.
// log's Data and Extensions are freshly allocated and belong to the caller.
func (l *Log) GetLog(index uint64, log *raft.Log) error {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.closed {
		return ErrClosed
	}
	if l.last == 0 || index < l.first || index > l.last {
		return raft.ErrLogNotFound
	}
	s := l.segmentForLocked(index)
	off, end := s.span(index)
	buf := make([]byte, end-off)
	if _, err := s.f.ReadAt(buf, off); err != nil {
		return fmt.Errorf("wal: read index %d from %s offset %d: %w", index, s.path, off, err)
	}
	r, n, err := decodeRecord(buf)
	if err != nil || n != len(buf) || r.index != index {
		return fmt.Errorf("%w: %s offset %d: record of index %d fails its checks", ErrCorrupt, s.path, off, index)
	}
	r.toLog(log)
	return nil
}

// segmentForLocked returns the segment holding index, which must be in the log.
func (l *Log) segmentForLocked(index uint64) *segment {
	i := sort.Search(len(l.segs), func(i int) bool { return l.segs[i].base > index })
	return l.segs[i-1]
}

// StoreLog stores one entry; see StoreLogs.
func (l *Log) StoreLog(log *raft.Log) error { return l.StoreLogs([]*raft.Log{log}) }

// StoreLogs appends logs, which must have consecutive indexes continuing the log (any
// index if the log is empty), with one write and one fdatasync. When it returns nil
// every entry is on stable storage. On error no entry of the batch is visible; see the
// package comment for what a crash may leave.
func (l *Log) StoreLogs(logs []*raft.Log) error {
	if len(logs) == 0 {
		return nil
	}
	l.writeMu.Lock()
	defer l.writeMu.Unlock()
	if err := l.writableLocked(); err != nil {
		return err
	}
	next := logs[0].Index
	if next == 0 {
		return fmt.Errorf("%w: index 0 is not a valid raft index", ErrOutOfOrder)
	}
	if l.last != 0 && next != l.last+1 {
		return fmt.Errorf("%w: batch starts at index %d but the log ends at %d", ErrOutOfOrder, next, l.last)
	}
	total := 0
	for i, e := range logs {
		if e.Index != next+uint64(i) {
			return fmt.Errorf("%w: entry %d of the batch has index %d, want %d", ErrOutOfOrder, i, e.Index, next+uint64(i))
		}
		if sz := recordSize(e); sz-headerSize > maxPayload {
			return fmt.Errorf("wal: entry %d is %d bytes, more than the %d allowed", e.Index, sz, maxPayload)
		}
		total += recordSize(e)
	}

	s, err := l.activeSegmentLocked(next, int64(total))
	if err != nil {
		return err
	}
	start := s.size
	end := start + int64(total)
	buf := l.buf[:0]
	offsets := make([]int64, len(logs))
	for i, e := range logs {
		offsets[i] = start + int64(len(buf))
		buf = appendRecord(buf, e, start, end)
	}
	if cap(buf) <= 4<<20 {
		l.buf = buf
	}

	l.crashPoint("store: before write")
	if err := l.write(s.f, buf, start); err != nil {
		// Take back whatever part of the batch reached the file, durably, before
		// anything else is written: past the end of the log there must be nothing
		// but zeros or the end of the file (see classifyTail). The segment then takes
		// no more batches, unless it holds none.
		terr := s.f.Truncate(start)
		if terr == nil {
			terr = l.sync(s.f)
		}
		if terr != nil {
			l.failed = fmt.Errorf("truncate %s after failed write: %w", s.path, terr)
		} else {
			s.fileSize = start
		}
		return fmt.Errorf("wal: write %s: %w", s.path, err)
	}
	l.crashPoint("store: before sync")
	if err := l.sync(s.f); err != nil {
		l.failed = fmt.Errorf("sync %s: %w", s.path, err)
		return fmt.Errorf("wal: sync %s: %w", s.path, err)
	}

	l.crashPoint("store: synced")
	s.fileSize = max(s.fileSize, end)
	l.mu.Lock()
	s.offsets = append(s.offsets, offsets...)
	s.size = end
	if l.last == 0 {
		l.first = next // activeSegmentLocked moved the marker to next
	}
	l.last = logs[len(logs)-1].Index
	l.mu.Unlock()
	l.spareDueLocked()
	return nil
}

// activeSegmentLocked returns the segment the next batch (starting at index next, total
// bytes long) goes to, starting a new one when the log is empty or the batch does not
// fit in the free space of the current one.
func (l *Log) activeSegmentLocked(next uint64, total int64) (*segment, error) {
	if l.last == 0 {
		// Empty log: at most one segment remains, holding no entries (a new segment
		// whose first write failed). Start afresh at next.
		if len(l.segs) == 1 && l.segs[0].base == next {
			return l.segs[0], nil
		}
		if len(l.segs) > 0 {
			old := l.segs
			l.mu.Lock()
			l.segs = nil
			l.mu.Unlock()
			if err := l.removeSegmentsLocked(old); err != nil {
				return nil, err
			}
		}
		// The first segment always starts at the marker (or at 1 with no marker), so
		// that Open can tell a missing first segment from a compacted one. After a
		// delete of everything the marker may even be above next (raft installed a
		// snapshot older than the deleted entries): the new entries would be hidden
		// after a restart unless it is moved first.
		if max(l.meta.marker, 1) != next {
			if err := l.setMarker(next); err != nil {
				return nil, err
			}
		}
		return l.newSegmentLocked(next)
	}
	s := l.segs[len(l.segs)-1]
	if s.size+total > s.fileSize && len(s.offsets) > 0 {
		return l.newSegmentLocked(next)
	}
	return s, nil
}

// newSegmentLocked makes the spare the segment file for base (waiting for it if it is
// still being prepared, starting it if it is not) and makes its name durable.
// Until the directory fsync nothing else has changed, so an error before it leaves the
// Log usable.
func (l *Log) newSegmentLocked(base uint64) (*segment, error) {
	path := segmentPath(l.dir, base)
	// Rename replaces an existing file without a word; no segment of this name
	// should exist, but if one does it must not be lost.
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		if err == nil {
			err = fs.ErrExist
		}
		return nil, fmt.Errorf("wal: create segment %s: %w", path, err)
	}
	if err := l.takeSpareLocked(); err != nil {
		return nil, err
	}
	if err := os.Rename(filepath.Join(l.dir, spareName), path); err != nil {
		_ = removeSpare(l.dir)
		return nil, fmt.Errorf("wal: create segment: %w", err)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		if rerr := os.Remove(path); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
			l.failed = rerr
		}
		return nil, fmt.Errorf("wal: open new segment: %w", err)
	}
	l.crashPoint("segment: created")
	if err := syncDir(l.dir); err != nil {
		_ = f.Close()
		l.failed = err
		return nil, err
	}
	s := &segment{base: base, path: path, f: f, fileSize: l.opts.SegmentSize}
	l.mu.Lock()
	l.segs = append(l.segs, s)
	l.mu.Unlock()
	return s, nil
}

func (l *Log) crashPoint(step string) {
	if l.opts.crashHook != nil {
		l.opts.crashHook(step)
	}
}

func (l *Log) write(f *os.File, b []byte, off int64) error {
	if l.opts.writeHook != nil {
		return l.opts.writeHook(f, b, off)
	}
	_, err := f.WriteAt(b, off)
	return err
}

func (l *Log) sync(f *os.File) error {
	l.syncs.Add(1)
	if l.opts.ObserveSync != nil {
		defer l.observeSync(time.Now())
	}
	if l.opts.syncHook != nil {
		return l.opts.syncHook(f)
	}
	if l.opts.fullSync {
		return f.Sync()
	}
	return fdatasync(f)
}

func (l *Log) observeSync(start time.Time) { l.opts.ObserveSync(time.Since(start)) }

// setMarker durably records that indexes below m are deleted. If the meta file may have
// changed on disk without the change being durable, the Log is marked failed.
func (l *Log) setMarker(m uint64) error {
	l.metaMu.Lock()
	defer l.metaMu.Unlock()
	next := metaState{marker: m, kv: l.meta.kv}
	l.crashPoint("marker: before write")
	committed, err := writeMeta(l.dir, next)
	if err != nil {
		if committed {
			l.failed = err
		}
		return err
	}
	l.meta.marker = m
	l.crashPoint("marker: written")
	return nil
}

func (l *Log) writableLocked() error {
	l.mu.RLock()
	closed := l.closed
	l.mu.RUnlock()
	if closed {
		return ErrClosed
	}
	if l.failed != nil {
		return fmt.Errorf("%w: %w", ErrFailed, l.failed)
	}
	return nil
}

// IsMonotonic implements raft.MonotonicLogStore: the log cannot hold a gap, so after
// installing or restoring a snapshot raft deletes all entries instead of appending past
// a gap.
func (l *Log) IsMonotonic() bool { return true }

// Syncs returns how many fdatasync (or fsync) calls the Log has made on segment files,
// for tests and benchmarks. Directory, meta-file and spare syncs are not counted.
func (l *Log) Syncs() uint64 { return l.syncs.Load() }

// Close stops the preparation of the spare segment and removes it, closes the files
// and releases the directory lock. Every later call fails with ErrClosed. Close does
// not sync: everything acknowledged is already durable.
func (l *Log) Close() error {
	l.writeMu.Lock()
	defer l.writeMu.Unlock()
	l.metaMu.Lock()
	defer l.metaMu.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	l.stopSpare()
	err := removeSpare(l.dir)
	l.closeFiles()
	return err
}

// closeFiles stops the spare's preparation, closes the files and releases the lock,
// leaving the directory as it is: what a crash would leave (tests use it so).
func (l *Log) closeFiles() {
	l.stopSpare()
	for _, s := range l.segs {
		_ = s.f.Close()
	}
	l.segs = nil
	if l.lock != nil {
		_ = l.lock.Close()
		l.lock = nil
	}
}
