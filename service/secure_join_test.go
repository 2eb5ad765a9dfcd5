package service_test

import (
	"context"
	"testing"
	"time"

	"github.com/leasehold/leasehold/client"
)

// TestSecureJoinThroughAFollower: with peer TLS and auth, a node joins by calling the
// seed's AddMember as a peer (its peer certificate is its credential: SECURITY.md, "n1
// logs the two joins as admin actions of identity=peer n2"). When the seed is a
// follower it forwards the AddMember to the leader — without any credential, since a
// peer certificate cannot be forwarded and forwardCredentials knows only tokens and
// subjects — and the leader answers Unauthenticated. The joining node retries for ever:
// a secure cluster can be joined only through its leader, and `--join` of any other
// node (the leader moved since the seed was chosen) never completes.
func TestSecureJoinThroughAFollower(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p := newPKI(t)
	n1 := p.first(t, ctx)
	ops := p.dial(t, ctx, n1.Addr(), p.nodes.ClientConfig(p.clients.Issue(t, "ops")), client.WithToken("ops-secret"))
	n2 := p.start(t, "n2", n1.Addr(), p.node, p.nodes)
	waitMembers(t, ctx, ops, 2)
	_ = p.start(t, "n3", n2.Addr(), p.node, p.nodes) // n2 is a follower
	wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
	defer wcancel()
	for {
		ms, err := ops.Members(wctx)
		if err == nil && len(ms) == 3 {
			return
		}
		if wctx.Err() != nil {
			t.Fatalf("n3, joining through the follower n2, is not a member after 20 s: %v %v", ms, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
