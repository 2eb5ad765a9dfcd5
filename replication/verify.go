package replication

import (
	"context"
	"fmt"
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
	round func() raft.Future // starts one confirmation round (Node.confirmRound)

	mu      sync.Mutex
	running bool         // a goroutine is running rounds
	next    *verifyRound // the round the callers arriving now will wait for; nil if none
}

// verifyRound is one confirmation round and the callers that wait for it: err is set
// before done is closed and before thens are called.
type verifyRound struct {
	done  chan struct{} // nil until a caller waits on it (verify)
	thens []func(error) // the callers that do not wait (verifyThen)
	err   error
}

// verify returns nil once a round that started after the call was confirmed by a quorum,
// the round's error if it failed, or ctx's error.
func (v *verifier) verify(ctx context.Context) error {
	v.mu.Lock()
	r := v.joinLocked()
	if r.done == nil {
		r.done = make(chan struct{})
	}
	v.mu.Unlock()
	select {
	case <-r.done:
		return r.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// verifyThen is verify without the wait: then gets what Node.VerifyLeader would have
// returned (there is no context: nil, or the round's error wrapped in ErrNotLeader),
// once, on the goroutine that runs rounds, and must not block.
// A caller that answers many requests (a keepalive each) so needs no goroutine, channel
// or wake-up per request.
func (v *verifier) verifyThen(then func(error)) {
	v.mu.Lock()
	r := v.joinLocked()
	r.thens = append(r.thens, then)
	v.mu.Unlock()
}

// joinLocked returns the round the callers arriving now wait for, and makes sure a
// goroutine runs it.
func (v *verifier) joinLocked() *verifyRound {
	if v.next == nil {
		v.next = &verifyRound{}
	}
	if !v.running {
		v.running = true
		go v.run()
	}
	return v.next
}

// run starts rounds until no caller is waiting. Every caller of a round joined it
// before run took it, so before the round started.
func (v *verifier) run() {
	for {
		v.mu.Lock()
		r := v.next
		v.next = nil
		if r == nil {
			v.running = false
			v.mu.Unlock()
			return
		}
		v.mu.Unlock()
		r.err = v.round().Error()
		if r.done != nil {
			close(r.done)
		}
		if len(r.thens) > 0 {
			err := r.err
			if err != nil {
				err = fmt.Errorf("%w: %w", ErrNotLeader, err) // once per round, not per caller
			}
			for _, then := range r.thens {
				then(err)
			}
		}
	}
}
