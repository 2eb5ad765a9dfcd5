package client

import (
	"context"
	"errors"
	"fmt"

	"connectrpc.com/connect"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/internal/reason"
)

// Errors of the key-value store.
var (
	// ErrStaleToken is returned by a fenced Put or Delete whose token is lower than the
	// highest the key has accepted: a newer holder has written since. The error is a
	// *StaleTokenError.
	ErrStaleToken = errors.New("client: fenced write rejected: stale token")
	// ErrVersionMismatch is returned by a Put or Delete with IfVersion when the key's
	// version differs. The error is a *VersionMismatchError.
	ErrVersionMismatch = errors.New("client: compare-and-set failed: version mismatch")
	// ErrNotCurrentHolder is returned by a write with RequireHolder whose token is not
	// the lock's current holder's.
	ErrNotCurrentHolder = errors.New("client: fenced write rejected: token is not the current holder's")
)

// StaleTokenError names the rejected token and the key's highest accepted token.
type StaleTokenError struct {
	Key     string
	Token   uint64
	Highest uint64
}

func (e *StaleTokenError) Error() string {
	return fmt.Sprintf("client: write to %q with token %d rejected: the key has accepted token %d", e.Key, e.Token, e.Highest)
}

// Is makes StaleTokenError match ErrStaleToken.
func (e *StaleTokenError) Is(target error) bool { return target == ErrStaleToken }

// VersionMismatchError names the key's current version (0 when it does not exist).
type VersionMismatchError struct {
	Key     string
	Current uint64
}

func (e *VersionMismatchError) Error() string {
	return fmt.Sprintf("client: compare-and-set on %q failed: current version is %d", e.Key, e.Current)
}

// Is makes VersionMismatchError match ErrVersionMismatch.
func (e *VersionMismatchError) Is(target error) bool { return target == ErrVersionMismatch }

// Value is a key's state in the store.
type Value struct {
	Found      bool
	Data       []byte
	Version    uint64 // store revision of the last write; 0 when not found
	FenceToken uint64 // highest fence token the key accepted
	FenceLock  string
}

// WriteOption adds a condition to Put or Delete.
type WriteOption func(*writeOptions)

type writeOptions struct {
	fence     *leaseholdv1.Fence
	ifVersion *uint64
}

// Fenced makes the write carry l's name and token: the store rejects it if the key has
// accepted a higher token (a newer holder wrote), with ErrStaleToken.
func Fenced(l *Lock) WriteOption { return FencedBy(l.Name(), l.Token()) }

// FencedBy is Fenced for a token obtained elsewhere (another process, the CLI's
// LEASEHOLD_TOKEN).
func FencedBy(lock string, token uint64) WriteOption {
	return func(o *writeOptions) {
		o.fence = &leaseholdv1.Fence{Lock: lock, Token: token, RequireHolder: o.fence.GetRequireHolder()}
	}
}

// RequireHolder also rejects the write unless its fence token is the current holder's
// token of the (correctness) lock when the write is applied.
func RequireHolder(o *writeOptions) {
	if o.fence == nil {
		o.fence = &leaseholdv1.Fence{}
	}
	o.fence.RequireHolder = true
}

// IfVersion makes the write a compare-and-set: it applies only if the key's version is v
// (0: only if the key does not exist).
func IfVersion(v uint64) WriteOption { return func(o *writeOptions) { o.ifVersion = &v } }

// Get reads key, linearizably.
func (c *Client) Get(ctx context.Context, key string) (Value, error) {
	resp, err := call(ctx, c, repeatable, func(ctx context.Context) (*leaseholdv1.GetResponse, error) {
		return rpc(ctx, c, c.kv.Get, &leaseholdv1.GetRequest{Key: key})
	})
	if err != nil {
		return Value{}, err
	}
	return Value{Found: resp.GetFound(), Data: resp.GetValue(), Version: resp.GetVersion(), FenceToken: resp.GetFenceToken(), FenceLock: resp.GetFenceLock()}, nil
}

// Put writes value to key under the given conditions and returns the new version.
// Success means committed and fsynced. It is sent again, to another node, only when it
// was certainly not carried out; an error wrapping ErrUnavailable (code Unavailable)
// means the outcome is unknown.
func (c *Client) Put(ctx context.Context, key string, value []byte, opts ...WriteOption) (uint64, error) {
	var o writeOptions
	for _, opt := range opts {
		opt(&o)
	}
	resp, err := call(ctx, c, once, func(ctx context.Context) (*leaseholdv1.PutResponse, error) {
		return rpc(ctx, c, c.kv.Put, &leaseholdv1.PutRequest{Key: key, Value: value, Fence: o.fence, IfVersion: o.ifVersion})
	})
	if err != nil {
		return 0, kvError(key, o.fence, err)
	}
	return resp.GetVersion(), nil
}

// Delete removes key under the given conditions and reports whether it existed. Like
// Put, it is sent again only when it was certainly not carried out.
func (c *Client) Delete(ctx context.Context, key string, opts ...WriteOption) (bool, error) {
	var o writeOptions
	for _, opt := range opts {
		opt(&o)
	}
	resp, err := call(ctx, c, once, func(ctx context.Context) (*leaseholdv1.DeleteResponse, error) {
		return rpc(ctx, c, c.kv.Delete, &leaseholdv1.DeleteRequest{Key: key, Fence: o.fence, IfVersion: o.ifVersion})
	})
	if err != nil {
		return false, kvError(key, o.fence, err)
	}
	return resp.GetDeleted(), nil
}

// ListKV returns keys under prefix (limit 0: the server's default).
func (c *Client) ListKV(ctx context.Context, prefix string, limit int) ([]*leaseholdv1.KeyValue, bool, error) {
	resp, err := call(ctx, c, repeatable, func(ctx context.Context) (*leaseholdv1.KVServiceListResponse, error) {
		return rpc(ctx, c, c.kv.List, &leaseholdv1.KVServiceListRequest{Prefix: prefix, Limit: uint32(max(0, limit))})
	})
	return resp.GetItems(), resp.GetTruncated(), err
}

func kvError(key string, fence *leaseholdv1.Fence, err error) error {
	code, d := detail(err)
	if code != connect.CodeFailedPrecondition {
		return err
	}
	switch d.GetReason() {
	case reason.StaleToken:
		return &StaleTokenError{Key: key, Token: fence.GetToken(), Highest: d.GetHighestToken()}
	case reason.VersionMismatch:
		return &VersionMismatchError{Key: key, Current: d.GetCurrentVersion()}
	case reason.NotHolder:
		return fmt.Errorf("%w: %w", ErrNotCurrentHolder, err)
	}
	return err
}
