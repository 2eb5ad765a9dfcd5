package core

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func begin(lease LeaseID, key string) Command {
	return Command{Op: OpBegin, Key: key, Lease: lease, Holder: Holder{Host: "h", PID: 7}}
}

func complete(key string, token uint64, result string) Command {
	return Command{Op: OpComplete, Key: key, Token: token, Value: []byte(result)}
}

func wantKey(t *testing.T, r Result, status KeyStatus, token uint64, result string) {
	t.Helper()
	if r.Key == nil || r.Key.Status != status || r.Key.Token != token || string(r.Key.Result) != result {
		t.Fatalf("key: got %+v, want %v token %d result %q", r.Key, status, token, result)
	}
}

// TestKeyBeginComplete walks one key through its life: new, in progress for others,
// done with its result for everybody, a retried Begin and a retried Complete answered
// as before, and stale completions rejected without a change.
func TestKeyBeginComplete(t *testing.T) {
	h := newHarness(t, Limits{}, leaseA, leaseB)
	r := h.ok(begin(leaseA, "job/1"))
	tok := r.Token
	wantKey(t, r, KeyNew, tok, "")
	if tok != h.s.LastToken() {
		t.Fatalf("Begin's token %d is not the sequence's last %d", tok, h.s.LastToken())
	}
	wantKey(t, h.ok(begin(leaseA, "job/1")), KeyNew, tok, "") // retried: same token
	r = h.ok(begin(leaseB, "job/1"))
	wantKey(t, r, KeyInProgress, tok, "")
	if r.Key.Holder != (Holder{Host: "h", PID: 7}) {
		t.Fatalf("in progress by %+v", r.Key.Holder)
	}

	h.fails(complete("job/1", tok+1, "x"), ErrStaleToken)
	h.fails(complete("job/2", tok, "x"), ErrStaleToken)
	r = h.ok(complete("job/1", tok, "answer"))
	wantKey(t, r, KeyDone, tok, "answer")
	wantEffects(t, r.Effects, Effect{Kind: EffectKeyDone, Name: "job/1", Token: tok})

	wantKey(t, h.ok(complete("job/1", tok, "other")), KeyDone, tok, "answer") // retried: first result stays
	h.fails(complete("job/1", tok+1, "late"), ErrStaleToken)
	for _, l := range []LeaseID{leaseA, leaseB} {
		wantKey(t, h.ok(begin(l, "job/1")), KeyDone, tok, "answer")
	}
	if v := h.s.Key("job/1"); v.Status != KeyDone || string(v.Result) != "answer" {
		t.Fatalf("Key: %+v", v)
	}
	if v := h.s.Key("job/9"); v.Status != KeyAbsent || v.Token != 0 {
		t.Fatalf("Key of an unknown key: %+v", v)
	}
	h.fails(begin(nobody, "job/3"), ErrLeaseNotFound)
}

// TestKeyFreedWhenLeaseEnds: a holder that dies leaves its key free; the next Begin gets
// a larger token, and the dead holder's late Complete (and Abandon) change nothing.
func TestKeyFreedWhenLeaseEnds(t *testing.T) {
	for _, op := range []Op{OpExpire, OpRevoke} {
		t.Run(op.String(), func(t *testing.T) {
			h := newHarness(t, Limits{}, leaseA, leaseB)
			old := h.ok(begin(leaseA, "job")).Token
			h.ok(begin(leaseA, "job2"))
			h.ok(Command{Op: op, Lease: leaseA})
			if in, _ := h.s.NumKeys(); in != 0 {
				t.Fatalf("%d keys in progress after the lease ended", in)
			}
			h.fails(complete("job", old, "late"), ErrStaleToken)
			r := h.ok(begin(leaseB, "job"))
			wantKey(t, r, KeyNew, r.Token, "")
			if r.Token <= old {
				t.Fatalf("new token %d not above the dead holder's %d", r.Token, old)
			}
			h.fails(complete("job", old, "late"), ErrStaleToken)
			h.unchanged(Command{Op: OpAbandon, Key: "job", Token: old})
			h.ok(complete("job", r.Token, "done"))
		})
	}
}

// TestKeyAbandon: a key given back is free for the next Begin; Abandon with another
// token, or of a done key, changes nothing.
func TestKeyAbandon(t *testing.T) {
	h := newHarness(t, Limits{}, leaseA, leaseB)
	tok := h.ok(begin(leaseA, "job")).Token
	h.unchanged(Command{Op: OpAbandon, Key: "job", Token: tok + 5})
	h.ok(Command{Op: OpAbandon, Key: "job", Token: tok})
	if v := h.s.Key("job"); v.Status != KeyAbsent {
		t.Fatalf("after Abandon: %+v", v)
	}
	h.fails(complete("job", tok, "x"), ErrStaleToken)
	tok2 := h.ok(begin(leaseB, "job")).Token
	h.ok(complete("job", tok2, "x"))
	h.unchanged(Command{Op: OpAbandon, Key: "job", Token: tok2})
	wantKey(t, h.ok(begin(leaseA, "job")), KeyDone, tok2, "x")
}

func TestKeyValidation(t *testing.T) {
	h := newHarness(t, Limits{}, leaseA)
	for name, c := range map[string]Command{
		"key":       begin(leaseA, "bad key"),
		"lease_id":  {Op: OpBegin, Key: "k"},
		"holder":    {Op: OpBegin, Key: "k", Lease: leaseA, Holder: Holder{Note: strings.Repeat("n", MaxNoteLen+1)}},
		"token":     complete("k", 0, "x"),
		"result":    {Op: OpComplete, Key: "k", Token: 1, Value: make([]byte, MaxResultLen+1)},
		"abandon":   {Op: OpAbandon, Key: "k"},
		"empty key": complete("", 1, "x"),
	} {
		r := h.fails(c, ErrInvalid)
		var fe *FieldError
		if !errors.As(r.Err, &fe) {
			t.Errorf("%s: %v is not a FieldError", name, r.Err)
		}
	}
}

// TestKeyLimits: Begin beyond IdempotencyKeys keys in progress is refused; retention
// keeps the newest IdempotencyKeys done keys, and the newest whose results fit in
// IdempotencyBytes.
func TestKeyLimits(t *testing.T) {
	h := newHarness(t, Limits{IdempotencyKeys: 2, IdempotencyBytes: MaxResultLen + 4}, leaseA)
	t1 := h.ok(begin(leaseA, "k1")).Token
	t2 := h.ok(begin(leaseA, "k2")).Token
	h.fails(begin(leaseA, "k3"), ErrTooManyKeys)
	h.ok(complete("k1", t1, "one"))
	h.ok(complete("k2", t2, "two"))
	t3 := h.ok(begin(leaseA, "k3")).Token
	h.ok(complete("k3", t3, "three")) // k1 is the oldest of three done keys: gone
	if got := doneKeys(h.s); !slices.Equal(got, []string{"k2", "k3"}) {
		t.Fatalf("done keys %v", got)
	}
	wantKey(t, h.ok(begin(leaseA, "k2")), KeyDone, t2, "two")
	r := h.ok(begin(leaseA, "k1")) // its retention ended: it may run again
	wantKey(t, r, KeyNew, r.Token, "")

	big := strings.Repeat("b", MaxResultLen)
	t4 := h.ok(begin(leaseA, "k4")).Token
	h.ok(complete("k4", t4, big)) // k2 goes by count, k3 by size: 32 KiB + 5 bytes > the byte limit
	if got := doneKeys(h.s); !slices.Equal(got, []string{"k4"}) {
		t.Fatalf("done keys %v after a big result", got)
	}
	if in, done := h.s.NumKeys(); in != 1 || done != 1 {
		t.Fatalf("NumKeys = %d, %d", in, done)
	}
	if got := NewState(Limits{IdempotencyBytes: 1}).limits.IdempotencyBytes; got != MaxResultLen {
		t.Fatalf("IdempotencyBytes below MaxResultLen became %d", got)
	}
}

func doneKeys(s *State) []string { return slices.Clone(s.keys.done[s.keys.head:]) }

// TestKeyEvictionCompacts: the done queue's consumed front is reclaimed, so a long run
// of completions keeps it bounded.
func TestKeyEvictionCompacts(t *testing.T) {
	h := newHarness(t, Limits{IdempotencyKeys: 10}, leaseA)
	for i := range 5000 {
		key := fmt.Sprintf("k%d", i)
		h.s.Apply(complete(key, h.s.Apply(begin(leaseA, key)).Token, "r"))
	}
	if n := len(h.s.keys.done); n > 2100 {
		t.Fatalf("done queue holds %d entries for 10 kept keys", n)
	}
	if got := doneKeys(h.s); len(got) != 10 || got[9] != "k4999" {
		t.Fatalf("done keys %v", got)
	}
}

func TestKeyCommandsRoundTrip(t *testing.T) {
	for _, c := range []Command{
		begin(leaseA, "job/1"),
		complete("job/1", 42, "result"),
		{Op: OpComplete, Key: "job/1", Token: 42},
		{Op: OpAbandon, Key: "job/1", Token: 42},
	} {
		b, err := EncodeCommand(c)
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodeCommand(b)
		if err != nil || !commandsEqual(got, c) {
			t.Fatalf("%v: round trip gave %+v, %v", c.Op, got, err)
		}
	}
	// The biggest Complete fits in a log entry.
	if _, err := EncodeCommand(Command{Op: OpComplete, Key: strings.Repeat("k", MaxNameLen), Token: 1 << 63, Value: make([]byte, MaxResultLen)}); err != nil {
		t.Fatal(err)
	}
	if OpBegin.String() != "begin" || OpComplete.String() != "complete" || OpAbandon.String() != "abandon" || KeyInProgress.String() != "in progress" {
		t.Fatal("names of the key ops")
	}
}

func commandsEqual(a, b Command) bool {
	return a.Op == b.Op && a.Key == b.Key && a.Lease == b.Lease && a.Token == b.Token && a.Holder == b.Holder && bytes.Equal(a.Value, b.Value)
}

// TestKeySnapshot: keys survive a snapshot in their order (the done keys' order is the
// retention's), a restored state goes on exactly as the original, and a snapshot written
// before idempotency keys existed still restores.
func TestKeySnapshot(t *testing.T) {
	h := newHarness(t, Limits{IdempotencyKeys: 3}, leaseA, leaseB)
	for _, k := range []string{"z", "y", "x", "w"} {
		h.ok(complete(k, h.ok(begin(leaseA, k)).Token, "r-"+k))
	}
	h.ok(begin(leaseB, "in/2"))
	h.ok(begin(leaseA, "in/1"))
	b := mustSnapshot(t, h.s)
	if !bytes.Contains(b, []byte(`"idempotency":[{"key":"in/1"`)) {
		t.Fatalf("snapshot: %s", b)
	}
	if got, want := b, oneShotSnapshot(t, h.s); !bytes.Equal(got, want) {
		t.Fatalf("streamed snapshot\n%s\ndiffers from one-shot\n%s", got, want)
	}
	s2, err := RestoreState(b, Limits{IdempotencyKeys: 3})
	if err != nil {
		t.Fatal(err)
	}
	if b2 := mustSnapshot(t, s2); !bytes.Equal(b, b2) {
		t.Fatalf("restored state encodes differently:\n%s\n%s", b, b2)
	}
	for _, s := range []*State{h.s, s2} { // both evict "y", the oldest, next
		s.Apply(complete("v", s.Apply(begin(leaseA, "v")).Token, ""))
		s.Apply(Command{Op: OpExpire, Lease: leaseB})
	}
	if !bytes.Equal(mustSnapshot(t, h.s), mustSnapshot(t, s2)) || !slices.Equal(doneKeys(s2), []string{"x", "w", "v"}) {
		t.Fatalf("restored state diverged: %v", doneKeys(s2))
	}

	// A snapshot restored with a smaller retention keeps the newest.
	s3, err := RestoreState(b, Limits{IdempotencyKeys: 1})
	if err != nil || !slices.Equal(doneKeys(s3), []string{"w"}) {
		t.Fatalf("restore with a smaller limit: %v, %v", doneKeys(s3), err)
	}

	old := snapJSON(`{"seq":3,"leases":[],"locks":[],"tombstones":null}`)
	s4, err := RestoreState(old, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if in, done := s4.NumKeys(); in != 0 || done != 0 {
		t.Fatal("an old snapshot restored with keys")
	}
}

func TestKeySnapshotRejects(t *testing.T) {
	lease := leaseA.String()
	pre := `{"seq":9,"leases":[{"id":"` + lease + `","ttl":1000}],"locks":[],"tombstones":null,"idempotency":[`
	for name, body := range map[string]string{
		"null":               `null]`,
		"bad key":            `{"key":"a b","token":1,"done":true}]`,
		"zero token":         `{"key":"a","done":true}]`,
		"future token":       `{"key":"a","token":10,"done":true}]`,
		"twice":              `{"key":"a","token":1,"done":true},{"key":"a","token":2,"done":true}]`,
		"done with lease":    `{"key":"a","token":1,"done":true,"lease":"` + lease + `"}]`,
		"unknown lease":      `{"key":"a","token":1,"lease":"` + leaseB.String() + `"}]`,
		"no lease":           `{"key":"a","token":1}]`,
		"result in progress": `{"key":"a","token":1,"lease":"` + lease + `","result":"eA=="}]`,
		"in progress last":   `{"key":"a","token":1,"done":true},{"key":"b","token":2,"lease":"` + lease + `"}]`,
		"unknown field":      `{"key":"a","token":1,"done":true,"x":1}]`,
	} {
		if _, err := RestoreState(snapJSON(pre+body+`}`), Limits{}); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", name, err)
		}
	}
}

// TestPropertyKeys checks G9 on random command sequences over four keys and four lease
// slots, against a reference model, after every command: a key is marked done at most
// once while it is kept (only a Complete with the token of the Begin it is in progress
// under succeeds, and its result is the one every later Begin answers, until the
// retention ends); every other Complete is rejected as stale and changes nothing; a Begin
// of a free key gets a token larger than any before; Begin, Get and the model agree;
// only more than IdempotencyKeys done keys (or IdempotencyBytes of results) end a
// retention; a failing command changes no byte of the snapshot; the snapshot restores to
// the same bytes; a twin fed the same commands stays byte-identical.
func TestPropertyKeys(t *testing.T) {
	seeds := 100
	if testing.Short() {
		seeds = 15
	}
	for seed := range uint64(seeds) {
		if err := runKeySequence(seed, 300); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
	}
}

type mKey struct {
	token  uint64
	lease  LeaseID // zero when done
	done   bool
	result string
}

func runKeySequence(seed uint64, steps int) error {
	rng := rand.New(rand.NewPCG(seed, 0x1de))
	limits := Limits{IdempotencyKeys: 1 + rng.IntN(4), IdempotencyBytes: MaxResultLen + rng.IntN(MaxResultLen)}
	s, twin := NewState(limits), NewState(limits)
	keys := []string{"a", "b", "c", "d"}
	slots := make([]LeaseID, 4)
	live := map[LeaseID]bool{}
	model := map[string]*mKey{}
	var order []string // done keys, oldest first
	var tokens []uint64
	var lastToken, nextLease uint64
	doneCount := map[string]int{} // successful completions per key since it was last absent

	apply := func(c Command) Result {
		twin.Apply(c)
		return s.Apply(c)
	}
	for step := range steps {
		var c Command
		key := keys[rng.IntN(len(keys))]
		slot := rng.IntN(len(slots))
		switch n := rng.IntN(20); {
		case n < 2 || slots[slot].IsZero():
			nextLease++
			c = Command{Op: OpGrant, Lease: lid(uint32(nextLease)), TTLMillis: 1000}
		case n < 4:
			c = Command{Op: OpExpire, Lease: slots[slot]}
			if n == 3 {
				c.Op = OpRevoke
			}
		case n < 10:
			c = begin(slots[slot], key)
		case n < 17:
			var tok uint64
			switch {
			case model[key] != nil && rng.IntN(2) == 0:
				tok = model[key].token
			case len(tokens) > 0:
				tok = tokens[rng.IntN(len(tokens))]
			default:
				tok = 1 + rng.Uint64N(20)
			}
			size := rng.IntN(8)
			if rng.IntN(40) == 0 {
				size = MaxResultLen - rng.IntN(100)
			}
			c = Command{Op: OpComplete, Key: key, Token: tok, Value: bytes.Repeat([]byte{byte('a' + step%26)}, size)}
		default:
			tok := uint64(1 + rng.IntN(int(lastToken)+1))
			if m := model[key]; m != nil && rng.IntN(2) == 0 {
				tok = m.token
			}
			c = Command{Op: OpAbandon, Key: key, Token: tok}
		}
		before := mustSnapshotErr(s)
		r := apply(c)
		where := fmt.Sprintf("step %d %v %+v", step, c.Op, c)

		// The model's answer.
		m := model[c.Key]
		switch c.Op {
		case OpGrant:
			if r.Err != nil {
				return fmt.Errorf("%s: %w", where, r.Err)
			}
			slots[slot] = c.Lease // a live lease it replaces lives on, out of reach
			live[c.Lease] = true
		case OpExpire, OpRevoke:
			if !live[c.Lease] {
				if r.Err == nil {
					return fmt.Errorf("%s: ended an unknown lease", where)
				}
				break
			}
			if r.Err != nil {
				return fmt.Errorf("%s: %w", where, r.Err)
			}
			delete(live, c.Lease)
			for k, mk := range model {
				if !mk.done && mk.lease == c.Lease {
					delete(model, k)
					doneCount[k] = 0
				}
			}
		case OpBegin:
			switch {
			case !live[c.Lease]:
				if !errors.Is(r.Err, ErrLeaseNotFound) {
					return fmt.Errorf("%s: Begin on a dead lease: %w", where, r.Err)
				}
			case m == nil:
				inProgress := 0
				for _, mk := range model {
					if !mk.done {
						inProgress++
					}
				}
				if inProgress >= limits.IdempotencyKeys {
					if !errors.Is(r.Err, ErrTooManyKeys) {
						return fmt.Errorf("%s: Begin beyond the limit: %w", where, r.Err)
					}
					break
				}
				if r.Err != nil || r.Key.Status != KeyNew || r.Token <= lastToken {
					return fmt.Errorf("%s: Begin of a free key: %+v %w (last token %d)", where, r.Key, r.Err, lastToken)
				}
				lastToken = r.Token
				tokens = append(tokens, r.Token)
				model[c.Key] = &mKey{token: r.Token, lease: c.Lease}
			case m.done:
				if r.Err != nil || r.Key.Status != KeyDone || r.Token != m.token || string(r.Key.Result) != m.result {
					return fmt.Errorf("%s: Begin of a done key answered %+v %w, want its result %q", where, r.Key, r.Err, m.result)
				}
			default:
				want := KeyInProgress
				if m.lease == c.Lease {
					want = KeyNew
				}
				if r.Err != nil || r.Key.Status != want || r.Token != m.token {
					return fmt.Errorf("%s: Begin of a key in progress answered %+v %w", where, r.Key, r.Err)
				}
			}
		case OpComplete:
			switch {
			case m != nil && !m.done && m.token == c.Token:
				if r.Err != nil || r.Key.Status != KeyDone {
					return fmt.Errorf("%s: the rightful Complete failed: %w", where, r.Err)
				}
				if doneCount[c.Key]++; doneCount[c.Key] > 1 {
					return fmt.Errorf("%s: key marked done twice", where)
				}
				m.done, m.lease, m.result = true, LeaseID{}, string(c.Value)
				order = append(order, c.Key)
				for total(model, order) > limits.IdempotencyBytes || len(order) > limits.IdempotencyKeys {
					delete(model, order[0])
					doneCount[order[0]] = 0
					order = order[1:]
				}
			case m != nil && m.done && m.token == c.Token:
				if r.Err != nil || string(r.Key.Result) != m.result {
					return fmt.Errorf("%s: a retried Complete: %+v %w", where, r.Key, r.Err)
				}
			default:
				if !errors.Is(r.Err, ErrStaleToken) {
					return fmt.Errorf("%s: a stale Complete was not rejected: %w", where, r.Err)
				}
			}
		case OpAbandon:
			if r.Err != nil {
				return fmt.Errorf("%s: %w", where, r.Err)
			}
			if m != nil && !m.done && m.token == c.Token {
				delete(model, c.Key)
			}
		}
		if r.Err != nil && !bytes.Equal(before, mustSnapshotErr(s)) {
			return fmt.Errorf("%s failed with %w but changed the state", where, r.Err)
		}

		// The state agrees with the model on every key.
		for _, k := range keys {
			v, mk := s.Key(k), model[k]
			switch {
			case mk == nil && v.Status != KeyAbsent:
				return fmt.Errorf("after %s: key %s is %v, the model has none", where, k, v.Status)
			case mk == nil:
			case mk.done != (v.Status == KeyDone) || v.Token != mk.token || mk.done && string(v.Result) != mk.result:
				return fmt.Errorf("after %s: key %s is %+v, the model %+v", where, k, v, mk)
			}
		}
		if got := doneKeys(s); !slices.Equal(got, order) {
			return fmt.Errorf("after %s: done keys %v, the model %v", where, got, order)
		}
	}
	b := mustSnapshotErr(s)
	if !bytes.Equal(b, mustSnapshotErr(twin)) {
		return errors.New("the twin diverged")
	}
	restored, err := RestoreState(b, limits)
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	if !bytes.Equal(b, mustSnapshotErr(restored)) {
		return errors.New("the restored state encodes differently")
	}
	return nil
}

func total(model map[string]*mKey, order []string) int {
	n := 0
	for _, k := range order {
		n += len(model[k].result)
	}
	return n
}
