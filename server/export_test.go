package server

import "github.com/leasehold/leasehold/leader"

// Internals of routing, for the external tests (forward_test.go).
var (
	ForwardError     = forwardError
	ForwardContext   = forwardContext
	ErrLeaderUnknown = errLeaderUnknown
)

// NotLeaderAt is the not-leader error of a node that believes addr leads.
func NotLeaderAt(addr string) error { return &leaderHint{err: leader.ErrNotLeader, addr: addr} }
