package server

import (
	"context"

	dto "github.com/prometheus/client_model/go"

	"google.golang.org/protobuf/proto"

	"github.com/leasehold/leasehold/leader"
)

// ReplaceHandlers makes every RPC of s answer with fn instead of its handler: the
// method table's routing, error mapping and metrics stay as they are. For tests that
// check what both transports make of a handler's answer.
func ReplaceHandlers(s *Server, fn func(procedure string) error) {
	for _, m := range s.methods.list {
		m.serve = func(_ *Server, _ context.Context, req proto.Message) (proto.Message, error) {
			return nil, fn(m.procedure)
		}
		if m.stream != nil {
			m.stream = func(*Server, context.Context, proto.Message, func(proto.Message) error) error {
				return fn(m.procedure)
			}
		}
	}
}

// Procedures returns the Connect procedures of s's method table, in table order.
func Procedures(s *Server) []string {
	var out []string
	for _, m := range s.methods.list {
		out = append(out, m.procedure)
	}
	return out
}

// MappedErrors returns one error of each kind that the error table maps.
func MappedErrors() []error {
	out := make([]error, 0, len(errorCodes))
	for _, e := range errorCodes {
		out = append(out, e.err)
	}
	return out
}

// RequestCount is leasehold_requests_total{procedure, code} of s, read from its registry
// as /metrics would show it (without an HTTP scrape, which under the race detector costs
// a second each).
func RequestCount(s *Server, procedure, code string) float64 {
	var m dto.Metric
	if err := s.metrics.requests.WithLabelValues(procedure, code).Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

// Internals of routing, for the external tests (forward_test.go).
var (
	ForwardError     = forwardError
	ForwardContext   = forwardContext
	ErrLeaderUnknown = errLeaderUnknown
)

// NotLeaderAt is the not-leader error of a node that believes addr leads.
func NotLeaderAt(addr string) error { return &leaderHint{err: leader.ErrNotLeader, addr: addr} }

// Call serves req as a transport does, through the method table: routed here or
// forwarded to the leader, its error mapped (finish).
func Call(ctx context.Context, s *Server, procedure string, req proto.Message) (proto.Message, error) {
	return s.call(ctx, s.methods.byProcedure[procedure], req, caller{})
}
