package server_test

import (
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/fastlane"
)

const (
	modeShared    = leaseholdv1.LockMode_LOCK_MODE_SHARED
	modeSemaphore = leaseholdv1.LockMode_LOCK_MODE_SEMAPHORE
	modeExclusive = leaseholdv1.LockMode_LOCK_MODE_EXCLUSIVE
)

// TestModesOverConnect: shared locks, semaphores and lock sets through the API, both
// classes: every holder in Describe and List, CheckToken for any holder, the codes and
// details of mode and set conflicts, and the held lock of a set named in lock_held.
func TestModesOverConnect(t *testing.T) {
	s := startStack(t, stackOpts{})
	ctx := ctxT(t)
	for _, class := range []leaseholdv1.LockClass{corr, eff} {
		t.Run(class.String(), func(t *testing.T) {
			p := class.String() + "/"
			a, b, c := s.grant(t, 30000), s.grant(t, 30000), s.grant(t, 30000)
			rw := p + "rw"
			ta := s.acquire(t, &leaseholdv1.AcquireRequest{Name: rw, Class: class, LeaseId: a, Mode: modeShared, Holder: &leaseholdv1.Holder{Host: "reader-a"}}).Token
			tb := s.acquire(t, &leaseholdv1.AcquireRequest{Name: rw, Class: class, LeaseId: b, Mode: modeShared}).Token
			info := s.describe(t, rw)
			if info.Mode != modeShared || info.Token != ta || len(info.Holders) != 2 || info.Holders[0].Token != ta || info.Holders[1].Token != tb ||
				info.Holders[0].Holder.GetHost() != "reader-a" || info.Holders[1].TtlRemainingMs <= 0 {
				t.Fatalf("Describe of two readers: %v", info)
			}
			list, err := s.locks.List(ctx, &leaseholdv1.ListRequest{Prefix: rw})
			if err != nil || len(list.Locks) != 1 || len(list.Locks[0].Holders) != 2 {
				t.Fatalf("List: %v, %v", list, err)
			}
			for _, tok := range []uint64{ta, tb} {
				if r, err := s.locks.CheckToken(ctx, &leaseholdv1.CheckTokenRequest{Name: rw, Token: tok}); err != nil || !r.Current {
					t.Fatalf("CheckToken of reader token %d: %v, %v", tok, r, err)
				}
			}
			_, err = s.locks.Acquire(ctx, &leaseholdv1.AcquireRequest{Name: rw, Class: class, LeaseId: c, Mode: modeExclusive})
			if d := wantErr(t, err, connect.CodeDeadlineExceeded, "lock_held"); d.HolderToken != ta || d.HeldLock != rw {
				t.Fatalf("writer refused with %v", d)
			}
			_, err = s.locks.Acquire(ctx, &leaseholdv1.AcquireRequest{Name: rw, Class: class, LeaseId: c, Mode: modeSemaphore, Limit: 2})
			wantErr(t, err, connect.CodeFailedPrecondition, "mode_conflict")
			_, err = s.locks.Acquire(ctx, &leaseholdv1.AcquireRequest{Name: rw, Class: class, LeaseId: a, Mode: modeExclusive})
			wantErr(t, err, connect.CodeFailedPrecondition, "mode_conflict") // no upgrades

			sem := p + "sem"
			s.acquire(t, &leaseholdv1.AcquireRequest{Name: sem, Class: class, LeaseId: a, Mode: modeSemaphore, Limit: 1})
			if info := s.describe(t, sem); info.Mode != modeSemaphore || info.Limit != 1 || len(info.Holders) != 1 {
				t.Fatalf("Describe of a semaphore: %v", info)
			}

			set := s.acquire(t, &leaseholdv1.AcquireRequest{Names: []string{p + "s/2", p + "s/1"}, Class: class, LeaseId: a}).Token
			for _, n := range []string{p + "s/1", p + "s/2"} {
				if info := s.describe(t, n); info.Token != set {
					t.Fatalf("%s: %v, want held under the set's token %d", n, info, set)
				}
			}
			if again := s.acquire(t, &leaseholdv1.AcquireRequest{Names: []string{p + "s/1", p + "s/2"}, Class: class, LeaseId: a}); again.Token != set {
				t.Fatalf("repeated set acquire: token %d, want %d", again.Token, set)
			}
			_, err = s.locks.Acquire(ctx, &leaseholdv1.AcquireRequest{Names: []string{p + "s/2", p + "s/3"}, Class: class, LeaseId: b})
			if d := wantErr(t, err, connect.CodeDeadlineExceeded, "lock_held"); d.HeldLock != p+"s/2" || d.HolderToken != set {
				t.Fatalf("set refused with %v, want s/2 held under %d", d, set)
			}
			_, err = s.locks.Acquire(ctx, &leaseholdv1.AcquireRequest{Names: []string{p + "s/2", p + "s/9"}, Class: class, LeaseId: a})
			wantErr(t, err, connect.CodeFailedPrecondition, "set_conflict")
			if _, err := s.locks.Release(ctx, &leaseholdv1.ReleaseRequest{Name: p + "s/1", LeaseId: a, Token: set}); err != nil {
				t.Fatal(err)
			}
			if info := s.describe(t, p+"s/2"); info.Held {
				t.Fatalf("s/2 held after the set's release: %v", info)
			}
			// A set of one name is that name.
			one := s.acquire(t, &leaseholdv1.AcquireRequest{Names: []string{p + "one"}, Class: class, LeaseId: b}).Token
			if _, err := s.locks.Release(ctx, &leaseholdv1.ReleaseRequest{Name: p + "one", LeaseId: b, Token: one}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestFastLaneShortcutsKeepFIFO: the fast lane's reader shortcuts (acquireAtOnce for a
// try-once, acquireNow for an acquire that may wait, acquireThen for a correctness
// acquire) grant a reader beside readers, but never past a queued writer: the reader
// behind the writer waits, and each is granted in turn as the one before releases.
func TestFastLaneShortcutsKeepFIFO(t *testing.T) {
	addr := startFastLaneNode(t)
	for _, class := range []leaseholdv1.LockClass{eff, corr} {
		t.Run(class.String(), func(t *testing.T) {
			fl := dialLane(t, addr)
			name := class.String() + "/rw"
			r1, w, r2 := fl.lease(), fl.lease(), fl.lease()
			req := func(lease string, mode leaseholdv1.LockMode, wait int64) *leaseholdv1.AcquireRequest {
				return &leaseholdv1.AcquireRequest{Name: name, Class: class, LeaseId: lease, Mode: mode, WaitMs: wait}
			}
			var g1 leaseholdv1.AcquireResponse
			if kind := fl.roundTrip(methodAcquire, req(r1, modeShared, -1), &g1); kind != fastlane.KindResponse {
				t.Fatalf("first reader: answer kind %d", kind)
			}
			writer := fl.send(fastlane.KindRequest, methodAcquire, req(w, modeExclusive, -1))
			time.Sleep(50 * time.Millisecond) // let the writer reach the queue
			if kind := fl.roundTrip(methodAcquire, req(r2, modeShared, 0), nil); kind != fastlane.KindError {
				t.Fatalf("a try-once reader behind the writer: answer kind %d, want an error", kind)
			}
			reader := fl.send(fastlane.KindRequest, methodAcquire, req(r2, modeShared, -1))
			time.Sleep(50 * time.Millisecond)
			fl.send(fastlane.KindRequest, methodRelease, &leaseholdv1.ReleaseRequest{Name: name, LeaseId: r1, Token: g1.Token})
			answers := readAcquires(fl, 2) // the release's and the writer's grant, in either order
			gw, ok := answers[writer]
			if !ok {
				t.Fatalf("the writer was not granted when the reader before it left (answers %v)", answers)
			}
			if _, early := answers[reader]; early {
				t.Fatal("the reader behind the writer was granted past it")
			}
			fl.send(fastlane.KindRequest, methodRelease, &leaseholdv1.ReleaseRequest{Name: name, LeaseId: w, Token: gw.Token})
			if answers := readAcquires(fl, 2); answers[reader] == nil || answers[reader].Token <= gw.Token {
				t.Fatalf("the reader after the writer: %v", answers)
			}
			// A lock set goes through the same shortcuts.
			var set leaseholdv1.AcquireResponse
			setReq := &leaseholdv1.AcquireRequest{Names: []string{name + "/a", name + "/b"}, Class: class, LeaseId: w, WaitMs: -1}
			if kind := fl.roundTrip(methodAcquire, setReq, &set); kind != fastlane.KindResponse || set.Token == 0 {
				t.Fatalf("a free set: answer kind %d, %v", kind, &set)
			}
			setReq = &leaseholdv1.AcquireRequest{Names: []string{name + "/b", name + "/c"}, Class: class, LeaseId: r1}
			if kind := fl.roundTrip(methodAcquire, setReq, nil); kind != fastlane.KindError || fl.lastError.GetDetail().GetHeldLock() != name+"/b" {
				t.Fatalf("a set with a held name: answer kind %d, %v", kind, &fl.lastError)
			}
		})
	}
}

// readAcquires reads n answers on l, all responses, and returns those that carry a
// token (acquire grants), by request id.
func readAcquires(l *lane, n int) map[uint64]*leaseholdv1.AcquireResponse {
	l.t.Helper()
	out := make(map[uint64]*leaseholdv1.AcquireResponse)
	for range n {
		f, err := l.r.Read()
		if err != nil || f.Kind != fastlane.KindResponse {
			l.t.Fatalf("answer: %+v, %v", f, err)
		}
		var resp leaseholdv1.AcquireResponse
		_ = proto.Unmarshal(f.Payload, &resp)
		if resp.Token != 0 {
			out[f.ID] = &resp
		}
	}
	return out
}
