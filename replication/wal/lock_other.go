//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package wal

import (
	"fmt"
	"os"
	"path/filepath"
)

// lockDir only creates dir/LOCK on platforms without flock: two processes opening the
// same directory are not detected there.
func lockDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, "LOCK"), os.O_RDWR|os.O_CREATE, 0o640)
	if err != nil {
		return nil, fmt.Errorf("wal: open lock file: %w", err)
	}
	return f, nil
}
