package nemesis

import (
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/leasehold/leasehold/client"
)

// TestInvariantChecks runs the lock, fence and lease checks on small made-up histories,
// so that what the nemesis reports is the service's fault and not the checker's.
func TestInvariantChecks(t *testing.T) {
	ms := func(n int64) int64 { return n * int64(time.Millisecond) }
	grant := func(w int, name string, tok uint64, ack, unlock int64) *Grant {
		return &Grant{Worker: w, Name: name, Token: tok, Chain: ack - ms(5), Call: ack - ms(5), Ack: ack, UnlockCall: unlock, UnlockDone: unlock + ms(1), LiveAtUnlock: true}
	}
	lost := func(g *Grant, at int64) *Grant { g.setCancel(at, client.ErrLeaseDeadline); return g }
	fput := func(key string, tok uint64, call, ret int64, out kvOutput) porcupine.Operation {
		return porcupine.Operation{Input: kvInput{Op: opPut, Key: key, Lock: "l", Token: tok, Value: "v"}, Call: call, Output: out, Return: ret}
	}
	cases := []struct {
		name string
		h    *History
		want []string // substrings of the violated checks, in any order; none means clean
	}{
		{"sequential holders", &History{grants: []*Grant{grant(0, "a", 1, ms(10), ms(20)), grant(1, "a", 2, ms(21), ms(30))}}, nil},
		{"overlapping holders", &History{grants: []*Grant{grant(0, "a", 1, ms(10), ms(20)), grant(1, "a", 2, ms(15), ms(30))}}, []string{"one holder"}},
		{"holder lost its lock first", &History{grants: []*Grant{lost(grant(0, "a", 1, ms(10), ms(40)), ms(12)), grant(1, "a", 2, ms(15), ms(30))}}, nil},
		{"token not increasing", &History{grants: []*Grant{grant(0, "a", 5, ms(10), ms(20)), grant(1, "a", 4, ms(21), ms(30))}}, []string{"tokens increase per lock", "tokens never go backwards"}},
		{"other lock, lower token, concurrent call", &History{grants: []*Grant{grant(0, "a", 5, ms(10), ms(20)), {Name: "b", Token: 4, Chain: ms(9), Call: ms(9), Ack: ms(12), UnlockCall: ms(20)}}}, nil},
		{"other lock, lower token, later call", &History{grants: []*Grant{grant(0, "a", 5, ms(10), ms(20)), {Name: "b", Token: 4, Chain: ms(11), Call: ms(11), Ack: ms(12), UnlockCall: ms(20)}}}, []string{"tokens never go backwards"}},
		{"token reused", &History{grants: []*Grant{grant(0, "a", 5, ms(10), ms(20)), grant(1, "b", 5, ms(30), ms(40))}}, []string{"tokens never reused", "tokens never go backwards"}},
		{"fenced writes in order", &History{ops: []porcupine.Operation{fput("k", 3, ms(0), ms(5), kvOutput{Version: 1}), fput("k", 4, ms(6), ms(9), kvOutput{Version: 2})}}, nil},
		{"fenced write out of order", &History{ops: []porcupine.Operation{fput("k", 4, ms(0), ms(5), kvOutput{Version: 1}), fput("k", 3, ms(6), ms(9), kvOutput{Version: 2})}}, []string{"fenced writes ordered"}},
		{"fenced writes concurrent", &History{ops: []porcupine.Operation{fput("k", 4, ms(0), ms(5), kvOutput{Version: 1}), fput("k", 3, ms(4), ms(9), kvOutput{Version: 2})}}, nil},
		{"lease gone after TTL", &History{leases: map[string]*leaseObs{"x": {ttl: time.Second, lastAck: ms(100)}}, leaseGone: []leaseGoneObs{{lease: "x", at: ms(1101)}}}, nil},
		{"hold nobody knows of", &History{unknownHolds: []string{"nemesis/lock/1 held under token 7"}}, []string{"no hold nobody knows of"}},
		{"lease gone early", &History{leases: map[string]*leaseObs{"x": {ttl: time.Second, lastAck: ms(100)}}, leaseGone: []leaseGoneObs{{lease: "x", at: ms(900)}}}, []string{"no early expiry"}},
	}
	for _, c := range cases {
		if c.h.leases == nil {
			c.h.leases = map[string]*leaseObs{}
		}
		r := &Report{}
		checkGrants(c.h, r)
		checkFencedOrder(c.h, r)
		checkLeases(c.h, r)
		var got []string
		for _, v := range r.Violations {
			got = append(got, v.Check)
		}
		if len(got) != len(c.want) {
			t.Errorf("%s: violations %q, want %q", c.name, got, c.want)
			continue
		}
		for _, w := range c.want {
			found := false
			for _, g := range got {
				found = found || strings.Contains(g, w)
			}
			if !found {
				t.Errorf("%s: violations %q, want one matching %q", c.name, got, w)
			}
		}
	}
}
