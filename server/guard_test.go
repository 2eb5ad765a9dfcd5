package server_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"
	"connectrpc.com/grpcreflect"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/api/leasehold/v1/leaseholdv1connect"
	"github.com/leasehold/leasehold/fastlane"
	"github.com/leasehold/leasehold/server"
)

// goTypeName matches what a message must never show a client: a Go type of ours
// (Connect's codecs say "unmarshal into *leaseholdv1.GrantRequest").
var goTypeName = regexp.MustCompile(`leaseholdv1\.|\*[a-z]+v1\.|unmarshal into`)

// TestBrokenEnvelopes checks G6 for the 5-byte message prefixes of gRPC and gRPC-Web:
// every broken envelope is InvalidArgument (ResourceExhausted for a message over the
// size limit), never Internal, and the server keeps serving.
func TestBrokenEnvelopes(t *testing.T) {
	s := startStack(t, stackOpts{})
	c := newRawClients()
	defer c.close()
	msg, err := proto.Marshal(&leaseholdv1.GrantRequest{TtlMs: 5000})
	if err != nil {
		t.Fatal(err)
	}
	var zipped bytes.Buffer
	zw := gzip.NewWriter(&zipped)
	_, _ = zw.Write(msg)
	_ = zw.Close()
	gzipHeader := http.Header{"Grpc-Encoding": {"gzip"}}
	over := make([]byte, 5)
	over[0], over[1] = 0, 0x01 // announces 16 MiB, sends nothing of it
	cases := []struct {
		name   string
		body   []byte
		header http.Header
		code   connect.Code
	}{
		{name: "well formed", body: envelope(0, msg)},
		{name: "well formed, gzip", body: envelope(1, zipped.Bytes()), header: gzipHeader},
		{name: "empty message", body: envelope(0, nil)},
		{name: "empty body", body: nil, code: connect.CodeInvalidArgument},
		{name: "prefix cut short", body: []byte{0, 0, 0}, code: connect.CodeInvalidArgument},
		{name: "unknown flag 0x02", body: envelope(2, msg), code: connect.CodeInvalidArgument},
		{name: "trailer flag 0x80 in a request", body: envelope(0x80, msg), code: connect.CodeInvalidArgument},
		{name: "compressed flag without grpc-encoding", body: envelope(1, msg), code: connect.CodeInvalidArgument},
		{name: "compressed flag, gzip, not gzip", body: envelope(1, msg), header: gzipHeader, code: connect.CodeInvalidArgument},
		{name: "length prefix longer than the body", body: envelope(0, msg)[:len(msg)+2], code: connect.CodeInvalidArgument},
		{name: "length prefix far longer than the body", body: append([]byte{0, 0, 0, 0x40, 0}, msg...), code: connect.CodeInvalidArgument},
		{name: "body past the limit", body: envelope(0, bytes.Repeat([]byte{0x0a}, 70<<10)), code: connect.CodeResourceExhausted},
		{name: "prefix past the limit, no body", body: over, code: connect.CodeResourceExhausted},
		{name: "trailing garbage", body: append(envelope(0, msg), "xyz"...), code: connect.CodeInvalidArgument},
		{name: "trailing zero bytes", body: append(envelope(0, msg), 0, 0, 0, 0, 0, 0, 0), code: connect.CodeInvalidArgument},
		{name: "two messages", body: append(envelope(0, msg), envelope(0, msg)...), code: connect.CodeInvalidArgument},
		{name: "message that does not decode", body: envelope(0, []byte{0x08, 0xff}), code: connect.CodeInvalidArgument},
	}
	for _, w := range []wire{grpcWire, grpcWebWire} {
		for _, tc := range cases {
			t.Run(w.String()+"/"+tc.name, func(t *testing.T) {
				a, err := c.rawCall(ctxT(t), s.url, pGrant, w, tc.body, tc.header)
				if err != nil {
					t.Fatal(err)
				}
				if a.code != tc.code {
					t.Fatalf("code %v (%q), want %v", a.code, a.message, tc.code)
				}
				if goTypeName.MatchString(a.message) {
					t.Fatalf("message %q names a Go type", a.message)
				}
				t.Log(a.code, a.message)
			})
		}
	}
	checkServes(t, s)
}

// TestUndecodableRequests checks that a request that does not decode is
// InvalidArgument naming the field at fault (in the message over Connect, also in
// ErrorDetail over the fast lane) and never a Go type.
func TestUndecodableRequests(t *testing.T) {
	s := startStack(t, stackOpts{})
	c := newRawClients()
	defer c.close()
	badUTF8 := func() []byte { // AcquireRequest{name: "orders/42", holder: {note: "\xff"}}
		var holder, b []byte
		holder = protowire.AppendTag(holder, 3, protowire.BytesType)
		holder = protowire.AppendString(holder, "bad \xff note")
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendString(b, "orders/42")
		b = protowire.AppendTag(b, 4, protowire.BytesType)
		return protowire.AppendBytes(b, holder)
	}()
	cutVarint := []byte{0x08, 0xff} // GrantRequest.ttl_ms, a varint that never ends
	cases := []struct {
		name, path string
		w          wire
		body       []byte
		field      string // the message must start with it ("" : about the request)
	}{
		{"truncated JSON", pAcquire, connectJSON, []byte(`{"name": "orders/42", "class": `), "class"},
		{"not an object", pGrant, connectJSON, []byte(`[1,2,3]`), ""},
		{"not JSON", pGrant, connectJSON, []byte(`ttl=5`), ""},
		{"unknown field", pGrant, connectJSON, []byte(`{"ttlMs": 1000, "ttlMsec": 5000}`), "ttlMsec"},
		{"field twice", pGrant, connectJSON, []byte(`{"ttlMs": 1000, "ttl_ms": 5000}`), "ttl_ms"},
		{"object for a number", pGrant, connectJSON, []byte(`{"ttlMs": {"value": 1}}`), "ttl_ms"},
		{"string for a number", pList, connectJSON, []byte(`{"limit": "many"}`), "limit"},
		{"number out of range", pList, connectJSON, []byte(`{"limit": 99999999999}`), "limit"},
		{"unknown enum", pAcquire, connectJSON, []byte(`{"class": "LOCK_CLASS_MAYBE"}`), "class"},
		{"nested: number for a string", pAcquire, connectJSON, []byte(`{"name": "a", "holder": {"host": 5}}`), "holder.host"},
		{"nested: unknown field", pAcquire, connectJSON, []byte(`{"holder": {"hots": "x"}}`), "holder.hots"},
		{"nested: not an object", pAcquire, connectJSON, []byte(`{"holder": "me"}`), "holder"},
		{"bytes not base64", "/leasehold.v1.KVService/Put", connectJSON, []byte(`{"key": "k", "value": "%%%"}`), "value"},
		{"after the object", pGrant, connectJSON, []byte(`{"ttlMs": 1000} {}`), ""},
		{"empty", pGrant, connectJSON, nil, ""},
		{"invalid UTF-8, binary", pAcquire, connectProto, badUTF8, "holder.note"},
		{"cut varint, binary", pGrant, connectProto, cutVarint, "ttl_ms"},
		{"invalid UTF-8, gRPC", pAcquire, grpcWire, envelope(0, badUTF8), "holder.note"},
		{"cut varint, gRPC-Web", pGrant, grpcWebWire, envelope(0, cutVarint), "ttl_ms"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a, err := c.rawCall(ctxT(t), s.url, tc.path, tc.w, tc.body, nil)
			if err != nil {
				t.Fatal(err)
			}
			if a.code != connect.CodeInvalidArgument {
				t.Fatalf("code %v (%q), want InvalidArgument", a.code, a.message)
			}
			if goTypeName.MatchString(a.message) {
				t.Fatalf("message %q names a Go type", a.message)
			}
			want := "unmarshal message: " + tc.field + ": "
			if tc.field == "" {
				want = "unmarshal message: the request "
			}
			if !strings.HasPrefix(a.message, want) {
				t.Fatalf("message %q, want it to start %q", a.message, want)
			}
			t.Log(a.message)
		})
	}

	t.Run("fast lane", func(t *testing.T) {
		l := dialLane(t, startFastLaneNode(t))
		for _, tc := range []struct {
			m       fastlane.Method
			payload []byte
			field   string
		}{
			{fastlane.MustMethodOf(leaseholdv1connect.LockServiceAcquireProcedure), badUTF8, "holder.note"},
			{fastlane.MustMethodOf(leaseholdv1connect.LeaseServiceGrantProcedure), cutVarint, "ttl_ms"},
		} {
			l.next++
			id := l.next
			frame, err := fastlane.AppendFrame(nil, fastlane.KindRequest, tc.m, id, func(b []byte) ([]byte, error) { return append(b, tc.payload...), nil })
			if err != nil {
				t.Fatal(err)
			}
			if _, err := l.conn.Write(frame); err != nil {
				t.Fatal(err)
			}
			f, err := l.r.Read()
			if err != nil {
				t.Fatal(err)
			}
			var fe leaseholdv1.FastLaneError
			if f.Kind != fastlane.KindError || proto.Unmarshal(f.Payload, &fe) != nil {
				t.Fatalf("%v: answer of kind %v, want an error frame", tc.m, f.Kind)
			}
			if connect.Code(fe.GetCode()) != connect.CodeInvalidArgument || fe.GetDetail().GetField() != tc.field || goTypeName.MatchString(fe.GetMessage()) {
				t.Fatalf("%v: %v %q field %q, want InvalidArgument naming %q", tc.m, connect.Code(fe.GetCode()), fe.GetMessage(), fe.GetDetail().GetField(), tc.field)
			}
		}
	})
}

// TestHealthAndReflection checks /healthz, /readyz, grpc.health.v1 and gRPC reflection
// on a leader. (A follower's answers: service.TestReadyOnFollower.)
func TestHealthAndReflection(t *testing.T) {
	s := startStack(t, stackOpts{})
	for _, path := range []string{"/healthz", "/readyz"} {
		resp, err := http.Get(s.url + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %s", path, resp.Status)
		}
	}

	h2c := h2cClient(t)
	health := grpchealth.NewClient(h2c, s.url, connect.WithGRPC())
	services := []string{"", leaseholdv1connect.LeaseServiceName, leaseholdv1connect.LockServiceName, leaseholdv1connect.KVServiceName, leaseholdv1connect.ClusterServiceName}
	for _, sv := range services {
		res, err := health.Check(ctxT(t), &grpchealth.CheckRequest{Service: sv})
		if err != nil || res.Status != grpchealth.StatusServing {
			t.Fatalf("health of %q: %v, %v; want SERVING", sv, res, err)
		}
	}
	if _, err := health.Check(ctxT(t), &grpchealth.CheckRequest{Service: "no.such.Service"}); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("health of an unknown service: %v, want NotFound", err)
	}

	refl := grpcreflect.NewClient(h2c, s.url, connect.WithGRPC())
	stream := refl.NewStream(ctxT(t))
	defer stream.Close()
	names, err := stream.ListServices()
	if err != nil {
		t.Fatal(err)
	}
	listed := make([]string, len(names))
	for i, n := range names {
		listed[i] = string(n)
	}
	for _, want := range append(services[1:], grpchealth.HealthV1ServiceName) {
		if !slices.Contains(listed, want) {
			t.Fatalf("reflection lists %v, without %s", listed, want)
		}
	}
	files, err := stream.FileContainingSymbol("leasehold.v1.LockService")
	if err != nil || len(files) == 0 {
		t.Fatalf("reflection: file of LockService: %v, %v", files, err)
	}
}

// TestDeadlinesSpareWaits checks that the per-request read and write deadlines do not
// cut off an Acquire that waits longer than both for its lock, over HTTP/1.1 (where a
// read deadline left in place would end the request through net/http's background
// read) and HTTP/2.
func TestDeadlinesSpareWaits(t *testing.T) {
	s := startStack(t, stackOpts{config: server.Config{ReadTimeout: 100 * time.Millisecond, WriteTimeout: 100 * time.Millisecond}})
	h1 := leaseholdv1connect.NewLockServiceClient(&http.Client{}, s.url, connect.WithProtoJSON())
	for _, tc := range []struct {
		name  string
		locks leaseholdv1connect.LockServiceClient
	}{{"HTTP/1.1", h1}, {"HTTP/2", s.locks}} {
		t.Run(tc.name, func(t *testing.T) {
			holder, waiter := s.grant(t, 10000), s.grant(t, 10000)
			g := s.acquire(t, &leaseholdv1.AcquireRequest{Name: "wait/here", Class: corr, LeaseId: holder})
			go func() {
				time.Sleep(500 * time.Millisecond)
				_, _ = s.locks.Release(context.Background(), &leaseholdv1.ReleaseRequest{Name: "wait/here", LeaseId: holder, Token: g.Token})
			}()
			start := time.Now()
			res, err := tc.locks.Acquire(ctxT(t), &leaseholdv1.AcquireRequest{Name: "wait/here", Class: corr, LeaseId: waiter, WaitMs: 5000})
			if err != nil {
				t.Fatalf("Acquire that waited %v: %v", time.Since(start), err)
			}
			if _, err := s.locks.Release(ctxT(t), &leaseholdv1.ReleaseRequest{Name: "wait/here", LeaseId: waiter, Token: res.Token}); err != nil {
				t.Fatal(err)
			}
		})
	}
}
