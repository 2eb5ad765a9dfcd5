package core

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"
)

// Tenure is one hold of a correctness lock in the ledger: who held it, under which
// token, from when to when, and how it ended. Times are the proposing leader's wall
// clock (Command.WallMillis, Unix milliseconds), for display only: the state machine
// reads no clock, and nothing depends on them. The ledger's order is the log's.
type Tenure struct {
	Name   string `json:"name"`
	Token  uint64 `json:"token"`
	Holder Holder `json:"holder,omitzero"`
	Mode   Mode   `json:"mode,omitempty"`
	// StartMillis and EndMillis: when the grant and the end were proposed (0: unknown,
	// a command written before commands carried the time).
	StartMillis int64 `json:"start,omitempty"`
	EndMillis   int64 `json:"end,omitempty"`
	// End is how the tenure ended: EventReleased, EventExpired, EventRevoked or
	// EventForceReleased; 0 for a hold still open.
	End EventKind `json:"how,omitempty"`
	// Note is a force release's reason, with who asked.
	Note string `json:"note,omitempty"`

	gone bool // dropped by the per-lock bound, still in the ledger's order
}

// DefaultLedgerPerLock and DefaultLedgerTotal bound the ledger by default: the last 16
// tenures of each lock, 100,000 in all.
const (
	DefaultLedgerPerLock = 16
	DefaultLedgerTotal   = 100_000
)

// ledger is the replicated record of recent tenures (State.History).
type ledger struct {
	perLock, total int
	// open holds the start of every hold still open whose start is known, by token:
	// one entry per grant, which covers all the names of a lock set (granted in one
	// command, so at one time, and always ended together). An entry is an openStart,
	// and the map holds no pointer: with a million locks held, the GC does not scan it.
	open   map[uint64]openStart
	byLock map[string][]*Tenure
	order  []*Tenure // ended tenures, oldest first; some gone (perLock)
	live   int       // tenures in order not gone
}

func newLedger(l Limits) ledger {
	return ledger{perLock: l.LedgerPerLock, total: l.LedgerTotal, open: make(map[uint64]openStart), byLock: make(map[string][]*Tenure)}
}

// openStart is an open grant's start (Unix milliseconds, below 2^56) shifted left by
// seven bits, and in those bits how many of its names are still held (a lock set has
// at most MaxSetNames).
type openStart int64

const openNamesBits = 7

func (o openStart) start() int64 { return int64(o) >> openNamesBits }
func (o openStart) names() int   { return int(o & (1<<openNamesBits - 1)) }

// opened counts one more name held under token since start (0: unknown, not recorded).
func (g *ledger) opened(token uint64, start int64) {
	if start <= 0 || start >= 1<<(63-openNamesBits) {
		return // unknown, or a time no clock gives: as if not recorded
	}
	o, ok := g.open[token]
	if !ok || o.names() >= MaxSetNames {
		o = openStart(start << openNamesBits)
	}
	g.open[token] = o + 1
}

// closed counts one name of token's grant fewer and returns the grant's start (0 when
// unknown).
func (g *ledger) closed(token uint64) int64 {
	o, ok := g.open[token]
	if !ok {
		return 0
	}
	if o.names() <= 1 {
		delete(g.open, token)
	} else {
		g.open[token] = o - 1
	}
	return o.start()
}

// started returns the start of token's open grant (0 when unknown).
func (g *ledger) started(token uint64) int64 { return g.open[token].start() }

// note records what event e (of the command proposed at now) does to the ledger.
func (g *ledger) note(e Event, now int64) {
	switch e.Kind {
	case EventAcquired:
		g.opened(e.Token, now)
	case EventReleased, EventExpired, EventRevoked, EventForceReleased, EventDisconnected:
		start := g.closed(e.Token)
		g.add(&Tenure{Name: e.Name, Token: e.Token, Holder: e.Holder, Mode: e.Mode, StartMillis: start, EndMillis: now, End: e.Kind, Note: e.Note})
	}
}

// add appends an ended tenure, dropping the lock's oldest beyond perLock and the
// ledger's oldest beyond total.
func (g *ledger) add(t *Tenure) {
	list := append(g.byLock[t.Name], t)
	if len(list) > g.perLock {
		list[0].gone = true
		list = slices.Delete(list, 0, 1)
		g.live--
	}
	g.byLock[t.Name] = list
	g.order = append(g.order, t)
	g.live++
	for g.live > g.total {
		old := g.order[0]
		g.order[0] = nil
		g.order = g.order[1:]
		if old.gone {
			continue
		}
		g.live--
		rest := g.byLock[old.Name][1:] // old is its lock's oldest
		if len(rest) == 0 {
			delete(g.byLock, old.Name)
		} else {
			g.byLock[old.Name] = rest
		}
	}
	for len(g.order) > 0 && g.order[0].gone { // keep the order from filling with the gone
		g.order[0] = nil
		g.order = g.order[1:]
	}
}

// History returns lock name's recent tenures, oldest first, then its holds still open
// (End 0), as the lock table has them. The result is a copy.
func (s *State) History(name string) []Tenure {
	var out []Tenure
	for _, t := range s.ledger.byLock[name] {
		out = append(out, *t)
	}
	if l := s.locks.Get(name); l != nil {
		holds := l.Holds
		mode := Shared
		if l.Limit > 0 {
			mode = Semaphore
		}
		if l.Hold != nil {
			holds, mode = []Hold{*l.Hold}, Exclusive
		}
		for _, h := range holds {
			out = append(out, Tenure{Name: name, Token: h.Token, Holder: h.Holder, Mode: mode, StartMillis: s.ledger.started(h.Token)})
		}
	}
	return out
}

// records copies the ledger for a snapshot: the ended tenures oldest first, then the
// open holds' starts in (name, token) order, one per name held (the holds of locks).
func (g *ledger) records(locks *Locks) []Tenure {
	out := make([]Tenure, 0, g.live+len(g.open))
	for _, t := range g.order {
		if !t.gone {
			out = append(out, *t)
		}
	}
	n := len(out)
	add := func(name string, token uint64) {
		if o, ok := g.open[token]; ok {
			out = append(out, Tenure{Name: name, Token: token, StartMillis: o.start()})
		}
	}
	for _, l := range locks.locks {
		if l.held() {
			add(l.name, l.token)
		}
		if l.more != nil {
			for _, h := range l.more.holds {
				add(l.name, h.token)
			}
		}
	}
	slices.SortFunc(out[n:], func(a, b Tenure) int {
		return cmp.Or(strings.Compare(a.Name, b.Name), cmp.Compare(a.Token, b.Token))
	})
	return out
}

// restoreTenure adds a ledger record read from a snapshot (records' order), after
// checking it.
func (s *State) restoreTenure(t Tenure) error {
	switch {
	case ValidateName("name", t.Name) != nil || t.Token == 0 || t.Token > s.seq:
		return fmt.Errorf("%w: ledger entry with a bad name or token in snapshot", ErrCorrupt)
	case len(t.Note) > MaxReasonLen || !utf8.ValidString(t.Note):
		return fmt.Errorf("%w: ledger entry with a bad note in snapshot", ErrCorrupt)
	case t.End == 0 && t.StartMillis != 0:
		s.ledger.opened(t.Token, t.StartMillis)
	case t.End == 0:
		return fmt.Errorf("%w: ledger entry of an open hold without its start in snapshot", ErrCorrupt)
	case t.End == EventReleased || t.End == EventExpired || t.End == EventRevoked || t.End == EventForceReleased || t.End == EventDisconnected:
		s.ledger.add(&t)
	default:
		return fmt.Errorf("%w: ledger entry that ended as %d in snapshot", ErrCorrupt, t.End)
	}
	return nil
}
