package server_test

import (
	"fmt"
	"testing"

	"connectrpc.com/connect"

	"github.com/leasehold/leasehold/leader"
	"github.com/leasehold/leasehold/replication"
	"github.com/leasehold/leasehold/server"
)

// TestLeaderErrorsUnavailable: the leader's answer to a keepalive or CheckToken on a node
// that could not confirm it leads (ErrNotLeader wrapping the log's error), and to an
// efficiency acquire whose queue went with the leadership, are Unavailable, so that
// clients retry on another node.
func TestLeaderErrorsUnavailable(t *testing.T) {
	for _, c := range []struct {
		err    error
		reason string
	}{
		{fmt.Errorf("%w: leadership not confirmed: %w", leader.ErrNotLeader, replication.ErrNotLeader), "not_leader"},
		{leader.ErrEpochLost, "epoch_lost"},
	} {
		if code, d := server.Classify(c.err); code != connect.CodeUnavailable || d.GetReason() != c.reason {
			t.Errorf("Classify(%v) = %v, %q; want Unavailable, %q", c.err, code, d.GetReason(), c.reason)
		}
	}
}
