package client

import (
	"context"
	"errors"
	"net"
	"slices"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"connectrpc.com/connect"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/internal/reason"
)

// attempts runs call over nodes with answer deciding each attempt (by its number, from
// 0, and its node) and returns the node and the time (since the start, on synctest's
// clock) of every attempt.
func attempts(t *testing.T, nodes []string, answer func(i int, node string) error) ([]string, []time.Duration) {
	t.Helper()
	c := &Client{nodes: newFailover(nil, nodes)}
	var on []string
	var at []time.Duration
	start := time.Now()
	_, err := call(t.Context(), c, repeatable, func(ctx context.Context) (int, error) {
		node := c.nodes.nodeFor(ctx)
		on, at = append(on, node), append(at, time.Since(start))
		return 0, answer(len(on)-1, node)
	})
	if err != nil {
		t.Fatal(err)
	}
	return on, at
}

// TestRefusedMovesOnAtOnce: an attempt a dead node refused (its connection refused) goes
// to the next node at once, with no backoff; only when every node was tried since the
// last wait does the client wait before the next round.
func TestRefusedMovesOnAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		refused := connect.NewError(connect.CodeUnavailable, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED})
		on, at := attempts(t, []string{"a:1", "b:1", "c:1"}, func(i int, _ string) error {
			if i < 4 {
				return refused
			}
			return nil
		})
		if want := []string{"a:1", "b:1", "c:1", "a:1", "b:1"}; !slices.Equal(on, want) {
			t.Fatalf("attempts went to %v, want %v", on, want)
		}
		if at[1] != 0 || at[2] != 0 {
			t.Errorf("attempts on b and c after %v and %v, want at once", at[1], at[2])
		}
		if at[3] < retryFirst*9/10 || at[3] > retryFirst*11/10 {
			t.Errorf("second round began after %v, want one backoff (%v)", at[3], retryFirst)
		}
		if at[4] != at[3] {
			t.Errorf("b tried %v after a in the second round, want at once", at[4]-at[3])
		}
	})
}

// TestLeaderHintFollowedAtOnce: a node that says it is not the leader and names it sends
// the next attempt to the leader at once.
func TestLeaderHintFollowedAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hint := connect.NewError(connect.CodeUnavailable, errors.New(reason.NotLeader))
		d, err := connect.NewErrorDetail(&leaseholdv1.ErrorDetail{Reason: reason.NotLeader, LeaderApiAddr: "c:1"})
		if err != nil {
			t.Fatal(err)
		}
		hint.AddDetail(d)
		on, at := attempts(t, []string{"a:1", "b:1", "c:1"}, func(_ int, node string) error {
			if node != "c:1" {
				return hint
			}
			return nil
		})
		if want := []string{"a:1", "c:1"}; !slices.Equal(on, want) || at[1] != 0 {
			t.Fatalf("attempts went to %v at %v, want %v at once", on, at, want)
		}
	})
}
