package server_test

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"connectrpc.com/connect"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/api/leasehold/v1/leaseholdv1connect"
	"github.com/leasehold/leasehold/core"
	"github.com/leasehold/leasehold/internal/reason"
	"github.com/leasehold/leasehold/internal/testnode"
	"github.com/leasehold/leasehold/leader"
	"github.com/leasehold/leasehold/replication"
	"github.com/leasehold/leasehold/server"
)

// followerRaft is the replication layer of a follower that sees leaderID lead, and
// knows the API addresses in members. Nothing else of it may be called.
type followerRaft struct {
	server.Raft
	leaderID string
	members  map[string]string
}

func (f *followerRaft) Status() replication.Status {
	return replication.Status{NodeID: "n2", Role: "follower", LeaderID: f.leaderID}
}

func (f *followerRaft) Read(fn func(*core.State)) {
	st := core.NewState(core.Limits{})
	for id, addr := range f.members {
		st.Apply(core.Command{Op: core.OpSetMember, Node: id, Addr: addr})
	}
	fn(st)
}

func newFollower(t *testing.T, leaderID string, members map[string]string) *server.Server {
	t.Helper()
	s, err := server.New(server.Config{NodeID: "n2", APIAddr: "127.0.0.1:1"}, leader.New(nil, leader.Config{}), &followerRaft{leaderID: leaderID, members: members})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// wantUnavailable checks that err maps to Unavailable with reason r and leader hint
// hint, on both transports' paths (ToConnect for Connect, Classify for the fast lane).
func wantUnavailable(t *testing.T, err error, r, hint string) {
	t.Helper()
	code, d := server.Classify(err)
	if code != connect.CodeUnavailable || d.GetReason() != r || d.GetLeaderApiAddr() != hint {
		t.Fatalf("%v: classified %v %q hint %q, want Unavailable %q hint %q", err, code, d.GetReason(), d.GetLeaderApiAddr(), r, hint)
	}
	ce := new(connect.Error)
	if !errors.As(server.ToConnect(err), &ce) || ce.Code() != connect.CodeUnavailable || len(ce.Details()) != 1 {
		t.Fatalf("%v: ToConnect gives %v, want Unavailable with its detail", err, server.ToConnect(err))
	}
}

// TestFollowerWithoutLeaderAddress: a follower that knows no leader, or knows its id
// but not yet its API address (a restarted follower that has not applied the entry
// registering it), says so at once — "leader_unknown", nothing done — instead of a
// bare not-leader.
func TestFollowerWithoutLeaderAddress(t *testing.T) {
	for _, leaderID := range []string{"", "n1"} {
		s := newFollower(t, leaderID, nil)
		_, err := server.Call(context.Background(), s, leaseholdv1connect.LeaseServiceKeepAliveProcedure, &leaseholdv1.KeepAliveRequest{LeaseId: "0123456789abcdef0123456789abcdef"})
		wantUnavailable(t, err, reason.LeaderUnknown, "")
	}
}

// TestRoutingErrors: a not-leader error names the leader when the node knows it; a
// forward that fails in transport is "leader_unreachable" naming the leader it tried
// (and does not pass the peer client's own error through unmapped); the leader's own
// answers and the caller's context errors pass through as they are.
func TestRoutingErrors(t *testing.T) {
	wantUnavailable(t, server.NotLeaderAt("10.0.0.1:7740"), reason.NotLeader, "10.0.0.1:7740")
	wantUnavailable(t, server.ErrLeaderUnknown, reason.LeaderUnknown, "")

	transport := connect.NewError(connect.CodeUnavailable, io.ErrUnexpectedEOF)
	wantUnavailable(t, server.ForwardError(context.Background(), "10.0.0.1:7740", transport), reason.LeaderUnreachable, "10.0.0.1:7740")
	silent := connect.NewError(connect.CodeDeadlineExceeded, context.DeadlineExceeded)
	wantUnavailable(t, server.ForwardError(context.Background(), "10.0.0.1:7740", silent), reason.LeaderUnreachable, "10.0.0.1:7740")

	answer := server.ToConnect(core.ErrNotHolder)
	if got := server.ForwardError(context.Background(), "10.0.0.1:7740", answer); !errors.Is(got, answer) {
		t.Fatalf("the leader's answer became %v", got)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if got := server.ForwardError(ctx, "10.0.0.1:7740", transport); !errors.Is(got, transport) {
		t.Fatalf("with the caller gone, the forward's error became %v", got)
	}
}

// TestForwardContext: a forward that does not wait in a queue gets half of what is left
// of its caller's deadline; a waiting Acquire, and a request with no deadline, keep
// theirs (pings bound those).
func TestForwardContext(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	f, fcancel := server.ForwardContext(ctx, &leaseholdv1.KeepAliveRequest{})
	defer fcancel()
	if d, ok := f.Deadline(); !ok || time.Until(d) > time.Second+50*time.Millisecond || time.Until(d) < 900*time.Millisecond {
		t.Fatalf("keepalive forward deadline in %v, want about 1s", time.Until(d))
	}
	w, wcancel := server.ForwardContext(ctx, &leaseholdv1.AcquireRequest{WaitMs: 1500})
	defer wcancel()
	if d, _ := w.Deadline(); time.Until(d) < 1500*time.Millisecond {
		t.Fatalf("waiting acquire forward deadline in %v, want the caller's 2s", time.Until(d))
	}
	n, ncancel := server.ForwardContext(context.Background(), &leaseholdv1.KeepAliveRequest{})
	defer ncancel()
	if _, ok := n.Deadline(); ok {
		t.Fatal("a forward without a caller deadline got one")
	}
}

// TestForwardToSilentLeader: a follower forwards to a leader that accepted the
// connection but answers nothing (cut off the network). The forward ends — well before
// the caller's deadline, or without one within the peer pings' bound, and for an
// Acquire that would wait for ever too — with "leader_unreachable" naming that leader.
func TestForwardToSilentLeader(t *testing.T) {
	lease := "0123456789abcdef0123456789abcdef"
	for _, tc := range []struct {
		name     string
		deadline time.Duration // 0: none, as over the fast lane
		within   time.Duration
		call     func(context.Context, *server.Server) error
	}{
		{"keepalive with a 2s deadline", 2 * time.Second, 1500 * time.Millisecond, func(ctx context.Context, s *server.Server) error {
			_, err := server.Call(ctx, s, leaseholdv1connect.LeaseServiceKeepAliveProcedure, &leaseholdv1.KeepAliveRequest{LeaseId: lease})
			return err
		}},
		{"keepalive without a deadline", 0, 3 * time.Second, func(ctx context.Context, s *server.Server) error {
			_, err := server.Call(ctx, s, leaseholdv1connect.LeaseServiceKeepAliveProcedure, &leaseholdv1.KeepAliveRequest{LeaseId: lease})
			return err
		}},
		{"acquire waiting for ever", 0, 3 * time.Second, func(ctx context.Context, s *server.Server) error {
			_, err := server.Call(ctx, s, leaseholdv1connect.LockServiceAcquireProcedure, &leaseholdv1.AcquireRequest{Name: "a", Class: leaseholdv1.LockClass_LOCK_CLASS_CORRECTNESS, LeaseId: lease, WaitMs: -1})
			return err
		}},
	} {
		silent, _ := testnode.Silent(t)
		s := newFollower(t, "n1", map[string]string{"n1": silent})
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if tc.deadline > 0 {
			ctx, cancel = context.WithTimeout(context.Background(), tc.deadline)
		}
		start := time.Now()
		err := tc.call(ctx, s)
		took := time.Since(start)
		cancel()
		t.Logf("%s: answered after %v", tc.name, took.Round(time.Millisecond))
		if took > tc.within {
			t.Errorf("%s: the forward to the silent leader took %v, want at most %v", tc.name, took, tc.within)
		}
		wantUnavailable(t, err, reason.LeaderUnreachable, silent)
	}
}
