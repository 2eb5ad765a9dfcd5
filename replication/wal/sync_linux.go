//go:build linux

package wal

import (
	"errors"
	"os"
	"syscall"
)

// fdatasync flushes f's data and the metadata needed to read it back, but not, unlike
// fsync, its timestamps. StoreLogs uses it: segments are preallocated (see spare.go),
// so a batch overwrites zeros already on disk, the file's size and blocks do not
// change, and fdatasync has only the data and a disk cache flush to wait for, where
// fsync would also commit the inode's new mtime to the journal whenever the clock has
// ticked since the previous write. Most of the gain is the preallocation itself: on
// ext4 on a VM disk, BenchmarkStoreLogsPaired ("wal" vs "wal-fsync") showed fsync and
// fdatasync on preallocated segments within the noise of each other, and on files that
// grow with every write, as segments did before, fdatasync was no faster than fsync
// (the size changes, so both commit the inode). It still commits the size when a
// write extends a file, as a batch larger than an empty segment's free space does,
// and after a truncate.
func fdatasync(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		for {
			serr = syscall.Fdatasync(int(fd))
			if !errors.Is(serr, syscall.EINTR) {
				return
			}
		}
	}); err != nil {
		return err
	}
	if serr != nil {
		return &os.PathError{Op: "fdatasync", Path: f.Name(), Err: serr}
	}
	return nil
}
