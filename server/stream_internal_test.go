package server

import (
	"context"
	"strings"
	"testing"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/api/leasehold/v1/leaseholdv1connect"
)

// TestServerStreamRefusesUnary: the table cannot list a unary RPC as a stream (its
// Connect handler would speak the wrong protocol); serverStream panics naming it.
func TestServerStreamRefusesUnary(t *testing.T) {
	defer func() {
		r := recover()
		if s, _ := r.(string); !strings.Contains(s, "is not a server-streaming RPC") {
			t.Fatalf("serverStream of a unary RPC: recovered %v, want a panic naming it", r)
		}
	}()
	serverStream(leaseholdv1connect.LockServiceDescribeProcedure,
		func(*Server, context.Context, *leaseholdv1.DescribeRequest, func(*leaseholdv1.DescribeResponse) error) error {
			return nil
		},
		needs(permRead))
}
