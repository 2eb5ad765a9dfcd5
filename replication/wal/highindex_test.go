package wal

import (
	"fmt"
	"os"
	"testing"
)

// TestHighIndexes: a restored log starts far above 2^32 (replication/restore.go). Batches
// across segment boundaries, every kind of delete, a torn tail and reopens work the
// same there as at index 1.
func TestHighIndexes(t *testing.T) {
	for _, base := range []uint64{1<<32 - 7, 1 << 62, 1<<62 + 1<<32 + 12345, 1<<63 + 5} {
		t.Run(fmt.Sprint(base), func(t *testing.T) {
			dir := t.TempDir()
			opts := Options{SegmentSize: 2048}
			l := openT(t, dir, opts)
			m := newModel()
			do := func(o op) {
				t.Helper()
				var err error
				if o.isDel {
					err = l.DeleteRange(o.del[0], o.del[1])
					if err == nil {
						m.del(o.del[0], o.del[1])
					}
				} else {
					err = l.StoreLogs(entries(o.store[0], o.store[1], o.store[2]))
					if err == nil {
						m.store(entries(o.store[0], o.store[1], o.store[2]))
					}
				}
				must(t, err)
				m.check(t, l, o.String())
				must(t, l.Close())
				l = openT(t, dir, opts)
				m.check(t, l, "reopened after "+o.String())
			}
			b := base
			for i := uint64(0); i < 100; i += 10 {
				do(st(b+i, b+i+9, 1))
			}
			do(del(b, b+35))
			do(del(b+70, b+99))
			do(st(b+70, b+80, 2))
			do(del(b+36, b+80))
			do(st(b+500, b+510, 3))
			do(st(b+511, b+600, 3))
			do(del(0, b+550))
			// A torn tail.
			must(t, l.StoreLogs(entries(b+601, b+604, 3)))
			s := l.segs[len(l.segs)-1]
			off := s.offsets[b+603-s.base]
			must(t, l.Close())
			data, _ := os.ReadFile(s.path)
			clear(data[off+3:])
			must(t, os.WriteFile(s.path, data, 0o640))
			l = openT(t, dir, opts)
			m.store(entries(b+601, b+602, 3))
			m.check(t, l, "torn")
		})
	}
}
