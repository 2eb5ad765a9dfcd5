package core

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"testing"
)

// Random tests of lock modes and lock sets, on both classes: every command goes to a
// State (correctness) and to a bare Locks table run the way the leader runs its
// efficiency table, which must answer alike. After every step: the table invariants
// (checkTable: G2 on every name — one exclusive holder, or readers only, or at most a
// semaphore's limit — and no waiter that could be granted), FIFO on every name (grants
// go to the front of the queue as it stood, in order; a newcomer is granted at once
// only where nobody waits, so a queued writer holds back the readers behind it), and
// rising tokens (one per grant, shared only by the names of one lock set). Now and
// then a State restored from a snapshot joins and must go on byte for byte alike. At
// the end every holder releases, and every acquire still waiting must be granted, once:
// no set of lock sets ever deadlocks.

// modeNames are the names the generator uses: readers-writer locks and semaphores.
var (
	modeRWNames  = []string{"a", "b", "c", "d"}
	modeSemNames = []string{"p", "q"}
)

const modeSemLimit = 2

// modeSystem is one side of the test: the State, or the efficiency table.
type modeSystem interface {
	apply(Command) Result
	table() *Locks
	live(LeaseID) bool
	last() uint64
}

type stateSystem struct{ s *State }

func (x stateSystem) apply(c Command) Result { return x.s.Apply(c) }
func (x stateSystem) table() *Locks          { return x.s.locks }
func (x stateSystem) live(id LeaseID) bool   { return x.s.live(id) }
func (x stateSystem) last() uint64           { return x.s.seq }

type tableSystem struct{ d *tableDriver }

func (x tableSystem) apply(c Command) Result {
	if c.Op == OpAcquire {
		c.Class = Efficiency
	}
	return x.d.apply(c)
}
func (x tableSystem) table() *Locks        { return x.d.t }
func (x tableSystem) live(id LeaseID) bool { return x.d.live[id] }
func (x tableSystem) last() uint64         { return x.d.seq.n }

// modeGen makes commands from the current state of the State it reads.
type modeGen struct {
	ch     chooser
	s      *State
	slots  []LeaseID
	nextID uint32
}

func (g *modeGen) lease() LeaseID {
	if g.ch.intn(40) == 0 {
		return lid(2_000_000 + uint32(g.ch.intn(10)))
	}
	return g.slots[g.ch.intn(len(g.slots))]
}

func (g *modeGen) next() Command {
	switch w := g.ch.intn(100); {
	case w < 10:
		i := g.ch.intn(len(g.slots))
		if g.s.Lease(g.slots[i]) == nil || g.ch.intn(3) == 0 {
			g.nextID++
			g.slots[i] = lid(g.nextID)
		}
		return Command{Op: OpGrant, Lease: g.slots[i], TTLMillis: 1000}
	case w < 13:
		return Command{Op: OpRevoke, Lease: g.lease()}
	case w < 17:
		return Command{Op: OpExpire, Lease: g.lease()}
	case w < 42:
		return g.acquire(false)
	case w < 57:
		return g.acquire(true)
	case w < 80:
		return g.release()
	case w < 88:
		return g.cancel()
	case w < 91:
		return Command{Op: OpForceRelease, Name: g.anyName(), Reason: "ops"}
	case w < 97:
		for _, n := range g.s.locks.sortedNames() {
			if g.s.locks.locks.get(n).delayed() && g.ch.intn(2) == 0 {
				return Command{Op: OpEndDelay, Name: n}
			}
		}
		return Command{Op: OpEndDelay, Name: g.anyName()}
	default:
		return Command{Op: OpReserve, Count: uint64(1 + g.ch.intn(5))}
	}
}

func (g *modeGen) anyName() string {
	all := append(slices.Clone(modeRWNames), modeSemNames...)
	return all[g.ch.intn(len(all))]
}

func (g *modeGen) acquire(set bool) Command {
	id := g.lease()
	c := Command{Op: OpAcquire, Lease: id, Class: Correctness, Wait: g.ch.intn(10) < 7, Holder: Holder{PID: uint32(id[15])}}
	if g.ch.intn(4) == 0 {
		c.DelayMillis = int64(100 * (1 + g.ch.intn(3)))
	}
	group, mode, limit := modeRWNames, Mode(g.ch.intn(2)), uint32(0)
	if g.ch.intn(3) == 0 {
		group, mode, limit = modeSemNames, Semaphore, modeSemLimit
	}
	if g.ch.intn(25) == 0 { // a kind conflict
		mode, limit = Semaphore, uint32(1+g.ch.intn(3))
	}
	c.Mode, c.Limit = mode, limit
	if !set {
		c.Name = group[g.ch.intn(len(group))]
		return c
	}
	names := slices.Clone(group)
	if g.ch.intn(15) == 0 {
		names = append(slices.Clone(modeRWNames), modeSemNames...)
	}
	for i := range names { // a random subset of two or more
		j := i + g.ch.intn(len(names)-i)
		names[i], names[j] = names[j], names[i]
	}
	names = names[:2+g.ch.intn(len(names)-1)]
	slices.Sort(names)
	c.Names = names
	return c
}

// release mostly releases a real hold (any mode, any name of a set), now and then with
// a wrong token or lease.
func (g *modeGen) release() Command {
	name := g.anyName()
	l := g.s.locks.Get(name)
	if l == nil || !l.Held() {
		return Command{Op: OpRelease, Lease: g.lease(), Name: name, Token: uint64(1 + g.ch.intn(int(g.s.seq)+1))}
	}
	holds := l.Holds
	if l.Hold != nil {
		holds = []Hold{*l.Hold}
	}
	h := holds[g.ch.intn(len(holds))]
	c := Command{Op: OpRelease, Lease: h.Lease, Name: name, Token: h.Token}
	switch g.ch.intn(12) {
	case 0:
		c.Token++
	case 1:
		c.Lease = g.lease()
	}
	return c
}

func (g *modeGen) cancel() Command {
	name := g.anyName()
	if l := g.s.locks.Get(name); l != nil && len(l.Waiters) > 0 && g.ch.intn(5) != 0 {
		return Command{Op: OpCancelWait, Lease: l.Waiters[g.ch.intn(len(l.Waiters))].Lease, Name: name}
	}
	return Command{Op: OpCancelWait, Lease: g.lease(), Name: name}
}

// modePre is what a step check needs of the table before the step.
type modePre struct {
	last   uint64
	queues map[string][]LeaseID
}

func captureQueues(t *Locks, last uint64) modePre {
	p := modePre{last: last, queues: make(map[string][]LeaseID)}
	for l := range t.locks.all() {
		name := l.name
		for _, w := range l.more.waitersOrNil() {
			p.queues[name] = append(p.queues[name], w.lease)
		}
	}
	return p
}

// checkModeStep checks FIFO on every name and rising tokens for one step that succeeded.
func checkModeStep(pre modePre, c Command, r Result, t *Locks, last uint64) error {
	post := captureQueues(t, last)
	names := c.Names
	if c.Name != "" {
		names = []string{c.Name}
	}
	fresh := c.Op == OpAcquire && r.Token > pre.last
	if fresh {
		for _, n := range names {
			if len(pre.queues[n]) > 0 {
				return fmt.Errorf("granted %s at once past its queue %v", n, pre.queues[n])
			}
		}
	}
	// Tokens: above everything before the step, rising, shared only by one set's names.
	prevTok, prevLease := pre.last, LeaseID{}
	if fresh {
		prevTok, prevLease = r.Token, c.Lease
	}
	grants := make(map[string][]LeaseID)
	for _, e := range r.Effects {
		if e.Kind != EffectGranted {
			continue
		}
		switch {
		case e.Token > last:
			return fmt.Errorf("granted %s under token %d, above the last issued %d", e.Name, e.Token, last)
		case e.Token < prevTok || e.Token == prevTok && (e.Lease != prevLease || prevTok == pre.last):
			return fmt.Errorf("granted %s to %s under token %d after token %d (to %s)", e.Name, e.Lease, e.Token, prevTok, prevLease)
		}
		prevTok, prevLease = e.Token, e.Lease
		grants[e.Name] = append(grants[e.Name], e.Lease)
	}
	// FIFO: of the queue as it stood (with a place this step added at its back), the
	// places this step granted are its front, in order, and the rest keep their order.
	for l := range t.locks.all() {
		name := l.name
		before := pre.queues[name]
		if c.Op == OpAcquire && r.Queued && slices.Contains(names, name) && !slices.Contains(before, c.Lease) {
			before = append(slices.Clone(before), c.Lease)
		}
		checkFIFO := func() error {
			want := append(slices.Clone(grants[name]), post.queues[name]...)
			var kept []LeaseID
			for _, id := range before {
				if slices.Contains(want, id) {
					kept = append(kept, id)
				}
			}
			if !slices.Equal(kept, want) {
				return fmt.Errorf("%s: queue %v, granted %v, left %v: not FIFO", name, before, grants[name], post.queues[name])
			}
			return nil
		}
		if err := checkFIFO(); err != nil {
			return err
		}
	}
	for name, g := range grants {
		if t.locks.get(name) == nil && len(g) > 0 {
			return fmt.Errorf("%s granted but gone from the table", name)
		}
	}
	return nil
}

// runModeSequence runs steps random commands against a State and an efficiency table
// side by side, then drains both.
func runModeSequence(seed uint64, steps int, limits Limits) error {
	ch := newRandChooser(seed)
	s := NewState(limits)
	d := newTableDriver(limits)
	d.t.limits.MaxLeases = 1 << 30
	systems := []modeSystem{stateSystem{s}, tableSystem{d}}
	g := &modeGen{ch: ch, s: s}
	for range 5 {
		g.nextID++
		g.slots = append(g.slots, lid(g.nextID))
	}
	var clones []*State
	for step := range steps {
		c := g.next()
		if c.Op == OpGrant && limits.MaxLeases > 0 && s.NumLeases() >= limits.MaxLeases {
			continue // the bare table knows no lease limit
		}
		fail := func(format string, args ...any) error {
			return fmt.Errorf("seed %d step %d: %+v: %s", seed, step, c, fmt.Sprintf(format, args...))
		}
		if step%40 == 39 {
			b := mustSnapshotErr(s)
			clone, err := RestoreState(b, limits)
			if err != nil {
				return fail("restore: %v\n%s", err, b)
			}
			if !bytes.Equal(mustSnapshotErr(clone), b) {
				return fail("snapshot -> restore -> snapshot changed the bytes")
			}
			clones = append(clones, clone)
			if len(clones) > 2 {
				clones = clones[1:]
			}
		}
		before := mustSnapshotErr(s)
		var results []Result
		for _, sys := range systems {
			pre := captureQueues(sys.table(), sys.last())
			r := sys.apply(c)
			if err := checkTable(sys.table(), sys.live, sys.last()); err != nil {
				return fail("%T: invariant: %v", sys, err)
			}
			if r.Err != nil {
				// Checked below: a failed command changed nothing.
			} else if err := checkModeStep(pre, c, r, sys.table(), sys.last()); err != nil {
				return fail("%T: %v (result %+v)", sys, err, r)
			}
			results = append(results, r)
		}
		r := results[0]
		if r.Err != nil && !bytes.Equal(before, mustSnapshotErr(s)) {
			return fail("failed with %v but changed the state", r.Err)
		}
		if err := sameOutcome(r, results[1]); err != nil {
			return fail("the efficiency table answered otherwise: %v", err)
		}
		if err := sameLocks(s.locks, d.t); err != nil {
			return fail("%v", err)
		}
		for _, clone := range clones {
			if err := sameResult(r, clone.Apply(c)); err != nil {
				return fail("restored clone: %v", err)
			}
			if !bytes.Equal(mustSnapshotErr(clone), mustSnapshotErr(s)) {
				return fail("restored clone went another way")
			}
		}
	}
	for _, sys := range systems {
		if err := drain(sys); err != nil {
			return fmt.Errorf("seed %d: %T: drain: %w", seed, sys, err)
		}
	}
	return nil
}

// sameOutcome compares the State's and the efficiency table's results: the same but
// for the wording of errors about leases (the table's driver words them its own way).
func sameOutcome(a, b Result) error {
	if (a.Err == nil) != (b.Err == nil) {
		return fmt.Errorf("errors %w vs %w", a.Err, b.Err)
	}
	a.Err, b.Err = nil, nil
	return sameResult(a, b)
}

// sameLocks checks that two tables hold the same locks, class aside.
func sameLocks(x, y *Locks) error {
	if !slices.Equal(x.sortedNames(), y.sortedNames()) {
		return fmt.Errorf("the tables hold %v and %v", x.sortedNames(), y.sortedNames())
	}
	for _, n := range x.sortedNames() {
		a, b := x.Get(n), y.Get(n)
		b.Class = a.Class
		if !reflect.DeepEqual(a, b) {
			return fmt.Errorf("lock %s: %+v vs %+v", n, a, b)
		}
	}
	return nil
}

func mustSnapshotErr(s *State) []byte {
	b, err := s.MarshalSnapshot()
	if err != nil {
		panic(err)
	}
	return b
}

// drain ends every lock-delay and has every holder release, one hold at a time, until
// the table is empty; every acquire that was waiting must be granted on the way, once.
func drain(sys modeSystem) error {
	t := sys.table()
	type wait struct {
		lease LeaseID
		key   string
	}
	waiting := make(map[wait]int) // how many grants (names) each waiting acquire expects
	for l := range t.locks.all() {
		name := l.name
		for _, w := range l.more.waitersOrNil() {
			k := wait{w.lease, name}
			if w.set != nil {
				k.key = w.set.key
			}
			waiting[k]++
		}
	}
	granted := make(map[wait]int)
	setOf := make(map[uint64]string) // a set's token: its key
	for round := 0; t.locks.len() > 0; round++ {
		if round > 10_000 {
			return fmt.Errorf("still %d locks after %d rounds: %v", t.locks.len(), round, t.sortedNames())
		}
		var c Command
		for _, n := range t.sortedNames() {
			l := t.locks.get(n)
			if l.delayed() {
				c = Command{Op: OpEndDelay, Name: n}
				break
			}
			if tok, _, ok := l.holdOf(heldBy(l)); ok {
				c = Command{Op: OpRelease, Lease: heldBy(l), Name: n, Token: tok}
				break
			}
		}
		if c.Op == 0 {
			return fmt.Errorf("waiters left with nothing held or delayed: %v (a deadlock)", t.sortedNames())
		}
		r := sys.apply(c)
		if r.Err != nil {
			return fmt.Errorf("%+v: %w", c, r.Err)
		}
		if err := checkTable(t, sys.live, sys.last()); err != nil {
			return fmt.Errorf("after %+v: %w", c, err)
		}
		for _, e := range r.Effects {
			if e.Kind != EffectGranted {
				continue
			}
			key, ok := setOf[e.Token]
			if !ok {
				key = e.Name
				setOf[e.Token] = key
			}
			granted[wait{e.Lease, key}]++
		}
	}
	for k, n := range waiting {
		if granted[k] != n {
			return fmt.Errorf("acquire %s of %q waited on %d names and was granted %d", k.lease, k.key, n, granted[k])
		}
	}
	for k, n := range granted {
		if waiting[k] != n {
			return fmt.Errorf("acquire %s of %q granted %d names, expected %d", k.lease, k.key, n, waiting[k])
		}
	}
	return nil
}

// heldBy returns some lease that holds l (zero if none).
func heldBy(l *lock) LeaseID {
	if l.held() {
		return l.lease
	}
	if l.more != nil && len(l.more.holds) > 0 {
		return l.more.holds[0].lease
	}
	return LeaseID{}
}

// TestPropertyModesAndSets is the random test described at the top of this file.
func TestPropertyModesAndSets(t *testing.T) {
	seeds := 100
	if testing.Short() || raceEnabled {
		seeds = 15
	}
	for seed := range uint64(seeds) {
		limits := Limits{}
		if seed%3 == 1 {
			limits = Limits{MaxLeases: 5, MaxLocksPerLease: 4, MaxWaitersPerLock: 3}
		}
		if err := runModeSequence(7000+seed, 400, limits); err != nil {
			t.Fatal(err)
		}
	}
}

// TestPropertyModesCoverage makes sure the generator reaches the cases that matter:
// shared and semaphore grants past other holders, sets granted at once and after a
// wait, writers blocking readers, conflicts of mode and set.
func TestPropertyModesCoverage(t *testing.T) {
	seen := map[string]int{}
	for seed := range uint64(20) {
		ch := newRandChooser(9000 + seed)
		s := NewState(Limits{})
		g := &modeGen{ch: ch, s: s}
		for range 5 {
			g.nextID++
			g.slots = append(g.slots, lid(g.nextID))
		}
		for range 400 {
			c := g.next()
			pre := captureQueues(s.locks, s.seq)
			held := map[string]bool{}
			for _, n := range append(slices.Clone(c.Names), c.Name) {
				if l := s.locks.locks.get(n); l != nil && l.inUse() {
					held[n] = true
				}
			}
			r := s.Apply(c)
			set := len(c.Names) > 0
			switch {
			case r.Err != nil:
				for _, e := range []error{ErrModeConflict, ErrSetConflict, ErrLockHeld, ErrTooManyWaiters} {
					if errors.Is(r.Err, e) {
						seen[fmt.Sprintf("set=%v %v", set, e)]++
					}
				}
			case c.Op == OpAcquire && r.Queued:
				seen[fmt.Sprintf("set=%v %v queued", set, c.Mode)]++
				if c.Mode == Shared {
					for _, n := range append(slices.Clone(c.Names), c.Name) {
						if held[n] && !s.locks.locks.get(n).terms.set() {
							seen["reader queued behind a writer, readers holding"]++
						}
					}
				}
			case c.Op == OpAcquire && r.Token > pre.last && len(held) > 0:
				seen[fmt.Sprintf("set=%v %v granted past other holders", set, c.Mode)]++
			}
			tokens := map[uint64]int{}
			for _, e := range r.Effects {
				if e.Kind == EffectGranted {
					tokens[e.Token]++
				}
			}
			if len(tokens) > 0 {
				seen[fmt.Sprintf("grant on %v", c.Op)]++
			}
			for _, n := range tokens {
				if n > 1 {
					seen[fmt.Sprintf("set granted after a wait on %v", c.Op)]++
				}
			}
			if len(tokens) > 1 {
				seen[fmt.Sprintf("several grants at once on %v", c.Op)]++
			}
		}
	}
	for _, want := range []string{
		"set=false shared granted past other holders", "set=false semaphore granted past other holders",
		"set=true shared granted past other holders", "set=false exclusive queued", "set=true exclusive queued",
		"set=true semaphore queued", "reader queued behind a writer, readers holding",
		"set=false core: lock is in use in another mode", "set=true core: lock is in use in another mode",
		"set=false " + ErrSetConflict.Error(), "set=true " + ErrSetConflict.Error(), "set=true core: lock is held",
		"set granted after a wait on release", "set granted after a wait on expire", "set granted after a wait on force-release",
		"grant on cancel-wait", "grant on end-delay", "several grants at once on release",
	} {
		if seen[want] == 0 {
			t.Errorf("the generator never produced %q", want)
		}
	}
	if t.Failed() {
		t.Logf("seen: %v", seen)
	}
}
