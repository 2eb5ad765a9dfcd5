package core

import (
	"fmt"
	"unicode/utf8"
)

// Bounds on names and descriptions. They are part of the API contract.
const (
	MaxNameLen   = 256
	MaxHostLen   = 255
	MaxNoteLen   = 1024
	MaxReasonLen = 1024
)

// FieldError is an invalid request field. Field is the snake_case field name as in the
// protobuf API. It wraps ErrInvalid.
type FieldError struct {
	Field  string
	Reason string
}

func (e *FieldError) Error() string { return fmt.Sprintf("%s: %s", e.Field, e.Reason) }

// Unwrap makes FieldError match ErrInvalid.
func (e *FieldError) Unwrap() error { return ErrInvalid }

// Invalid returns a *FieldError for field.
func Invalid(field, format string, args ...any) error {
	return &FieldError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// ValidateName checks a lock name: 1 to MaxNameLen bytes of letters, digits and
// . _ - / : @ + ; not starting or ending with '/', no "//". field names the request field
// in the error.
func ValidateName(field, name string) error {
	switch {
	case name == "":
		return Invalid(field, "must not be empty")
	case len(name) > MaxNameLen:
		return Invalid(field, "is %d bytes, the limit is %d", len(name), MaxNameLen)
	case name[0] == '/' || name[len(name)-1] == '/':
		return Invalid(field, "must not start or end with '/'")
	}
	prevSlash := false
	for i := 0; i < len(name); i++ {
		c := name[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '.' || c == '_' || c == '-' || c == '/' || c == ':' || c == '@' || c == '+'
		if !ok {
			return Invalid(field, "has character %q at byte %d; allowed are letters, digits and . _ - / : @ +", rune(c), i)
		}
		if c == '/' && prevSlash {
			return Invalid(field, "must not contain \"//\"")
		}
		prevSlash = c == '/'
	}
	return nil
}

// ValidateHolder checks the sizes and encoding of a holder description.
func ValidateHolder(field string, h Holder) error {
	if len(h.Host) > MaxHostLen {
		return Invalid(field+".host", "is %d bytes, the limit is %d", len(h.Host), MaxHostLen)
	}
	if !utf8.ValidString(h.Host) {
		return Invalid(field+".host", "is not valid UTF-8")
	}
	if len(h.Note) > MaxNoteLen {
		return Invalid(field+".note", "is %d bytes, the limit is %d", len(h.Note), MaxNoteLen)
	}
	if !utf8.ValidString(h.Note) {
		return Invalid(field+".note", "is not valid UTF-8")
	}
	return nil
}

// validate checks what the state machine itself relies on. The server checks the same
// (and more: TTL bounds, wait bounds) with friendlier messages before proposing.
func (c *Command) validate() error {
	needLease := func() error {
		if c.Lease.IsZero() {
			return Invalid("lease_id", "must be set")
		}
		return nil
	}
	switch c.Op {
	case OpGrant:
		if c.TTLMillis <= 0 {
			return Invalid("ttl_ms", "must be positive")
		}
		return needLease()
	case OpRevoke, OpExpire, OpDisconnect:
		return needLease()
	case OpAcquire:
		if len(c.Names) > 0 {
			if c.Name != "" {
				return Invalid("name", "must be empty for a lock set (names)")
			}
			if err := ValidateNames("names", c.Names); err != nil {
				return err
			}
		} else if err := ValidateName("name", c.Name); err != nil {
			return err
		}
		if err := validateMode(c.Mode, c.Limit); err != nil {
			return err
		}
		if c.Class != Correctness && c.Class != Efficiency {
			return Invalid("class", "must be efficiency or correctness")
		}
		if c.DelayMillis < 0 {
			return Invalid("lock_delay_ms", "must not be negative")
		}
		if err := ValidateHolder("holder", c.Holder); err != nil {
			return err
		}
		return needLease()
	case OpRelease, OpCancelWait:
		if err := ValidateName("name", c.Name); err != nil {
			return err
		}
		return needLease()
	case OpForceRelease, OpEndDelay:
		if len(c.Reason) > MaxReasonLen {
			return Invalid("reason", "is %d bytes, the limit is %d", len(c.Reason), MaxReasonLen)
		}
		if !utf8.ValidString(c.Reason) {
			// The reason is kept in the state (LostLock) and snapshots are JSON, which
			// would not give invalid UTF-8 back byte for byte.
			return Invalid("reason", "must be valid UTF-8")
		}
		return ValidateName("name", c.Name)
	case OpPut, OpDelete:
		if err := ValidateName("key", c.Key); err != nil {
			return err
		}
		if len(c.Value) > MaxValueLen {
			return Invalid("value", "is %d bytes, the limit is %d", len(c.Value), MaxValueLen)
		}
		if c.Token != 0 {
			return ValidateName("fence.lock", c.Name)
		}
		if c.RequireHolder {
			return Invalid("fence.require_holder", "needs a fence token")
		}
		return nil
	case OpBegin, OpComplete, OpAbandon:
		return c.validateKeyOp()
	case OpGroupCreate, OpGroupJoin, OpGroupLeave, OpGroupRelease, OpGroupDrainEnd:
		return c.validateGroupOp()
	case OpCampaign, OpProclaim, OpResign, OpWithdraw:
		if err := ValidateName("name", c.Name); err != nil {
			return err
		}
		if len(c.Value) > MaxValueLen {
			return Invalid("value", "is %d bytes, the limit is %d", len(c.Value), MaxValueLen)
		}
		if err := ValidateHolder("holder", c.Holder); err != nil {
			return err
		}
		if (c.Op == OpProclaim || c.Op == OpResign) && c.Token == 0 {
			return Invalid("epoch", "must be set")
		}
		return needLease()
	case OpSetMember:
		if err := ValidateNodeID("node_id", c.Node); err != nil {
			return err
		}
		if c.FastLane != "" {
			if err := ValidateAddr("fast_lane_addr", c.FastLane); err != nil {
				return err
			}
		}
		return ValidateAddr("api_addr", c.Addr)
	case OpRemoveMember:
		return ValidateNodeID("node_id", c.Node)
	case OpSetClusterID:
		return ValidateClusterID("cluster_id", c.ClusterID)
	case OpReserve:
		if c.Count == 0 || c.Count > 1<<40 {
			return Invalid("count", "must be 1 to 2^40")
		}
		return nil
	default:
		return fmt.Errorf("%w: unknown op %d", ErrInvalid, c.Op)
	}
}
