package core

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
)

// propertySeeds × propertySteps random commands, over propertyLeases lease slots (each
// re-granted with a new id after it ends) and the four names of genNames.
const (
	propertySeeds  = 200
	propertySteps  = 500
	propertyLeases = 6
)

// smallLimits make the limit paths reachable: 5 leases for 6 slots, 3 locks per lease
// for 4 names, 2 waiters per lock.
var smallLimits = Limits{MaxLeases: 5, MaxLocksPerLease: 3, MaxWaitersPerLock: 2}

// TestPropertyState runs random command sequences against State.Apply and, after every
// command, compares with the reference model and checks the invariants: one holder per
// lock, holders and waiters are live leases, nobody waits twice, tokens strictly
// increase and LastToken never falls, grants go FIFO, failing commands (including
// releases by non-owners) leave the snapshot bytes unchanged, a restored snapshot
// re-encodes to the same bytes and then behaves exactly like the original, and a twin
// fed the same commands stays byte-identical.
func TestPropertyState(t *testing.T) {
	seeds := propertySeeds
	if testing.Short() || raceEnabled {
		seeds = 20
	}
	for seed := range uint64(seeds) {
		limits := Limits{}
		if seed%2 == 1 {
			limits = smallLimits
		}
		o := seqOptions{steps: propertySteps, leases: propertyLeases, limits: limits, forkOdds: 200, twin: seed%4 == 0}
		if err := runStateSequence(newRandChooser(seed), o); err != nil {
			t.Fatalf("seed %d (limits %+v): %v", seed, limits, err)
		}
	}
}

// TestPropertyLocksTable runs the bare Locks table the way the leader runs its
// efficiency table (a counter Sequence, the caller tracking lease liveness) and checks
// the same model, one-holder and FIFO properties.
func TestPropertyLocksTable(t *testing.T) {
	seeds := propertySeeds
	if testing.Short() || raceEnabled {
		seeds = 20
	}
	for seed := range uint64(seeds) {
		limits := Limits{}
		if seed%2 == 1 {
			limits = smallLimits
		}
		if err := runTableSequence(newRandChooser(1000+seed), propertySteps, propertyLeases, limits); err != nil {
			t.Fatalf("seed %d (limits %+v): %v", seed, limits, err)
		}
	}
}

// TestPropertyCoverage makes sure the generator reaches every interesting outcome, so
// that the property tests are not passing by never trying the hard cases.
func TestPropertyCoverage(t *testing.T) {
	seen := map[string]int{}
	for seed := range uint64(40) {
		limits := Limits{}
		if seed%2 == 1 {
			limits = smallLimits
		}
		ch := newRandChooser(seed)
		m := newModel(true, limits)
		g := newGenerator(ch, m, propertyLeases)
		s := NewState(limits)
		for range propertySteps {
			c := g.next()
			m.apply(c)
			r := s.Apply(c)
			key := c.Op.String()
			switch {
			case r.Err != nil:
				for _, e := range []error{ErrInvalid, ErrLeaseExists, ErrLeaseNotFound, ErrTooManyLeases, ErrTooManyLocks,
					ErrTooManyWaiters, ErrNotHolder, ErrNotWaiting, ErrLockHeld, ErrClassConflict, ErrStaleToken, ErrVersionMismatch} {
					if errors.Is(r.Err, e) {
						key += " " + e.Error()
						break
					}
				}
			case r.Queued:
				key += " queued"
			case c.Op == OpCancelWait && r.Token != 0:
				key += " already granted"
			case c.Op == OpForceRelease && r.Released != 0:
				key += " of a held lock"
			}
			seen[key]++
			for _, e := range r.Effects {
				seen[fmt.Sprintf("effect %d on %v", e.Kind, c.Op)]++
			}
		}
	}
	for _, want := range []string{
		"grant", "grant core: lease already exists", "grant core: too many leases", "grant core: invalid command",
		"revoke", "revoke core: lease not found", "expire", "expire core: lease not found",
		"acquire", "acquire queued", "acquire core: lock is held", "acquire core: invalid command",
		"acquire core: lease not found", "acquire core: too many locks for one lease", "acquire core: too many waiters for the lock",
		"release", "release core: lease does not hold the lock", "release core: lease not found",
		"cancel-wait", "cancel-wait already granted", "cancel-wait core: lease is not waiting for the lock",
		"force-release", "force-release of a held lock", "end-delay", "reserve", "reserve core: invalid command",
		"put", "put core: stale fencing token", "delete", "set-member", "remove-member",
		fmt.Sprintf("effect %d on expire", EffectGranted), fmt.Sprintf("effect %d on revoke", EffectGranted),
		fmt.Sprintf("effect %d on release", EffectGranted), fmt.Sprintf("effect %d on force-release", EffectGranted),
		fmt.Sprintf("effect %d on end-delay", EffectGranted), fmt.Sprintf("effect %d on expire", EffectDelayed),
		fmt.Sprintf("effect %d on force-release", EffectRevokedHold), fmt.Sprintf("effect %d on expire", EffectWaitEnded),
		fmt.Sprintf("effect %d on revoke", EffectWaitEnded), fmt.Sprintf("effect %d on grant", EffectLeaseGranted),
	} {
		if seen[want] == 0 {
			t.Errorf("the generator never produced %q", want)
		}
	}
	if t.Failed() {
		t.Logf("seen: %v", seen)
	}
}

// TestPropertyNonOwnerRelease targets the release check directly: for random states, every
// release by a lease or token that does not hold the lock is rejected with ErrNotHolder
// and leaves the snapshot bytes unchanged, and the holder's own release then succeeds.
func TestPropertyNonOwnerRelease(t *testing.T) {
	for seed := range uint64(50) {
		ch := newRandChooser(5000 + seed)
		m := newModel(true, Limits{})
		g := newGenerator(ch, m, propertyLeases)
		s := NewState(Limits{})
		for step := range 200 {
			c := g.next()
			m.apply(c)
			s.Apply(c)
			if step%10 != 9 {
				continue
			}
			for _, name := range s.locks.sortedNames() {
				l := s.Locks().Get(name)
				if l.Hold == nil {
					continue
				}
				h := *l.Hold
				var wrong []Command
				for _, sl := range g.slots {
					if sl.id != h.Lease && s.Lease(sl.id) != nil {
						wrong = append(wrong, Command{Op: OpRelease, Lease: sl.id, Name: name, Token: h.Token})
					}
				}
				for _, tok := range []uint64{0, h.Token - 1, h.Token + 1, s.LastToken() + 1} {
					if tok != h.Token {
						wrong = append(wrong, Command{Op: OpRelease, Lease: h.Lease, Name: name, Token: tok})
					}
				}
				for _, c := range wrong {
					before := mustSnapshot(t, s)
					if r := s.Apply(c); !errors.Is(r.Err, ErrNotHolder) {
						t.Fatalf("seed %d: %+v on a lock held by %s/%d: %v, want ErrNotHolder", seed, c, h.Lease, h.Token, r.Err)
					}
					if after := mustSnapshot(t, s); !bytes.Equal(before, after) {
						t.Fatalf("seed %d: rejected release %+v changed the state", seed, c)
					}
				}
			}
		}
	}
}

func mustSnapshot(t testing.TB, s *State) []byte {
	t.Helper()
	b, err := s.MarshalSnapshot()
	if err != nil {
		t.Fatal(err)
	}
	return b
}
