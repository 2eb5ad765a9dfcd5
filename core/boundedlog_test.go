package core

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
)

// checkLog checks a boundedLog's invariants: the order holds the live and the gone
// as counted, within the squeeze's slack; each name's list is, record for record, its
// live entries in the order's order, within perName; the sizes add up (none are
// counted without a byte bound); the totals hold; spare records are blank and bounded.
func checkLog[T any, P logged[T]](g *boundedLog[T, P]) error {
	if g.head != 0 && 2*g.head >= len(g.order) {
		return fmt.Errorf("order of %d with its head at %d: not moved down", len(g.order), g.head)
	}
	live, gone, size := 0, 0, 0
	perName := map[string][]*logEntry[T]{}
	for i, e := range g.order {
		switch {
		case i < g.head:
			if e != nil {
				return fmt.Errorf("order[%d] before the head %d is kept", i, g.head)
			}
			continue
		case e == nil:
			return fmt.Errorf("order[%d] is nil", i)
		case e.gone:
			gone++
			continue
		}
		live++
		name := P(&e.v).logName()
		if g.bytes > 0 {
			size += P(&e.v).logSize()
		}
		perName[name] = append(perName[name], e)
	}
	if live != g.live || gone != g.gone || size != g.size {
		return fmt.Errorf("order holds %d live, %d gone, size %d; counted %d, %d, %d", live, gone, size, g.live, g.gone, g.size)
	}
	if 4*g.gone > g.live+squeezeAfter {
		return fmt.Errorf("%d gone in the order beside %d live: not squeezed", g.gone, g.live)
	}
	if g.live > g.total || g.bytes > 0 && g.size > g.bytes && g.live > 1 {
		return fmt.Errorf("%d live of size %d, bounds %d and %d", g.live, g.size, g.total, g.bytes)
	}
	if len(perName) != len(g.byName) {
		return fmt.Errorf("%d names in the order, %d by name", len(perName), len(g.byName))
	}
	for name, ne := range g.byName {
		if len(ne.list) > g.perName || !slices.Equal(ne.list, perName[name]) {
			return fmt.Errorf("name %q: %d entries by name, %d in the order (bound %d)", name, len(ne.list), len(perName[name]), g.perName)
		}
	}
	if len(g.spare) > maxSpare {
		return fmt.Errorf("%d spare records, bound %d", len(g.spare), maxSpare)
	}
	for _, e := range g.spare {
		if !reflect.ValueOf(*e).IsZero() {
			return fmt.Errorf("a spare record keeps %+v", *e)
		}
	}
	return nil
}

// testEntry is a boundedLog entry for the tests: a name, a sequence number, a size.
type testEntry struct {
	name string
	n    int
	size int
}

func (e *testEntry) logName() string { return e.name }
func (e *testEntry) logSize() int    { return e.size }

// TestBoundedLogProperty adds random entries of a few busy and many quiet names to logs
// of random bounds and compares each with a model (a list of the entries held, oldest
// first, cut by the same rules): what it holds in all and by name, what add reports
// dropped by the totals, and its invariants (checkLog) after every add.
func TestBoundedLogProperty(t *testing.T) {
	for seed := range uint64(200) {
		rng := rand.New(rand.NewPCG(seed, 11))
		perName, total, bytes := 1+rng.IntN(5), 1+rng.IntN(40), 0
		if rng.IntN(2) == 0 {
			bytes = 1 + rng.IntN(400)
		}
		g := newBoundedLog[testEntry](perName, total, bytes)
		var model []testEntry
		size := func() int {
			n := 0
			for _, e := range model {
				n += e.size
			}
			return n
		}
		for n := range 1000 {
			name := fmt.Sprint("busy", rng.IntN(2))
			if rng.IntN(3) == 0 {
				name = fmt.Sprint("quiet", rng.IntN(30))
			}
			e := testEntry{name: name, n: n, size: rng.IntN(50)}
			model = append(model, e)
			var same []int
			for i, m := range model {
				if m.name == name {
					same = append(same, i)
				}
			}
			if len(same) > perName {
				model = slices.Delete(model, same[0], same[0]+1)
			}
			var wantDropped testEntry
			wantOK := false
			for len(model) > total || bytes > 0 && size() > bytes && len(model) > 1 {
				wantDropped, wantOK = model[0], true
				model = model[1:]
			}
			dropped, ok := g.add(e)
			if ok != wantOK || dropped != wantDropped {
				t.Fatalf("seed %d add %d: dropped %+v %v, want %+v %v", seed, n, dropped, ok, wantDropped, wantOK)
			}
			if err := checkLog(&g); err != nil {
				t.Fatalf("seed %d add %d: %v", seed, n, err)
			}
			if got := g.appendTo(nil); !slices.Equal(got, model) {
				t.Fatalf("seed %d add %d: holds %+v, want %+v", seed, n, got, model)
			}
			if newest, ok := g.newest(); !ok || *newest != e {
				t.Fatalf("seed %d add %d: newest %+v %v, want %+v", seed, n, newest, ok, e)
			}
			for _, m := range model {
				var got []testEntry
				for _, r := range g.of(m.name) {
					got = append(got, r.v)
				}
				want := slices.DeleteFunc(slices.Clone(model), func(o testEntry) bool { return o.name != m.name })
				if !slices.Equal(got, want) || !g.has(m.name) || g.full(m.name) != (len(want) >= perName) {
					t.Fatalf("seed %d add %d: %s holds %+v, want %+v", seed, n, m.name, got, want)
				}
			}
		}
	}
}

// TestBoundedLogAllocs: a log at its bound by name, or at its total, adds an entry of a
// name it holds without allocating (the records it drops are reused), and its order
// does not grow.
func TestBoundedLogAllocs(t *testing.T) {
	names := []string{"n0", "n1", "n2", "n3", "n4"}
	for _, b := range []struct{ perName, total int }{{2, 100}, {3, 10}} {
		g := newBoundedLog[testEntry](b.perName, b.total, 0)
		n := 0
		add := func() {
			g.add(testEntry{name: names[n%len(names)], n: n})
			n++
		}
		for range 100 {
			add()
		}
		if a := testing.AllocsPerRun(1000, add); a != 0 {
			t.Fatalf("%+v: an add to a full log allocates %.1f times", b, a)
		}
		if err := checkLog(&g); err != nil {
			t.Fatalf("%+v: %v", b, err)
		}
		if cap(g.order) > 32 {
			t.Fatalf("%+v: the order of a log of 10 has grown to %d", b, cap(g.order))
		}
	}
}
