package nemesis

import (
	"fmt"
	"hash/fnv"
	"math"
	"sort"
	"testing"

	"github.com/anishathalye/porcupine"
)

// kvState is one key of the fenced store, as the sequential specification sees it.
//
// Versions are store revisions, shared by all keys, so a write's new version cannot be
// predicted from one key's history: a definite write's version is taken from its answer
// (it must exceed the key's previous version). A write whose outcome is unknown leaves
// the version unknown — VerKnown false, the version only known to exceed VerMin — until
// a later answer (a Get, a version mismatch) names it; from then on that path of the
// search holds it fixed. This keeps every check sound (no history is called
// non-linearizable that is not) while still catching lost, reordered and resurrected
// writes, wrong versions and wrong fence tokens.
type kvState struct {
	Exists   bool
	Value    string
	Version  uint64 // when VerKnown
	VerKnown bool
	VerMin   uint64 // when !VerKnown: the version is larger than this
	Fence    uint64 // highest fence token the key accepted
}

// versionIs reports whether the key's version can be v, and the state with it fixed.
func (s kvState) versionIs(v uint64) (bool, kvState) {
	cur := uint64(0)
	if s.Exists {
		if !s.VerKnown {
			if v <= s.VerMin {
				return false, s
			}
			s.Version, s.VerKnown, s.VerMin = v, true, 0
			return true, s
		}
		cur = s.Version
	}
	return cur == v, s
}

// floor is a bound the key's version is known to be at least (or exceed, when unknown).
func (s kvState) floor() uint64 {
	if !s.Exists {
		return 0
	}
	if s.VerKnown {
		return s.Version
	}
	return s.VerMin
}

// kvStep returns every state the key can be in after in produced out, from s.
func kvStep(s kvState, in kvInput, out kvOutput) []kvState {
	if in.Op == opGet {
		if out.Found != s.Exists || out.FenceToken != s.Fence {
			return nil
		}
		if !out.Found {
			if out.Version != 0 {
				return nil
			}
			return []kvState{s}
		}
		if out.Value != s.Value {
			return nil
		}
		ok, s2 := s.versionIs(out.Version)
		if !ok {
			return nil
		}
		return []kvState{s2}
	}

	// Put. The store checks the fence first, then the version, then writes.
	if in.Token != 0 && in.Token < s.Fence {
		// The only possible outcome: rejected as stale, naming the key's highest token.
		switch {
		case out.Stale && out.Highest == s.Fence:
			return []kvState{s}
		case out.Ambiguous:
			return []kvState{s}
		}
		return nil
	}
	if out.Stale {
		return nil
	}
	apply := func(base kvState) kvState {
		n := base
		n.Exists, n.Value = true, in.Value
		if in.Token != 0 {
			n.Fence = in.Token
		}
		return n
	}
	var next []kvState
	if in.CAS {
		if out.Mismatch {
			if out.Current == in.IfVersion {
				return nil
			}
			if !s.Exists {
				if out.Current != 0 {
					return nil
				}
				return []kvState{s}
			}
			ok, s2 := s.versionIs(out.Current)
			if !ok {
				return nil
			}
			return []kvState{s2}
		}
		// The write can happen only if the version is IfVersion.
		ok, s2 := s.versionIs(in.IfVersion)
		if out.Ambiguous {
			next = append(next, s) // not applied (a mismatch, or never committed)
		}
		if !ok {
			return next
		}
		s = s2
	} else if out.Mismatch {
		return nil
	}
	n := apply(s)
	if out.Ambiguous {
		n.VerKnown, n.VerMin, n.Version = false, s.floor(), 0
		return append(next, n, s)
	}
	if out.Version <= s.floor() {
		return nil // versions only grow
	}
	n.Version, n.VerKnown, n.VerMin = out.Version, true, 0
	return []kvState{n}
}

// kvModel is the per-key model; histories are partitioned by key.
var kvModel = (&porcupine.NondeterministicModel{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		for _, op := range history {
			k := op.Input.(kvInput).Key
			byKey[k] = append(byKey[k], op)
		}
		keys := make([]string, 0, len(byKey))
		for k := range byKey {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() []any { return []any{kvState{VerKnown: true}} },
	Step: func(state, input, output any) []any {
		var out []any
		for _, s := range kvStep(state.(kvState), input.(kvInput), output.(kvOutput)) {
			out = append(out, s)
		}
		return out
	},
	Equal: func(a, b any) bool { return a.(kvState) == b.(kvState) },
	Hash: func(state any) uint64 {
		s := state.(kvState)
		h := fnv.New64a()
		fmt.Fprintf(h, "%v|%s|%d|%v|%d|%d", s.Exists, s.Value, s.Version, s.VerKnown, s.VerMin, s.Fence)
		return h.Sum64()
	},
	DescribeOperation: func(input, output any) string { return describeOp(input.(kvInput), output.(kvOutput)) },
	DescribeState: func(state any) string {
		s := state.(kvState)
		if !s.Exists {
			return fmt.Sprintf("absent fence=%d", s.Fence)
		}
		v := fmt.Sprint(s.Version)
		if !s.VerKnown {
			v = fmt.Sprintf(">%d", s.VerMin)
		}
		return fmt.Sprintf("%q v%s fence=%d", s.Value, v, s.Fence)
	},
}).ToModel()

func describeOp(in kvInput, out kvOutput) string {
	var call string
	switch in.Op {
	case opGet:
		call = fmt.Sprintf("get(%s)", in.Key)
	default:
		call = fmt.Sprintf("put(%s, %q", in.Key, in.Value)
		if in.Token != 0 {
			call += fmt.Sprintf(", fence %s=%d", in.Lock, in.Token)
		}
		if in.CAS {
			call += fmt.Sprintf(", if v%d", in.IfVersion)
		}
		call += ")"
	}
	var res string
	switch {
	case out.Ambiguous:
		res = "unknown"
	case in.Op == opGet && !out.Found:
		res = fmt.Sprintf("not found (fence %d)", out.FenceToken)
	case in.Op == opGet:
		res = fmt.Sprintf("%q v%d fence %d", out.Value, out.Version, out.FenceToken)
	case out.Stale:
		res = fmt.Sprintf("stale token (highest %d)", out.Highest)
	case out.Mismatch:
		res = fmt.Sprintf("version mismatch (current %d)", out.Current)
	default:
		res = fmt.Sprintf("ok v%d", out.Version)
	}
	return call + " -> " + res
}

// TestKVModel checks the model on small hand-made histories, so that a violation the
// nemesis reports is the service's and not the model's.
func TestKVModel(t *testing.T) {
	const inf = math.MaxInt64
	put := func(c int, call, ret int64, key, val string, ver uint64) porcupine.Operation {
		out := kvOutput{Version: ver}
		if ret == inf {
			out = kvOutput{Ambiguous: true}
		}
		return porcupine.Operation{ClientId: c, Input: kvInput{Op: opPut, Key: key, Value: val}, Call: call, Output: out, Return: ret}
	}
	fput := func(c int, call, ret int64, key, val string, tok uint64, out kvOutput) porcupine.Operation {
		return porcupine.Operation{ClientId: c, Input: kvInput{Op: opPut, Key: key, Value: val, Lock: "l", Token: tok}, Call: call, Output: out, Return: ret}
	}
	cas := func(c int, call, ret int64, key, val string, ifv uint64, out kvOutput) porcupine.Operation {
		return porcupine.Operation{ClientId: c, Input: kvInput{Op: opPut, Key: key, Value: val, CAS: true, IfVersion: ifv}, Call: call, Output: out, Return: ret}
	}
	get := func(c int, call, ret int64, key string, out kvOutput) porcupine.Operation {
		return porcupine.Operation{ClientId: c, Input: kvInput{Op: opGet, Key: key}, Call: call, Output: out, Return: ret}
	}
	found := func(val string, ver, fence uint64) kvOutput {
		return kvOutput{Found: true, Value: val, Version: ver, FenceToken: fence}
	}
	cases := []struct {
		name string
		ok   bool
		h    []porcupine.Operation
	}{
		{"read own write", true, []porcupine.Operation{put(0, 0, 10, "k", "a", 5), get(1, 20, 30, "k", found("a", 5, 0))}},
		{"stale read", false, []porcupine.Operation{put(0, 0, 10, "k", "a", 5), put(0, 11, 20, "k", "b", 6), get(1, 30, 40, "k", found("a", 5, 0))}},
		{"lost acknowledged write", false, []porcupine.Operation{put(0, 0, 10, "k", "a", 5), get(1, 20, 30, "k", kvOutput{})}},
		{"versions must grow", false, []porcupine.Operation{put(0, 0, 10, "k", "a", 5), put(0, 20, 30, "k", "b", 4)}},
		{"wrong version read", false, []porcupine.Operation{put(0, 0, 10, "k", "a", 5), get(1, 20, 30, "k", found("a", 6, 0))}},
		{"unknown put may apply", true, []porcupine.Operation{put(0, 0, inf, "k", "a", 0), get(1, 20, 30, "k", found("a", 9, 0))}},
		{"unknown put may not apply", true, []porcupine.Operation{put(0, 0, inf, "k", "a", 0), get(1, 20, 30, "k", kvOutput{})}},
		{"unknown put applies once", false, []porcupine.Operation{put(0, 0, inf, "k", "a", 0), get(1, 20, 30, "k", found("a", 9, 0)), put(1, 31, 40, "k", "b", 10), get(1, 50, 60, "k", found("a", 9, 0))}},
		{"unknown put version fixed by read", false, []porcupine.Operation{put(0, 0, inf, "k", "a", 0), get(1, 20, 30, "k", found("a", 9, 0)), get(1, 40, 50, "k", found("a", 8, 0))}},
		{"cas ok", true, []porcupine.Operation{put(0, 0, 10, "k", "a", 5), cas(1, 20, 30, "k", "b", 5, kvOutput{Version: 7}), get(1, 40, 50, "k", found("b", 7, 0))}},
		{"cas must fail on wrong version", false, []porcupine.Operation{put(0, 0, 10, "k", "a", 5), cas(1, 20, 30, "k", "b", 4, kvOutput{Version: 7})}},
		{"cas mismatch names current", true, []porcupine.Operation{put(0, 0, 10, "k", "a", 5), cas(1, 20, 30, "k", "b", 4, kvOutput{Mismatch: true, Current: 5})}},
		{"cas mismatch wrong current", false, []porcupine.Operation{put(0, 0, 10, "k", "a", 5), cas(1, 20, 30, "k", "b", 4, kvOutput{Mismatch: true, Current: 6})}},
		{"cas create", true, []porcupine.Operation{cas(1, 0, 10, "k", "b", 0, kvOutput{Version: 3}), cas(1, 20, 30, "k", "c", 0, kvOutput{Mismatch: true, Current: 3})}},
		{"cas after unknown put", true, []porcupine.Operation{put(0, 0, 10, "k", "a", 5), put(0, 11, inf, "k", "b", 0), cas(1, 20, 30, "k", "c", 5, kvOutput{Mismatch: true, Current: 8}), get(1, 40, 50, "k", found("b", 8, 0))}},
		{"fence equal allowed", true, []porcupine.Operation{fput(0, 0, 10, "k", "a", 7, kvOutput{Version: 2}), fput(1, 20, 30, "k", "b", 7, kvOutput{Version: 3}), get(1, 40, 50, "k", found("b", 3, 7))}},
		{"fence lower rejected", true, []porcupine.Operation{fput(0, 0, 10, "k", "a", 7, kvOutput{Version: 2}), fput(1, 20, 30, "k", "b", 6, kvOutput{Stale: true, Highest: 7})}},
		{"fence lower accepted", false, []porcupine.Operation{fput(0, 0, 10, "k", "a", 7, kvOutput{Version: 2}), fput(1, 20, 30, "k", "b", 6, kvOutput{Version: 3})}},
		{"fence higher rejected", false, []porcupine.Operation{fput(0, 0, 10, "k", "a", 7, kvOutput{Version: 2}), fput(1, 20, 30, "k", "b", 8, kvOutput{Stale: true, Highest: 7})}},
		{"fence unknown then stale", true, []porcupine.Operation{fput(0, 0, inf, "k", "a", 9, kvOutput{Ambiguous: true}), fput(1, 20, 30, "k", "b", 8, kvOutput{Stale: true, Highest: 9})}},
		{"get shows fence", false, []porcupine.Operation{fput(0, 0, 10, "k", "a", 7, kvOutput{Version: 2}), get(1, 20, 30, "k", found("a", 2, 0))}},
		{"keys independent", true, []porcupine.Operation{put(0, 0, 10, "k", "a", 5), put(0, 0, 10, "j", "a", 6), get(1, 20, 30, "j", found("a", 6, 0)), get(1, 20, 30, "k", found("a", 5, 0))}},
		{"concurrent writes either order", true, []porcupine.Operation{put(0, 0, 10, "k", "a", 5), put(1, 0, 10, "k", "b", 6), get(2, 20, 30, "k", found("b", 6, 0))}},
	}
	for _, c := range cases {
		got := porcupine.CheckOperations(kvModel, c.h)
		if got != c.ok {
			t.Errorf("%s: linearizable=%v, want %v", c.name, got, c.ok)
		}
	}
}
