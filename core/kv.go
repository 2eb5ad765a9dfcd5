package core

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
)

// MaxValueLen bounds a KV value.
const MaxValueLen = 32 << 10

// Entry is one key of the fenced store. An entry whose Deleted is true keeps only its
// fence, so that a stale holder cannot recreate a deleted key.
type Entry struct {
	Key        string `json:"key"`
	Value      []byte `json:"value,omitempty"`
	Version    uint64 `json:"version,omitempty"` // store revision of the last write; 0 when deleted
	FenceToken uint64 `json:"fenceToken,omitempty"`
	FenceLock  string `json:"fenceLock,omitempty"`
	Deleted    bool   `json:"deleted,omitempty"`
}

// StaleTokenError is a fenced write rejected because its token is lower than the
// highest the key has accepted. It matches ErrStaleToken.
type StaleTokenError struct {
	Key     string
	Token   uint64
	Highest uint64
}

func (e *StaleTokenError) Error() string {
	return fmt.Sprintf("core: fenced write to %q rejected: token %d is lower than the highest accepted token %d", e.Key, e.Token, e.Highest)
}

// Unwrap makes StaleTokenError match ErrStaleToken.
func (e *StaleTokenError) Unwrap() error { return ErrStaleToken }

// VersionMismatchError is a compare-and-set whose expected version did not match. It
// matches ErrVersionMismatch.
type VersionMismatchError struct {
	Key      string
	Expected uint64
	Current  uint64
}

func (e *VersionMismatchError) Error() string {
	return fmt.Sprintf("core: compare-and-set on %q failed: expected version %d, current version %d", e.Key, e.Expected, e.Current)
}

// Unwrap makes VersionMismatchError match ErrVersionMismatch.
func (e *VersionMismatchError) Unwrap() error { return ErrVersionMismatch }

// kvStore is the fenced key-value store inside State.
type kvStore struct {
	entries map[string]*Entry
	rev     uint64 // last revision assigned to a write
}

// Get returns the entry for key, or nil. Deleted entries are returned too (with their
// fence); callers check Deleted.
func (s *State) Get(key string) *Entry { return s.kv.entries[key] }

// KVRevision returns the store's last revision.
func (s *State) KVRevision() uint64 { return s.kv.rev }

// ListKV returns up to limit live entries under prefix in key order, and whether more
// matched.
func (s *State) ListKV(prefix string, limit int) ([]*Entry, bool) {
	limit = max(0, limit)
	var keys []string
	for k, e := range s.kv.entries {
		if !e.Deleted && strings.HasPrefix(k, prefix) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	truncated := len(keys) > limit
	if truncated {
		keys = keys[:limit]
	}
	out := make([]*Entry, len(keys))
	for i, k := range keys {
		out[i] = s.kv.entries[k]
	}
	return out, truncated
}

// applyWrite applies OpPut and OpDelete: the fence check, the version check, then the
// write. Result.Token carries the new version (Put) or 1 when a live key was deleted.
func (s *State) applyWrite(c Command) Result {
	e := s.kv.entries[c.Key]
	if c.Token != 0 {
		if c.Token > s.seq {
			// A token the cluster never issued (a typo, another cluster's): accepted, it
			// would raise the key's fence above every real holder's for good.
			return Result{Err: Invalid("fence.token", "%d was never issued (the last token is %d)", c.Token, s.seq)}
		}
		if e != nil && c.Token < e.FenceToken {
			return Result{Err: &StaleTokenError{Key: c.Key, Token: c.Token, Highest: e.FenceToken}}
		}
		if c.RequireHolder {
			if l := s.locks.locks.get(c.Name); l == nil || !l.held() || l.token != c.Token {
				return Result{Err: fmt.Errorf("%w: token %d is not the current holder's of %q", ErrNotHolder, c.Token, c.Name)}
			}
		}
	}
	if c.CheckVersion {
		var cur uint64
		if e != nil && !e.Deleted {
			cur = e.Version
		}
		if cur != c.Version {
			return Result{Err: &VersionMismatchError{Key: c.Key, Expected: c.Version, Current: cur}}
		}
	}
	if e == nil {
		if c.Op == OpDelete && c.Token == 0 {
			return Result{} // nothing to delete, nothing to remember
		}
		e = &Entry{Key: c.Key}
		s.kv.entries[c.Key] = e
	}
	if c.Token != 0 {
		e.FenceToken, e.FenceLock = c.Token, c.Name
	}
	if c.Op == OpDelete {
		existed := !e.Deleted && e.Version != 0
		e.Value, e.Version, e.Deleted = nil, 0, true
		if e.FenceToken == 0 {
			delete(s.kv.entries, c.Key)
		}
		if existed {
			return Result{Token: 1}
		}
		return Result{}
	}
	s.kv.rev++
	e.Value, e.Version, e.Deleted = bytes.Clone(c.Value), s.kv.rev, false
	return Result{Token: e.Version}
}
