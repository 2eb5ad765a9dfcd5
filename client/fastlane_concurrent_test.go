package client_test

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

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
	_, c := dial(t, node.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const workers, rounds = 64, 80
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for r := range rounds {
				key := fmt.Sprintf("concurrent/%d", w)
				want := bytes.Repeat([]byte{byte('a' + w%26)}, 12<<10+r-r%20)
				if r%20 == 0 {
					if _, err := c.Put(ctx, key, want); err != nil {
						t.Errorf("put %s: %v", key, err)
						return
					}
				}
				got, err := c.Get(ctx, key)
				if err != nil || !bytes.Equal(got.Data, want) {
					t.Errorf("get %s: %d bytes, %v; want the %d bytes written", key, len(got.Data), err, len(want))
					return
				}
			}
		})
	}
	wg.Wait()
}
