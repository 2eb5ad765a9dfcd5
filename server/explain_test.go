package server_test

import (
	"context"
	"errors"
	"testing"
	"time"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/internal/testnode"
	"github.com/leasehold/leasehold/leader"
	"github.com/leasehold/leasehold/server"
)

// TestExplainedLockDelay: an acquire refused because the lock is in its lock-delay
// after its holder's lease expired says so, with when the delay ends, in the error
// detail both transports send.
func TestExplainedLockDelay(t *testing.T) {
	n := testnode.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s := n.Server
	grant := func(ttl time.Duration) string {
		r, err := s.Grant(ctx, &leaseholdv1.GrantRequest{TtlMs: ttl.Milliseconds()})
		if err != nil {
			t.Fatal(err)
		}
		return r.GetLeaseId()
	}
	const name = "explain/delay"
	short := grant(200 * time.Millisecond)
	if _, err := s.Acquire(ctx, &leaseholdv1.AcquireRequest{Name: name, Class: correctness, LeaseId: short, LockDelayMs: 10_000}); err != nil {
		t.Fatal(err)
	}
	other := grant(10 * time.Second)
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := s.Acquire(ctx, &leaseholdv1.AcquireRequest{Name: name, Class: correctness, LeaseId: other})
		var lh *leader.LockHeldError
		if !errors.As(err, &lh) || lh.Explain == nil {
			t.Fatalf("acquire: %v, want an explained LockHeldError", err)
		}
		if lh.Explain.Reason == leader.HeldInLockDelay {
			if until := time.Until(lh.Explain.DelayUntil); until < 5*time.Second || until > 11*time.Second {
				t.Fatalf("the lock-delay ends in %v, want about 10s", until)
			}
			_, detail := server.Classify(err)
			if x := detail.GetExplanation(); x.GetReason() != leaseholdv1.HeldReason_HELD_REASON_LOCK_DELAY || x.GetDelayUntilUnixMs() == 0 || len(x.GetHolders()) != 0 {
				t.Fatalf("error detail explanation %v", x)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("still %v after the lease's TTL", lh.Explain.Reason)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
