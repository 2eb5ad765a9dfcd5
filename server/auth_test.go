package server_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/api/leasehold/v1/leaseholdv1connect"
	"github.com/leasehold/leasehold/core"
	"github.com/leasehold/leasehold/fastlane"
	"github.com/leasehold/leasehold/internal/auth"
	"github.com/leasehold/leasehold/internal/clustertest"
	"github.com/leasehold/leasehold/internal/testnode"
	"github.com/leasehold/leasehold/server"
	"github.com/leasehold/leasehold/service"
)

// aclNeeds is what each RPC must need, written out apart from the method table so that
// a change to the table's permissions fails here: the permission, and whether it is
// checked on the request's name (lock name, key or prefix). A new RPC must be added.
var aclNeeds = map[string]struct {
	perm  auth.Permission
	named bool
}{
	"/leasehold.v1.LeaseService/Grant":          {auth.Lock, false},
	"/leasehold.v1.LeaseService/KeepAlive":      {auth.Lock, false},
	"/leasehold.v1.LeaseService/Revoke":         {auth.Lock, false},
	"/leasehold.v1.LeaseService/Bind":           {auth.Lock, false},
	"/leasehold.v1.LockService/Acquire":         {auth.Lock, true},
	"/leasehold.v1.LockService/Release":         {auth.Lock, true},
	"/leasehold.v1.LockService/Describe":        {auth.Read, true},
	"/leasehold.v1.LockService/List":            {auth.Read, true},
	"/leasehold.v1.LockService/ForceRelease":    {auth.Admin, false},
	"/leasehold.v1.LockService/CheckToken":      {auth.Read, true},
	"/leasehold.v1.LockService/Watch":           {auth.Read, true},
	"/leasehold.v1.LockService/History":         {auth.Read, true},
	"/leasehold.v1.KVService/Get":               {auth.Read, true},
	"/leasehold.v1.KVService/Put":               {auth.KVWrite, true},
	"/leasehold.v1.KVService/Delete":            {auth.KVWrite, true},
	"/leasehold.v1.KVService/List":              {auth.Read, true},
	"/leasehold.v1.ClusterService/Status":       {auth.Read, false},
	"/leasehold.v1.ClusterService/Members":      {auth.Read, false},
	"/leasehold.v1.ClusterService/AddMember":    {auth.Admin, false},
	"/leasehold.v1.ClusterService/RemoveMember": {auth.Admin, false},
	"/leasehold.v1.IdempotencyService/Begin":    {auth.Lock, true},
	"/leasehold.v1.IdempotencyService/Complete": {auth.Lock, true},
	"/leasehold.v1.IdempotencyService/Abandon":  {auth.Lock, true},
	"/leasehold.v1.IdempotencyService/Get":      {auth.Read, true},
	"/leasehold.v1.GroupService/Create":         {auth.Lock, true},
	"/leasehold.v1.GroupService/Join":           {auth.Lock, true},
	"/leasehold.v1.GroupService/Leave":          {auth.Lock, true},
	"/leasehold.v1.GroupService/Release":        {auth.Lock, true},
	"/leasehold.v1.GroupService/Status":         {auth.Read, true},
	"/leasehold.v1.GroupService/Assignments":    {auth.Lock, true},
	"/leasehold.v1.ElectionService/Campaign":    {auth.Lock, true},
	"/leasehold.v1.ElectionService/Proclaim":    {auth.Lock, true},
	"/leasehold.v1.ElectionService/Leader":      {auth.Read, true},
	"/leasehold.v1.ElectionService/Resign":      {auth.Lock, true},
	"/leasehold.v1.ElectionService/Observe":     {auth.Read, true},
}

// aclTokens are the identities of the ACL test: each token's name is its secret too.
// Every named request names "acl/x".
var aclTokens = []struct {
	name  string
	rules []map[string]any
	// may lists what it may do: a permission on "acl/x" (named) or on nothing.
	may func(p auth.Permission, named bool) bool
}{
	{"reader", rules("acl/", "read"), func(p auth.Permission, named bool) bool { return p == auth.Read }},
	{"locker", rules("acl/", "lock"), func(p auth.Permission, named bool) bool {
		return p == auth.Lock || (p == auth.Read && !named)
	}},
	{"writer", rules("acl/", "kv-write"), func(p auth.Permission, named bool) bool {
		return p == auth.KVWrite || (p == auth.Read && !named)
	}},
	// Admin on a prefix: everything on its names, but no cluster-wide admin RPC.
	{"acl-admin", rules("acl/", "admin"), func(p auth.Permission, named bool) bool { return p != auth.Admin || named }},
	{"root", rules("", "admin"), func(auth.Permission, bool) bool { return true }},
	// Rules elsewhere: nameless lock and read, nothing on acl/x.
	{"elsewhere", rules("other/", "read", "lock", "kv-write"), func(p auth.Permission, named bool) bool {
		return !named && p != auth.Admin && p != auth.KVWrite
	}},
}

func rules(prefix string, allow ...string) []map[string]any {
	return []map[string]any{{"prefix": prefix, "allow": allow}}
}

// writeAuthFile writes an auth file of tokens whose secret is their name.
func writeAuthFile(t *testing.T, subjects ...map[string]any) string {
	t.Helper()
	var tokens []map[string]any
	for _, tk := range aclTokens {
		sum := sha256.Sum256([]byte(tk.name))
		tokens = append(tokens, map[string]any{"name": tk.name, "sha256": hex.EncodeToString(sum[:]), "rules": tk.rules})
	}
	b, err := json.Marshal(map[string]any{"tokens": tokens, "subjects": subjects})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "auth.json")
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// startAuthNode starts a node whose auth file holds aclTokens.
func startAuthNode(t *testing.T) *service.Node {
	t.Helper()
	a, err := auth.Load(writeAuthFile(t))
	if err != nil {
		t.Fatal(err)
	}
	return testnode.StartWith(t, func(c *service.Config) { c.Server.Auth = a })
}

// TestACL calls every RPC of the method table over both transports (the fast lane for
// those it carries) without a token, with an unknown one, and with each identity of
// aclTokens, and checks that the server answers Unauthenticated, PermissionDenied
// naming what is missing, or lets the request through to its handler, as the rules say.
func TestACL(t *testing.T) {
	n := startAuthNode(t)
	procedures := server.Procedures(n.Server)
	for p := range aclNeeds {
		if !slices.Contains(procedures, p) {
			t.Errorf("%s is in aclNeeds but not in the method table", p)
		}
	}
	lanes := map[string]*lane{}
	for _, token := range []string{"", "nobody"} {
		lanes[token] = dialLaneWith(t, n.FastLaneAddr(), fastlane.Extensions{Token: token})
	}
	for _, tk := range aclTokens {
		lanes[tk.name] = dialLaneWith(t, n.FastLaneAddr(), fastlane.Extensions{Token: tk.name})
	}
	for _, procedure := range procedures {
		need, ok := aclNeeds[procedure]
		if !ok {
			t.Errorf("%s: the ACL test does not know what it needs: add it to aclNeeds", procedure)
			continue
		}
		req := aclRequest(t, procedure, need.named)
		fast, onFastLane := fastlane.MethodOf(procedure)
		check := func(token string, want connect.Code, wantIn string) {
			t.Helper()
			code, msg := authCall(t, n.Addr(), procedure, token, req)
			if !matches(code, want) || !strings.Contains(msg, wantIn) {
				t.Errorf("%s over Connect with token %q: %v %q, want %v containing %q", procedure, token, code, msg, describe(want), wantIn)
			}
			if !onFastLane {
				return
			}
			l := lanes[token]
			l.lastError.Reset()
			code = 0
			if kind := l.roundTrip(fast, req, fast.NewResponse()); kind == fastlane.KindError {
				code = connect.Code(l.lastError.GetCode())
			}
			if !matches(code, want) || !strings.Contains(l.lastError.GetMessage(), wantIn) {
				t.Errorf("%s over the fast lane with token %q: %v %q, want %v containing %q", procedure, token, code, l.lastError.GetMessage(), describe(want), wantIn)
			}
		}
		check("", connect.CodeUnauthenticated, "no credentials")
		check("nobody", connect.CodeUnauthenticated, "not in the auth file")
		for _, tk := range aclTokens {
			if tk.may(need.perm, need.named) {
				check(tk.name, allowed, "")
			} else {
				check(tk.name, connect.CodePermissionDenied, "token "+tk.name+" may not "+need.perm.String())
			}
		}
	}
}

// allowed stands for any answer but Unauthenticated and PermissionDenied: the request
// reached its handler (which may well refuse an empty request).
const allowed connect.Code = 1000

func matches(got, want connect.Code) bool {
	if want == allowed {
		return got != connect.CodeUnauthenticated && got != connect.CodePermissionDenied
	}
	return got == want
}

func describe(c connect.Code) string {
	if c == allowed {
		return "the handler's answer"
	}
	return c.String()
}

// aclRequest is an empty request of procedure, naming "acl/x" when the RPC is named.
func aclRequest(t *testing.T, procedure string, named bool) proto.Message {
	t.Helper()
	var req proto.Message
	for _, m := range fastlane.Methods() {
		if m.Procedure() == procedure {
			req = m.NewRequest()
		}
	}
	if req == nil {
		req = newRequest(t, procedure)
	}
	if named {
		fields := req.ProtoReflect().Descriptor().Fields()
		for _, f := range []protoreflect.Name{"name", "key", "prefix", "group"} {
			if fd := fields.ByName(f); fd != nil {
				req.ProtoReflect().Set(fd, protoreflect.ValueOfString("acl/x"))
				return req
			}
		}
		t.Fatalf("%s is named but its request has no name, key, prefix or group", procedure)
	}
	return req
}

// newRequest makes an empty request message of procedure from the .proto descriptors.
func newRequest(t *testing.T, procedure string) proto.Message {
	t.Helper()
	services := leaseholdv1.File_leasehold_v1_leasehold_proto.Services()
	for i := range services.Len() {
		sd := services.Get(i)
		for j := range sd.Methods().Len() {
			if md := sd.Methods().Get(j); "/"+string(sd.FullName())+"/"+string(md.Name()) == procedure {
				mt, err := protoregistry.GlobalTypes.FindMessageByName(md.Input().FullName())
				if err != nil {
					t.Fatal(err)
				}
				return mt.New().Interface()
			}
		}
	}
	t.Fatalf("no RPC %s", procedure)
	return nil
}

// authCall calls procedure over Connect's binary protocol with token (none when "") and
// returns the answer's code (0 for success) and error message.
func authCall(t *testing.T, addr, procedure, token string, req proto.Message) (connect.Code, string) {
	t.Helper()
	if isStream(procedure) {
		code, msg, _ := streamCall(t, addr, procedure, token, req)
		return code, msg
	}
	body, err := proto.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	hr, err := http.NewRequest(http.MethodPost, "http://"+addr+procedure, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	hr.Header.Set("Content-Type", "application/proto")
	if token != "" {
		hr.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(hr)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusOK {
		return 0, ""
	}
	var e struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatalf("%s: error body %q: %v", procedure, b, err)
	}
	var code connect.Code
	if err := code.UnmarshalText([]byte(e.Code)); err != nil {
		t.Fatalf("%s: code %q: %v", procedure, e.Code, err)
	}
	return code, e.Message
}

// dialLaneWith is dialLane with hello extensions.
func dialLaneWith(t *testing.T, addr string, ext fastlane.Extensions) *lane {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := fastlane.ClientHello(conn, "", ext); err != nil {
		t.Fatal(err)
	}
	return &lane{t: t, conn: conn, r: fastlane.NewReader(conn)}
}

// TestAdminHTTP checks the HTTP endpoints beside the RPCs with auth on: /admin/snapshot
// and /debug/pprof/ need admin on every name, /metrics needs read (any rule gives it),
// /healthz and the dashboard's assets (/ui, whose page reads with the caller's token) are
// open.
func TestAdminHTTP(t *testing.T) {
	a, err := auth.Load(writeAuthFile(t))
	if err != nil {
		t.Fatal(err)
	}
	n := testnode.StartWith(t, func(c *service.Config) { c.Server.Auth, c.Pprof = a, true })
	for _, c := range []struct {
		path, token string
		want        int
	}{
		{"/healthz", "", http.StatusOK},
		{"/ui", "", http.StatusOK},
		{"/ui/app.js", "", http.StatusOK},
		{"/ui/config.json", "", http.StatusOK},
		{"/metrics", "", http.StatusUnauthorized},
		{"/metrics", "nobody", http.StatusUnauthorized},
		{"/metrics", "locker", http.StatusOK},
		{"/admin/snapshot", "", http.StatusUnauthorized},
		{"/admin/snapshot", "acl-admin", http.StatusForbidden},
		{"/admin/snapshot", "root", http.StatusOK},
		{"/debug/pprof/", "", http.StatusUnauthorized},
		{"/debug/pprof/cmdline", "reader", http.StatusForbidden},
		{"/debug/pprof/cmdline", "root", http.StatusOK},
	} {
		req, _ := http.NewRequest(http.MethodGet, "http://"+n.Addr()+c.path, nil)
		if c.token != "" {
			req.Header.Set("Authorization", "Bearer "+c.token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("GET %s with token %q: %s, want %d", c.path, c.token, resp.Status, c.want)
		}
	}
}

// TestListingsHideLeaseIDs checks that no listing shows a lease ID (G11: only its holder
// knows it, and it is the power to release or keep alive the holder's locks).
func TestListingsHideLeaseIDs(t *testing.T) {
	n := startAuthNode(t)
	l := dialLaneWith(t, n.FastLaneAddr(), fastlane.Extensions{Token: "root"})
	id := l.lease()
	if kind := l.roundTrip(methodAcquire, &leaseholdv1.AcquireRequest{Name: "acl/held", Class: corr, LeaseId: id}, &leaseholdv1.AcquireResponse{}); kind != fastlane.KindResponse {
		t.Fatalf("acquire: %v", l.lastError.GetMessage())
	}
	for _, c := range []struct {
		procedure string
		req       proto.Message
	}{
		{"/leasehold.v1.LockService/List", &leaseholdv1.ListRequest{Prefix: "acl/"}},
		{"/leasehold.v1.LockService/Describe", &leaseholdv1.DescribeRequest{Name: "acl/held"}},
		{"/leasehold.v1.ClusterService/Status", &leaseholdv1.StatusRequest{}},
	} {
		body, err := protojson.Marshal(c.req)
		if err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest(http.MethodPost, "http://"+n.Addr()+c.procedure, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer reader")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		out, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %s %s", c.procedure, resp.Status, out)
		}
		if _, status := c.req.(*leaseholdv1.StatusRequest); !status && !strings.Contains(string(out), "acl/held") {
			t.Fatalf("%s does not list the lock: %s", c.procedure, out)
		}
		if strings.Contains(strings.ToLower(string(out)), id) {
			t.Errorf("%s shows the lease ID: %s", c.procedure, out)
		}
	}
}

// TestQuotas checks each quota of an identity on both transports: a call past it is
// ResourceExhausted naming the quota and changes nothing, and what ends frees its place.
func TestQuotas(t *testing.T) {
	sum := sha256.Sum256([]byte("q"))
	file := filepath.Join(t.TempDir(), "auth.json")
	if err := os.WriteFile(file, []byte(`{"tokens":[
		{"name":"q","sha256":"`+hex.EncodeToString(sum[:])+`","rules":[{"prefix":"","allow":["lock","read"]}],"quota":{"leases":2,"locks":3,"waiters":2}},
		{"name":"w","sha256":"`+hex.EncodeToString(sha256Sum("w"))+`","rules":[{"prefix":"","allow":["lock"]}],"quota":{"waiters":2}},
		{"name":"root","sha256":"`+hex.EncodeToString(sha256Sum("root"))+`","rules":[{"prefix":"","allow":["admin"]}]}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := auth.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	n := testnode.StartWith(t, func(c *service.Config) { c.Server.Auth = a })
	lane := dialLaneWith(t, n.FastLaneAddr(), fastlane.Extensions{Token: "q"})
	exhausted := func(what, reason string, kind fastlane.Kind) {
		t.Helper()
		if kind != fastlane.KindError || connect.Code(lane.lastError.GetCode()) != connect.CodeResourceExhausted || lane.lastError.GetDetail().GetReason() != reason {
			t.Fatalf("%s: kind %d %v %q, want ResourceExhausted %s", what, kind, connect.Code(lane.lastError.GetCode()), lane.lastError.GetDetail().GetReason(), reason)
		}
	}

	// Leases: two, the third refused (over Connect too); a revoked one frees its place.
	l1, l2 := lane.lease(), lane.lease()
	exhausted("third lease", "quota_leases", lane.roundTrip(methodGrant, &leaseholdv1.GrantRequest{}, &leaseholdv1.GrantResponse{}))
	if code, msg := authCall(t, n.Addr(), "/leasehold.v1.LeaseService/Grant", "q", &leaseholdv1.GrantRequest{}); code != connect.CodeResourceExhausted || !strings.Contains(msg, "token q may hold at most 2 leases") {
		t.Errorf("third lease over Connect: %v %q", code, msg)
	}
	if kind := lane.roundTrip(fastlane.MustMethodOf(leaseholdv1connect.LeaseServiceRevokeProcedure), &leaseholdv1.RevokeRequest{LeaseId: l2}, &leaseholdv1.RevokeResponse{}); kind != fastlane.KindResponse {
		t.Fatalf("revoke: %v", lane.lastError.GetMessage())
	}
	l2 = lane.lease()

	// Locks: three, the fourth refused; a release frees its place.
	acquire := func(lease, name string, wait int64) fastlane.Kind {
		return lane.roundTrip(methodAcquire, &leaseholdv1.AcquireRequest{Name: name, Class: corr, LeaseId: lease, WaitMs: wait}, &leaseholdv1.AcquireResponse{})
	}
	var tokens []uint64
	for i, name := range []string{"q/1", "q/2", "q/3"} {
		var g leaseholdv1.AcquireResponse
		if kind := lane.roundTrip(methodAcquire, &leaseholdv1.AcquireRequest{Name: name, Class: []leaseholdv1.LockClass{corr, eff}[i%2], LeaseId: l1}, &g); kind != fastlane.KindResponse {
			t.Fatalf("acquire %s: %v", name, lane.lastError.GetMessage())
		}
		tokens = append(tokens, g.GetToken())
	}
	exhausted("fourth lock", "quota_locks", acquire(l2, "q/4", 0))
	if kind := lane.roundTrip(methodRelease, &leaseholdv1.ReleaseRequest{Name: "q/1", LeaseId: l1, Token: tokens[0]}, &leaseholdv1.ReleaseResponse{}); kind != fastlane.KindResponse {
		t.Fatalf("release: %v", lane.lastError.GetMessage())
	}
	if kind := acquire(l2, "q/4", 0); kind != fastlane.KindResponse {
		t.Fatalf("acquire after a release: %v", lane.lastError.GetMessage())
	}

	// Waiters: root holds w/1 and w/1b; two acquires of w wait for them, a third is refused, and
	// one more may wait once one of them has given up.
	root := dialLaneWith(t, n.FastLaneAddr(), fastlane.Extensions{Token: "root"})
	rl := root.lease()
	for _, name := range []string{"w/1", "w/1b"} {
		if kind := root.roundTrip(methodAcquire, &leaseholdv1.AcquireRequest{Name: name, Class: corr, LeaseId: rl}, &leaseholdv1.AcquireResponse{}); kind != fastlane.KindResponse {
			t.Fatalf("root acquire: %v", root.lastError.GetMessage())
		}
	}
	w := dialLaneWith(t, n.FastLaneAddr(), fastlane.Extensions{Token: "w"})
	wl := w.lease()
	waiting := dialLaneWith(t, n.FastLaneAddr(), fastlane.Extensions{Token: "w"})
	var ids []uint64
	for _, name := range []string{"w/1", "w/1b"} {
		ids = append(ids, waiting.send(fastlane.KindRequest, methodAcquire, &leaseholdv1.AcquireRequest{Name: name, Class: corr, LeaseId: w.lease(), WaitMs: 60_000}))
	}
	locks := leaseholdv1connect.NewLockServiceClient(http.DefaultClient, "http://"+n.Addr(), connect.WithInterceptors(bearerInterceptor("root")))
	if !eventuallyTrue(10*time.Second, func() bool {
		for _, name := range []string{"w/1", "w/1b"} {
			d, err := locks.Describe(t.Context(), &leaseholdv1.DescribeRequest{Name: name})
			if err != nil || d.GetLock().GetWaiters() != 1 {
				return false
			}
		}
		return true
	}) {
		t.Fatal("w's acquires are not both waiting")
	}
	third := func() fastlane.Kind {
		return w.roundTrip(methodAcquire, &leaseholdv1.AcquireRequest{Name: "w/2", Class: corr, LeaseId: wl}, &leaseholdv1.AcquireResponse{})
	}
	if !eventuallyTrue(10*time.Second, func() bool {
		return third() == fastlane.KindError && w.lastError.GetDetail().GetReason() == "quota_waiters"
	}) {
		t.Fatalf("a third acquire in flight: %q, want quota_waiters", w.lastError.GetMessage())
	}
	cancel, err := fastlane.AppendFrame(nil, fastlane.KindCancel, methodAcquire, ids[0], nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := waiting.conn.Write(cancel); err != nil {
		t.Fatal(err)
	}
	if !eventuallyTrue(10*time.Second, func() bool { return third() == fastlane.KindResponse }) {
		t.Fatalf("after a waiter gave up: %q", w.lastError.GetMessage())
	}
}

func eventuallyTrue(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

func sha256Sum(s string) []byte {
	sum := sha256.Sum256([]byte(s))
	return sum[:]
}

// bearerInterceptor sends token on every Connect request.
func bearerInterceptor(token string) connect.Interceptor {
	return connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			req.Header().Set("Authorization", "Bearer "+token)
			return next(ctx, req)
		}
	})
}

// TestACLLockSet: a lock set is allowed only when every one of its names is: a token
// with "lock" on acl/ may take {acl/a, acl/b} but not {acl/a, other/b}, on either
// transport.
func TestACLLockSet(t *testing.T) {
	n := startAuthNode(t)
	procedure := leaseholdv1connect.LockServiceAcquireProcedure
	fast := fastlane.MustMethodOf(procedure)
	l := dialLaneWith(t, n.FastLaneAddr(), fastlane.Extensions{Token: "locker"})
	for _, c := range []struct {
		names []string
		want  connect.Code
	}{
		{[]string{"acl/a", "acl/b"}, allowed},
		{[]string{"acl/a", "other/b"}, connect.CodePermissionDenied},
	} {
		req := &leaseholdv1.AcquireRequest{Names: c.names, Class: leaseholdv1.LockClass_LOCK_CLASS_CORRECTNESS}
		if code, msg := authCall(t, n.Addr(), procedure, "locker", req); !matches(code, c.want) {
			t.Errorf("lock set %v over Connect: %v %q, want %v", c.names, code, msg, describe(c.want))
		}
		l.lastError.Reset()
		code := connect.Code(0)
		if kind := l.roundTrip(fast, req, fast.NewResponse()); kind == fastlane.KindError {
			code = connect.Code(l.lastError.GetCode())
		}
		if !matches(code, c.want) {
			t.Errorf("lock set %v over the fast lane: %v %q, want %v", c.names, code, l.lastError.GetMessage(), describe(c.want))
		}
	}
}

// The locks quota counts every name of a lock set: a set of 64 names is 64 locks, not
// one (three sets once went through a quota of 3, for 192 locks held).
func TestLockQuotaCountsEveryNameOfASet(t *testing.T) {
	file := filepath.Join(t.TempDir(), "auth.json")
	if err := os.WriteFile(file, []byte(`{"tokens":[{"name":"q","sha256":"`+hex.EncodeToString(sha256Sum("q"))+
		`","rules":[{"prefix":"","allow":["lock","read"]}],"quota":{"locks":5}}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := auth.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	n := testnode.StartWith(t, func(c *service.Config) { c.Server.Auth = a })
	l := dialLaneWith(t, n.FastLaneAddr(), fastlane.Extensions{Token: "q"})
	lease := l.lease()
	set := func(prefix string, size int) fastlane.Kind {
		names := make([]string, size)
		for i := range names {
			names[i] = fmt.Sprintf("%s/%d", prefix, i)
		}
		return l.roundTrip(methodAcquire, &leaseholdv1.AcquireRequest{Names: names, Class: corr, LeaseId: lease}, &leaseholdv1.AcquireResponse{})
	}
	if kind := set("q/a", 3); kind != fastlane.KindResponse {
		t.Fatalf("a set of 3 under a quota of 5: %q", l.lastError.GetMessage())
	}
	if kind := set("q/b", 3); kind != fastlane.KindError || connect.Code(l.lastError.GetCode()) != connect.CodeResourceExhausted {
		t.Fatalf("a second set of 3 (6 locks under a quota of 5): kind %d %q, want ResourceExhausted", kind, l.lastError.GetMessage())
	}
	if kind := set("q/c", 2); kind != fastlane.KindResponse {
		t.Fatalf("a set of 2 (5 locks): %q", l.lastError.GetMessage())
	}
	id, _ := core.ParseLeaseID(lease)
	if held := n.Leader.LeaseLocks(id); held != 5 {
		t.Fatalf("%d locks held under a quota of 5", held)
	}
}

// With auth on, a release-on-disconnect lease bound to a fast-lane connection that a
// follower holds is revoked when that connection ends (G7): the follower forwards the
// revoke with the connection's own credential, since the leader takes no other.
func TestReleaseOnDisconnectThroughAFollowerWithAuth(t *testing.T) {
	file := filepath.Join(t.TempDir(), "auth.json")
	if err := os.WriteFile(file, []byte(`{"tokens":[{"name":"root","sha256":"`+hex.EncodeToString(sha256Sum("root"))+
		`","rules":[{"prefix":"","allow":["admin"]}]}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := auth.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	c := clustertest.MakeCluster(t, 3, clustertest.Options{Server: server.Config{Auth: a}})
	ld := c.Leader()
	f := c.Others(ld)[0]
	clustertest.WaitFor(t, func() bool { return f.Server().ClusterID() != "" }, "the follower knows the cluster")
	l := dialLaneWith(t, f.FastLaneAddr(), fastlane.Extensions{Token: "root"})
	var g leaseholdv1.GrantResponse
	if kind := l.roundTrip(methodGrant, &leaseholdv1.GrantRequest{TtlMs: 60_000, ReleaseOnDisconnect: true}, &g); kind != fastlane.KindResponse {
		t.Fatalf("grant through the follower: %q", l.lastError.GetMessage())
	}
	id, err := core.ParseLeaseID(g.GetLeaseId())
	if err != nil {
		t.Fatal(err)
	}
	_ = l.conn.Close()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		gone := false
		ld.Raft().Read(func(st *core.State) { gone = st.Lease(id) == nil })
		if gone {
			return
		}
	}
	t.Fatalf("lease %s alive 5 s after its fast-lane connection to the follower closed (TTL 60 s)", g.GetLeaseId())
}
