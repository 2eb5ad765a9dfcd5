package wal

import (
	"encoding/binary"
	"fmt"
	"slices"
)

// Set durably stores key = val (write a temporary file, fsync, rename, fsync the
// directory). On error the previous value remains the one Get returns; the new one may
// or may not be on disk.
func (l *Log) Set(key, val []byte) error {
	l.metaMu.Lock()
	defer l.metaMu.Unlock()
	if l.isClosed() {
		return ErrClosed
	}
	kv := make(map[string][]byte, len(l.meta.kv)+1)
	for k, v := range l.meta.kv {
		kv[k] = v
	}
	kv[string(key)] = slices.Clone(val)
	if _, err := writeMeta(l.dir, metaState{marker: l.meta.marker, kv: kv}); err != nil {
		return err
	}
	l.meta.kv = kv
	return nil
}

// Get returns the value stored for key, or nil and no error if there is none (the
// raft.StableStore contract).
func (l *Log) Get(key []byte) ([]byte, error) {
	l.metaMu.Lock()
	defer l.metaMu.Unlock()
	if l.isClosed() {
		return nil, ErrClosed
	}
	return slices.Clone(l.meta.kv[string(key)]), nil
}

// SetUint64 stores val under key as 8 big-endian bytes; see Set.
func (l *Log) SetUint64(key []byte, val uint64) error {
	return l.Set(key, binary.BigEndian.AppendUint64(nil, val))
}

// GetUint64 returns the value SetUint64 stored for key, or 0 and no error if there is
// none. A value of another length is an error.
func (l *Log) GetUint64(key []byte) (uint64, error) {
	b, err := l.Get(key)
	if err != nil || b == nil {
		return 0, err
	}
	if len(b) != 8 {
		return 0, fmt.Errorf("wal: value of key %q is %d bytes, not a uint64", key, len(b))
	}
	return binary.BigEndian.Uint64(b), nil
}

func (l *Log) isClosed() bool {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.closed
}
