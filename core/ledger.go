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
}

// DefaultLedgerPerLock and DefaultLedgerTotal bound the ledger by default: the last 16
// tenures of each lock, 100,000 in all.
const (
	DefaultLedgerPerLock = 16
	DefaultLedgerTotal   = 100_000
)

// Ledger is a bounded record of recent tenures, fed with a lock table's events (Note):
// the replicated State keeps one for the correctness locks (State.History), and a
// leader one for its efficiency table. It keeps each lock's last LedgerPerLock ended
// tenures and LedgerTotal in all, dropping the oldest first (a boundedLog), and the
// start of every hold still open. Its zero value is not usable: make one with
// NewLedger. It is not safe for concurrent use.
type Ledger struct {
	// open holds the start of every hold still open whose start is known, by token:
	// one entry per grant, which covers all the names of a lock set (granted in one
	// change, so at one time, and always ended together). The map holds no pointer:
	// with a million locks held, the GC does not scan it.
	open  map[uint64]openStart
	ended boundedLog[Tenure, *Tenure] // the ended tenures, by lock
}

// logName and logSize make a Tenure an entry of a boundedLog.
func (t *Tenure) logName() string { return t.Name }
func (t *Tenure) logSize() int    { return 0 } // the ledger has no byte bound

// NewLedger returns an empty ledger bounded by l's LedgerPerLock and LedgerTotal (their
// defaults when unset).
func NewLedger(l Limits) Ledger {
	l = l.withDefaults()
	return Ledger{open: make(map[uint64]openStart), ended: newBoundedLog[Tenure](l.LedgerPerLock, l.LedgerTotal, 0)}
}

// Note records what event e, of a change made at now (Unix milliseconds; 0: unknown),
// does to the ledger: an acquire opens a hold, and a release, expiry, revocation, force
// release or disconnect ends one; other kinds change nothing. When e ends the last
// name held under its token (a lock set's names end together, one event each) and the
// ledger knew the grant's start, Note returns that start, else 0: a leader times its
// holds by it (the hold-time metric), so that it keeps no start of its own per hold.
func (g *Ledger) Note(e Event, now int64) (ended int64) {
	switch e.Kind {
	case EventAcquired:
		g.opened(e.Token, now)
	case EventReleased, EventExpired, EventRevoked, EventForceReleased, EventDisconnected:
		start, last := g.closed(e.Token)
		g.ended.add(Tenure{Name: e.Name, Token: e.Token, Holder: e.Holder, Mode: e.Mode, StartMillis: start, EndMillis: now, End: e.Kind, Note: e.Note})
		if last {
			return start
		}
	}
	return 0
}

// openStart is an open grant's start (Unix milliseconds, below 2^56) shifted left by
// seven bits, and in those bits how many of its names are still held (a lock set has
// at most MaxSetNames).
type openStart int64

const openNamesBits = 7

func (o openStart) start() int64 { return int64(o) >> openNamesBits }
func (o openStart) names() int   { return int(o & (1<<openNamesBits - 1)) }

// opened counts one more name held under token since start (0: unknown, not recorded).
func (g *Ledger) opened(token uint64, start int64) {
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
// unknown) and whether that was the grant's last name held.
func (g *Ledger) closed(token uint64) (start int64, last bool) {
	o, ok := g.open[token]
	if !ok {
		return 0, false
	}
	if o.names() <= 1 {
		delete(g.open, token)
		return o.start(), true
	}
	g.open[token] = o - 1
	return o.start(), false
}

// started returns the start of token's open grant (0 when unknown).
func (g *Ledger) started(token uint64) int64 { return g.open[token].start() }

// Has reports whether the ledger keeps an ended tenure of lock name.
func (g *Ledger) Has(name string) bool { return g.ended.has(name) }

// History returns correctness lock name's recent tenures, oldest first, then its holds
// still open (End 0), as the lock table has them. The result is a copy.
func (s *State) History(name string) []Tenure { return s.ledger.History(name, s.locks) }

// History returns lock name's recent tenures, oldest first, then its holds still open
// in locks (End 0; the table whose events the ledger notes). The result is a copy.
func (g *Ledger) History(name string, locks *Locks) []Tenure {
	var out []Tenure
	for _, e := range g.ended.of(name) {
		out = append(out, e.v)
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
			out = append(out, Tenure{Name: name, Token: h.Token, Holder: h.Holder, Mode: mode, StartMillis: g.started(h.Token)})
		}
	}
	return out
}

// records copies the ledger as a snapshot records it: the ended tenures oldest first,
// then the open holds' starts in (name, token) order, one per name held (the holds of
// locks). A snapshot view keeps less (viewRecords, writeLedger); the tests check the
// two agree.
func (g *Ledger) records(locks *Locks) []Tenure {
	out := g.ended.appendTo(make([]Tenure, 0, g.ended.live+len(g.open)))
	n := len(out)
	add := func(name string, token uint64) {
		if o, ok := g.open[token]; ok {
			out = append(out, Tenure{Name: name, Token: token, StartMillis: o.start()})
		}
	}
	for l := range locks.locks.all() {
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

// openRecord is an open hold's start (Unix milliseconds) by token, as a snapshot view
// keeps it: 16 bytes a grant instead of a Tenure (some 110 bytes) a name held.
type openRecord struct {
	token uint64
	start int64
}

// viewRecords copies the ledger for a snapshot view, as records would but without
// making a Tenure of every open hold: the ended tenures oldest first, and the open
// holds' starts by token, in no order. writeLedger writes them as records orders them.
func (g *Ledger) viewRecords() ([]Tenure, []openRecord) {
	ended := g.ended.appendTo(make([]Tenure, 0, g.ended.live))
	open := make([]openRecord, 0, len(g.open))
	for token, o := range g.open {
		open = append(open, openRecord{token: token, start: o.start()})
	}
	return ended, open
}

// writeLedger writes the "ledger" field of a snapshot (when it has any record) from a
// view's copies: ended as it is, then the start of each hold of locks (in name order)
// whose token open has, in (name, token) order — the bytes records' would give.
// It sorts open.
func writeLedger(e *jsonWriter, ended []Tenure, open []openRecord, locks []lock) {
	slices.SortFunc(open, func(a, b openRecord) int { return cmp.Compare(a.token, b.token) })
	n := 0
	put := func(t *Tenure) {
		if n == 0 {
			e.raw(`,"ledger":[`)
		}
		e.elem(n, t)
		n++
	}
	for i := range ended {
		put(&ended[i])
	}
	var tokens []uint64
	for i := range locks {
		l := &locks[i]
		tokens = tokens[:0]
		if l.held() {
			tokens = append(tokens, l.token)
		}
		if l.more != nil {
			for _, h := range l.more.holds {
				tokens = append(tokens, h.token)
			}
			slices.Sort(tokens)
		}
		for _, tok := range tokens {
			if j, ok := slices.BinarySearchFunc(open, tok, func(o openRecord, t uint64) int { return cmp.Compare(o.token, t) }); ok {
				put(&Tenure{Name: l.name, Token: tok, StartMillis: open[j].start})
			}
		}
	}
	if n > 0 {
		e.raw("]")
	}
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
		s.ledger.ended.add(t)
	default:
		return fmt.Errorf("%w: ledger entry that ended as %d in snapshot", ErrCorrupt, t.End)
	}
	return nil
}
