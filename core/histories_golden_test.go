package core

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
)

var updateHistories = flag.Bool("update-histories", false, "rewrite testdata/snapshot-v2-histories-past-bounds.bin and print the digest")

// historiesLimits are small bounds that the golden run below goes well past: per name,
// in total, and (the election history) in bytes.
var historiesLimits = Limits{LedgerPerLock: 3, LedgerTotal: 60, ElectionHistory: 4, ElectionHistoryTotal: 40, ElectionHistoryBytes: MaxValueLen}

// historiesDigest is the SHA-256 of every checkpoint snapshot of runHistories, as the
// code before the bounded log (core/boundedlog.go) wrote them.
const historiesDigest = "e523f9e06615e7a6f3c5bad38343edcb6075138e45edf3623902a4fc5f55f9b3"

// runHistories applies a fixed pseudo-random run of lock and election commands that
// fills the ledger and the election history past all their bounds (a few busy names,
// many quiet ones), and calls checkpoint with the state every 20 steps and at the end.
func runHistories(checkpoint func(step int, s *State)) {
	rng := rand.New(rand.NewPCG(42, 7))
	s := NewState(historiesLimits)
	leases := []LeaseID{leaseA, leaseB, leaseC, leaseD}
	pick := func(busy []string, quiet string, n int) string {
		if rng.IntN(10) < 7 {
			return busy[rng.IntN(len(busy))]
		}
		return fmt.Sprintf("%s/%d", quiet, rng.IntN(n))
	}
	holds := func(name string) []Hold {
		l := s.Locks().Get(name)
		if l == nil {
			return nil
		}
		if l.Hold != nil {
			return []Hold{*l.Hold}
		}
		return l.Holds
	}
	at := int64(1_000_000)
	const steps = 3000
	for step := range steps {
		at += 1 + int64(rng.IntN(5))
		l := leases[rng.IntN(len(leases))]
		lock := pick([]string{"busy/a", "busy/b", "busy/c"}, "quiet", 60)
		elect := pick([]string{"svc/a", "svc/b"}, "svc/q", 25)
		holder := Holder{Host: fmt.Sprintf("host-%d", rng.IntN(5)), PID: uint32(rng.IntN(100))}
		var c Command
		switch k := rng.IntN(20); {
		case s.Lease(l) == nil:
			c = Command{Op: OpGrant, Lease: l, TTLMillis: 10_000}
		case k < 5:
			c = Command{Op: OpAcquire, Lease: l, Name: lock, Class: Correctness, Holder: holder, Wait: rng.IntN(2) == 0}
			switch rng.IntN(4) {
			case 0:
				c.Mode = Shared
			case 1:
				c.Mode, c.Limit = Semaphore, 2
			}
		case k < 6:
			c = Command{Op: OpAcquire, Lease: l, Names: []string{lock + "/s1", lock + "/s2"}, Class: Correctness, Holder: holder}
		case k < 10:
			hs := holds(lock)
			if len(hs) == 0 {
				hs = holds(lock + "/s1")
				lock += "/s1"
			}
			if len(hs) == 0 {
				continue
			}
			h := hs[rng.IntN(len(hs))]
			c = Command{Op: OpRelease, Lease: h.Lease, Name: lock, Token: h.Token}
		case k < 11:
			c = Command{Op: OpForceRelease, Name: lock, Reason: fmt.Sprintf("by admin ops: step %d", step)}
		case k < 12:
			c = []Command{{Op: OpExpire, Lease: l}, {Op: OpRevoke, Lease: l}, {Op: OpDisconnect, Lease: l}}[rng.IntN(3)]
		case k < 14:
			n := rng.IntN(300)
			if rng.IntN(4) == 0 {
				n = rng.IntN(8000) // a few large values, for the byte bound
			}
			c = Command{Op: OpCampaign, Lease: l, Name: elect, Value: bytes.Repeat([]byte{'v'}, n), Holder: holder, Wait: rng.IntN(3) > 0}
		case k < 17:
			e := s.Elections().Get(elect)
			if e == nil || e.Leader == nil {
				continue
			}
			c = Command{Op: OpProclaim, Lease: e.Leader.Lease, Name: elect, Token: e.Leader.Epoch, Value: fmt.Appendf(nil, "%d", step)}
		case k < 19:
			e := s.Elections().Get(elect)
			if e == nil || e.Leader == nil {
				continue
			}
			c = Command{Op: OpResign, Lease: e.Leader.Lease, Name: elect, Token: e.Leader.Epoch}
		default:
			c = Command{Op: OpWithdraw, Lease: l, Name: elect}
		}
		c.WallMillis = at
		s.Apply(c) // errors are part of the run
		if step%20 == 19 || step == steps-1 {
			checkpoint(step, s)
		}
	}
}

// TestHistoriesPastBounds: a state whose ledger and election history went past every
// bound snapshots byte for byte as the code before the bounded log wrote it, at every
// checkpoint (historiesDigest) and at the end (the fixture); every checkpoint
// restores to the same bytes, and the fixture decodes and answers as the live state.
func TestHistoriesPastBounds(t *testing.T) {
	sum := sha256.New()
	var last []byte
	var final *State
	runHistories(func(step int, s *State) {
		b := mustSnapshot(t, s)
		sum.Write(b)
		r, err := RestoreState(b, historiesLimits)
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		if b2 := mustSnapshot(t, r); !bytes.Equal(b, b2) {
			t.Fatalf("step %d: snapshot → restore → snapshot changed the bytes", step)
		}
		last, final = b, s
	})
	digest := hex.EncodeToString(sum.Sum(nil))
	const fixture = "testdata/snapshot-v2-histories-past-bounds.bin"
	if *updateHistories {
		if err := os.WriteFile(fixture, last, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("digest %s", digest)
		return
	}
	if digest != historiesDigest {
		t.Errorf("checkpoint snapshots digest %s, want %s", digest, historiesDigest)
	}
	want, err := os.ReadFile(fixture)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(last, want) {
		t.Fatalf("final snapshot differs from %s", fixture)
	}
	r, err := RestoreState(want, historiesLimits)
	if err != nil {
		t.Fatal(err)
	}
	names, ended := map[string]bool{}, 0
	for _, tn := range final.ledger.records(final.locks) {
		names[tn.Name] = true
		if tn.End != 0 {
			ended++
		}
	}
	if ended != historiesLimits.LedgerTotal {
		t.Fatalf("the run left %d ended tenures, want the total bound %d", ended, historiesLimits.LedgerTotal)
	}
	if _, err := final.ElectionChanges("svc/q/0", 0, nil); !errors.Is(err, ErrHistoryCompacted) {
		t.Fatalf("the run dropped no election change by the totals: %v", err)
	}
	if len(names) < 20 {
		t.Fatalf("the run left only %d names in the ledger", len(names))
	}
	for n := range names {
		if w, g := fmt.Sprint(final.History(n)), fmt.Sprint(r.History(n)); w != g {
			t.Fatalf("history of %s: restored %s, live %s", n, g, w)
		}
	}
	for _, n := range []string{"svc/a", "svc/b", "svc/q/0", "svc/q/1", "svc/q/2"} {
		for after := uint64(0); after <= final.ElectionRev()+1; after += 7 {
			w, werr := final.ElectionChanges(n, after, nil)
			g, gerr := r.ElectionChanges(n, after, nil)
			if fmt.Sprint(werr) != fmt.Sprint(gerr) || fmt.Sprint(w) != fmt.Sprint(g) {
				t.Fatalf("%s after %d: restored %v %v, live %v %v", n, after, g, gerr, w, werr)
			}
		}
	}
}
