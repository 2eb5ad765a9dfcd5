package core

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"
)

// Tenure is one hold of a lock in a ledger: who held it, under which token, from when
// to when, and how it ended. In the replicated ledger (State.History, correctness
// locks) times are the proposing leader's wall clock (Command.WallMillis, Unix
// milliseconds) and the order is the log's; in a leader's efficiency ledger they are
// that leader's wall clock and the order is its table's. Either way the times are for
// display only: nothing depends on them.
type Tenure struct {
	Name   string `json:"name"`
	Token  uint64 `json:"token"`
	Holder Holder `json:"holder,omitzero"`
	Mode   Mode   `json:"mode,omitempty"`
	// StartMillis and EndMillis: when the grant and the end were proposed (0: unknown,
	// a command written before commands carried the time).
	StartMillis int64 `json:"start,omitempty"`
	EndMillis   int64 `json:"end,omitempty"`
	// End is how the tenure ended: EventReleased, EventExpired, EventRevoked,
	// EventForceReleased or EventDisconnected; 0 for a hold still open.
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

type holdKey struct {
	name  string
	token uint64
}

// Ledger is a bounded record of recent tenures, fed with a lock table's events (Note):
// the replicated State keeps one for the correctness locks (State.History), and a
// leader one for its efficiency table. It keeps each lock's last LedgerPerLock ended
// tenures and LedgerTotal in all, dropping the oldest first, and the start of every
// hold still open. Its zero value is not usable: make one with NewLedger. It is not
// safe for concurrent use.
type Ledger struct {
	perLock, total int
	open           map[holdKey]int64 // start of every hold still open whose start is known
	byLock         map[string][]*Tenure
	order          []*Tenure // ended tenures, oldest first; some gone (perLock)
	live           int       // tenures in order not gone
}

// NewLedger returns an empty ledger bounded by l's LedgerPerLock and LedgerTotal (their
// defaults when unset).
func NewLedger(l Limits) Ledger {
	l = l.withDefaults()
	return Ledger{perLock: l.LedgerPerLock, total: l.LedgerTotal, open: make(map[holdKey]int64), byLock: make(map[string][]*Tenure)}
}

// Note records what event e, of a change made at now (Unix milliseconds; 0: unknown),
// does to the ledger: an acquire opens a hold, and a release, expiry, revocation, force
// release or disconnect ends one; other kinds change nothing.
func (g *Ledger) Note(e Event, now int64) {
	k := holdKey{e.Name, e.Token}
	switch e.Kind {
	case EventAcquired:
		if now != 0 { // 0: unknown, as if not recorded
			g.open[k] = now
		}
	case EventReleased, EventExpired, EventRevoked, EventForceReleased, EventDisconnected:
		start := g.open[k]
		delete(g.open, k)
		g.add(&Tenure{Name: e.Name, Token: e.Token, Holder: e.Holder, Mode: e.Mode, StartMillis: start, EndMillis: now, End: e.Kind, Note: e.Note})
	}
}

// Has reports whether the ledger keeps an ended tenure of lock name.
func (g *Ledger) Has(name string) bool { return len(g.byLock[name]) > 0 }

// add appends an ended tenure, dropping the lock's oldest beyond perLock and the
// ledger's oldest beyond total.
func (g *Ledger) add(t *Tenure) {
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

// History returns correctness lock name's recent tenures, oldest first, then its holds
// still open (End 0), as the lock table has them. The result is a copy.
func (s *State) History(name string) []Tenure { return s.ledger.History(name, s.locks) }

// History returns lock name's recent tenures, oldest first, then its holds still open
// in locks (End 0; the table whose events the ledger notes). The result is a copy.
func (g *Ledger) History(name string, locks *Locks) []Tenure {
	var out []Tenure
	for _, t := range g.byLock[name] {
		out = append(out, *t)
	}
	if l := locks.Get(name); l != nil {
		holds := l.Holds
		mode := Shared
		if l.Limit > 0 {
			mode = Semaphore
		}
		if l.Hold != nil {
			holds, mode = []Hold{*l.Hold}, Exclusive
		}
		for _, h := range holds {
			out = append(out, Tenure{Name: name, Token: h.Token, Holder: h.Holder, Mode: mode, StartMillis: g.open[holdKey{name, h.Token}]})
		}
	}
	return out
}

// records copies the ledger for a snapshot: the ended tenures oldest first, then the
// open holds' starts in (name, token) order.
func (g *Ledger) records() []Tenure {
	out := make([]Tenure, 0, g.live+len(g.open))
	for _, t := range g.order {
		if !t.gone {
			out = append(out, *t)
		}
	}
	n := len(out)
	for k, start := range g.open {
		out = append(out, Tenure{Name: k.name, Token: k.token, StartMillis: start})
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
		s.ledger.open[holdKey{t.Name, t.Token}] = t.StartMillis
	case t.End == 0:
		return fmt.Errorf("%w: ledger entry of an open hold without its start in snapshot", ErrCorrupt)
	case t.End == EventReleased || t.End == EventExpired || t.End == EventRevoked || t.End == EventForceReleased || t.End == EventDisconnected:
		s.ledger.add(&t)
	default:
		return fmt.Errorf("%w: ledger entry that ended as %d in snapshot", ErrCorrupt, t.End)
	}
	return nil
}
