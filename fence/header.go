package fence

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Wire format of a fencing token.
//
// Over HTTP a fenced request carries exactly one header
//
//	Fencing-Token: <lock>=<token>
//
// for example "Fencing-Token: orders/42=34". Over gRPC and Connect the same value travels
// in the metadata key "fencing-token" (HTTP/2 and gRPC lowercase header names; it is the
// same header). The lock part is 1 to MaxLockLen bytes of ASCII letters, digits and
// . _ - / : @ + (no '=', no spaces, no control characters, no other bytes); the token part
// is a decimal number from 1 to 18446744073709551615 written without sign and without
// leading zeros. The whole value is at most MaxHeaderLen bytes.
const (
	// HeaderName is the HTTP header that carries a fencing token.
	HeaderName = "Fencing-Token"
	// MetadataKey is the gRPC/Connect metadata key that carries a fencing token. It names
	// the same header as HeaderName.
	MetadataKey = "fencing-token"
	// MaxLockLen is the longest lock name, in bytes, that a header may carry. It equals
	// the lock service's limit on lock names.
	MaxLockLen = 256
	// MaxHeaderLen is the longest header value, in bytes, that ParseHeader accepts.
	MaxHeaderLen = 300
)

// FormatHeader returns the header value carrying token for lock, "<lock>=<token>".
// It does not validate: a lock name outside the allowed characters or token 0 yields a
// value that ParseHeader (and so every server using this package) rejects. Lock names
// issued by the leasehold lock service always format to a valid value.
func FormatHeader(lock string, token uint64) string {
	return lock + "=" + strconv.FormatUint(token, 10)
}

// ParseHeader parses a header value written by FormatHeader. Every error wraps
// ErrMalformedToken and says what is wrong, for example
// `fence: malformed fencing token: token "-1" is not a positive integer`. It never panics,
// whatever v holds.
func ParseHeader(v string) (lock string, token uint64, err error) {
	if len(v) > MaxHeaderLen {
		return "", 0, malformed("value is %d bytes, the limit is %d", len(v), MaxHeaderLen)
	}
	if v == "" {
		return "", 0, malformed("value is empty")
	}
	lock, tok, found := strings.Cut(v, "=")
	if !found {
		return "", 0, malformed("missing '=' between lock and token in %q", v)
	}
	if err := validateLock(lock); err != nil {
		return "", 0, err
	}
	token, err = parseToken(tok)
	if err != nil {
		return "", 0, err
	}
	return lock, token, nil
}

// validateLock checks the lock part of a header value.
func validateLock(lock string) error {
	if lock == "" {
		return malformed("lock name is empty")
	}
	if len(lock) > MaxLockLen {
		return malformed("lock name is %d bytes, the limit is %d", len(lock), MaxLockLen)
	}
	for i := 0; i < len(lock); i++ {
		if !lockByte(lock[i]) {
			return malformed("lock name has byte %q at offset %d; allowed are letters, digits and . _ - / : @ +", lock[i], i)
		}
	}
	return nil
}

func lockByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
		c == '.' || c == '_' || c == '-' || c == '/' || c == ':' || c == '@' || c == '+'
}

// parseToken parses the token part of a header value.
func parseToken(s string) (uint64, error) {
	if s == "" {
		return 0, malformed("token is empty")
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, malformed("token %q is not a positive integer", s)
		}
	}
	if s[0] == '0' {
		if len(s) == 1 {
			return 0, malformed("token 0 is never issued")
		}
		return 0, malformed("token %q has leading zeros", s)
	}
	t, err := strconv.ParseUint(s, 10, 64)
	if errors.Is(err, strconv.ErrRange) {
		return 0, malformed("token %q is larger than 18446744073709551615", s)
	}
	if err != nil {
		// Unreachable: s is 1 to 20 decimal digits or out of range. Kept so that a
		// future change cannot turn a parse failure into an admitted token.
		return 0, malformed("token %q: %w", s, err)
	}
	return t, nil
}

// checkFence validates a lock and token before they are sent.
func checkFence(lock string, token uint64) error {
	if err := validateLock(lock); err != nil {
		return err
	}
	return checkToken(token)
}

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrMalformedToken}, args...)...)
}
