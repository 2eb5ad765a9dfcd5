package client_test

import (
	"bytes"
	"fmt"
	"sync"
	"testing"

	"github.com/leasehold/leasehold/internal/testnode"
)

// TestFastLaneConcurrentAnswers: many calls share one fast-lane connection, so the
// reading role passes between them (a call that reads its own answer hands the reading
// to a new reader when others still wait). Every call must get its own answer intact.
// Answers of 12 KiB wrap the reader's 32 KiB buffer every few frames. Run with -race:
// calls once copied an answer after handing the reading on (the reading call its own,
// the reader that stopped the one it handed out), while the next reader already reused
// the buffer the answer lay in (found by the race detector in the nemesis suite).
func TestFastLaneConcurrentAnswers(t *testing.T) {
	node := testnode.Start(t)
	ctx, c := dial(t, node.Addr())
	const workers, rounds = 64, 300
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for r := range rounds {
				key := fmt.Sprintf("concurrent/%d", w)
				want := bytes.Repeat([]byte{byte('a' + w%26)}, 12<<10+r-r%50)
				if r%50 == 0 {
					if _, err := c.Put(ctx, key, want); err != nil {
						t.Errorf("put %s: %v", key, err)
						return
					}
				}
				got, err := c.Get(ctx, key)
				if err != nil || !bytes.Equal(got.Data, want) {
					t.Errorf("get %s: %q, %v; want %q", key, got.Data, err, want)
					return
				}
			}
		})
	}
	wg.Wait()
}
