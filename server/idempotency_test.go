package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/api/leasehold/v1/leaseholdv1connect"
	"github.com/leasehold/leasehold/core"
	"github.com/leasehold/leasehold/fastlane"
	"github.com/leasehold/leasehold/internal/clustertest"
	"github.com/leasehold/leasehold/internal/testnode"
)

// keyCaller sends one RPC of the idempotency tests over one transport and returns the
// code and error detail of a failure (code 0 on success).
type keyCaller func(t *testing.T, procedure string, req, resp proto.Message) (connect.Code, *leaseholdv1.ErrorDetail)

// connectCaller calls over Connect with opts (the Connect protocol, or gRPC).
func connectCaller(hc connect.HTTPClient, url string, opts ...connect.ClientOption) keyCaller {
	keys := leaseholdv1connect.NewIdempotencyServiceClient(hc, url, opts...)
	leases := leaseholdv1connect.NewLeaseServiceClient(hc, url, opts...)
	return func(t *testing.T, procedure string, req, resp proto.Message) (connect.Code, *leaseholdv1.ErrorDetail) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var got proto.Message
		var err error
		switch r := req.(type) {
		case *leaseholdv1.GrantRequest:
			got, err = msg(leases.Grant(ctx, r))
		case *leaseholdv1.RevokeRequest:
			got, err = msg(leases.Revoke(ctx, r))
		case *leaseholdv1.BeginRequest:
			got, err = msg(keys.Begin(ctx, r))
		case *leaseholdv1.CompleteRequest:
			got, err = msg(keys.Complete(ctx, r))
		case *leaseholdv1.AbandonRequest:
			got, err = msg(keys.Abandon(ctx, r))
		case *leaseholdv1.IdempotencyServiceGetRequest:
			got, err = msg(keys.Get(ctx, r))
		default:
			t.Fatalf("no Connect call for %T", req)
		}
		if err != nil {
			var ce *connect.Error
			if !errors.As(err, &ce) {
				t.Fatalf("%s: %v", procedure, err)
			}
			return ce.Code(), detailOf(t, err)
		}
		proto.Merge(resp, got)
		return 0, nil
	}
}

func msg[T proto.Message](m T, err error) (proto.Message, error) {
	if err != nil {
		return nil, err
	}
	return m, nil
}

// fastLaneCaller sends what the fast lane carries on it, and the rest through fallback,
// as the Go client does.
func fastLaneCaller(l *lane, fallback keyCaller) keyCaller {
	return func(t *testing.T, procedure string, req, resp proto.Message) (connect.Code, *leaseholdv1.ErrorDetail) {
		t.Helper()
		m, ok := fastlane.MethodOf(procedure)
		if !ok {
			return fallback(t, procedure, req, resp)
		}
		if kind := l.roundTrip(m, req, resp); kind == fastlane.KindError {
			return connect.Code(l.lastError.GetCode()), l.lastError.GetDetail()
		}
		return 0, nil
	}
}

// TestIdempotencyService runs one key's life over Connect, gRPC and the fast lane: NEW
// for the first Begin (and again, same token, for its retry), IN_PROGRESS for another
// lease, stale completions rejected, DONE with the result for everyone after Complete,
// a key freed when its lease ends and begun again under a larger token, and bad input
// answered InvalidArgument naming the field.
func TestIdempotencyService(t *testing.T) {
	n := testnode.Start(t)
	url := "http://" + n.Addr()
	hc := h2cClient(t)
	connectCall := connectCaller(hc, url)
	for _, tr := range []struct {
		name string
		call keyCaller
	}{
		{"connect", connectCall},
		{"grpc", connectCaller(hc, url, connect.WithGRPC())},
		{"fastlane", fastLaneCaller(dialLane(t, n.FastLaneAddr()), connectCall)},
	} {
		t.Run(tr.name, func(t *testing.T) { keyLife(t, tr.call, "svc/"+tr.name) })
	}
}

func keyLife(t *testing.T, call keyCaller, key string) {
	ok := func(procedure string, req, resp proto.Message) {
		t.Helper()
		if code, d := call(t, procedure, req, resp); code != 0 {
			t.Fatalf("%s %v: %v %+v", procedure, req, code, d)
		}
	}
	fails := func(procedure string, req proto.Message, code connect.Code, reason, field string) {
		t.Helper()
		got, d := call(t, procedure, req, new(leaseholdv1.BeginResponse))
		if got != code || d.GetReason() != reason || d.GetField() != field {
			t.Fatalf("%s %v: got %v %q field %q, want %v %q field %q", procedure, req, got, d.GetReason(), d.GetField(), code, reason, field)
		}
	}
	grant := func() string {
		var g leaseholdv1.GrantResponse
		ok(leaseholdv1connect.LeaseServiceGrantProcedure, &leaseholdv1.GrantRequest{TtlMs: 10_000}, &g)
		return g.GetLeaseId()
	}
	begin := func(lease, k string) *leaseholdv1.BeginResponse {
		t.Helper()
		var r leaseholdv1.BeginResponse
		ok(leaseholdv1connect.IdempotencyServiceBeginProcedure, &leaseholdv1.BeginRequest{Key: k, LeaseId: lease, Holder: &leaseholdv1.Holder{Host: "h", Pid: 1, Note: lease[:4]}}, &r)
		return &r
	}
	const (
		beginP    = leaseholdv1connect.IdempotencyServiceBeginProcedure
		completeP = leaseholdv1connect.IdempotencyServiceCompleteProcedure
		abandonP  = leaseholdv1connect.IdempotencyServiceAbandonProcedure
		getP      = leaseholdv1connect.IdempotencyServiceGetProcedure
	)
	a, b := grant(), grant()

	first := begin(a, key)
	tok := first.GetToken()
	if first.GetStatus() != leaseholdv1.KeyStatus_KEY_STATUS_NEW || tok == 0 {
		t.Fatalf("first Begin: %v", first)
	}
	if again := begin(a, key); again.GetStatus() != leaseholdv1.KeyStatus_KEY_STATUS_NEW || again.GetToken() != tok {
		t.Fatalf("retried Begin: %v", again)
	}
	other := begin(b, key)
	if other.GetStatus() != leaseholdv1.KeyStatus_KEY_STATUS_IN_PROGRESS || other.GetToken() != tok || other.GetHolder().GetNote() != a[:4] {
		t.Fatalf("Begin by another lease: %v", other)
	}

	fails(completeP, &leaseholdv1.CompleteRequest{Key: key, Token: tok + 1000, Result: []byte("x")}, connect.CodeFailedPrecondition, "stale_token", "")
	ok(completeP, &leaseholdv1.CompleteRequest{Key: key, Token: tok, Result: []byte("the answer")}, new(leaseholdv1.CompleteResponse))
	ok(completeP, &leaseholdv1.CompleteRequest{Key: key, Token: tok, Result: []byte("retry")}, new(leaseholdv1.CompleteResponse))
	for _, l := range []string{a, b} {
		if done := begin(l, key); done.GetStatus() != leaseholdv1.KeyStatus_KEY_STATUS_DONE || done.GetToken() != tok || string(done.GetResult()) != "the answer" {
			t.Fatalf("Begin of a done key: %v", done)
		}
	}
	var got leaseholdv1.IdempotencyServiceGetResponse
	ok(getP, &leaseholdv1.IdempotencyServiceGetRequest{Key: key}, &got)
	if got.GetStatus() != leaseholdv1.KeyStatus_KEY_STATUS_DONE || string(got.GetResult()) != "the answer" {
		t.Fatalf("Get: %v", &got)
	}
	got.Reset()
	ok(getP, &leaseholdv1.IdempotencyServiceGetRequest{Key: key + "/none"}, &got)
	if got.GetStatus() != leaseholdv1.KeyStatus_KEY_STATUS_UNSPECIFIED || got.GetToken() != 0 {
		t.Fatalf("Get of an unknown key: %v", &got)
	}

	// The lease ends with a key in progress: the key is free, its token stale.
	k2 := key + "/2"
	old := begin(a, k2).GetToken()
	ok(leaseholdv1connect.LeaseServiceRevokeProcedure, &leaseholdv1.RevokeRequest{LeaseId: a}, new(leaseholdv1.RevokeResponse))
	again := begin(b, k2)
	if again.GetStatus() != leaseholdv1.KeyStatus_KEY_STATUS_NEW || again.GetToken() <= old {
		t.Fatalf("Begin after the holder's lease ended: %v (old token %d)", again, old)
	}
	fails(completeP, &leaseholdv1.CompleteRequest{Key: k2, Token: old}, connect.CodeFailedPrecondition, "stale_token", "")
	ok(abandonP, &leaseholdv1.AbandonRequest{Key: k2, Token: again.GetToken()}, new(leaseholdv1.AbandonResponse))
	if third := begin(b, k2); third.GetStatus() != leaseholdv1.KeyStatus_KEY_STATUS_NEW || third.GetToken() <= again.GetToken() {
		t.Fatalf("Begin after Abandon: %v", third)
	}

	// Bad input names the field; a gone lease is NotFound.
	fails(beginP, &leaseholdv1.BeginRequest{Key: "a b", LeaseId: b}, connect.CodeInvalidArgument, "invalid_argument", "key")
	fails(beginP, &leaseholdv1.BeginRequest{Key: key}, connect.CodeInvalidArgument, "invalid_argument", "lease_id")
	fails(beginP, &leaseholdv1.BeginRequest{Key: key, LeaseId: b, Holder: &leaseholdv1.Holder{Note: string(bytes.Repeat([]byte("n"), core.MaxNoteLen+1))}},
		connect.CodeInvalidArgument, "invalid_argument", "holder.note")
	fails(beginP, &leaseholdv1.BeginRequest{Key: key + "/3", LeaseId: a}, connect.CodeNotFound, "lease_unknown", "")
	fails(completeP, &leaseholdv1.CompleteRequest{Key: key}, connect.CodeInvalidArgument, "invalid_argument", "token")
	fails(completeP, &leaseholdv1.CompleteRequest{Key: key, Token: tok, Result: make([]byte, core.MaxResultLen+1)}, connect.CodeInvalidArgument, "invalid_argument", "result")
	fails(abandonP, &leaseholdv1.AbandonRequest{Key: "", Token: 1}, connect.CodeInvalidArgument, "invalid_argument", "key")
	fails(getP, &leaseholdv1.IdempotencyServiceGetRequest{Key: "//"}, connect.CodeInvalidArgument, "invalid_argument", "key")
}

// TestIdempotencyJSON: the service answers JSON over plain HTTP, like every RPC.
func TestIdempotencyJSON(t *testing.T) {
	n := testnode.Start(t)
	url := "http://" + n.Addr()
	r := postJSON(t, url, leaseholdv1connect.LeaseServiceGrantProcedure, `{"ttlMs": 10000}`)
	if r.status != http.StatusOK {
		t.Fatalf("grant: %d %s", r.status, r.body)
	}
	var g struct{ LeaseID string }
	if err := json.Unmarshal(r.body, &g); err != nil || g.LeaseID == "" {
		t.Fatalf("grant: %s %v", r.body, err)
	}
	lease := g.LeaseID
	r = postJSON(t, url, leaseholdv1connect.IdempotencyServiceBeginProcedure, `{"key": "json/1", "leaseId": "`+lease+`"}`)
	if r.status != http.StatusOK || !bytes.Contains(r.body, []byte(`"KEY_STATUS_NEW"`)) {
		t.Fatalf("begin: %d %s", r.status, r.body)
	}
}

// TestKeysSurviveLeaderChange (G3, G9): a key done and a key in progress on a leader
// that is then cut off are, on the new leader, done with the same result and in
// progress under the same claim (its lease's Begin answers NEW with the same token, and
// its Complete succeeds there); the cut-off leader cannot complete anything.
func TestKeysSurviveLeaderChange(t *testing.T) {
	c := clustertest.MakeCluster(t, 3, clustertest.Options{})
	L := c.Leader()
	lease := at(t, L).grant(5 * time.Second)
	other := at(t, L).grant(5 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	begin := func(n *clustertest.Node, lease, key string) *leaseholdv1.BeginResponse {
		t.Helper()
		r, err := n.Server().Begin(ctx, &leaseholdv1.BeginRequest{Key: key, LeaseId: lease})
		if err != nil {
			t.Fatalf("Begin %s through %s: %v", key, n.ID, err)
		}
		return r
	}
	done := begin(L, lease, "lc/done").GetToken()
	if _, err := L.Server().Complete(ctx, &leaseholdv1.CompleteRequest{Key: "lc/done", Token: done, Result: []byte("r")}); err != nil {
		t.Fatal(err)
	}
	open := begin(L, lease, "lc/open").GetToken()

	c.Partition(L)
	N := c.Leader(c.Others(L)...)
	if r := begin(N, other, "lc/done"); r.GetStatus() != leaseholdv1.KeyStatus_KEY_STATUS_DONE || r.GetToken() != done || string(r.GetResult()) != "r" {
		t.Fatalf("the done key on the new leader: %v", r)
	}
	if r := begin(N, other, "lc/open"); r.GetStatus() != leaseholdv1.KeyStatus_KEY_STATUS_IN_PROGRESS || r.GetToken() != open {
		t.Fatalf("the open key on the new leader, for another lease: %v", r)
	}
	if r := begin(N, lease, "lc/open"); r.GetStatus() != leaseholdv1.KeyStatus_KEY_STATUS_NEW || r.GetToken() != open {
		t.Fatalf("the open key on the new leader, for its own lease: %v", r)
	}
	short, cancelShort := context.WithTimeout(ctx, 500*time.Millisecond)
	if _, err := L.Server().Complete(short, &leaseholdv1.CompleteRequest{Key: "lc/open", Token: open, Result: []byte("cut off")}); err == nil {
		t.Fatal("the cut-off leader completed a key")
	}
	cancelShort()
	if _, err := N.Server().Complete(ctx, &leaseholdv1.CompleteRequest{Key: "lc/open", Token: open, Result: []byte("new leader")}); err != nil {
		t.Fatalf("Complete on the new leader: %v", err)
	}
	c.Heal()
}
