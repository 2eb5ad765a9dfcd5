package wal

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
)

// The meta file holds the StableStore's keys and the log's first-index marker. It is
// small and rewritten whole on every change (write meta.tmp, fsync, rename over meta,
// fsync the directory), so a reader sees either the old or the new version, never a
// mix. Raft changes it only when the term or vote changes; the log changes it once per
// compaction.
//
// Layout (little-endian): magic "LHWMETA1", marker u64, key count u32, then per key
// (key length u32, key, value length u32, value), then CRC-32C of everything before it.
const (
	metaName  = "meta"
	metaTemp  = "meta.tmp"
	metaMagic = "LHWMETA1"
)

// metaState is the content of the meta file.
type metaState struct {
	// marker: every log index below it is deleted, whatever the segments still hold.
	marker uint64
	kv     map[string][]byte
}

func encodeMeta(m metaState) []byte {
	b := []byte(metaMagic)
	b = binary.LittleEndian.AppendUint64(b, m.marker)
	keys := make([]string, 0, len(m.kv))
	for k := range m.kv {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(keys)))
	for _, k := range keys {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(k)))
		b = append(b, k...)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(m.kv[k])))
		b = append(b, m.kv[k]...)
	}
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

func decodeMeta(b []byte) (metaState, error) {
	bad := errors.New("malformed")
	if len(b) < len(metaMagic)+8+4+4 || !bytes.HasPrefix(b, []byte(metaMagic)) {
		return metaState{}, bad
	}
	body, sum := b[:len(b)-4], binary.LittleEndian.Uint32(b[len(b)-4:])
	if crc32.Checksum(body, castagnoli) != sum {
		return metaState{}, errors.New("checksum mismatch")
	}
	p := body[len(metaMagic):]
	m := metaState{marker: binary.LittleEndian.Uint64(p[0:8]), kv: map[string][]byte{}}
	count := binary.LittleEndian.Uint32(p[8:12])
	p = p[12:]
	field := func() ([]byte, bool) {
		if len(p) < 4 {
			return nil, false
		}
		n := binary.LittleEndian.Uint32(p[0:4])
		if uint64(len(p)-4) < uint64(n) {
			return nil, false
		}
		f := p[4 : 4+n]
		p = p[4+n:]
		return f, true
	}
	for range count {
		k, ok1 := field()
		v, ok2 := field()
		if !ok1 || !ok2 {
			return metaState{}, bad
		}
		m.kv[string(k)] = bytes.Clone(v)
	}
	if len(p) != 0 {
		return metaState{}, bad
	}
	return m, nil
}

// loadMeta reads dir's meta file; a missing file is an empty state. A leftover
// meta.tmp (a crash before its rename) is removed: the rename is the commit point.
func loadMeta(dir string) (metaState, error) {
	if err := os.Remove(filepath.Join(dir, metaTemp)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return metaState{}, fmt.Errorf("wal: remove %s: %w", metaTemp, err)
	}
	path := filepath.Join(dir, metaName)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return metaState{kv: map[string][]byte{}}, nil
	}
	if err != nil {
		return metaState{}, fmt.Errorf("wal: read %s: %w", path, err)
	}
	m, err := decodeMeta(b)
	if err != nil {
		return metaState{}, fmt.Errorf("%w: %s: %w", ErrCorrupt, path, err)
	}
	return m, nil
}

// writeMeta durably replaces dir's meta file with m. committed reports whether the
// rename happened: if it did and err is not nil, the new content may or may not survive
// a crash.
func writeMeta(dir string, m metaState) (committed bool, err error) {
	tmp := filepath.Join(dir, metaTemp)
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o640)
	if err != nil {
		return false, fmt.Errorf("wal: write meta: %w", err)
	}
	_, err = f.Write(encodeMeta(m))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(tmp)
		return false, fmt.Errorf("wal: write meta: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, metaName)); err != nil {
		_ = os.Remove(tmp)
		return false, fmt.Errorf("wal: write meta: %w", err)
	}
	if err := syncDir(dir); err != nil {
		return true, fmt.Errorf("wal: write meta: %w", err)
	}
	return true, nil
}
