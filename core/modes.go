package core

import "fmt"

// Mode is how a lease asks to hold a lock.
//
// Exclusive and Shared are the two sides of one readers–writer lock: a name held
// exclusively has one holder; a name held shared has any number of holders and no
// exclusive one. Semaphore is a lock of its own kind with a limit N: up to N holders at
// once. A name is used in one kind at a time (readers–writer, or a semaphore of one
// limit) while it is held, waited for or delayed: asking for it as another kind fails
// with ErrModeConflict, as asking for it in the other class fails with
// ErrClassConflict.
//
// Every holder has a token of its own, except that the names of one lock set share
// the set's token. Queues are FIFO in every mode: a lock is granted to its queue's
// head only, so a writer queued behind readers blocks the readers that come after it
// (writers never starve), and a lease asking for a lock somebody waits for waits too.
type Mode uint8

// The modes. The numbers are part of the log and snapshot formats; Exclusive is the
// zero value, so commands and snapshots written before modes existed are exclusive.
const (
	Exclusive Mode = 0
	Shared    Mode = 1
	Semaphore Mode = 2
)

func (m Mode) String() string {
	switch m {
	case Exclusive:
		return "exclusive"
	case Shared:
		return "shared"
	case Semaphore:
		return "semaphore"
	default:
		return fmt.Sprintf("mode(%d)", m)
	}
}

// Bounds of modes and lock sets. They are part of the API contract.
const (
	// MaxSemaphoreLimit is the largest limit of a semaphore.
	MaxSemaphoreLimit = 10000
	// MaxSetNames is the most names one lock set may name.
	MaxSetNames = 64
)

// kindName describes the kind a lock of limit limit is used as, for errors.
func kindName(limit uint32) string {
	if limit == 0 {
		return "a readers-writer lock (exclusive or shared)"
	}
	return fmt.Sprintf("a semaphore of %d", limit)
}

// askedName describes what an acquire asked for, for errors.
func askedName(mode Mode, limit uint32) string {
	if mode == Semaphore {
		return fmt.Sprintf("a semaphore of %d", limit)
	}
	return mode.String()
}

// validateMode checks a mode and its limit (the fields "mode" and "limit").
func validateMode(mode Mode, limit uint32) error {
	switch mode {
	case Exclusive, Shared:
		if limit != 0 {
			return Invalid("limit", "is only for a semaphore; %s takes none", mode)
		}
	case Semaphore:
		if limit < 1 || limit > MaxSemaphoreLimit {
			return Invalid("limit", "must be 1 to %d for a semaphore, got %d", MaxSemaphoreLimit, limit)
		}
	default:
		return Invalid("mode", "must be exclusive, shared or semaphore, got %d", mode)
	}
	return nil
}

// ValidateNames checks the names of a lock set as the state machine takes them: 2 to
// MaxSetNames valid names, in strictly increasing order (so each name once). field
// names the request field in the error.
func ValidateNames(field string, names []string) error {
	if len(names) < 2 || len(names) > MaxSetNames {
		return Invalid(field, "a lock set names 2 to %d locks, got %d", MaxSetNames, len(names))
	}
	for i, n := range names {
		if err := ValidateName(field, n); err != nil {
			return err
		}
		if i > 0 && names[i-1] >= n {
			return Invalid(field, "must be in increasing order without repeats (%q then %q)", names[i-1], n)
		}
	}
	return nil
}
