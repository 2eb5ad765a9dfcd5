package server_test

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/api/leasehold/v1/leaseholdv1connect"
	"github.com/leasehold/leasehold/fastlane"
	"github.com/leasehold/leasehold/internal/auth"
	"github.com/leasehold/leasehold/internal/testnode"
	"github.com/leasehold/leasehold/service"
)

// reviewAuthFile writes an auth file of tokens (name → rules, the secret is the name).
func reviewAuthFile(t *testing.T, file string, tokens map[string][]map[string]any) {
	t.Helper()
	var list []map[string]any
	for name, r := range tokens {
		list = append(list, map[string]any{"name": name, "sha256": hex.EncodeToString(sha256Sum(name)), "rules": r})
	}
	b, err := json.Marshal(map[string]any{"tokens": list})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// streamBearer sends token on every Connect request, streams included.
type streamBearer string

func (b streamBearer) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		req.Header().Set("Authorization", "Bearer "+string(b))
		return next(ctx, req)
	}
}

func (b streamBearer) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		conn.RequestHeader().Set("Authorization", "Bearer "+string(b))
		return conn
	}
}

func (streamBearer) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// TestRevokedTokenEndsItsWatch: SECURITY.md, "Reloading": after SIGHUP "every request —
// on connections already open too — is authorized by the new file, so a token taken out
// of it stops working at once". A Watch stream opened with a token goes on delivering
// every event under its prefix (lock names, holders, notes, force-release reasons) after
// the token was taken out of the auth file, for as long as the caller keeps it open.
func TestRevokedTokenEndsItsWatch(t *testing.T) {
	t.Run("removed", func(t *testing.T) {
		revokedWatch(t, map[string][]map[string]any{"root": rules("", "admin")}, connect.CodeUnauthenticated)
	})
	t.Run("narrowed", func(t *testing.T) {
		revokedWatch(t, map[string][]map[string]any{"root": rules("", "admin"), "watcher": rules("other/", "read")}, connect.CodePermissionDenied)
	})
}

// revokedWatch opens a Watch of w/ as token watcher, reloads the auth file as tokens,
// and checks that the stream delivers nothing more and ends with want.
func revokedWatch(t *testing.T, tokens map[string][]map[string]any, want connect.Code) {
	file := filepath.Join(t.TempDir(), "auth.json")
	reviewAuthFile(t, file, map[string][]map[string]any{
		"root":    rules("", "admin"),
		"watcher": rules("w/", "read"),
	})
	a, err := auth.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	n := testnode.StartWith(t, func(c *service.Config) { c.Server.Auth = a })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	locks := leaseholdv1connect.NewLockServiceClient(http.DefaultClient, "http://"+n.Addr(), connect.WithInterceptors(streamBearer("watcher")))
	st, err := locks.Watch(ctx, &leaseholdv1.WatchRequest{Prefix: "w/"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if !st.Receive() { // the first answer: where the stream stands
		t.Fatalf("watch: %v", st.Err())
	}

	// Take the watcher out of the auth file, then take a lock under its prefix.
	reviewAuthFile(t, file, tokens)
	if err := n.Reload(); err != nil {
		t.Fatal(err)
	}
	if code, msg := authCall(t, n.Addr(), leaseholdv1connect.LockServiceListProcedure, "watcher", &leaseholdv1.ListRequest{Prefix: "w/"}); code != want {
		t.Fatalf("List with the revoked token: %v %s, want %v", code, msg, want)
	}
	l := dialLaneWith(t, n.FastLaneAddr(), fastlane.Extensions{Token: "root"})
	id := l.lease()
	if kind := l.roundTrip(methodAcquire, &leaseholdv1.AcquireRequest{Name: "w/secret", Class: corr, LeaseId: id,
		Holder: &leaseholdv1.Holder{Note: "after the revocation"}}, &leaseholdv1.AcquireResponse{}); kind != fastlane.KindResponse {
		t.Fatalf("acquire: %v", l.lastError.GetMessage())
	}
	for st.Receive() {
		for _, e := range st.Msg().GetEvents() {
			if e.GetName() == "w/secret" {
				t.Fatalf("the Watch of a token taken out of the auth file still delivers events: %v", e)
			}
		}
	}
	if code := connect.CodeOf(st.Err()); code != want {
		t.Errorf("the Watch of a revoked token ended with %v, want %v", st.Err(), want)
	}
}
