package wal

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// TestMain makes a zero Options.SegmentSize mean 64 KiB: big enough that the tests that
// want one segment get one, small enough that zero-filling the many logs they create
// costs little. Benchmarks ask for DefaultSegmentSize explicitly.
func TestMain(m *testing.M) {
	defaultSegmentSize = 64 << 10
	os.Exit(m.Run())
}

// entry builds a deterministic log entry: its data, extensions and type derive from
// index and term, so a read-back can be checked against the model.
func entry(index, term uint64) *raft.Log {
	l := &raft.Log{
		Index:      index,
		Term:       term,
		Type:       raft.LogType(index % 6),
		Data:       []byte(fmt.Sprintf("data-%d-%d-%s", index, term, bytes.Repeat([]byte("x"), int(index%37)))),
		AppendedAt: time.Unix(1_700_000_000, int64(index)*1000),
	}
	if index%3 == 0 {
		l.Extensions = []byte(fmt.Sprintf("ext-%d", index))
	}
	if index%10 == 7 {
		l.Data = nil // empty data must round-trip as nil
	}
	return l
}

func entries(from, to, term uint64) []*raft.Log {
	var out []*raft.Log
	for i := from; i <= to; i++ {
		out = append(out, entry(i, term))
	}
	return out
}

// model is the reference behaviour: a contiguous map of index to term.
type model struct {
	first, last uint64
	terms       map[uint64]uint64
}

func newModel() *model { return &model{terms: map[uint64]uint64{}} }

func (m *model) store(logs []*raft.Log) {
	for _, l := range logs {
		if m.last == 0 {
			m.first = l.Index
		}
		m.terms[l.Index] = l.Term
		m.last = l.Index
	}
}

func (m *model) del(min, max uint64) {
	if m.last == 0 {
		return
	}
	for i := m.first; i <= m.last; i++ {
		if i >= min && i <= max {
			delete(m.terms, i)
		}
	}
	if len(m.terms) == 0 {
		m.first, m.last = 0, 0
		return
	}
	for m.terms[m.first] == 0 {
		m.first++
	}
	for m.terms[m.last] == 0 {
		m.last--
	}
}

// check compares the store with the model entry by entry.
func (m *model) check(t *testing.T, l *Log, when string) {
	t.Helper()
	first, err := l.FirstIndex()
	if err != nil || first != m.first {
		t.Fatalf("%s: FirstIndex = %d, %v; want %d", when, first, err, m.first)
	}
	last, err := l.LastIndex()
	if err != nil || last != m.last {
		t.Fatalf("%s: LastIndex = %d, %v; want %d", when, last, err, m.last)
	}
	for i := m.first; i <= m.last && m.last != 0; i++ {
		var got raft.Log
		if err := l.GetLog(i, &got); err != nil {
			t.Fatalf("%s: GetLog(%d): %v", when, i, err)
		}
		want := entry(i, m.terms[i])
		if got.Index != want.Index || got.Term != want.Term || got.Type != want.Type ||
			!bytes.Equal(got.Data, want.Data) || !bytes.Equal(got.Extensions, want.Extensions) ||
			!got.AppendedAt.Equal(want.AppendedAt) || (want.Data == nil) != (got.Data == nil) {
			t.Fatalf("%s: GetLog(%d) = %+v; want %+v", when, i, got, want)
		}
	}
	// Just outside the log, and the empty log: exactly raft.ErrLogNotFound, unwrapped,
	// because raft's replication compares it with ==.
	for _, i := range []uint64{0, m.first - 1, m.last + 1, m.last + 1000} {
		if m.last != 0 && i >= m.first && i <= m.last {
			continue
		}
		var got raft.Log
		if err := l.GetLog(i, &got); err != raft.ErrLogNotFound { //nolint:errorlint // raft compares with ==
			t.Fatalf("%s: GetLog(%d) = %v; want raft.ErrLogNotFound itself", when, i, err)
		}
	}
}

type op struct {
	store   [3]uint64 // from, to, term (to == 0: no store)
	del     [2]uint64 // min, max
	isDel   bool
	wantErr error
}

func st(from, to, term uint64) op { return op{store: [3]uint64{from, to, term}} }
func del(min, max uint64) op      { return op{del: [2]uint64{min, max}, isDel: true} }
func (o op) fails(err error) op   { o.wantErr = err; return o }
func (o op) String() string {
	if o.isDel {
		return fmt.Sprintf("DeleteRange(%d, %d)", o.del[0], o.del[1])
	}
	return fmt.Sprintf("StoreLogs(%d..%d term %d)", o.store[0], o.store[1], o.store[2])
}

func openT(t testing.TB, dir string, opts Options) *Log {
	t.Helper()
	l, err := Open(dir, opts)
	if err != nil {
		t.Fatalf("Open(%s): %v", dir, err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// TestConformance runs each sequence of operations against the store and the model,
// comparing them after every operation and again after closing and reopening.
func TestConformance(t *testing.T) {
	cases := []struct {
		name string
		ops  []op
	}{
		{"empty", nil},
		{"single entry", []op{st(1, 1, 1)}},
		{"batches", []op{st(1, 10, 1), st(11, 11, 1), st(12, 40, 2)}},
		{"empty log starts anywhere", []op{st(1000, 1010, 3)}},
		{"gap refused", []op{st(1, 10, 1), st(12, 15, 1).fails(ErrOutOfOrder), st(11, 12, 1)}},
		{"overwrite refused", []op{st(1, 10, 1), st(5, 6, 2).fails(ErrOutOfOrder), st(10, 10, 2).fails(ErrOutOfOrder)}},
		{"index 0 refused", []op{st(0, 3, 1).fails(ErrOutOfOrder)}},
		{"prefix delete", []op{st(1, 100, 1), del(1, 40), st(101, 110, 1), del(41, 41)}},
		{"prefix delete from below first", []op{st(5, 100, 1), del(1, 50)}},
		{"suffix delete then rewrite", []op{st(1, 100, 1), del(61, 100), st(61, 70, 2), del(70, 70), st(70, 75, 3)}},
		{"suffix delete past last", []op{st(1, 100, 1), del(90, 1<<40), st(90, 95, 4)}},
		{"delete all then higher", []op{st(1, 100, 1), del(1, 100), st(500, 510, 2)}},
		{"delete all then lower", []op{st(1, 100, 1), del(1, 40), del(41, 100), st(50, 60, 2), st(61, 61, 2)}},
		{"delete all then same", []op{st(1, 100, 1), del(1, 100), st(1, 5, 2)}},
		{"compact, reset, compact", []op{st(1, 300, 1), del(1, 250), del(1, 300), st(301, 600, 2), del(301, 599)}},
		{"middle delete refused", []op{st(1, 100, 1), del(10, 20).fails(ErrMiddleDelete)}},
		{"deletes outside are no-ops", []op{del(1, 10), st(10, 20, 1), del(1, 9), del(21, 30), del(15, 14)}},
		{"suffix across segments", []op{st(1, 50, 1), st(51, 100, 1), st(101, 150, 1), st(151, 200, 1), del(73, 200), st(73, 80, 2)}},
		{"suffix at a segment start", []op{st(1, 60, 1), st(61, 120, 1), st(121, 180, 1), del(61, 180), st(61, 70, 2)}},
		{"prefix across segments", []op{st(1, 60, 1), st(61, 120, 1), st(121, 180, 1), del(1, 130), st(181, 190, 1), del(131, 185)}},
	}
	for _, segSize := range []int64{0, 2048} {
		for _, tc := range cases {
			t.Run(fmt.Sprintf("%s/seg=%d", tc.name, segSize), func(t *testing.T) {
				dir := t.TempDir()
				opts := Options{SegmentSize: segSize}
				l := openT(t, dir, opts)
				m := newModel()
				m.check(t, l, "new")
				for i, o := range tc.ops {
					var err error
					if o.isDel {
						err = l.DeleteRange(o.del[0], o.del[1])
					} else {
						err = l.StoreLogs(entries(o.store[0], o.store[1], o.store[2]))
					}
					if !errors.Is(err, o.wantErr) || (o.wantErr == nil) != (err == nil) {
						t.Fatalf("op %d %v: err = %v; want %v", i, o, err, o.wantErr)
					}
					if err == nil {
						if o.isDel {
							m.del(o.del[0], o.del[1])
						} else {
							m.store(entries(o.store[0], o.store[1], o.store[2]))
						}
					}
					m.check(t, l, fmt.Sprintf("after op %d %v", i, o))
					if err := l.Close(); err != nil {
						t.Fatal(err)
					}
					l = openT(t, dir, opts)
					m.check(t, l, fmt.Sprintf("reopened after op %d %v", i, o))
				}
			})
		}
	}
}

func TestSegmentsRollAndCompactionRemovesFiles(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, Options{SegmentSize: 4096})
	for i := uint64(1); i <= 1000; i += 10 {
		if err := l.StoreLogs(entries(i, i+9, 1)); err != nil {
			t.Fatal(err)
		}
	}
	before := segmentFiles(t, dir)
	if len(before) < 10 {
		t.Fatalf("%d segments for 1000 entries with 4 KiB segments; want many", len(before))
	}
	if err := l.DeleteRange(1, 900); err != nil {
		t.Fatal(err)
	}
	after := segmentFiles(t, dir)
	if len(after) > 3 {
		t.Fatalf("%d segments left after deleting 900 of 1000 entries: %v", len(after), after)
	}
	m := newModel()
	m.store(entries(1, 1000, 1))
	m.del(1, 900)
	m.check(t, l, "after compaction")
}

func segmentFiles(t testing.TB, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "wal-*.seg"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestStableStore(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, Options{})
	if v, err := l.Get([]byte("missing")); err != nil || v != nil {
		t.Fatalf("Get(missing) = %q, %v; want nil, nil", v, err)
	}
	if v, err := l.GetUint64([]byte("missing")); err != nil || v != 0 {
		t.Fatalf("GetUint64(missing) = %d, %v; want 0, nil", v, err)
	}
	must(t, l.SetUint64([]byte("CurrentTerm"), 7))
	must(t, l.Set([]byte("LastVoteCand"), []byte("node2")))
	must(t, l.SetUint64([]byte("CurrentTerm"), 8))
	must(t, l.Set([]byte("empty"), nil))
	if _, err := l.GetUint64([]byte("LastVoteCand")); err == nil {
		t.Fatal("GetUint64 of a 5-byte value succeeded")
	}
	// The log's marker shares the meta file: neither may clobber the other.
	must(t, l.StoreLogs(entries(1, 20, 1)))
	must(t, l.DeleteRange(1, 10))
	must(t, l.Set([]byte("after"), []byte("compaction")))
	check := func(l *Log) {
		t.Helper()
		if v, _ := l.GetUint64([]byte("CurrentTerm")); v != 8 {
			t.Fatalf("CurrentTerm = %d; want 8", v)
		}
		if v, _ := l.Get([]byte("LastVoteCand")); string(v) != "node2" {
			t.Fatalf("LastVoteCand = %q", v)
		}
		if v, _ := l.Get([]byte("after")); string(v) != "compaction" {
			t.Fatalf("after = %q", v)
		}
		if first, _ := l.FirstIndex(); first != 11 {
			t.Fatalf("FirstIndex = %d; want 11 (marker lost by a stable-store write?)", first)
		}
	}
	check(l)
	must(t, l.Close())
	l = openT(t, dir, Options{})
	check(l)
	// Returned values are copies.
	v, _ := l.Get([]byte("LastVoteCand"))
	v[0] = 'X'
	if v2, _ := l.Get([]byte("LastVoteCand")); string(v2) != "node2" {
		t.Fatal("Get returned a slice aliasing the store")
	}
}

func TestCorruptMetaFailsOpen(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, Options{})
	must(t, l.SetUint64([]byte("CurrentTerm"), 3))
	must(t, l.Close())
	path := filepath.Join(dir, metaName)
	b, err := os.ReadFile(path)
	must(t, err)
	b[len(b)/2] ^= 0x40
	must(t, os.WriteFile(path, b, 0o640))
	_, err = Open(dir, Options{})
	if !errors.Is(err, ErrCorrupt) || !bytes.Contains([]byte(err.Error()), []byte(path)) {
		t.Fatalf("Open with a corrupt meta file: %v; want ErrCorrupt naming %s", err, path)
	}
}

func TestLockAndClose(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, Options{})
	if _, err := Open(dir, Options{}); !errors.Is(err, ErrLocked) {
		t.Fatalf("second Open: %v; want ErrLocked", err)
	}
	must(t, l.StoreLogs(entries(1, 3, 1)))
	must(t, l.Close())
	must(t, l.Close()) // idempotent
	var got raft.Log
	for name, err := range map[string]error{
		"GetLog":      l.GetLog(1, &got),
		"StoreLogs":   l.StoreLogs(entries(4, 4, 1)),
		"DeleteRange": l.DeleteRange(1, 1),
		"Set":         l.Set([]byte("k"), []byte("v")),
	} {
		if !errors.Is(err, ErrClosed) {
			t.Errorf("%s after Close: %v; want ErrClosed", name, err)
		}
	}
	if _, err := l.FirstIndex(); !errors.Is(err, ErrClosed) {
		t.Errorf("FirstIndex after Close: %v", err)
	}
	l2 := openT(t, dir, Options{})
	if last, _ := l2.LastIndex(); last != 3 {
		t.Fatalf("LastIndex after reopen = %d; want 3", last)
	}
}

// TestFailedSyncIsSticky: after fsync fails nothing of the batch is visible, every
// later write fails with ErrFailed, reads keep working, and a reopen recovers.
func TestFailedSyncIsSticky(t *testing.T) {
	dir := t.TempDir()
	var fail sync.Mutex
	failing := false
	opts := Options{syncHook: func(f *os.File) error {
		fail.Lock()
		defer fail.Unlock()
		if failing {
			return errors.New("injected EIO")
		}
		return f.Sync()
	}}
	l := openT(t, dir, opts)
	must(t, l.StoreLogs(entries(1, 10, 1)))
	fail.Lock()
	failing = true
	fail.Unlock()
	if err := l.StoreLogs(entries(11, 20, 1)); err == nil {
		t.Fatal("StoreLogs succeeded although fsync failed")
	}
	if last, _ := l.LastIndex(); last != 10 {
		t.Fatalf("LastIndex = %d after a failed batch; want 10", last)
	}
	var got raft.Log
	if err := l.GetLog(11, &got); err != raft.ErrLogNotFound { //nolint:errorlint // raft compares with ==
		t.Fatalf("GetLog(11) after failed batch: %v", err)
	}
	fail.Lock()
	failing = false
	fail.Unlock()
	if err := l.StoreLogs(entries(11, 20, 1)); !errors.Is(err, ErrFailed) {
		t.Fatalf("StoreLogs after a failed sync: %v; want ErrFailed", err)
	}
	if err := l.DeleteRange(1, 5); !errors.Is(err, ErrFailed) {
		t.Fatalf("DeleteRange after a failed sync: %v; want ErrFailed", err)
	}
	m := newModel()
	m.store(entries(1, 10, 1))
	m.check(t, l, "reads after failure")
	must(t, l.Close())
	// The unacknowledged batch reached the page cache, so it may be back: raft allows
	// that (a leader reported its outcome as unknown). Acknowledged entries must be.
	l = openT(t, dir, Options{})
	if last, _ := l.LastIndex(); last != 10 && last != 20 {
		t.Fatalf("LastIndex after reopen = %d; want 10 or 20", last)
	}
	must(t, l.StoreLogs(entries(l.last+1, l.last+5, 2)))
}

// TestConcurrentReadersAndWriter runs raft's access pattern under -race: one goroutine
// appends and compacts, others read whatever is in [FirstIndex, LastIndex].
func TestConcurrentReadersAndWriter(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, Options{SegmentSize: 8 << 10})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for r := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(r), 1))
			for {
				select {
				case <-stop:
					return
				default:
				}
				first, _ := l.FirstIndex()
				last, _ := l.LastIndex()
				if last == 0 {
					continue
				}
				i := first + rng.Uint64N(last-first+1)
				var got raft.Log
				err := l.GetLog(i, &got)
				if err == raft.ErrLogNotFound { //nolint:errorlint // compacted meanwhile
					continue
				}
				if err != nil {
					errs <- fmt.Errorf("GetLog(%d): %w", i, err)
					return
				}
				if want := entry(i, 1); !bytes.Equal(got.Data, want.Data) {
					errs <- fmt.Errorf("GetLog(%d) data %q; want %q", i, got.Data, want.Data)
					return
				}
			}
		}()
	}
	next := uint64(1)
	for round := range 200 {
		n := uint64(1 + round%17)
		if err := l.StoreLogs(entries(next, next+n-1, 1)); err != nil {
			t.Fatal(err)
		}
		next += n
		if round%25 == 24 {
			if err := l.DeleteRange(1, next-50); err != nil {
				t.Fatal(err)
			}
		}
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestOneSyncPerBatch: the point of the package. A batch of any size costs exactly one
// fsync of the segment, including the batch that starts a new segment.
func TestOneSyncPerBatch(t *testing.T) {
	l := openT(t, t.TempDir(), Options{SegmentSize: 4096})
	next := uint64(1)
	for _, n := range []uint64{1, 16, 128, 1, 128, 3} {
		before := l.Syncs()
		must(t, l.StoreLogs(entries(next, next+n-1, 1)))
		if got := l.Syncs() - before; got != 1 {
			t.Fatalf("StoreLogs of %d entries made %d syncs; want 1", n, got)
		}
		next += n
	}
}
