package core

// boundedLog is a bounded record of recent entries of many names, in the order they
// were added (the log's, in the replicated state): each name keeps its last perName
// entries, and all names together at most total — and, when bytes is above 0, entries
// whose sizes add up to at most bytes, the newest always kept — dropping the oldest
// first. The ledger (tenures, by lock) and the election history (changes, by election)
// are one each; the leader keeps another ledger for its efficiency table. Its zero
// value is not usable: make one with newBoundedLog. It is not safe for concurrent use.
//
// Memory: one record per entry held, one pointer to it in its name's list and one in
// the order, and a map entry per name. Adding an entry at a bound allocates nothing: the
// records dropped are kept (at most maxSpare of them) and reused.
type boundedLog[T any, P logged[T]] struct {
	perName, total, bytes int
	byName                map[string]*nameEntries[T]
	// order[head:] are the entries held, oldest first, and some dropped by their name's
	// bound (gone): those go when they reach the front, or all at once (squeeze) once
	// four of them for each live one pass squeezeAfter (a quarter of the live and 16
	// more). pop moves order down once half of it is free, so that a full log grows
	// nothing.
	order []*logEntry[T]
	head  int
	live  int // entries in order not gone
	gone  int // entries in order[head:] that are gone
	size  int // the sizes (logSize) of the live entries; 0 without a byte bound
	// spare are records no longer in the log, reused by add.
	spare []*logEntry[T]
}

// logged is what a boundedLog holds (its methods on a pointer, so that calling them
// through the type parameter copies nothing): an entry of the name logName, costing
// logSize against the log's byte bound (called only when it has one).
type logged[T any] interface {
	*T
	logName() string
	logSize() int
}

// logEntry is one record of a boundedLog.
type logEntry[T any] struct {
	v    T
	gone bool // dropped by its name's bound, still in the order
}

// nameEntries are one name's entries, oldest first: a pointer in the map, so that add
// appends to the list without writing the map.
type nameEntries[T any] struct{ list []*logEntry[T] }

// maxSpare bounds boundedLog.spare.
const maxSpare = 64

// squeezeAfter is the slack before squeeze takes the gone out of the order: once
// 4*gone > live+squeezeAfter, so that the order stays within a quarter of the live
// (and 16) beyond them and squeezing costs O(1) per add on average.
const squeezeAfter = 64

// newBoundedLog returns an empty log keeping perName entries of each name, total in
// all and (bytes above 0) at most bytes of logSize in all.
func newBoundedLog[T any, P logged[T]](perName, total, bytes int) boundedLog[T, P] {
	return boundedLog[T, P]{perName: perName, total: total, bytes: bytes, byName: make(map[string]*nameEntries[T])}
}

// add appends v, dropping its name's oldest beyond perName and the oldest of all beyond
// the totals, and returns the last entry the totals dropped (ok false when they dropped
// none; an entry its name's bound drops is not returned).
func (g *boundedLog[T, P]) add(v T) (dropped T, ok bool) {
	e := g.record()
	e.v = v
	name := P(&e.v).logName()
	ne := g.byName[name]
	if ne == nil {
		ne = &nameEntries[T]{}
		g.byName[name] = ne
	}
	ne.list = append(ne.list, e)
	if len(ne.list) > g.perName {
		old := ne.list[0]
		old.gone = true
		ne.list = dropOldest(ne.list)
		g.live--
		g.gone++
		g.size -= g.sizeOf(old)
	}
	g.order = append(g.order, e)
	g.live++
	g.size += g.sizeOf(e)
	for g.live > g.total || g.bytes > 0 && g.size > g.bytes && g.live > 1 {
		old := g.pop()
		if old.gone {
			g.gone--
		} else {
			g.live--
			g.size -= g.sizeOf(old)
			name := P(&old.v).logName()
			ne := g.byName[name] // old is its name's oldest
			if ne.list = dropOldest(ne.list); len(ne.list) == 0 {
				delete(g.byName, name)
			}
			dropped, ok = old.v, true
		}
		g.free(old)
	}
	for g.head < len(g.order) && g.order[g.head].gone { // keep the order from filling with the gone
		g.free(g.pop())
		g.gone--
	}
	if 4*g.gone > g.live+squeezeAfter {
		// A quiet name's old entry at the front of the order would otherwise keep a busy
		// name's dropped entries behind it for ever: the order would grow with every add.
		g.squeeze()
	}
	return dropped, ok
}

// sizeOf returns what e costs against the byte bound (0 without one: logSize is not
// called).
func (g *boundedLog[T, P]) sizeOf(e *logEntry[T]) int {
	if g.bytes <= 0 {
		return 0
	}
	return P(&e.v).logSize()
}

// dropOldest returns list without its first entry, in the same array.
func dropOldest[E any](list []*E) []*E {
	n := copy(list, list[1:])
	list[n] = nil
	return list[:n]
}

// pop takes the oldest record out of the order.
func (g *boundedLog[T, P]) pop() *logEntry[T] {
	e := g.order[g.head]
	g.order[g.head] = nil
	g.head++
	if g.head*2 >= len(g.order) {
		n := copy(g.order, g.order[g.head:])
		clear(g.order[n:])
		g.order, g.head = g.order[:n], 0
	}
	return e
}

// squeeze takes the gone entries out of the order, keeping the others in their order.
func (g *boundedLog[T, P]) squeeze() {
	n := 0
	for _, e := range g.order[g.head:] {
		if e.gone {
			g.free(e)
			continue
		}
		g.order[n] = e
		n++
	}
	clear(g.order[n:])
	g.order, g.head, g.gone = g.order[:n], 0, 0
}

// record returns a record for add: a spare one, or a new one.
func (g *boundedLog[T, P]) record() *logEntry[T] {
	n := len(g.spare)
	if n == 0 {
		return new(logEntry[T])
	}
	e := g.spare[n-1]
	g.spare[n-1] = nil
	g.spare = g.spare[:n-1]
	return e
}

// free keeps e, which nothing refers to any more, for reuse.
func (g *boundedLog[T, P]) free(e *logEntry[T]) {
	if len(g.spare) < maxSpare {
		*e = logEntry[T]{}
		g.spare = append(g.spare, e)
	}
}

// of returns name's entries held, oldest first. The list is the log's: it changes with
// the next add.
func (g *boundedLog[T, P]) of(name string) []*logEntry[T] {
	if ne := g.byName[name]; ne != nil {
		return ne.list
	}
	return nil
}

// has reports whether the log holds an entry of name.
func (g *boundedLog[T, P]) has(name string) bool { return g.byName[name] != nil }

// full reports whether name holds perName entries: its older ones may have been dropped.
func (g *boundedLog[T, P]) full(name string) bool { return len(g.of(name)) >= g.perName }

// newest returns the entry added last that is still held, and false when none is.
func (g *boundedLog[T, P]) newest() (*T, bool) {
	// The newest entry is live: its name's bound drops older ones, and the totals keep
	// the newest.
	if g.head == len(g.order) {
		return nil, false
	}
	return &g.order[len(g.order)-1].v, true
}

// appendTo appends copies of the entries held to out, oldest first, and returns it.
func (g *boundedLog[T, P]) appendTo(out []T) []T {
	for _, e := range g.order[g.head:] {
		if !e.gone {
			out = append(out, e.v)
		}
	}
	return out
}
