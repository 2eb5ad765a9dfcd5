package wal

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"sort"
)

// DeleteRange deletes the entries with indexes in [min, max]. The range must reach the
// start or the end of the log (raft deletes a prefix after a snapshot, a suffix on a
// conflict, or everything after installing a snapshot); parts of it outside the log
// are ignored. It is durable when it returns nil; see the package comment for crashes.
func (l *Log) DeleteRange(min, max uint64) error {
	l.writeMu.Lock()
	defer l.writeMu.Unlock()
	if err := l.writableLocked(); err != nil {
		return err
	}
	if l.last == 0 || min > max || max < l.first || min > l.last {
		return nil
	}
	switch {
	case min <= l.first && max >= l.last:
		return l.deleteAllLocked()
	case min <= l.first:
		return l.deletePrefixLocked(max)
	case max >= l.last:
		return l.deleteSuffixLocked(min)
	default:
		return fmt.Errorf("%w: [%d, %d] inside [%d, %d]", ErrMiddleDelete, min, max, l.first, l.last)
	}
}

// deleteAllLocked empties the log. The marker (last+1) makes it atomic: a crash after
// it is written and before every file is gone finishes the job on Open.
func (l *Log) deleteAllLocked() error {
	if err := l.setMarker(l.last + 1); err != nil {
		return err
	}
	l.mu.Lock()
	old := l.segs
	l.segs, l.first, l.last = nil, 0, 0
	l.mu.Unlock()
	if err := l.removeSegmentsLocked(old); err != nil {
		return err
	}
	l.spareDueLocked()
	return nil
}

// deletePrefixLocked deletes indexes up to max (< last): it writes the marker max+1,
// then removes the segments that hold nothing at or above it.
func (l *Log) deletePrefixLocked(max uint64) error {
	first := max + 1
	if err := l.setMarker(first); err != nil {
		return err
	}
	l.mu.Lock()
	n := 0
	for n+1 < len(l.segs) && l.segs[n+1].base <= first {
		n++
	}
	old := slices.Clone(l.segs[:n])
	l.segs = slices.Delete(l.segs, 0, n)
	l.first = first
	l.mu.Unlock()
	if err := l.removeSegmentsLocked(old); err != nil {
		return err
	}
	return nil
}

// deleteSuffixLocked deletes indexes from min (> first) to the end: later segments are
// removed newest first, then the segment holding min is truncated at its record and
// synced. A crash in between leaves a prefix of the old log.
//
// The cut is a truncate, not zeros written over the deleted records: a truncate takes
// effect whole or not at all, while a crash during a write of zeros could leave old
// records beyond a hole, where Open would take them for acknowledged entries after
// damage. The truncated segment loses its free space, so the next batch starts a new
// segment; raft deletes a suffix only when a new leader overrides entries a follower
// never committed, which is rare.
func (l *Log) deleteSuffixLocked(min uint64) error {
	l.mu.Lock()
	k := sort.Search(len(l.segs), func(i int) bool { return l.segs[i].base > min }) - 1
	s := l.segs[k]
	var old []*segment
	cut := int64(-1)
	if min == s.base { // k > 0 here, because min > first >= segs[0].base
		old = slices.Clone(l.segs[k:])
		l.segs = l.segs[:k]
	} else {
		old = slices.Clone(l.segs[k+1:])
		l.segs = l.segs[:k+1]
		cut = s.offsets[min-s.base]
		s.offsets = s.offsets[:min-s.base]
		s.size = cut
	}
	l.last = min - 1
	l.mu.Unlock()

	slices.Reverse(old)
	if err := l.removeSegmentsLocked(old); err != nil {
		return err
	}
	if cut >= 0 {
		l.crashPoint("suffix: before cut")
		err := s.f.Truncate(cut)
		if err == nil {
			err = l.sync(s.f)
		}
		if err != nil {
			l.failed = fmt.Errorf("truncate %s: %w", s.path, err)
			return fmt.Errorf("wal: truncate %s: %w", s.path, err)
		}
		s.fileSize = cut
		l.spareDueLocked()
	}
	return nil
}

// removeSegmentsLocked closes and unlinks segs in order, then fsyncs the directory.
// Failure marks the Log failed: which files are gone is no longer known.
func (l *Log) removeSegmentsLocked(segs []*segment) error {
	for i, s := range segs {
		l.crashPoint(fmt.Sprintf("remove: file %d", i))
		if s.f != nil {
			_ = s.f.Close()
		}
		if err := os.Remove(s.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			l.failed = err
			return fmt.Errorf("wal: remove %s: %w", s.path, err)
		}
	}
	if len(segs) > 0 {
		if err := syncDir(l.dir); err != nil {
			l.failed = err
			return err
		}
	}
	return nil
}
