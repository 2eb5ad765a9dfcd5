//go:build linux

package wal

import (
	"errors"
	"os"
	"syscall"
)

// fdatasync flushes f's data and the metadata needed to read it back. It is not used by
// default: every StoreLogs appends, so the file size changes and fdatasync has to commit
// the same journal transaction as fsync; measured side by side (BenchmarkStoreLogsPaired,
// "wal" vs "wal-fdatasync") it was no faster on ext4. It would pay off only with
// preallocated segments, which this package does not use.
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
