package core

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestLockIndexAgainstMap runs random puts, replacements and deletes (with growth and
// shrinking) on a lockIndex and a map side by side, and checks after each step that
// both hold the same records.
func TestLockIndexAgainstMap(t *testing.T) {
	for seed := range uint64(20) {
		r := rand.New(rand.NewPCG(seed, 7))
		var x lockIndex
		m := map[string]*lock{}
		names := 1 + r.IntN(3000) // few names: many collisions of put and del
		steps := 20_000
		for step := range steps {
			name := fmt.Sprintf("n/%d", r.IntN(names))
			switch op := r.IntN(10); {
			case op < 5 || step < steps/4: // put (growth first)
				l := &lock{name: name}
				x.put(l)
				m[name] = l
			default:
				x.del(name)
				delete(m, name)
			}
			if got, want := x.get(name), m[name]; got != want {
				t.Fatalf("seed %d step %d: get(%q) = %p, want %p", seed, step, name, got, want)
			}
			if step%97 == 0 || step == steps-1 {
				checkIndex(t, &x, m)
			}
		}
		for name := range m { // empty it: shrinks all the way
			x.del(name)
			delete(m, name)
		}
		checkIndex(t, &x, m)
		if len(x.slots) != minIndexSlots {
			t.Errorf("seed %d: an empty index keeps %d slots", seed, len(x.slots))
		}
	}
}

func checkIndex(t *testing.T, x *lockIndex, m map[string]*lock) {
	t.Helper()
	if x.len() != len(m) {
		t.Fatalf("len %d, map %d", x.len(), len(m))
	}
	if len(x.slots) > 0 && (x.len()+x.dead)*4 > len(x.slots)*3 {
		t.Fatalf("%d records and %d tombstones in %d slots", x.len(), x.dead, len(x.slots))
	}
	dead := 0
	for _, tag := range x.tags {
		if tag == tagDeleted {
			dead++
		}
	}
	if dead != x.dead {
		t.Fatalf("%d tombstones, counted %d", dead, x.dead)
	}
	seen := 0
	for l := range x.all() {
		if m[l.name] != l {
			t.Fatalf("all yields %q (%p), map has %p", l.name, l, m[l.name])
		}
		seen++
	}
	if seen != len(m) {
		t.Fatalf("all yields %d records, map has %d", seen, len(m))
	}
	for name, l := range m {
		if x.get(name) != l {
			t.Fatalf("get(%q) = %p, want %p", name, x.get(name), l)
		}
	}
	for i, l := range x.slots {
		if (l == nil) != (x.tags[i] < tagBit) {
			t.Fatalf("slot %d: record %p with tag %#x", i, l, x.tags[i])
		}
	}
}

// TestLockIndexZero checks that the zero index is empty and usable.
func TestLockIndexZero(t *testing.T) {
	var x lockIndex
	if x.get("a") != nil || x.len() != 0 {
		t.Fatal("zero index not empty")
	}
	x.del("a")
	for range x.all() {
		t.Fatal("zero index yields a record")
	}
}

// BenchmarkLockIndex measures a get that finds its record and a put with a del of a new
// name, in an index of a million records, beside a Go map.
func BenchmarkLockIndex(b *testing.B) {
	const n = 1 << 20
	locks := make([]*lock, n)
	for i := range locks {
		locks[i] = &lock{name: fmt.Sprintf("scale-locks/%d/%d", i/10000, i%10000)}
	}
	b.Run("index/get", func(b *testing.B) {
		var x lockIndex
		for _, l := range locks {
			x.put(l)
		}
		i := 0
		for b.Loop() {
			if x.get(locks[i&(n-1)].name) == nil {
				b.Fatal("missing")
			}
			i += 7919
		}
	})
	b.Run("map/get", func(b *testing.B) {
		m := make(map[string]*lock)
		for _, l := range locks {
			m[l.name] = l
		}
		i := 0
		for b.Loop() {
			if m[locks[i&(n-1)].name] == nil {
				b.Fatal("missing")
			}
			i += 7919
		}
	})
	b.Run("index/churn", func(b *testing.B) { // delete one record and put it back, all over the index
		var x lockIndex
		for _, l := range locks {
			x.put(l)
		}
		i := 0
		for b.Loop() {
			l := locks[i&(n-1)]
			x.del(l.name)
			x.put(l)
			i += 7919
		}
	})
	b.Run("map/churn", func(b *testing.B) {
		m := make(map[string]*lock)
		for _, l := range locks {
			m[l.name] = l
		}
		i := 0
		for b.Loop() {
			l := locks[i&(n-1)]
			delete(m, l.name)
			m[l.name] = l
			i += 7919
		}
	})
	extra := &lock{name: "scale-locks/extra/1"}
	b.Run("index/put-del", func(b *testing.B) {
		var x lockIndex
		for _, l := range locks {
			x.put(l)
		}
		for b.Loop() {
			x.put(extra)
			x.del(extra.name)
		}
	})
	b.Run("map/put-del", func(b *testing.B) {
		m := make(map[string]*lock)
		for _, l := range locks {
			m[l.name] = l
		}
		for b.Loop() {
			m[extra.name] = extra
			delete(m, extra.name)
		}
	})
}
