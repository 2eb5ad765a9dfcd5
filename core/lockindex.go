package core

import (
	"hash/maphash"
	"iter"
)

// lockIndex finds a lock table's records by name. It is a hash table with open
// addressing (linear probing) of the records themselves, keyed by each record's own
// name: a slot is one pointer and one byte of the name's hash. A Go map from name to
// record would keep, in every slot, the name's string header beside the pointer (24
// bytes and a control byte a slot; about 33 bytes a lock at its load), a copy of what
// the record already has; this keeps 9 bytes a slot, about 16 a lock (load ¾ to ⅜).
// With a million locks held that is some 17 MB less.
//
// Like a Go map, it has no order: its iteration order depends on a seed chosen per
// index, so nothing replicated may depend on it (every caller sorts, or does not care).
// Its zero value is an empty index. It is not safe for concurrent use.
type lockIndex struct {
	slots []*lock // nil or a power of two long
	// tags[i] is 0 for an empty slot, else tagBit with the top bits of its name's hash:
	// a probe looks at a record only when the tags match (one in 128 otherwise).
	tags []uint8
	n    int
	seed maphash.Seed
}

const (
	tagBit          = 0x80
	minIndexSlots   = 8
	indexLoadNum    = 3 // grow past ¾ full
	indexLoadDen    = 4
	indexShrinkFrac = 8 // shrink below ⅛ full (to ¼ to ½ of the slots)
)

func (x *lockIndex) hash(name string) (pos int, tag uint8) {
	h := maphash.String(x.seed, name)
	return int(h & uint64(len(x.slots)-1)), tagBit | uint8(h>>57)
}

// len returns the number of records.
func (x *lockIndex) len() int { return x.n }

// get returns the record called name, or nil.
func (x *lockIndex) get(name string) *lock {
	if x.n == 0 {
		return nil
	}
	mask := len(x.slots) - 1
	for i, tag := x.hash(name); ; i = (i + 1) & mask {
		switch t := x.tags[i]; {
		case t == 0:
			return nil
		case t == tag && x.slots[i].name == name:
			return x.slots[i]
		}
	}
}

// put adds l, replacing a record of the same name.
func (x *lockIndex) put(l *lock) {
	if x.slots == nil {
		x.seed = maphash.MakeSeed()
		x.resize(minIndexSlots)
	} else if (x.n+1)*indexLoadDen > len(x.slots)*indexLoadNum {
		x.resize(2 * len(x.slots))
	}
	if x.insert(l) {
		x.n++
	}
}

// insert puts l in its slot, reporting whether it was new (not a replacement); the
// table has room.
func (x *lockIndex) insert(l *lock) bool {
	mask := len(x.slots) - 1
	for i, tag := x.hash(l.name); ; i = (i + 1) & mask {
		switch t := x.tags[i]; {
		case t == 0:
			x.slots[i], x.tags[i] = l, tag
			return true
		case t == tag && x.slots[i].name == l.name:
			x.slots[i] = l
			return false
		}
	}
}

// del removes the record called name, if there is one.
func (x *lockIndex) del(name string) {
	if x.n == 0 {
		return
	}
	mask := len(x.slots) - 1
	i, tag := x.hash(name)
	for ; ; i = (i + 1) & mask {
		t := x.tags[i]
		if t == 0 {
			return
		}
		if t == tag && x.slots[i].name == name {
			break
		}
	}
	// Backward shift: the records after i in its run move up into the hole when their
	// home slot allows it, so that no probe ever meets an empty slot before its record.
	for j := i; ; {
		x.slots[i], x.tags[i] = nil, 0
		for {
			j = (j + 1) & mask
			if x.tags[j] == 0 {
				x.n--
				if len(x.slots) > minIndexSlots && x.n*indexShrinkFrac < len(x.slots) {
					x.resize(len(x.slots) / 2)
				}
				return
			}
			home, _ := x.hash(x.slots[j].name)
			// j's record may move to i unless its home lies cyclically in (i, j].
			if (j > i && (home <= i || home > j)) || (j < i && home <= i && home > j) {
				break
			}
		}
		x.slots[i], x.tags[i] = x.slots[j], x.tags[j]
		i = j
	}
}

// resize moves every record into a table of n slots (a power of two, room for them).
func (x *lockIndex) resize(n int) {
	old := x.slots
	x.slots, x.tags = make([]*lock, n), make([]uint8, n)
	for _, l := range old {
		if l != nil {
			x.insert(l)
		}
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
