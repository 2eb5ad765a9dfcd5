package fence

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync"
)

// Memory is a Guard that keeps the highest accepted token of each resource in a map in
// process memory. It is safe for concurrent use. The zero value is an empty guard, ready
// to use, like the one NewMemory returns. A Memory must not be copied after first use.
//
// It fits a resource that lives in the same process and is lost with it (an in-memory
// cache, a single-process service in tests). What it forgets on restart it cannot fence:
// after a restart the first token of each resource is admitted whatever its value. For a
// resource that outlives the process, keep the highest token next to the data, for
// example with SQL inside the same transaction as the write.
//
// Memory never forgets a resource while it lives: the map grows by one entry per resource
// name ever admitted or floored (Follow floors every exclusive correctness lock under its
// prefix that is released or granted). Use it for a bounded set of resources.
type Memory struct {
	mu      sync.Mutex
	highest map[string]uint64 // resource -> highest admitted token; guarded by mu
}

// NewMemory returns an empty in-memory guard.
func NewMemory() *Memory {
	return &Memory{highest: make(map[string]uint64)}
}

// Admit admits token for resource if it is not lower than the highest token admitted for
// resource so far, and raises that highest to token. It returns a *StaleError (matching
// ErrStale) otherwise, an error wrapping ErrMalformedToken for token 0, and ctx.Err()
// unchanged if ctx is already done. The check and the raise are one atomic step, but the
// caller's write that follows is not part of it: see Middleware for what that means when
// requests overlap.
func (m *Memory) Admit(ctx context.Context, resource string, token uint64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := checkToken(token); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if highest := m.highest[resource]; token < highest {
		return &StaleError{Resource: resource, Token: token, Highest: highest}
	}
	if m.highest == nil {
		m.highest = make(map[string]uint64)
	}
	m.highest[resource] = token
	return nil
}

// Highest returns the highest token admitted for resource, and false if none was.
func (m *Memory) Highest(resource string) (uint64, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	t, ok := m.highest[resource]
	return t, ok
}

// Floor makes every token <= ended stale for resource (Floorer, for Follow): it raises
// the resource's highest token to ended+1 unless it is higher already, creating the
// resource if needed. It returns ctx.Err() unchanged if ctx is already done, and an error
// wrapping ErrMalformedToken for ended = math.MaxUint64 (no token is above it).
func (m *Memory) Floor(ctx context.Context, resource string, ended uint64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if ended == math.MaxUint64 {
		return fmt.Errorf("%w: no token is above %d", ErrMalformedToken, ended)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.highest == nil {
		m.highest = make(map[string]uint64)
	}
	if m.highest[resource] <= ended {
		m.highest[resource] = ended + 1
	}
	return nil
}

// Resources returns the resources the guard holds a token for whose name starts with
// prefix, in no particular order (Floorer, for Follow). It never fails.
func (m *Memory) Resources(_ context.Context, prefix string) ([]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for r := range m.highest {
		if strings.HasPrefix(r, prefix) {
			out = append(out, r)
		}
	}
	return out, nil
}
