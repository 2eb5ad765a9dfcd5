package server_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/core"
	"github.com/leasehold/leasehold/fastlane"
	"github.com/leasehold/leasehold/internal/testnode"
	"github.com/leasehold/leasehold/leader"
	"github.com/leasehold/leasehold/server"
)

// TestMethodTable checks that the server's method table serves exactly the RPCs of the
// .proto file, each once, and that every RPC the fast lane carries is in it.
func TestMethodTable(t *testing.T) {
	n := testnode.Start(t)
	var want []string
	services := leaseholdv1.File_leasehold_v1_leasehold_proto.Services()
	for i := range services.Len() {
		sd := services.Get(i)
		for j := range sd.Methods().Len() {
			want = append(want, "/"+string(sd.FullName())+"/"+string(sd.Methods().Get(j).Name()))
		}
	}
	got := server.Procedures(n.Server)
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("method table serves\n%v\nthe .proto file has\n%v", got, want)
	}
	for _, m := range fastlane.Methods() {
		if !slices.Contains(got, m.Procedure()) {
			t.Errorf("fast-lane method %d (%s) is not in the method table", m, m.Procedure())
		}
	}
}

// TestTransportsAgree makes every RPC fail with every error the error table maps, and
// checks that Connect and the fast lane answer each with the same code and reason, and
// count it under the same metric label: the code the caller sees.
func TestTransportsAgree(t *testing.T) {
	n := testnode.Start(t)
	errs := append(server.MappedErrors(),
		core.Invalid("ttl_ms", "is out of range"),
		&leader.LeaseGoneError{Reason: core.EndRevoked},
		&leader.LockHeldError{Name: "a", HolderToken: 7},
		fmt.Errorf("wrapped: %w", core.ErrNotHolder),
		fmt.Errorf("something nobody mapped"),
	)
	var current error
	server.ReplaceHandlers(n.Server, func(string) error { return current })
	lane := dialLane(t, n.FastLaneAddr())
	for _, procedure := range server.Procedures(n.Server) {
		fast, onFastLane := fastlane.MethodOf(procedure)
		for _, e := range errs {
			current = e
			wantCode, wantDetail := server.Classify(e)
			before := server.RequestCount(n.Server, procedure, wantCode.String())

			code, reason := connectCall(t, n.Addr(), procedure)
			if code != wantCode || reason != wantDetail.GetReason() {
				t.Errorf("%s over Connect, handler error %q: code %v reason %q, want %v %q", procedure, e, code, reason, wantCode, wantDetail.GetReason())
			}
			calls := 1.0
			if onFastLane {
				calls++
				var fe leaseholdv1.FastLaneError
				if kind := lane.roundTrip(fast, fast.NewRequest(), &fe); kind != fastlane.KindError {
					t.Fatalf("%s over the fast lane: answer kind %d, want an error", procedure, kind)
				}
				if got := connect.Code(lane.lastError.GetCode()); got != code || lane.lastError.GetDetail().GetReason() != reason {
					t.Errorf("%s, handler error %q: fast lane %v %q, Connect %v %q", procedure, e, got, lane.lastError.GetDetail().GetReason(), code, reason)
				}
			}
			if after := server.RequestCount(n.Server, procedure, wantCode.String()); after-before != calls {
				t.Errorf("%s, handler error %q: leasehold_requests_total{code=%q} rose by %v, want %v", procedure, e, wantCode, after-before, calls)
			}
		}
	}
}

// connectCall calls procedure with an empty request over Connect's binary protocol and
// returns the error's code and ErrorDetail reason.
func connectCall(t *testing.T, addr, procedure string) (connect.Code, string) {
	t.Helper()
	if isStream(procedure) {
		code, _, reason := streamCall(t, addr, procedure, "", newRequest(t, procedure))
		if code == 0 {
			t.Fatalf("%s: the stream opened, want an error", procedure)
		}
		return code, reason
	}
	resp, err := http.Post("http://"+addr+procedure, "application/proto", bytes.NewReader(nil))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusOK {
		t.Fatalf("%s: 200 OK, want an error", procedure)
	}
	var e struct {
		Code    string `json:"code"`
		Details []struct {
			Type  string `json:"type"`
			Value string `json:"value"`
		} `json:"details"`
	}
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("%s: error body %q: %v", procedure, body, err)
	}
	var code connect.Code
	if err := code.UnmarshalText([]byte(e.Code)); err != nil {
		t.Fatalf("%s: code %q: %v", procedure, e.Code, err)
	}
	var d leaseholdv1.ErrorDetail
	for _, det := range e.Details {
		if det.Type == "leasehold.v1.ErrorDetail" {
			b, _ := base64.RawStdEncoding.DecodeString(det.Value)
			if err := proto.Unmarshal(b, &d); err != nil {
				t.Fatal(err)
			}
		}
	}
	return code, d.GetReason()
}

// requestCount reads leasehold_requests_total{procedure, code} from /metrics.
func requestCount(t *testing.T, addr, procedure string, code connect.Code) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	re := regexp.MustCompile(`(?m)^leasehold_requests_total\{code="` + regexp.QuoteMeta(code.String()) + `",procedure="` + regexp.QuoteMeta(procedure) + `"\} (\S+)$`)
	m := re.FindSubmatch(body)
	if m == nil {
		return 0
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestShortcutsCountAlike is the bug that made the method table: a try-once acquire of a
// held lock, which the fast lane's reader answers itself, was counted code="unknown"
// over the fast lane and code="deadline_exceeded" over Connect. Every shortcut of the
// reader (served at once, granted from memory, proposed by the reader) must answer and
// count as Connect does.
func TestShortcutsCountAlike(t *testing.T) {
	n := testnode.Start(t)
	lane := dialLane(t, n.FastLaneAddr())
	holder, other := lane.lease(), lane.lease()
	for _, class := range []leaseholdv1.LockClass{eff, corr} {
		name := "shortcut/" + class.String()
		var held leaseholdv1.AcquireResponse
		if kind := lane.roundTrip(methodAcquire, &leaseholdv1.AcquireRequest{Name: name, Class: class, LeaseId: holder}, &held); kind != fastlane.KindResponse {
			t.Fatalf("%v: first acquire: kind %d", class, kind)
		}
		try := &leaseholdv1.AcquireRequest{Name: name, Class: class, LeaseId: other}
		procedure := methodAcquire.Procedure()
		before := requestCount(t, n.Addr(), procedure, connect.CodeDeadlineExceeded)
		if kind := lane.roundTrip(methodAcquire, try, nil); kind != fastlane.KindError {
			t.Fatalf("%v: try-once on a held lock: kind %d", class, kind)
		}
		if got := connect.Code(lane.lastError.GetCode()); got != connect.CodeDeadlineExceeded || lane.lastError.GetDetail().GetReason() != "lock_held" {
			t.Errorf("%v: fast lane answered %v %q, want deadline_exceeded lock_held", class, got, lane.lastError.GetDetail().GetReason())
		}
		if after := requestCount(t, n.Addr(), procedure, connect.CodeDeadlineExceeded); after-before != 1 {
			t.Errorf("%v: a fast-lane try-once on a held lock rose code=deadline_exceeded by %v, want 1", class, after-before)
		}
	}
}
