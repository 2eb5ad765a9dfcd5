package wal

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Segments are preallocated: a new segment is a file already SegmentSize bytes long,
// written with zeros and fsynced, so that a StoreLogs call only overwrites data in
// place and its fdatasync has no file size or block allocation to commit. (fallocate
// would not do: its unwritten extents cost a journal commit on their first write.)
//
// Writing 64 MiB of zeros must not happen on the path of a commit, so the Log keeps
// one spare: a background goroutine zero-fills and fsyncs the file wal.spare, and
// starting a segment renames it to the segment's name and fsyncs the directory. The
// preparation starts as soon as the current segment has less than half a segment of
// free space left (or there is no segment), so a commit waits for it only if the log
// writes half a segment faster than the disk can zero a whole one. At most one
// preparation runs at a time; it touches nothing of the Log's state but its own file
// and the channel that reports its outcome. Close stops it and removes the spare;
// Open removes a spare left over by a crash, because it may not have been completely
// written.
const spareName = "wal.spare"

// errStopped is what a preparation interrupted by Close reports.
var errStopped = errors.New("wal: preallocation stopped by Close")

// spareDueLocked starts preparing a spare if the next segment may be needed soon: the
// log has no segment, or the last one has less than half a segment of free space.
func (l *Log) spareDueLocked() {
	if n := len(l.segs); n > 0 && 2*(l.segs[n-1].fileSize-l.segs[n-1].size) >= l.opts.SegmentSize {
		return
	}
	l.startSpareLocked()
}

// startSpareLocked starts preparing a spare unless one is already under way or ready,
// or the Log is shutting down.
func (l *Log) startSpareLocked() {
	if l.spareBusy || l.stop == nil {
		return
	}
	l.spareBusy = true
	l.bg.Add(1)
	go func(path string, size int64, stop <-chan struct{}, out chan<- error) {
		defer l.bg.Done()
		out <- makeSpare(path, size, stop) // never blocks: capacity 1, one sender at a time
	}(filepath.Join(l.dir, spareName), l.opts.SegmentSize, l.stop, l.spare)
}

// takeSpareLocked waits for the spare being prepared (starting one if none is) and
// hands it over: on success the file wal.spare is zero-filled to SegmentSize and
// durable, and the caller must rename it away before starting another. A failed
// preparation may be old news (the disk was full an hour ago), so it is retried once
// before its error is returned.
func (l *Log) takeSpareLocked() error {
	err := errStopped
	for range 2 {
		l.startSpareLocked()
		if !l.spareBusy {
			break // stopped
		}
		err = <-l.spare
		l.spareBusy = false
		if err == nil {
			return nil
		}
	}
	return fmt.Errorf("wal: preallocate segment: %w", err)
}

// stopSpare stops the preparation, if one is running, and waits for it. The spare file
// is left where it is.
func (l *Log) stopSpare() {
	if l.stop == nil {
		return
	}
	close(l.stop)
	l.stop = nil
	l.bg.Wait()
	if l.spareBusy {
		// Drain the outcome so the next preparation can report its own. Whether it was
		// stopped (errStopped), failed or done does not matter here: the file stays as
		// it is, and Open removes a leftover spare.
		err := <-l.spare
		l.spareBusy = false
		_ = err
	}
}

// makeSpare writes a file of size zeros at path and fsyncs it. It gives up, with
// errStopped, as soon as stop is closed. On error the file is removed.
func makeSpare(path string, size int64, stop <-chan struct{}) (err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o640)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			_ = os.Remove(path)
		}
	}()
	stopped := func() bool {
		select {
		case <-stop:
			return true
		default:
			return false
		}
	}
	for off := int64(0); off < size; {
		if stopped() {
			return errStopped
		}
		n := min(size-off, int64(len(zeroPage)))
		if _, err := f.Write(zeroPage[:n]); err != nil {
			return err
		}
		off += n
	}
	if stopped() {
		return errStopped
	}
	return f.Sync()
}

// removeSpare removes the spare file, if there is one.
func removeSpare(dir string) error {
	path := filepath.Join(dir, spareName)
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("wal: remove %s: %w", path, err)
	}
	return nil
}
