package leader

import (
	"time"

	"github.com/leasehold/leasehold/core"
)

// The efficiency ledger: the last tenures of the efficiency locks this node has served
// in its current epoch, kept in its memory beside the table (a core.Ledger, bounded as
// the replicated one: Limits.LedgerPerLock and LedgerTotal), fed with the table's events
// (recordLocked) and never written to the log. A new epoch starts it empty, as it
// starts the table empty; Demote drops it. What an earlier leader's epoch held is lost
// with that leader, and History says so (EfficiencyHistory.Lost).

// EfficiencyHistory is what the leader knows of an efficiency lock's past.
type EfficiencyHistory struct {
	// Epoch is this leader's efficiency epoch, and Since the wall-clock time it began
	// serving: its efficiency ledger starts then.
	Epoch string
	Since time.Time
	// Lost reports that efficiency tenures before Since may have existed and are
	// unknown: they were in an earlier leader's memory. It is false only when no token
	// at all had been issued before this leader began serving (a new cluster's first
	// leader), when nothing can have been lost.
	Lost bool
	// Served reports that the name has been in use as efficiency in this epoch
	// (classes.servedInMemoryLocked); when false, this leader knows nothing of the name
	// as an efficiency lock and Tenures is empty.
	Served bool
	// Tenures are the name's tenures in this epoch, oldest first (at most
	// Limits.LedgerPerLock of them), then its holds still open (End 0).
	Tenures []core.Tenure
}

// EfficiencyHistory returns efficiency lock name's history on this leader (see
// EfficiencyHistory). It fails with ErrNotLeader when this node does not serve: the
// efficiency ledger is the leader's, and only it can answer.
func (l *Leader) EfficiencyHistory(name string) (EfficiencyHistory, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.active {
		return EfficiencyHistory{}, ErrNotLeader
	}
	h := EfficiencyHistory{Epoch: l.epoch, Since: l.since, Lost: l.lostSome, Served: l.names.servedInMemoryLocked(name)}
	if h.Served {
		h.Tenures = l.effLedger.History(name, l.eff)
	}
	return h, nil
}
