package replication

import (
	"context"
	"sync"

	"github.com/hashicorp/raft"
)

// verifier shares leadership confirmations among concurrent callers. A caller may only
// be answered by a quorum round that started after it arrived: a round already in flight
// may have been answered by followers before the caller's request existed, so it proves
// nothing about leadership at the caller's arrival. Callers that arrive while a round is
// in flight therefore wait for the next one, which starts as soon as the current one
// ends and answers all of them at once. Under load this is one round per round trip
// instead of one per caller, and at most one goroutine runs rounds.
type verifier struct {
	round func() raft.Future // starts one confirmation round (raft.VerifyLeader)

	mu      sync.Mutex
	running bool         // a goroutine is running rounds
	next    []chan error // callers waiting for a round that has not started yet
}

// verify returns nil once a round that started after the call was confirmed by a quorum,
// the round's error if it failed, or ctx's error.
func (v *verifier) verify(ctx context.Context) error {
	ch := make(chan error, 1)
	v.mu.Lock()
	v.next = append(v.next, ch)
	if !v.running {
		v.running = true
		go v.run()
	}
	v.mu.Unlock()
	select {
	case err := <-ch:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// run starts rounds until no caller is waiting. Every caller in a batch was appended
// before the batch was taken, so before its round started.
func (v *verifier) run() {
	for {
		v.mu.Lock()
		batch := v.next
		v.next = nil
		if len(batch) == 0 {
			v.running = false
			v.mu.Unlock()
			return
		}
		v.mu.Unlock()
		err := v.round().Error()
		for _, ch := range batch {
			ch <- err
		}
	}
}
