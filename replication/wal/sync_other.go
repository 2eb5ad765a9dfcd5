//go:build !linux

package wal

import "os"

// fdatasync is File.Sync outside Linux; see sync_linux.go.
func fdatasync(f *os.File) error { return f.Sync() }
