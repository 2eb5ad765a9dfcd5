//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package wal

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// lockDir takes an exclusive advisory lock (flock) on dir/LOCK. The lock belongs to the
// open file: a second Open of the same directory, in this process or another, fails
// with ErrLocked until the first is closed (or its process exits).
func lockDir(dir string) (*os.File, error) {
	path := filepath.Join(dir, "LOCK")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o640)
	if err != nil {
		return nil, fmt.Errorf("wal: open lock file: %w", err)
	}
	rc, err := f.SyscallConn()
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("wal: lock %s: %w", path, err)
	}
	var lerr error
	if err := rc.Control(func(fd uintptr) {
		lerr = syscall.Flock(int(fd), syscall.LOCK_EX|syscall.LOCK_NB)
	}); err != nil {
		lerr = err
	}
	if lerr != nil {
		_ = f.Close()
		if errors.Is(lerr, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s", ErrLocked, dir)
		}
		return nil, fmt.Errorf("wal: lock %s: %w", path, lerr)
	}
	return f, nil
}
