package wal

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"

	"github.com/hashicorp/raft"
)

// tornCrash is what the hooks of TestRandomCrashesAndPowerLoss panic with.
type tornCrash struct{}

// envInt reads a non-negative integer from the environment, def if unset.
func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		t.Fatalf("%s=%q: want a non-negative integer", name, v)
	}
	return n
}

// TestRandomCrashesAndPowerLoss runs random sequences of batches (some larger than a
// segment), prefix, suffix and whole deletes (some near 2^32) against a model, with
// process crashes at random steps (torn writes of four kinds: a prefix, a prefix then
// garbage, a zeroed hole, random 64-byte sectors lost; crash points in StoreLogs,
// segment roll-over and DeleteRange) and simulated power losses, both at quiet points
// and right after a crash. A power loss puts each segment back to its content at its
// last sync (syncHook) and the directory to its listing at its last fsync (syncDir).
// After every crash Open must succeed with the acknowledged entries plus, at most, a
// prefix of the interrupted batch (which then counts as stored: Open made it durable).
// LEASEHOLD_WAL_SEEDS and LEASEHOLD_WAL_SEED_FROM run more or other seeds.
func TestRandomCrashesAndPowerLoss(t *testing.T) {
	seeds := 150
	if testing.Short() {
		seeds = 20
	}
	seeds = envInt(t, "LEASEHOLD_WAL_SEEDS", seeds)
	from := envInt(t, "LEASEHOLD_WAL_SEED_FROM", 0)
	for seed := from; seed < from+seeds; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { randomCrashes(t, uint64(seed)) })
	}
}

func randomCrashes(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 99))
	dir := t.TempDir()
	segSize := int64(256 + rng.IntN(4096))
	tear := -1 // mode for the next write, -1: none
	var tearLog []string
	crashAt := -1
	durable := map[string][]byte{}
	var listing []string // segment files at the directory's last fsync
	defer func(orig func(string) error) { syncDir = orig }(syncDir)
	syncDir = func(d string) error {
		if d == dir {
			listing = segmentFiles(t, dir)
			for p := range durable {
				if !slices.Contains(listing, p) {
					delete(durable, p) // its removal is durable: a new file may take the name
				}
			}
		}
		return fsyncDir(d)
	}
	opts := Options{SegmentSize: segSize, syncHook: func(f *os.File) error {
		b, err := os.ReadFile(f.Name())
		if err != nil {
			return err
		}
		durable[f.Name()] = b
		return nil // the simulation's images are what counts
	}, crashHook: func(step string) {
		if crashAt < 0 {
			return
		}
		if crashAt == 0 {
			crashAt = -1
			tearLog = append(tearLog, "crash at "+step)
			panic(tornCrash{})
		}
		crashAt--
	}, writeHook: func(f *os.File, b []byte, off int64) error {
		if tear < 0 {
			_, err := f.WriteAt(b, off)
			return err
		}
		c := b
		k := rng.IntN(len(b))
		switch tear {
		case 0: // prefix
			c = b[:k]
		case 1: // prefix then garbage
			c = bytes.Clone(b)
			for i := k; i < len(c); i++ {
				c[i] = byte(rng.Uint32()) | 1
			}
		case 2: // a zeroed hole of pages
			c = bytes.Clone(b)
			j := k + rng.IntN(len(b)-k+1)
			clear(c[k:j])
		case 3: // random 64-byte "sectors" lost
			c = bytes.Clone(b)
			for i := 0; i < len(c); i += 64 {
				if rng.IntN(2) == 0 {
					clear(c[i:min(i+64, len(c))])
				}
			}
		}
		tearLog = append(tearLog, fmt.Sprintf("tear mode %d at off %d len %d k %d", tear, off, len(b), k))
		_, _ = f.WriteAt(c, off)
		panic(tornCrash{})
	}}
	l, err := Open(dir, opts)
	must(t, err)
	defer func() { _ = l.Close() }()
	terms := map[uint64]uint64{}
	var first, last uint64
	term := uint64(1)
	mk := func(from, to uint64) []*raft.Log {
		var out []*raft.Log
		for i := from; i <= to; i++ {
			e := &raft.Log{Index: i, Term: term, Data: bytes.Repeat([]byte{byte(i), byte(term)}, rng.IntN(200))}
			out = append(out, e)
		}
		return out
	}
	data := map[uint64][]byte{}
	check := func(when string) {
		t.Helper()
		f, _ := l.FirstIndex()
		la, _ := l.LastIndex()
		if f != first || la != last {
			t.Fatalf("seed %d %s: log [%d, %d]; want [%d, %d] (tears %v)", seed, when, f, la, first, last, tearLog)
		}
		for i := first; i <= last && last != 0; i++ {
			var e raft.Log
			if err := l.GetLog(i, &e); err != nil {
				t.Fatalf("seed %d %s: GetLog(%d): %v", seed, when, i, err)
			}
			if e.Term != terms[i] || !bytes.Equal(e.Data, data[i]) {
				t.Fatalf("seed %d %s: GetLog(%d) term %d; want %d", seed, when, i, e.Term, terms[i])
			}
		}
	}
	powerLoss := func(step int) {
		t.Helper()
		now := segmentFiles(t, dir)
		image := func(p string) []byte {
			if b, ok := durable[p]; ok {
				return b
			}
			return make([]byte, segSize) // a renamed spare never synced since: zeros
		}
		for _, p := range listing {
			if !slices.Contains(now, p) {
				must(t, os.WriteFile(p, image(p), 0o640)) // removal not durable
			}
		}
		for _, p := range now {
			if !slices.Contains(listing, p) {
				must(t, os.Remove(p)) // creation not durable
				continue
			}
			must(t, os.WriteFile(p, image(p), 0o640))
		}
		tearLog = append(tearLog, fmt.Sprintf("power loss at step %d", step))
	}
	// storeCrashing stores batch while a tear or crash point is armed, and reports
	// whether it crashed (a tornCrash panic) and, if not, StoreLogs' error.
	storeCrashing := func(batch []*raft.Log) (crashed bool, err error) {
		defer func() {
			if r := recover(); r != nil {
				if _, ok := r.(tornCrash); !ok {
					panic(r)
				}
				crashed = true
			}
		}()
		return false, l.StoreLogs(batch)
	}
	// reopen opens the log again after a crash, after a power loss half the time.
	reopen := func(step int, after string) {
		t.Helper()
		l.closeFiles()
		if rng.IntN(2) == 0 {
			powerLoss(step)
		}
		var err error
		if l, err = Open(dir, opts); err != nil {
			t.Fatalf("seed %d step %d: Open after %s: %v (%v)", seed, step, after, err, tearLog)
		}
	}
	// adopt takes as the model's whatever prefix of the interrupted batch next..next+n-1
	// came back, which is all the log may hold of it.
	adopt := func(step int, batch []*raft.Log, next, n uint64) {
		t.Helper()
		la, _ := l.LastIndex()
		if la > next+n-1 {
			t.Fatalf("seed %d step %d: log ends at %d, past the interrupted batch %d..%d (%v)", seed, step, la, next, next+n-1, tearLog)
		}
		if la != 0 && la >= next {
			if last == 0 {
				first = next
			}
			for i := next; i <= la; i++ {
				terms[i] = term
				data[i] = batch[i-next].Data
			}
			last = la
		}
	}
	base := uint64(1)
	if rng.IntN(3) == 0 {
		base = 1<<32 + uint64(rng.IntN(1000))
	}
	for step := 0; step < 60; step++ {
		switch r := rng.IntN(10); {
		case r < 6 || last == 0: // append, maybe torn
			next := base
			if last != 0 {
				next = last + 1
			}
			n := uint64(1 + rng.IntN(6))
			batch := mk(next, next+n-1)
			if rng.IntN(4) == 0 {
				tear = rng.IntN(4)
				crashed, _ := storeCrashing(batch)
				tear = -1
				if !crashed {
					t.Fatalf("no crash")
				}
				reopen(step, "torn write")
				adopt(step, batch, next, n)
				check(fmt.Sprintf("step %d after torn write", step))
				continue
			}
			must(t, l.StoreLogs(batch))
			if last == 0 {
				first = next
			}
			for _, e := range batch {
				terms[e.Index] = e.Term
				data[e.Index] = e.Data
			}
			last = next + n - 1
		case r < 9: // deletes, maybe crashing part-way
			var lo, hi uint64
			kind := rng.IntN(3)
			switch {
			case kind == 0 && last > first:
				lo, hi = 0, first+uint64(rng.IntN(int(last-first)))
			case kind == 1 && last > first:
				lo, hi = first+1+uint64(rng.IntN(int(last-first))), last+uint64(rng.IntN(3))
			default:
				kind = 2
				lo, hi = 0, last+5
			}
			crashed := false
			if rng.IntN(3) == 0 {
				crashAt = rng.IntN(6)
				func() {
					defer func() {
						if r := recover(); r != nil {
							if _, ok := r.(tornCrash); !ok {
								panic(r)
							}
							crashed = true
						}
					}()
					must(t, l.DeleteRange(lo, hi))
				}()
				crashAt = -1
			} else {
				must(t, l.DeleteRange(lo, hi))
			}
			want := func() (uint64, uint64) {
				switch kind {
				case 0:
					return hi + 1, last
				case 1:
					return first, lo - 1
				}
				return 0, 0
			}
			if crashed {
				l.closeFiles()
				if rng.IntN(2) == 0 {
					powerLoss(step)
				}
				l, err = Open(dir, opts)
				if err != nil {
					t.Fatalf("seed %d step %d: Open after crash in delete: %v (%v)", seed, step, err, tearLog)
				}
				f, la := l.first, l.last
				wf, wl := want()
				ok := (f == first && la == last) || (f == wf && la == wl)
				if kind == 1 {
					ok = f == first && la >= wl && la <= last
				}
				if !ok {
					t.Fatalf("seed %d step %d: after crash in delete kind %d [%d,%d] of [%d,%d]: log [%d,%d] (%v)", seed, step, kind, lo, hi, first, last, f, la, tearLog)
				}
				first, last = f, la
			} else {
				first, last = want()
			}
			if kind != 0 {
				term++
			}
			if kind == 2 && rng.IntN(2) == 0 {
				base += uint64(rng.IntN(2000))
			} else if kind == 2 {
				base = max(1, base-uint64(rng.IntN(int(base))))
			}
		default: // append crashing at a step (segment roll-over, marker)
			next := base
			if last != 0 {
				next = last + 1
			}
			n := uint64(1 + rng.IntN(30))
			batch := mk(next, next+n-1)
			crashAt = rng.IntN(4)
			crashed, err := storeCrashing(batch)
			must(t, err)
			crashAt = -1
			if crashed {
				reopen(step, "crash in append")
			}
			adopt(step, batch, next, n)
		}
		check(fmt.Sprintf("step %d", step))
		if rng.IntN(6) == 0 { // power loss
			l.closeFiles()
			powerLoss(step)
			l, err = Open(dir, opts)
			if err != nil {
				t.Fatalf("seed %d step %d: Open after power loss: %v (%v)", seed, step, err, tearLog)
			}
			check(fmt.Sprintf("step %d after power loss", step))
		}
		if rng.IntN(5) == 0 {
			must(t, l.Close())
			l, err = Open(dir, opts)
			if err != nil {
				t.Fatalf("seed %d step %d: Open: %v", seed, step, err)
			}
			check(fmt.Sprintf("step %d reopened", step))
		}
	}
}
