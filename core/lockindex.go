package core

import (
	"hash/maphash"
	"iter"
)

// lockIndex finds a lock table's records by name. It is a hash table with open
// addressing (linear probing) of the records themselves, keyed by each record's own
// name: a slot is one pointer and one byte of the name's hash. A Go map from name to
// record would keep, in every slot, the name's string header beside the pointer (24
// bytes and a control byte a slot; 33 to 52 bytes a lock at its load), a copy of what
// the record already has; this keeps 9 bytes a slot, 12 to 24 a lock (at most ¾ of the
// slots in use, counting the deleted). With a million locks held that is some 33 MB
// less.
//
// A delete leaves a tombstone (unless the slot after it is empty), which a later put
// in its run reuses, so that neither looks at any record but the one it is after; a
// put that would fill past ¾ rebuilds the table, twice as large when the records alone
// fill more than ⅜ of it, and a delete that leaves less than ⅛ in use halves it.
//
// Like a Go map, it has no order: its iteration order depends on a seed chosen per
// index, so nothing replicated may depend on it (every caller sorts, or does not care).
// Its zero value is an empty index. It is not safe for concurrent use.
type lockIndex struct {
	slots []*lock // nil or a power of two long
	// tags[i] is tagEmpty, tagDeleted, or tagBit with the top bits of its record's name
	// hash: a probe looks at a record only when the tags match (one in 128 otherwise).
	tags []uint8
	n    int // records
	dead int // tombstones
	seed maphash.Seed
}

const (
	tagEmpty      = 0
	tagDeleted    = 1
	tagBit        = 0x80
	minIndexSlots = 8
)

func (x *lockIndex) hash(name string) (pos int, tag uint8) {
	h := maphash.String(x.seed, name)
	return int(h & uint64(len(x.slots)-1)), tagBit | uint8(h>>57)
}

// len returns the number of records.
func (x *lockIndex) len() int { return x.n }

// find returns the slot of the record called name, or -1.
func (x *lockIndex) find(name string) int {
	if x.n == 0 {
		return -1
	}
	mask := len(x.slots) - 1
	for i, tag := x.hash(name); ; i = (i + 1) & mask {
		switch t := x.tags[i]; {
		case t == tagEmpty:
			return -1
		case t == tag && x.slots[i].name == name:
			return i
		}
	}
}

// get returns the record called name, or nil.
func (x *lockIndex) get(name string) *lock {
	if i := x.find(name); i >= 0 {
		return x.slots[i]
	}
	return nil
}

// put adds l, replacing a record of the same name.
func (x *lockIndex) put(l *lock) {
	switch {
	case x.slots == nil:
		x.seed = maphash.MakeSeed()
		x.resize(minIndexSlots)
	case (x.n+x.dead+1)*4 > len(x.slots)*3:
		if (x.n+1)*8 > len(x.slots)*3 {
			x.resize(2 * len(x.slots))
		} else {
			x.resize(len(x.slots)) // only tombstones to clear
		}
	}
	mask := len(x.slots) - 1
	free := -1 // the first tombstone on the way
	for i, tag := x.hash(l.name); ; i = (i + 1) & mask {
		switch t := x.tags[i]; {
		case t == tagEmpty:
			if free >= 0 {
				i = free
				x.dead--
			}
			x.slots[i], x.tags[i] = l, tag
			x.n++
			return
		case t == tagDeleted:
			if free < 0 {
				free = i
			}
		case t == tag && x.slots[i].name == l.name:
			x.slots[i] = l
			return
		}
	}
}

// del removes the record called name, if there is one.
func (x *lockIndex) del(name string) {
	i := x.find(name)
	if i < 0 {
		return
	}
	mask := len(x.slots) - 1
	x.slots[i], x.tags[i] = nil, tagDeleted
	x.n--
	x.dead++
	if x.tags[(i+1)&mask] == tagEmpty {
		// The run ends here: this tombstone and those just before it stop no probe.
		for ; x.tags[i] == tagDeleted; i = (i - 1) & mask {
			x.tags[i] = tagEmpty
			x.dead--
		}
	}
	if len(x.slots) > minIndexSlots && x.n*8 < len(x.slots) {
		x.resize(len(x.slots) / 2)
	}
}

// resize moves every record into a table of n slots (a power of two, room for them),
// without tombstones.
func (x *lockIndex) resize(n int) {
	old := x.slots
	x.slots, x.tags, x.dead = make([]*lock, n), make([]uint8, n), 0
	mask := n - 1
	for _, l := range old {
		if l == nil {
			continue
		}
		i, tag := x.hash(l.name)
		for x.tags[i] != tagEmpty {
			i = (i + 1) & mask
		}
		x.slots[i], x.tags[i] = l, tag
	}
}

// all yields every record, in no particular order. The index must not change while it
// runs.
func (x *lockIndex) all() iter.Seq[*lock] {
	return func(yield func(*lock) bool) {
		for _, l := range x.slots {
			if l != nil && !yield(l) {
				return
			}
		}
	}
}
