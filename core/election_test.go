package core

import (
	"bytes"
	"testing"
)

// TestElection: the first campaign leads with an epoch from the token sequence; later
// campaigns queue, FIFO, and are idempotent; Proclaim changes the leader's value only
// under its epoch; Resign and the leader's lease ending each seat the next candidate
// with a higher epoch; Withdraw leaves the queue; a snapshot restores all of it, byte
// for byte.
func TestElection(t *testing.T) {
	h := newHarness(t, Limits{}, leaseA, leaseB, leaseC)
	camp := func(l LeaseID, v string) Command {
		return Command{Op: OpCampaign, Lease: l, Name: "svc", Value: []byte(v), Wait: true}
	}
	r := h.ok(camp(leaseA, "a"))
	e1 := r.Token
	if r.Queued || e1 != h.s.LastToken() {
		t.Fatalf("first campaign = %+v, want to lead with the last token", r)
	}
	wantEffects(t, r.Effects, Effect{Kind: EffectElected, Lease: leaseA, Name: "svc", Token: e1, Value: []byte("a")})
	if r := h.ok(camp(leaseA, "a")); r.Token != e1 || len(r.Effects) != 0 {
		t.Fatalf("repeated campaign of the leader = %+v", r)
	}
	if r := h.ok(camp(leaseB, "b")); !r.Queued || r.HolderToken != e1 {
		t.Fatalf("second campaign = %+v, want queued behind epoch %d", r, e1)
	}
	h.ok(camp(leaseB, "b")) // idempotent
	h.ok(camp(leaseC, "c"))
	if got := h.s.Elections().Get("svc"); len(got.Candidates) != 2 || got.Candidates[0].Lease != leaseB {
		t.Fatalf("candidates %+v, want B then C", got.Candidates)
	}
	h.ok(Command{Op: OpCampaign, Lease: leaseB, Name: "other"}) // try-once: a free election is led at once
	h.fails(Command{Op: OpCampaign, Lease: leaseA, Name: "other"}, ErrLockHeld)

	h.fails(Command{Op: OpProclaim, Lease: leaseB, Name: "svc", Token: e1, Value: []byte("x")}, ErrNotHolder)
	h.fails(Command{Op: OpProclaim, Lease: leaseA, Name: "svc", Token: e1 + 100, Value: []byte("x")}, ErrNotHolder)
	h.ok(Command{Op: OpProclaim, Lease: leaseA, Name: "svc", Token: e1, Value: []byte("a2")})
	if v := h.s.Elections().Get("svc").Leader.Value; string(v) != "a2" {
		t.Fatalf("value after Proclaim %q", v)
	}

	b := mustSnapshot(t, h.s)
	restored, err := RestoreState(b, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if b2 := mustSnapshot(t, restored); !bytes.Equal(b, b2) {
		t.Fatalf("snapshot after restore differs:\n%s\n%s", b, b2)
	}

	r = h.ok(Command{Op: OpResign, Lease: leaseA, Name: "svc", Token: e1})
	e2 := h.s.LastToken()
	wantEffects(t, r.Effects, Effect{Kind: EffectElected, Lease: leaseB, Name: "svc", Token: e2, Value: []byte("b")})
	if got := h.s.Elections().Get("svc").Leader; got.Lease != leaseB || got.Epoch != e2 || e2 <= e1 || string(got.Value) != "b" {
		t.Fatalf("leader after Resign %+v", got)
	}
	h.fails(Command{Op: OpResign, Lease: leaseA, Name: "svc", Token: e1}, ErrNotHolder)

	r = h.ok(Command{Op: OpExpire, Lease: leaseB})
	e3 := h.s.LastToken()
	if got := h.s.Elections().Get("svc").Leader; got.Lease != leaseC || got.Epoch != e3 || e3 <= e2 {
		t.Fatalf("leader after the leader's lease expired %+v", got)
	}
	if r := h.ok(Command{Op: OpWithdraw, Lease: leaseC, Name: "svc"}); r.Token != e3 {
		t.Fatalf("withdraw of the leader = %+v, want its epoch", r)
	}
	h.fails(Command{Op: OpWithdraw, Lease: leaseA, Name: "svc"}, ErrNotWaiting)
	r = h.ok(Command{Op: OpResign, Lease: leaseC, Name: "svc", Token: e3})
	wantEffects(t, r.Effects, Effect{Kind: EffectLeaderless, Name: "svc", Token: e3})
	if got := h.s.Elections().Get("svc"); got != nil {
		t.Fatalf("election after the last leader resigned: %+v", got)
	}
	h.fails(Command{Op: OpCampaign, Lease: nobody, Name: "svc"}, ErrLeaseNotFound)
	h.fails(Command{Op: OpCampaign, Lease: leaseA, Name: "/bad"}, ErrInvalid)
	h.fails(Command{Op: OpResign, Lease: leaseA, Name: "svc"}, ErrInvalid)
}
