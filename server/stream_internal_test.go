package server

import (
	"context"
	"strings"
	"testing"
	"unicode/utf8"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/api/leasehold/v1/leaseholdv1connect"
	"github.com/leasehold/leasehold/core"
	"github.com/leasehold/leasehold/internal/auth"
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

// TestRecordedReason: a force release's reason is recorded with the identity that asked
// (when auth knows it), within MaxReasonLen.
func TestRecordedReason(t *testing.T) {
	alice := &principal{who: &auth.Identity{Kind: auth.KindToken, Name: "alice"}}
	if got := recordedReason(alice, "stuck"); got != "by token alice: stuck" {
		t.Fatalf("recorded %q", got)
	}
	if got := recordedReason(nil, "stuck"); got != "stuck" {
		t.Fatalf("without auth: recorded %q", got)
	}
	long := recordedReason(alice, strings.Repeat("é", core.MaxReasonLen/2))
	if len(long) > core.MaxReasonLen || !utf8.ValidString(long) || !strings.HasPrefix(long, "by token alice: é") {
		t.Fatalf("a long reason recorded as %d bytes, valid %v", len(long), utf8.ValidString(long))
	}
}
