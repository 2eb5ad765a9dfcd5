package wal

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// layout is where the records of the last segment of a closed log lie.
type layout struct {
	path    string
	base    uint64
	offsets []int64
	size    int64             // end of the last record
	data    []byte            // the whole file: records, then zeros up to the preallocated size
	files   map[string][]byte // every segment file as buildLog left it
}

// restore puts the segment files back as buildLog left them, with the last one
// replaced by last.
func (ly layout) restore(t *testing.T, dir string, last []byte) {
	t.Helper()
	for _, p := range segmentFiles(t, dir) {
		must(t, os.Remove(p))
	}
	for p, b := range ly.files {
		if p == ly.path {
			b = last
		}
		must(t, os.WriteFile(p, b, 0o640))
	}
}

func (ly layout) end(k int) int64 {
	if k+1 < len(ly.offsets) {
		return ly.offsets[k+1]
	}
	return ly.size
}

// buildLog writes batches 1..5, 6..10 (both acknowledged) and a final batch of
// lastBatch entries, closes the log and returns the last segment's layout.
func buildLog(t *testing.T, dir string, segSize int64, lastBatch uint64) layout {
	t.Helper()
	l := openT(t, dir, Options{SegmentSize: segSize})
	must(t, l.StoreLogs(entries(1, 5, 1)))
	must(t, l.StoreLogs(entries(6, 10, 1)))
	must(t, l.StoreLogs(entries(11, 10+lastBatch, 2)))
	s := l.segs[len(l.segs)-1]
	ly := layout{path: s.path, base: s.base, offsets: slices.Clone(s.offsets), size: s.size}
	must(t, l.Close())
	var err error
	ly.data, err = os.ReadFile(ly.path)
	must(t, err)
	ly.files = map[string][]byte{}
	for _, p := range segmentFiles(t, dir) {
		b, err := os.ReadFile(p)
		must(t, err)
		ly.files[p] = b
	}
	if int64(len(ly.data)) < ly.size || !allZero(ly.data[ly.size:]) {
		t.Fatalf("segment is %d bytes, index says %d, and they are not all zeros in between", len(ly.data), ly.size)
	}
	return ly
}

// tails are the ways the file can go on after the point where a torn write stopped:
// it ends there (a write that extends the file, as every write did before segments
// were preallocated), or the zeros of the preallocated segment follow, or the rest of
// the write's range holds garbage (a sector written halfway) and then zeros. from is
// where the write began, cut where it stopped.
var tails = []struct {
	name string
	make func(ly layout, from, cut int64) []byte
}{
	{"file ends", func(ly layout, _, cut int64) []byte { return slices.Clone(ly.data[:cut]) }},
	{"zeros", func(ly layout, _, cut int64) []byte {
		b := slices.Clone(ly.data)
		clear(b[cut:])
		return b
	}},
	{"garbage", func(ly layout, _, cut int64) []byte {
		b := slices.Clone(ly.data)
		clear(b[cut:])
		rng := rand.New(rand.NewPCG(uint64(cut), 7))
		for i := cut; i < ly.size; i++ {
			b[i] = byte(rng.Uint32()) | 1
		}
		return b
	}},
}

// expectPrefix reopens dir and checks that the log is exactly 1..last.
func expectPrefix(t *testing.T, dir string, last uint64, when string) *Log {
	t.Helper()
	l, err := Open(dir, Options{})
	if err != nil {
		t.Fatalf("%s: Open: %v", when, err)
	}
	t.Cleanup(func() { _ = l.Close() })
	m := newModel()
	m.store(entries(1, min(last, 10), 1))
	if last > 10 {
		m.store(entries(11, last, 2))
	}
	m.check(t, l, when)
	return l
}

// lastBatchIndex returns the position in ly.offsets of index 11, the final batch's
// first record.
func (ly layout) lastBatchIndex() int { return int(11 - ly.base) }

// TestTornTailEveryByte cuts the final batch at every byte offset, with each kind of
// tail after the cut: the log must come back as the acknowledged prefix plus the final
// batch's records that are complete, and accept appends afterwards, in a preallocated
// segment right after the last valid record. SegmentSize 1 puts the final batch alone
// in a new segment (and makes every segment exactly as long as its records).
func TestTornTailEveryByte(t *testing.T) {
	for _, segSize := range []int64{0, 1} {
		for _, lastBatch := range []uint64{1, 4} {
			for _, tail := range tails {
				t.Run(fmt.Sprintf("seg=%d/batch=%d/%s", segSize, lastBatch, tail.name), func(t *testing.T) {
					dir := t.TempDir()
					ly := buildLog(t, dir, segSize, lastBatch)
					k0 := ly.lastBatchIndex()
					for cut := ly.offsets[k0]; cut < ly.size; cut++ {
						ly.restore(t, dir, tail.make(ly, ly.offsets[k0], cut))
						want := uint64(10)
						for k := k0; k < len(ly.offsets) && ly.end(k) <= cut; k++ {
							want++
						}
						when := fmt.Sprintf("cut at %d of %d", cut, ly.size)
						l := expectPrefix(t, dir, want, when)
						if cut%7 == 0 || cut == ly.offsets[k0] {
							must(t, l.StoreLogs(entries(want+1, want+1, 2)))
							s := l.segs[len(l.segs)-1]
							if k := int(want + 1 - ly.base); segSize == 0 && tail.name != "file ends" && want == 10 &&
								(s.base != ly.base || s.offsets[k] != ly.offsets[k]) {
								t.Fatalf("%s: index %d appended to %s offset %d; want %s offset %d (right after the last valid record)",
									when, want+1, s.path, s.offsets[len(s.offsets)-1], ly.path, ly.offsets[k])
							}
							// A prefix of the torn batch was kept: its segment was cut, and
							// the append starts a new one (see loadSegment).
							if want > 10 && (s.base != want+1 || s.offsets[0] != 0) {
								t.Fatalf("%s: index %d appended to %s offset %d; want a new segment after the kept prefix of the torn batch",
									when, want+1, s.path, s.offsets[len(s.offsets)-1])
							}
							must(t, l.Close())
							l = expectPrefix(t, dir, want+1, when+", appended, reopened")
						}
						must(t, l.Close())
					}
				})
			}
		}
	}
}

// TestCorruptTailEveryByte flips each byte of the final batch in turn: the damaged
// record and everything after it go, everything before it stays.
func TestCorruptTailEveryByte(t *testing.T) {
	for _, segSize := range []int64{0, 1} {
		for _, lastBatch := range []uint64{1, 4} {
			t.Run(fmt.Sprintf("seg=%d/batch=%d", segSize, lastBatch), func(t *testing.T) {
				dir := t.TempDir()
				ly := buildLog(t, dir, segSize, lastBatch)
				k0 := ly.lastBatchIndex()
				for pos := ly.offsets[k0]; pos < ly.size; pos++ {
					b := slices.Clone(ly.data)
					b[pos] ^= 0xA5
					ly.restore(t, dir, b)
					k := k0
					for ly.end(k) <= pos {
						k++
					}
					l := expectPrefix(t, dir, 10+uint64(k-k0), fmt.Sprintf("byte %d flipped", pos))
					must(t, l.Close())
				}
				// Garbage in the free space after the final batch is not a batch:
				// nothing is lost, and the garbage is zeroed so the space can be used.
				for _, pos := range []int64{ly.size, ly.size + 1, ly.size + 100, int64(len(ly.data)) - 1} {
					if pos < ly.size || pos >= int64(len(ly.data)) {
						continue // no free space (SegmentSize 1)
					}
					b := slices.Clone(ly.data)
					b[pos] ^= 0xA5
					ly.restore(t, dir, b)
					l := expectPrefix(t, dir, 10+uint64(len(ly.offsets)-k0), fmt.Sprintf("free byte %d flipped", pos))
					must(t, l.Close())
					got, err := os.ReadFile(ly.path)
					must(t, err)
					if !bytes.Equal(got, ly.data) {
						t.Fatalf("free byte %d flipped: the garbage was not zeroed", pos)
					}
				}
			})
		}
	}
}

// TestZeroedPagesInFinalBatch: the final write's pages can reach the disk in any order,
// leaving zeros where a middle record should be while later records are intact.
func TestZeroedPagesInFinalBatch(t *testing.T) {
	dir := t.TempDir()
	ly := buildLog(t, dir, 0, 4)
	k0 := ly.lastBatchIndex()
	for hole := k0; hole < len(ly.offsets); hole++ {
		b := slices.Clone(ly.data)
		clear(b[ly.offsets[hole]:ly.end(hole)])
		ly.restore(t, dir, b)
		l := expectPrefix(t, dir, 10+uint64(hole-k0), fmt.Sprintf("record %d zeroed", hole))
		must(t, l.Close())
	}
	// Zeros from some point to the end (allocated but unwritten blocks).
	for from := ly.offsets[k0]; from < ly.size; from += 13 {
		b := slices.Clone(ly.data)
		clear(b[from:])
		ly.restore(t, dir, b)
		want := uint64(10)
		for k := k0; k < len(ly.offsets) && ly.end(k) <= from; k++ {
			want++
		}
		l := expectPrefix(t, dir, want, fmt.Sprintf("zeros from %d", from))
		must(t, l.Close())
	}
}

// TestCorruptAcknowledgedFailsOpen flips each byte of batch 6..10, which was followed
// by another batch and so was acknowledged: Open must refuse, naming file and offset,
// rather than drop it.
func TestCorruptAcknowledgedFailsOpen(t *testing.T) {
	for _, lastBatch := range []uint64{1, 4} {
		t.Run(fmt.Sprintf("batch=%d", lastBatch), func(t *testing.T) {
			dir := t.TempDir()
			ly := buildLog(t, dir, 0, lastBatch)
			for pos := ly.offsets[0]; pos < ly.offsets[ly.lastBatchIndex()]; pos++ {
				b := slices.Clone(ly.data)
				b[pos] ^= 0x01
				ly.restore(t, dir, b)
				k := 0
				for ly.end(k) <= pos {
					k++
				}
				l, err := Open(dir, Options{})
				if err == nil {
					_ = l.Close()
					t.Fatalf("byte %d (record of index %d) flipped: Open succeeded", pos, k+1)
				}
				want := fmt.Sprintf("%s offset %d", ly.path, ly.offsets[k])
				if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), want) {
					t.Fatalf("byte %d flipped: Open error %v; want ErrCorrupt mentioning %q", pos, err, want)
				}
			}
		})
	}
}

// TestDamagedEarlierSegmentFailsOpen: a segment before the last one is complete by
// construction, so a cut, a flipped byte or a record zeroed there is corruption, and
// so is garbage in its free space (nothing is ever written there), or a missing one.
func TestDamagedEarlierSegmentFailsOpen(t *testing.T) {
	setup := func(t *testing.T) (string, []string, map[string]int64) {
		dir := t.TempDir()
		ends := fillSegments(t, dir, 1024)
		segs := segmentFiles(t, dir)
		if len(segs) < 4 {
			t.Fatalf("only %d segments", len(segs))
		}
		return dir, segs, ends
	}
	damage := map[string]func(t *testing.T, path string, end int64){
		"flipped byte": func(t *testing.T, path string, end int64) {
			b, err := os.ReadFile(path)
			must(t, err)
			b[end/2] ^= 0x10
			must(t, os.WriteFile(path, b, 0o640))
		},
		"zeroed record": func(t *testing.T, path string, end int64) {
			b, err := os.ReadFile(path)
			must(t, err)
			clear(b[end-10 : end])
			must(t, os.WriteFile(path, b, 0o640))
		},
		"cut short": func(t *testing.T, path string, end int64) { must(t, os.Truncate(path, end-3)) },
		"garbage in free space": func(t *testing.T, path string, end int64) {
			b, err := os.ReadFile(path)
			must(t, err)
			if int64(len(b)) <= end {
				t.Fatalf("%s has no free space (%d bytes, records end at %d)", path, len(b), end)
			}
			b[len(b)-1] = 1
			must(t, os.WriteFile(path, b, 0o640))
		},
		"missing": func(t *testing.T, path string, _ int64) { must(t, os.Remove(path)) },
	}
	for name, fn := range damage {
		for _, which := range []int{0, 1} {
			t.Run(fmt.Sprintf("%s/segment %d", name, which), func(t *testing.T) {
				dir, segs, ends := setup(t)
				fn(t, segs[which], ends[segs[which]])
				l, err := Open(dir, Options{})
				if err == nil {
					_ = l.Close()
					t.Fatal("Open succeeded")
				}
				if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), filepath.Base(segs[which])) && !strings.Contains(err.Error(), filepath.Base(segs[which+1])) {
					t.Fatalf("Open: %v; want ErrCorrupt naming the damaged segment", err)
				}
			})
		}
	}
}

// TestCrashStatesOfDeleteRange reproduces the on-disk state left at each point where a
// DeleteRange (or the append after one) can be interrupted, and checks what Open makes
// of it.
func TestCrashStatesOfDeleteRange(t *testing.T) {
	const segSize = 1024
	build := func(t *testing.T) (string, metaState) {
		dir := t.TempDir()
		l := openT(t, dir, Options{SegmentSize: segSize})
		for i := uint64(1); i <= 300; i += 10 {
			must(t, l.StoreLogs(entries(i, i+9, 1)))
		}
		must(t, l.SetUint64([]byte("CurrentTerm"), 4))
		meta := l.meta
		must(t, l.Close())
		return dir, meta
	}
	reopen := func(t *testing.T, dir string) *Log { return openT(t, dir, Options{SegmentSize: segSize}) }
	model := func(first, last uint64) *model {
		m := newModel()
		if last > 0 {
			m.store(entries(first, last, 1))
		}
		return m
	}

	t.Run("prefix: marker written, no file removed", func(t *testing.T) {
		dir, meta := build(t)
		meta.marker = 201
		_, err := writeMeta(dir, meta)
		must(t, err)
		l := reopen(t, dir)
		model(201, 300).check(t, l, "reopened")
		for _, p := range segmentFiles(t, dir) {
			base, _ := parseSegmentName(filepath.Base(p))
			s := l.segs[0]
			if base < s.base {
				t.Fatalf("segment %s wholly below the marker survived Open", p)
			}
		}
		if v, _ := l.GetUint64([]byte("CurrentTerm")); v != 4 {
			t.Fatalf("CurrentTerm = %d", v)
		}
	})
	t.Run("prefix: marker written, oldest file removed", func(t *testing.T) {
		dir, meta := build(t)
		meta.marker = 201
		_, err := writeMeta(dir, meta)
		must(t, err)
		must(t, os.Remove(segmentFiles(t, dir)[0]))
		model(201, 300).check(t, reopen(t, dir), "reopened")
	})
	t.Run("prefix: crash before the marker's rename", func(t *testing.T) {
		dir, _ := build(t)
		must(t, os.WriteFile(filepath.Join(dir, metaTemp), []byte("half a meta fi"), 0o640))
		model(1, 300).check(t, reopen(t, dir), "reopened")
		if _, err := os.Stat(filepath.Join(dir, metaTemp)); !errors.Is(err, os.ErrNotExist) {
			t.Fatal("meta.tmp left behind")
		}
	})
	t.Run("delete all: marker written, files remain", func(t *testing.T) {
		dir, meta := build(t)
		meta.marker = 301
		_, err := writeMeta(dir, meta)
		must(t, err)
		l := reopen(t, dir)
		model(0, 0).check(t, l, "reopened")
		if n := len(segmentFiles(t, dir)); n != 0 {
			t.Fatalf("%d segment files left after a delete of everything", n)
		}
		// Raft then appends after the snapshot it installed, which may be below the
		// deleted entries: the marker must be lowered, or they would vanish on restart.
		must(t, l.StoreLogs(entries(50, 60, 1)))
		must(t, l.Close())
		model(50, 60).check(t, reopen(t, dir), "appended below the old marker, reopened")
	})
	t.Run("delete all: marker lowered, segment not yet created", func(t *testing.T) {
		dir, meta := build(t)
		for _, p := range segmentFiles(t, dir) {
			must(t, os.Remove(p))
		}
		meta.marker = 50
		_, err := writeMeta(dir, meta)
		must(t, err)
		model(0, 0).check(t, reopen(t, dir), "reopened")
	})
	t.Run("suffix: newest segments removed, cut not done", func(t *testing.T) {
		dir, _ := build(t)
		segs := segmentFiles(t, dir)
		must(t, os.Remove(segs[len(segs)-1]))
		must(t, os.Remove(segs[len(segs)-2]))
		lastBase, _ := parseSegmentName(filepath.Base(segs[len(segs)-2]))
		l := reopen(t, dir)
		model(1, lastBase-1).check(t, l, "reopened")
		must(t, l.StoreLogs(entries(lastBase, lastBase+20, 1)))
	})
	for name, content := range map[string][]byte{"empty": nil, "preallocated": make([]byte, segSize)} {
		t.Run("new segment created, first write lost/"+name, func(t *testing.T) {
			dir, _ := build(t)
			must(t, os.WriteFile(segmentPath(dir, 301), content, 0o640))
			l := reopen(t, dir)
			model(1, 300).check(t, l, "reopened")
			must(t, l.StoreLogs(entries(301, 305, 1)))
			must(t, l.Close())
			model(1, 305).check(t, reopen(t, dir), "appended, reopened")
		})
	}
	t.Run("spare left over", func(t *testing.T) {
		dir, _ := build(t)
		// A crash while the spare was zero-filled: it must not be used as it is.
		must(t, os.WriteFile(filepath.Join(dir, spareName), []byte("not zeros"), 0o640))
		l := reopen(t, dir)
		model(1, 300).check(t, l, "reopened")
		for i := uint64(301); i <= 400; i += 10 {
			must(t, l.StoreLogs(entries(i, i+9, 1)))
		}
		must(t, l.Close())
		model(1, 400).check(t, reopen(t, dir), "appended across segments, reopened")
	})
	for _, tail := range tails {
		t.Run("torn append after a suffix delete/"+tail.name, func(t *testing.T) {
			dir := t.TempDir()
			l := openT(t, dir, Options{})
			must(t, l.StoreLogs(entries(1, 9, 1)))
			must(t, l.StoreLogs(entries(10, 14, 1)))
			must(t, l.DeleteRange(6, 14))
			must(t, l.StoreLogs(entries(6, 8, 2)))
			s := l.segs[len(l.segs)-1]
			ly := layout{path: s.path, offsets: s.offsets, size: s.size}
			off7 := s.offsets[7-s.base]
			must(t, l.Close())
			var err error
			ly.data, err = os.ReadFile(s.path)
			must(t, err)
			// Tear the final batch inside index 7: 6 (term 2) stays; nothing of the
			// old term-1 entries 7..14 may come back.
			must(t, os.WriteFile(s.path, tail.make(ly, s.offsets[0], off7+5), 0o640))
			l = openT(t, dir, Options{})
			m := newModel()
			m.store(entries(1, 5, 1))
			m.store(entries(6, 6, 2))
			m.check(t, l, "reopened")
		})
	}
}

// errCrash is what the crash hook panics with.
type errCrash struct{ step string }

// TestCrashAtEveryStep stops each kind of write at every step a crash could interrupt
// (the process dies there: no deferred work, no Close), reopens, and checks that the
// log is one of the states the operation allows. It checks the ordering of the steps;
// that each step is durable before the next is the job of the fsyncs between them.
func TestCrashAtEveryStep(t *testing.T) {
	const segSize = 1024
	type state struct{ first, last uint64 } // entries first..last, term 1 up to 300, then term 2
	cases := []struct {
		name  string
		setup []op
		op    op
		ok    func(s state) bool
	}{
		{"prefix delete", []op{st(1, 300, 1)}, del(1, 200),
			func(s state) bool { return s == state{1, 300} || s == state{201, 300} }},
		{"delete all", []op{st(1, 300, 1)}, del(1, 300),
			func(s state) bool { return s == state{1, 300} || s == state{0, 0} }},
		{"delete all after compaction", []op{st(1, 300, 1), del(1, 120)}, del(121, 300),
			func(s state) bool { return s == state{121, 300} || s == state{0, 0} }},
		{"suffix delete", []op{st(1, 300, 1)}, del(150, 300),
			func(s state) bool { return s.first == 1 && s.last >= 149 && s.last <= 300 }},
		{"append after delete all, below the marker", []op{st(1, 300, 1), del(1, 300)}, st(50, 60, 2),
			func(s state) bool { return s == state{0, 0} || s == state{50, 60} }},
		{"append after delete all, above the marker", []op{st(1, 300, 1), del(1, 300)}, st(900, 910, 2),
			func(s state) bool { return s == state{0, 0} || s == state{900, 910} }},
		{"append to an empty log", nil, st(1, 10, 2),
			func(s state) bool { return s == state{0, 0} || s == state{1, 10} }},
		{"append starting a segment", []op{st(1, 300, 1)}, st(301, 310, 2),
			func(s state) bool { return s == state{1, 300} || s == state{1, 310} }},
		{"append after a suffix delete", []op{st(1, 300, 1), del(155, 300)}, st(155, 165, 2),
			func(s state) bool { return s == state{1, 154} || s == state{1, 165} }},
	}
	apply := func(l *Log, o op) error {
		if o.isDel {
			return l.DeleteRange(o.del[0], o.del[1])
		}
		return l.StoreLogs(entries(o.store[0], o.store[1], o.store[2]))
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var steps []string
			for crashAt := 0; ; crashAt++ {
				dir := t.TempDir()
				n := 0
				steps = steps[:0]
				var crashed *errCrash
				opts := Options{SegmentSize: segSize, crashHook: func(step string) {
					if n == crashAt {
						panic(&errCrash{step})
					}
					n++
					steps = append(steps, step)
				}}
				l, err := Open(dir, Options{SegmentSize: segSize})
				must(t, err)
				for _, o := range tc.setup {
					if o.isDel {
						must(t, apply(l, o))
						continue
					}
					for i := o.store[0]; i <= o.store[1]; i += 10 { // several segments
						must(t, l.StoreLogs(entries(i, min(i+9, o.store[1]), o.store[2])))
					}
				}
				must(t, l.Close())
				l, err = Open(dir, opts)
				must(t, err)
				func() {
					defer func() {
						if r := recover(); r != nil {
							c, ok := r.(*errCrash)
							if !ok {
								panic(r)
							}
							crashed = c
						}
					}()
					must(t, apply(l, tc.op))
				}()
				l.closeFiles() // the process dies: nothing else runs
				if crashed == nil {
					if crashAt == 0 {
						t.Fatal("the operation passed no crash point")
					}
					t.Logf("%d crash points: %v", crashAt, steps)
					return
				}
				l, err = Open(dir, Options{SegmentSize: segSize})
				if err != nil {
					t.Fatalf("crash at %q: Open: %v", crashed.step, err)
				}
				first, _ := l.FirstIndex()
				last, _ := l.LastIndex()
				got := state{first, last}
				if !tc.ok(got) {
					t.Fatalf("crash at %q (point %d): log is [%d, %d], which %s does not allow", crashed.step, crashAt, first, last, tc.op)
				}
				m := newModel()
				for i := first; i <= last && last != 0; i++ {
					term := uint64(1)
					if o := tc.op; !o.isDel && i >= o.store[0] && i <= o.store[1] {
						term = o.store[2]
					}
					m.store(entries(i, i, term))
				}
				m.check(t, l, fmt.Sprintf("after crash at %q", crashed.step))
				// The reopened log must accept the next append.
				must(t, l.StoreLogs(entries(last+1, last+1, 3)))
				must(t, l.Close())
			}
		})
	}
}
