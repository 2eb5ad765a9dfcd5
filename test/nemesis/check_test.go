package nemesis

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/leasehold/leasehold/client"
)

// Violation is one broken guarantee, with the evidence.
type Violation struct {
	Check  string // which check
	At     int64  // when (ns since start), for the fault-timeline excerpt
	Detail string
}

// Report is the outcome of checking one run.
type Report struct {
	Violations     []Violation
	Linearizable   map[string]porcupine.CheckResult // per key
	KVOps, Grants  int
	Ambiguous      int
	CheckDuration  time.Duration
	Visualizations []string
}

// Check runs every check over h. dir receives porcupine visualizations of failing keys.
func Check(h *History, dir string, linTimeout time.Duration) *Report {
	t0 := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	r := &Report{Linearizable: map[string]porcupine.CheckResult{}, KVOps: len(h.ops), Grants: len(h.grants)}
	for _, op := range h.ops {
		if op.Output.(kvOutput).Ambiguous {
			r.Ambiguous++
		}
	}
	checkLinearizable(h, r, dir, linTimeout)
	checkGrants(h, r)
	checkFencedOrder(h, r)
	checkLeases(h, r)
	r.CheckDuration = time.Since(t0)
	return r
}

func (r *Report) add(check string, at int64, format string, args ...any) {
	r.Violations = append(r.Violations, Violation{Check: check, At: at, Detail: fmt.Sprintf(format, args...)})
}

// ---- linearizability of the KV store -------------------------------------------------

func checkLinearizable(h *History, r *Report, dir string, timeout time.Duration) {
	byKey := map[string][]porcupine.Operation{}
	for _, op := range h.ops {
		k := op.Input.(kvInput).Key
		byKey[k] = append(byKey[k], op)
	}
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		ops := byKey[k]
		res, info := porcupine.CheckOperationsVerbose(kvModel, ops, timeout)
		r.Linearizable[k] = res
		if res != porcupine.Illegal {
			continue
		}
		first := firstSuspect(ops)
		r.add("linearizability (G3, fenced KV)", first, "key %s: the history of %d operations is not linearizable; excerpt:\n%s",
			k, len(ops), excerpt(ops, 60))
		if dir != "" {
			p := filepath.Join(dir, "porcupine-"+strings.ReplaceAll(k, "/", "_")+".html")
			if err := porcupine.VisualizePath(kvModel, info, p); err == nil {
				r.Visualizations = append(r.Visualizations, p)
			}
		}
	}
}

// firstSuspect is a time to center a timeline excerpt on: the first definite answer
// that no state of a sequential replay with the recorded order can explain. Only a hint.
func firstSuspect(ops []porcupine.Operation) int64 {
	sorted := append([]porcupine.Operation(nil), ops...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Return < sorted[j].Return })
	states := []kvState{{VerKnown: true}}
	for _, op := range sorted {
		var next []kvState
		for _, s := range states {
			next = append(next, kvStep(s, op.Input.(kvInput), op.Output.(kvOutput))...)
		}
		if len(next) == 0 {
			return op.Call
		}
		if len(next) > 64 {
			next = next[:64]
		}
		states = next
	}
	return 0
}

// excerpt renders the operations in call order, at most n of them around the end of the
// first trouble spot (the whole history goes to the visualization).
func excerpt(ops []porcupine.Operation, n int) string {
	sorted := append([]porcupine.Operation(nil), ops...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Call < sorted[j].Call })
	at := firstSuspect(ops)
	idx := sort.Search(len(sorted), func(i int) bool { return sorted[i].Call >= at })
	lo, hi := max(0, idx-n*3/4), min(len(sorted), idx+n/4)
	var b strings.Builder
	if lo > 0 {
		fmt.Fprintf(&b, "  ... %d earlier operations\n", lo)
	}
	for _, op := range sorted[lo:hi] {
		fmt.Fprintf(&b, "  c%-2d [%9s, %9s] %s\n", op.ClientId, fmtT(op.Call), fmtT(op.Return), describeOp(op.Input.(kvInput), op.Output.(kvOutput)))
	}
	if hi < len(sorted) {
		fmt.Fprintf(&b, "  ... %d later operations\n", len(sorted)-hi)
	}
	return b.String()
}

// ---- locks: one holder, tokens, lost grants ----------------------------------------------

func checkGrants(h *History, r *Report) {
	byLock := map[string][]*Grant{}
	for _, g := range h.grants {
		byLock[g.Name] = append(byLock[g.Name], g)
	}
	names := make([]string, 0, len(byLock))
	for n := range byLock {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		gs := byLock[name]
		sort.Slice(gs, func(i, j int) bool { return gs[i].Ack < gs[j].Ack })
		var prev, holder *Grant // previous live grant; the one with the latest End so far
		for _, g := range gs {
			if g.DOA {
				continue
			}
			// G2/G4b: one holder at a time, as the holders see it. An earlier holder
			// stopped holding at its Unlock call or when its context was cancelled; a
			// later grant must not be acknowledged before that.
			if holder != nil && g.Ack < holder.End() {
				r.add("one holder (G2, G4b)", g.Ack, "lock %s acknowledged to w%d while w%d still held it (its context was not cancelled):\n  earlier %v\n  later   %v", name, g.Worker, holder.Worker, holder, g)
			}
			// G1 per lock: tokens strictly increase in acknowledgment order.
			if prev != nil && g.Token <= prev.Token {
				r.add("tokens increase per lock (G1)", g.Ack, "lock %s: token %d acknowledged after token %d:\n  earlier %v\n  later   %v", name, g.Token, prev.Token, prev, g)
			}
			prev = g
			if holder == nil || g.End() > holder.End() {
				holder = g
			}
		}
	}

	// No hold that nobody knows of: a lock still held at the end, after every lease
	// could have ended, under a token no worker holds.
	for _, u := range h.unknownHolds {
		r.add("no hold nobody knows of (G2)", 0, "at the end, %s, a token no worker holds: an acquire that gave up left its grant to a live lease", u)
	}

	// G1 across the cluster: a grant whose Lock call began after another grant was
	// acknowledged carries a larger token (one sequence per cluster). Chain is the call
	// time of the first attempt of a retried Lock, which may have been granted then.
	all := append([]*Grant(nil), h.grants...)
	byAck := append([]*Grant(nil), all...)
	sort.Slice(byAck, func(i, j int) bool { return byAck[i].Ack < byAck[j].Ack })
	byChain := append([]*Grant(nil), all...)
	sort.Slice(byChain, func(i, j int) bool { return byChain[i].Chain < byChain[j].Chain })
	var maxTok uint64
	var maxG *Grant
	i := 0
	for _, g := range byChain {
		for i < len(byAck) && byAck[i].Ack < g.Chain {
			if byAck[i].Token > maxTok {
				maxTok, maxG = byAck[i].Token, byAck[i]
			}
			i++
		}
		if maxG != nil && g.Token <= maxTok && (g.Name != maxG.Name || g.Token != maxG.Token) {
			r.add("tokens never go backwards (G1)", g.Ack, "token %d granted to a Lock call made after token %d was acknowledged:\n  earlier %v\n  later   %v", g.Token, maxTok, maxG, g)
		}
	}

	// Tokens are never reused: one (lock, token) pair per token, acknowledged once.
	seen := map[uint64]*Grant{}
	for _, g := range byAck {
		if o := seen[g.Token]; o != nil {
			r.add("tokens never reused (G1)", g.Ack, "token %d acknowledged twice:\n  %v\n  %v", g.Token, o, g)
		}
		seen[g.Token] = g
	}

	// No acknowledged grant lost.
	for _, g := range all {
		if g.DOA {
			continue
		}
		for _, s := range g.StaleWhileLive {
			r.add("fenced write of a live holder rejected (G4b, G5)", g.Ack, "%v: a fenced put was rejected as stale %s, while the holder's context was live", g, s)
		}
		if g.HeldAtEnd && g.LiveAtEnd {
			switch {
			case g.DescribeErr != nil:
				r.add("no acknowledged grant lost", g.Ack, "%v is held at the end but Describe failed: %v", g, g.DescribeErr)
			case !g.Describe.GetHeld() || g.Describe.GetToken() != g.Token:
				r.add("no acknowledged grant lost", g.Ack, "%v is held at the end (context live) but Describe shows held=%v token=%d", g, g.Describe.GetHeld(), g.Describe.GetToken())
			}
		}
		// Unlock said the grant was gone although the holder had not been told: a silent
		// loss — unless an earlier Release attempt of this Unlock may have been applied
		// (its answer was lost), which only the observer can tell apart. A refusal
		// because the lease was gone (404) is judged by checkLeases instead, which knows
		// when the lease's last keepalive was acknowledged.
		if g.UnlockCall > 0 && g.LiveAtUnlock && errors.Is(g.UnlockErr, client.ErrLockLost) {
			if _, cause := g.cancel(); cause != nil && !errors.Is(cause, client.ErrLockLost) {
				continue // the holder had been told (deadline, expiry) before Unlock gave up
			}
			if len(g.Releases) == 1 && g.Releases[0].Status == 400 {
				r.add("no acknowledged grant lost", g.UnlockCall, "%v: the first and only Release was refused (the service no longer had the grant, though the lease lived) while the holder's context was live", g)
			}
		}
	}
}

// ---- G5: fenced writes ordered by token -------------------------------------------------

// checkFencedOrder: a fenced Put that succeeded after (in real time) another succeeded
// on the same key carries a token at least as large.
func checkFencedOrder(h *History, r *Report) {
	byKey := map[string][]porcupine.Operation{}
	for _, op := range h.ops {
		in, out := op.Input.(kvInput), op.Output.(kvOutput)
		if in.Op == opPut && in.Token != 0 && !out.Ambiguous && !out.Stale && !out.Mismatch {
			byKey[in.Key] = append(byKey[in.Key], op)
		}
	}
	for key, ops := range byKey {
		byRet := append([]porcupine.Operation(nil), ops...)
		sort.Slice(byRet, func(i, j int) bool { return byRet[i].Return < byRet[j].Return })
		sort.Slice(ops, func(i, j int) bool { return ops[i].Call < ops[j].Call })
		var maxTok uint64
		var maxOp porcupine.Operation
		i := 0
		for _, op := range ops {
			for i < len(byRet) && byRet[i].Return < op.Call {
				if t := byRet[i].Input.(kvInput).Token; t > maxTok {
					maxTok, maxOp = t, byRet[i]
				}
				i++
			}
			if t := op.Input.(kvInput).Token; t < maxTok {
				r.add("fenced writes ordered by token (G5)", op.Call, "key %s accepted token %d after token %d had been accepted:\n  earlier %s [%s, %s]\n  later   %s [%s, %s]", key, t, maxTok,
					describeOp(maxOp.Input.(kvInput), maxOp.Output.(kvOutput)), fmtT(maxOp.Call), fmtT(maxOp.Return),
					describeOp(op.Input.(kvInput), op.Output.(kvOutput)), fmtT(op.Call), fmtT(op.Return))
			}
		}
	}
}

// ---- G4: no early expiry ----------------------------------------------------------------

// checkLeases: the service may say a lease is gone only TTL after the last keepalive it
// acknowledged. The observer knows when each acknowledged keepalive (or the Grant) was
// sent — before the server received it, so before its countdown restarted — and when a
// "lease not found" answer arrived. An answer earlier than last-ack-send + TTL proves
// the lease ended early.
func checkLeases(h *History, r *Report) {
	for _, g := range h.leaseGone {
		o := h.leases[g.lease]
		if o == nil || o.ttl == 0 {
			continue // not a lease we saw granted
		}
		if earliest := o.lastAck + int64(o.ttl); g.at < earliest {
			r.add("no early expiry (G4)", g.at, "lease %.8s (TTL %v): the client was told the lease was gone (%s answered NotFound) at %s, only %v after the last acknowledged keepalive was sent (%s, %d acks)",
				g.lease, o.ttl, g.rpc, fmtT(g.at), time.Duration(g.at-o.lastAck).Round(time.Millisecond), fmtT(o.lastAck), o.acks)
		}
	}
}

// ---- reporting --------------------------------------------------------------------------

// Summary renders the counts, the fault timeline and the violations.
func Summary(h *History, r *Report, seed uint64, faults map[string]int) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "nemesis summary (seed %d, %v of workload)\n", seed, time.Duration(h.now()).Round(time.Second))
	fmt.Fprintf(&b, "faults injected:\n")
	for _, k := range sortedKeys(faults) {
		fmt.Fprintf(&b, "  %-28s %d\n", k, faults[k])
	}
	fmt.Fprintf(&b, "operations by kind and outcome:\n")
	for _, k := range sortedKeys(h.counts) {
		fmt.Fprintf(&b, "  %-44s %d\n", k, h.counts[k])
	}
	causes := map[string]int{}
	for _, g := range h.grants {
		if _, cause := g.cancel(); cause != nil && !errors.Is(cause, client.ErrUnlocked) {
			causes[causeName(cause)]++
		}
	}
	if len(causes) > 0 {
		fmt.Fprintf(&b, "locks lost, by cause:\n")
		for _, k := range sortedKeys(causes) {
			fmt.Fprintf(&b, "  %-28s %d\n", k, causes[k])
		}
	}
	acks, leases := 0, 0
	for _, o := range h.leases {
		leases++
		acks += o.acks
	}
	fmt.Fprintf(&b, "history: %d KV operations (%d outcome unknown), %d grants; observed %d leases, %d acknowledged grants/keepalives, %d lease-gone answers\n",
		r.KVOps, r.Ambiguous, r.Grants, leases, acks, len(h.leaseGone))
	unknown := 0
	for _, res := range r.Linearizable {
		if res == porcupine.Unknown {
			unknown++
		}
	}
	fmt.Fprintf(&b, "linearizability: %d keys checked, %d inconclusive (timeout); checks took %v\n", len(r.Linearizable), unknown, r.CheckDuration.Round(time.Millisecond))
	if len(h.notes) > 0 {
		fmt.Fprintf(&b, "unexpected errors (first of each kind):\n")
		for _, n := range h.notes {
			fmt.Fprintf(&b, "  %s\n", n)
		}
	}
	fmt.Fprintf(&b, "violations found: %d\n", len(r.Violations))
	for _, v := range r.Violations {
		fmt.Fprintf(&b, "\n*** VIOLATION [%s] at %s\n%s\n", v.Check, fmtT(v.At), v.Detail)
		fmt.Fprintf(&b, "  faults around it:\n%s", timelineAround(h.events, v.At, 10*time.Second))
	}
	for _, p := range r.Visualizations {
		fmt.Fprintf(&b, "porcupine visualization: %s\n", p)
	}
	return b.String()
}

func causeName(err error) string {
	for _, c := range []struct {
		err  error
		name string
	}{
		{client.ErrLeaseExpired, "lease expired (server)"},
		{client.ErrLeaseDeadline, "local deadline (G4b)"},
		{client.ErrLeaseRevoked, "lease revoked"},
		{client.ErrReleasedByOperator, "released by operator"},
		{client.ErrStateLost, "state lost"},
		{client.ErrLockLost, "release failed"},
		{client.ErrUnlockUnconfirmed, "unlock unconfirmed"},
		{client.ErrDisconnected, "disconnected"},
	} {
		if errors.Is(err, c.err) {
			return c.name
		}
	}
	return "other: " + err.Error()
}

func timelineAround(events []event, at int64, window time.Duration) string {
	var b strings.Builder
	for _, e := range events {
		if e.at >= at-int64(window) && e.at <= at+int64(window) {
			fmt.Fprintf(&b, "    +%-9s %s\n", fmtT(e.at), e.what)
		}
	}
	if b.Len() == 0 {
		return "    (none within ±" + window.String() + ")\n"
	}
	return b.String()
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// keepDir makes a directory for the artifacts of a failed run.
func keepDir() string {
	d, err := os.MkdirTemp("", "leasehold-nemesis-report-")
	if err != nil {
		return ""
	}
	return d
}
