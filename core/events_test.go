package core

import (
	"fmt"
	"maps"
	"testing"
)

// TestEventsReplayTheTable: the events a State records are the changes it makes (G10's
// "atomic with the change"). Replaying them — a hold begins at acquired, ends at
// released, expired, revoked or force-released — gives, after every command, exactly
// the holds the table has, with their tokens and holders; a command that fails records
// nothing; a queued event names the place the waiter took.
func TestEventsReplayTheTable(t *testing.T) {
	for seed := range uint64(30) {
		s := NewState(Limits{})
		var evs []Event
		s.Record(func(e Event) { evs = append(evs, e) })
		g := &modeGen{ch: newRandChooser(seed), s: s}
		for range 5 {
			g.nextID++
			g.slots = append(g.slots, lid(g.nextID))
		}
		replayed := map[string]map[uint64]Holder{}
		for step := range 400 {
			c := g.next()
			evs = evs[:0]
			r := s.Apply(c)
			fail := func(format string, args ...any) {
				t.Fatalf("seed %d step %d: %+v: %s\nevents %+v", seed, step, c, fmt.Sprintf(format, args...), evs)
			}
			if r.Err != nil && len(evs) > 0 {
				fail("failed (%v) but recorded events", r.Err)
			}
			for _, e := range evs {
				holds := replayed[e.Name]
				switch e.Kind {
				case EventAcquired:
					if _, ok := holds[e.Token]; ok {
						fail("acquired twice under token %d", e.Token)
					}
					if holds == nil {
						holds = map[uint64]Holder{}
						replayed[e.Name] = holds
					}
					holds[e.Token] = e.Holder
				case EventReleased, EventExpired, EventRevoked, EventForceReleased:
					if _, ok := holds[e.Token]; !ok {
						fail("%v of %s token %d, which it did not hold", e.Kind, e.Name, e.Token)
					}
					if (e.Kind == EventForceReleased) != (c.Op == OpForceRelease) ||
						(e.Kind == EventExpired) != (c.Op == OpExpire) || (e.Kind == EventRevoked) != (c.Op == OpRevoke) {
						fail("%v from an op %d", e.Kind, c.Op)
					}
					delete(holds, e.Token)
				case EventQueued:
					l := s.locks.Get(e.Name)
					if l == nil || e.Position < 1 || e.Position > len(l.Waiters) {
						fail("queued at place %d of %s", e.Position, e.Name)
					}
				}
			}
			for _, name := range s.locks.sortedNames() {
				l := s.locks.Get(name)
				want := map[uint64]Holder{}
				if l.Hold != nil {
					want[l.Hold.Token] = l.Hold.Holder
				}
				for _, h := range l.Holds {
					want[h.Token] = h.Holder
				}
				if got := replayed[name]; !maps.Equal(got, want) && (len(got) > 0 || len(want) > 0) {
					fail("%s: the events give holds %v, the table has %v", name, got, want)
				}
			}
			for name, holds := range replayed {
				if len(holds) > 0 && s.locks.Get(name) == nil {
					fail("%s: the events give holds %v, the table has none", name, holds)
				}
			}
		}
	}
}
