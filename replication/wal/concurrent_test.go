package wal

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/hashicorp/raft"
)

// TestConcurrentReadersWithSuffixDeletes: raft's follower deletes a suffix and appends
// in its place (a new term) while other goroutines read. A read in [FirstIndex,
// LastIndex] returns raft.ErrLogNotFound (deleted meanwhile) or an entry of that index
// whose content matches its term: never a torn or foreign record.
func TestConcurrentReadersWithSuffixDeletes(t *testing.T) {
	l := openT(t, t.TempDir(), Options{SegmentSize: 4 << 10})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for r := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(r), 3))
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
				if err == raft.ErrLogNotFound { //nolint:errorlint // raft compares with ==
					continue
				}
				if err != nil {
					errs <- fmt.Errorf("GetLog(%d): %w", i, err)
					return
				}
				if want := entry(i, got.Term); got.Index != i || !bytes.Equal(got.Data, want.Data) {
					errs <- fmt.Errorf("GetLog(%d) = index %d term %d data %q", i, got.Index, got.Term, got.Data)
					return
				}
			}
		}()
	}
	rng := rand.New(rand.NewPCG(9, 9))
	next, term := uint64(1), uint64(1)
	for round := range 400 {
		n := uint64(1 + rng.IntN(12))
		must(t, l.StoreLogs(entries(next, next+n-1, term)))
		next += n
		switch {
		case round%7 == 6 && next > 30:
			cut := next - 1 - uint64(rng.IntN(25))
			first, _ := l.FirstIndex()
			if cut > first {
				must(t, l.DeleteRange(cut, next-1))
				next = cut
				term++
			}
		case round%31 == 30:
			must(t, l.DeleteRange(1, next-40))
		}
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
