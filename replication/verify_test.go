package replication

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// roundErr is what a fake round answers: the number of the round, so a caller can tell
// which round answered it.
type roundErr struct{ n int64 }

func (e roundErr) Error() string { return fmt.Sprintf("round %d", e.n) }

type fakeFuture struct{ err error }

func (f fakeFuture) Error() error { return f.err }

// TestVerifierAnswersOnlyWithLaterRounds: a caller is answered by a round that started
// after it called, never by one already in flight (which would not prove leadership at
// the caller's arrival), and concurrent callers share rounds.
func TestVerifierAnswersOnlyWithLaterRounds(t *testing.T) {
	var started atomic.Int64
	v := &verifier{round: func() raft.Future {
		n := started.Add(1)
		time.Sleep(200 * time.Microsecond) // the round trip to the followers
		return fakeFuture{roundErr{n}}
	}}
	const callers, calls = 32, 50
	var wg sync.WaitGroup
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range calls {
				before := started.Load()
				err := v.verify(context.Background())
				var re roundErr
				if !errors.As(err, &re) {
					t.Errorf("verify = %v", err)
					return
				}
				if re.n <= before {
					t.Errorf("answered by round %d, which started before the call (rounds started then: %d)", re.n, before)
					return
				}
			}
		}()
	}
	wg.Wait()
	if n := started.Load(); n >= callers*calls/2 {
		t.Errorf("%d rounds for %d calls: rounds are not shared", n, callers*calls)
	}
	t.Logf("%d rounds for %d calls", started.Load(), callers*calls)
}

// TestVerifierHonoursContext: a caller whose context ends stops waiting; the rounds go on
// for the others.
func TestVerifierHonoursContext(t *testing.T) {
	release := make(chan struct{})
	v := &verifier{round: func() raft.Future {
		<-release
		return fakeFuture{nil}
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := v.verify(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("verify = %v, want DeadlineExceeded", err)
	}
	close(release)
	if err := v.verify(context.Background()); err != nil {
		t.Fatalf("verify after release = %v", err)
	}
}
