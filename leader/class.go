package leader

import (
	"fmt"

	"github.com/leasehold/leasehold/core"
)

// classes is the one place that decides which class a lock name is in use as while this
// node leads. Every acquire of either class asks it first (claimLocked), and every call
// that must find the table holding a name asks it (inMemoryLocked): release, force
// release, describe, and the end of a leadership for its waiters; History asks which
// ledgers to show (servedInMemoryLocked). It is guarded by Leader.mu.
//
// A name is in use
//   - as efficiency while the leader's efficiency table has it (held, waited for, or in
//     its lock-delay);
//   - as correctness while the replicated table has it, or while a correctness acquire
//     of it is being proposed: that commit may grant the name before the table shows it,
//     and an efficiency grant in between would give one name to both classes (G2);
//   - as neither otherwise, and then either class may take it.
//
// An acquire of a name in use as the other class fails with core.ErrClassConflict. The
// two tables cannot both come to hold a name, since the only ways in are the two claims
// below, made under Leader.mu, and each refuses what the other has or is about to have.
// (The core tables check the class too, but each holds one class and cannot see the
// other, so that check never fires: see core.Locks.Acquire.)
type classes struct {
	l       *Leader
	pending map[string]int // correctness acquires being proposed, by name
	// askName and askHeld are a question to the replicated state and its answer, asked
	// through askHas, which is made once so that asking allocates nothing on the
	// efficiency fast path.
	askName string
	askHeld bool
	askHas  func(*core.State)
}

func (c *classes) init(l *Leader) {
	c.l = l
	c.pending = make(map[string]int)
	c.askHas = func(s *core.State) { c.askHeld = s.Locks().Has(c.askName) }
}

// claimLocked checks that name may be acquired as class. A correctness claim then counts
// as pending until settleLocked, which its proposer calls once the commit's outcome is
// known, whatever it is; an efficiency claim holds nothing (the grant that follows under
// the same hold of Leader.mu puts the name in the efficiency table).
func (c *classes) claimLocked(name string, class core.Class) error {
	var other core.Class
	switch class {
	case core.Correctness:
		if c.inMemoryLocked(name) {
			other = core.Efficiency
		}
	case core.Efficiency:
		if c.pending[name] > 0 || c.replicatedLocked(name) {
			other = core.Correctness
		}
	}
	if other != core.ClassUnspecified {
		return fmt.Errorf("%w: %q is in use as %s", core.ErrClassConflict, name, other)
	}
	if class == core.Correctness {
		c.pending[name]++
	}
	return nil
}

// settleLocked ends a correctness claim.
func (c *classes) settleLocked(name string) {
	if c.pending[name]--; c.pending[name] <= 0 {
		delete(c.pending, name)
	}
}

// inMemoryLocked reports whether name is in use as efficiency: released, force-released
// and described from the efficiency table, never through the log.
func (c *classes) inMemoryLocked(name string) bool { return c.l.eff.Has(name) }

// servedInMemoryLocked reports whether name has been in use as efficiency in this
// epoch: it is now (inMemoryLocked), or the efficiency ledger still keeps a tenure of
// it. History shows the efficiency ledger of such a name (EfficiencyHistory) after the
// replicated one, which it shows for every name: a name may have been used in both
// classes, one after the other.
func (c *classes) servedInMemoryLocked(name string) bool {
	return c.inMemoryLocked(name) || c.l.effLedger.Has(name)
}

// replicatedLocked reports whether the replicated table has name.
func (c *classes) replicatedLocked(name string) bool {
	c.askName = name
	c.l.log.Read(c.askHas)
	held := c.askHeld
	c.askName = ""
	return held
}
