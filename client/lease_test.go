package client

import (
	"errors"
	"testing"
	"time"
)

// TestAlignedRenewals: a renewal is never sooner than asked, late by less than one
// quantum, ends on a quantum boundary, and renewals due within one quantum are sent at
// the same moment.
func TestAlignedRenewals(t *testing.T) {
	for _, interval := range []time.Duration{10 * time.Millisecond, 333 * time.Millisecond, 3333 * time.Millisecond, time.Hour} {
		q := min(max(interval/32, time.Millisecond), 100*time.Millisecond)
		for _, now := range []time.Duration{0, 1, q - 1, 7*q + q/2, 1000 * time.Hour} {
			for _, d := range []time.Duration{0, 1, q / 3, interval - q/2, interval} {
				got := alignedAt(now, d, interval)
				if got < d || got >= d+q {
					t.Fatalf("interval %v now %v: alignedAt(%v) = %v, want in [%v, %v)", interval, now, d, got, d, d+q)
				}
				if (now+got)%q != 0 {
					t.Fatalf("interval %v now %v d %v: ends %v past a boundary of %v", interval, now, d, (now+got)%q, q)
				}
			}
			base := alignedAt(now, interval, interval)
			if other := alignedAt(now, base-q+1, interval); other != base {
				t.Fatalf("interval %v now %v: renewals due in one quantum end at %v and %v", interval, now, base, other)
			}
		}
	}
}

// TestLeaseGrantedPastItsDeadline: a lease whose grant was answered after its cautious
// deadline (the server paused, say) ends at once, and the timer that ends it does not
// race with setting it up (the race detector catches that).
func TestLeaseGrantedPastItsDeadline(t *testing.T) {
	c := &Client{}
	for range 50 {
		s := newLease(c, "late", time.Second, time.Now().Add(-time.Hour))
		deadline := time.Now().Add(5 * time.Second)
		for s.alive() {
			if time.Now().After(deadline) {
				t.Fatal("a lease past its deadline is still alive")
			}
			time.Sleep(time.Millisecond)
		}
		if !errors.Is(s.err, ErrLeaseDeadline) {
			t.Fatalf("ended with %v, want ErrLeaseDeadline", s.err)
		}
	}
}
