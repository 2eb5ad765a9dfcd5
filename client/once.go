package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/internal/reason"
)

// Errors of idempotency keys (Once).
var (
	// ErrInProgress is returned by Once when another holder is doing the key's work
	// right now. The error is an *InProgressError saying who, under which token.
	ErrInProgress = errors.New("client: idempotency key in progress elsewhere")
	// ErrKeyLost is returned by Once when fn succeeded but its result could not be
	// recorded because the key was no longer this caller's: its lease ended (the holder
	// was paused or cut off past its TTL) before Complete reached the service. The work
	// may therefore be done again by the next Once of the key: fence the work's writes
	// with the token (see package fence) so that a resource refuses the older holder's
	// late writes.
	ErrKeyLost = errors.New("client: idempotency key lost before its result was recorded")
)

// InProgressError says who is doing a key's work. It matches ErrInProgress.
type InProgressError struct {
	Key    string
	Token  uint64 // the token of the Begin that has the key
	Holder Holder // as that holder described itself
}

func (e *InProgressError) Error() string {
	return fmt.Sprintf("client: idempotency key %q is in progress%s under token %d", e.Key, e.Holder.describe(), e.Token)
}

// Is makes InProgressError match ErrInProgress.
func (e *InProgressError) Is(target error) bool { return target == ErrInProgress }

// String returns "HOST pid PID (NOTE)", without the note when it is empty.
func (h Holder) String() string {
	s := fmt.Sprintf("%s pid %d", h.Host, h.PID)
	if h.Note != "" {
		s += fmt.Sprintf(" (%s)", h.Note)
	}
	return s
}

// describe returns " by " and h, or "" for an empty description.
func (h Holder) describe() string {
	if h == (Holder{}) {
		return ""
	}
	return " by " + h.String()
}

// KeyStatus is where an idempotency key stands.
type KeyStatus int

// The statuses Client.Key reports.
const (
	KeyAbsent     KeyStatus = iota // never begun, given back, or its retention ended
	KeyInProgress                  // a holder is doing the work
	KeyDone                        // the work was done; Result is stored
)

// Key is an idempotency key as the service knows it.
type Key struct {
	Status KeyStatus
	Token  uint64 // of the Begin that has, or had, the key; 0 when absent
	Holder Holder // who works on it, or who did it
	Result []byte // the stored result of a done key
}

// Key reads an idempotency key, linearizably.
func (c *Client) Key(ctx context.Context, key string) (Key, error) {
	resp, err := rpc(ctx, c, c.keys.Get, &leaseholdv1.IdempotencyServiceGetRequest{Key: key})
	if err != nil {
		return Key{}, err
	}
	k := Key{Token: resp.GetToken(), Holder: holderFrom(resp.GetHolder()), Result: resp.GetResult()}
	switch resp.GetStatus() {
	case leaseholdv1.KeyStatus_KEY_STATUS_IN_PROGRESS:
		k.Status = KeyInProgress
	case leaseholdv1.KeyStatus_KEY_STATUS_DONE:
		k.Status = KeyDone
	}
	return k, nil
}

// Once runs fn at most once for key, across every client of the cluster, and returns
// the result fn returned — now, or, when the work was done before, the result stored
// then, without running fn (guarantee G9). The key is claimed for the Client's lease
// (Begin), fn runs, and its result is stored (Complete) with the token the claim got.
//
// fn gets a context and the key's token. The context is cancelled when ctx is, and —
// like a held lock's context (G4b) — before the service can give the key to someone
// else: at the lease's cautious local deadline when keepalives go unanswered, or as
// soon as the lease is known lost; context.Cause says why. Pass the token to every
// resource fn writes to and have it check the token (package fence): a holder that was
// paused past its TTL may still be running when the key has passed to the next one.
//
// If fn returns an error, nothing is stored and the key is given back (Abandon): a
// later Once runs fn again, and Once returns fn's error unchanged. That is the IETF
// Idempotency-Key draft's reading (a request that did not complete may be retried) and
// DESIGN's: a key is done when its work is. Work that fails after it has done something
// that must not be repeated should return a result describing the failure instead of
// an error: that result is stored, and every later Once returns it. A panic in fn also
// gives the key back, and propagates.
//
// Errors: *InProgressError (matching ErrInProgress) at once when another holder has the
// key, or another Once of this Client (or Session) runs it — Once does not wait; retry
// later, or watch the key with Key. ErrKeyLost when fn
// succeeded but the key's lease ended before its result was recorded. ErrUnavailable
// when no node answered: if fn had run, whether its result was recorded is unknown (a
// later Once tells). The server's InvalidArgument for a bad key or a result above 32
// KiB (the key is then given back); ctx's error.
func (c *Client) Once(ctx context.Context, key string, fn func(ctx context.Context, token uint64) ([]byte, error)) ([]byte, error) {
	return c.once(ctx, &c.own, key, fn)
}

// Once is Client.Once on the Session's own lease.
func (s *Session) Once(ctx context.Context, key string, fn func(ctx context.Context, token uint64) ([]byte, error)) ([]byte, error) {
	return s.c.once(ctx, &s.set, key, fn)
}

func (c *Client) once(ctx context.Context, set *leaseSet, key string, fn func(context.Context, uint64) ([]byte, error)) ([]byte, error) {
	// Every Once of one holder claims the key on the same lease, and the service answers
	// a Begin repeated by the lease that has the key with the same claim (so that a retry
	// after a lost answer gets it back): Once calls of one holder for one key must
	// therefore take turns here first.
	if token, ok := set.claimKey(key); !ok {
		return nil, &InProgressError{Key: key, Token: token, Holder: c.opts.holder}
	}
	claim := &keyClaim{set: set, key: key}
	defer claim.release()
	// A claim answered after its lease's cautious deadline (a pause, a slow leader) may
	// be expiring on the server already: fn must not run under it. It is given back and
	// the key claimed once more, on a fresh lease, as Lock does with a late grant.
	for late := 0; ; late++ {
		s, resp, err := c.begin(ctx, claim)
		if err != nil {
			return nil, err
		}
		switch resp.GetStatus() {
		case leaseholdv1.KeyStatus_KEY_STATUS_DONE:
			return resp.GetResult(), nil
		case leaseholdv1.KeyStatus_KEY_STATUS_IN_PROGRESS:
			return nil, &InProgressError{Key: key, Token: resp.GetToken(), Holder: holderFrom(resp.GetHolder())}
		case leaseholdv1.KeyStatus_KEY_STATUS_NEW:
		default:
			return nil, fmt.Errorf("client: Begin of %q answered status %v", key, resp.GetStatus())
		}
		token := resp.GetToken()
		set.keyToken(key, token)
		// The key is held like a lock on the lease, so that its context ends with the lease.
		h := &Lock{c: c, s: s, name: key, token: token, class: leaseholdv1.LockClass_LOCK_CLASS_CORRECTNESS}
		h.ctx, h.cancel = context.WithCancelCause(ctx)
		if err := s.add(h); err != nil {
			h.lost(err)
			c.giveBack(claim, s, token)
			if late == 0 && ctx.Err() == nil {
				continue
			}
			return nil, fmt.Errorf("claiming %q: %w", key, err)
		}
		return c.runClaimed(ctx, claim, h, fn)
	}
}

// runClaimed runs fn under the claim h of a Once and stores its result.
func (c *Client) runClaimed(ctx context.Context, claim *keyClaim, h *Lock, fn func(context.Context, uint64) ([]byte, error)) ([]byte, error) {
	s, token := h.s, h.token
	defer func() {
		s.remove(h)
		h.lost(ErrUnlocked)
	}()

	result, err := c.run(claim, h, fn)
	if err != nil {
		c.giveBack(claim, s, token)
		return nil, err
	}
	if err := c.complete(ctx, claim, s, token, result); err != nil {
		return nil, err
	}
	return result, nil
}

// run calls fn with the key's context and token; a panic in fn gives the key back
// before it propagates.
func (c *Client) run(claim *keyClaim, h *Lock, fn func(context.Context, uint64) ([]byte, error)) ([]byte, error) {
	done := false
	defer func() {
		if !done {
			c.giveBack(claim, h.s, h.token)
		}
	}()
	result, err := fn(h.Context(), h.token)
	done = true
	return result, err
}

// begin claims key for a lease of set, retrying while no node can answer; a Begin
// repeated on the same lease returns the same claim. If it gives up after an attempt
// whose outcome is unknown, it gives the key back in the background.
func (c *Client) begin(ctx context.Context, claim *keyClaim) (*lease, *leaseholdv1.BeginResponse, error) {
	set, key := claim.set, claim.key
	h := c.opts.holder
	b := newBackoff()
	for gone := 0; ; gone++ {
		if gone > 1 && b.sleep(ctx) != nil {
			return nil, nil, ctx.Err() // fresh leases keep vanishing: not at once, then
		}
		s, err := c.leaseFor(ctx, set, leaseKind{ttl: c.opts.ttl})
		if err != nil {
			return nil, nil, err
		}
		req := &leaseholdv1.BeginRequest{Key: key, LeaseId: s.id, Holder: &leaseholdv1.Holder{Host: h.Host, Pid: h.PID, Note: h.Note}}
		resp, err := call(ctx, c, repeatable, func(ctx context.Context) (*leaseholdv1.BeginResponse, error) {
			return rpc(ctx, c, c.keys.Begin, req)
		})
		if errIsLeaseGone(err) {
			s.end(leaseGoneCause(err))
			continue // a fresh lease, at once
		}
		if err != nil {
			if ctx.Err() != nil {
				claim.abandonInBackground(c, s) // the lease may have claimed it
			}
			return nil, nil, err
		}
		return s, resp, nil
	}
}

// complete stores result for key under token, retrying while no node can answer, for
// up to the lease's TTL even when ctx has ended (the work is done: its result should
// be kept). Repeating a Complete that took effect succeeds again.
func (c *Client) complete(ctx context.Context, claim *keyClaim, s *lease, token uint64, result []byte) error {
	key := claim.key
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.ttl)
	defer cancel()
	_, err := call(ctx, c, repeatable, func(ctx context.Context) (*leaseholdv1.CompleteResponse, error) {
		return rpc(ctx, c, c.keys.Complete, &leaseholdv1.CompleteRequest{Key: key, Token: token, Result: result})
	})
	if err == nil {
		return nil
	}
	code, d := detail(err)
	switch {
	case code == connect.CodeFailedPrecondition && d.GetReason() == reason.StaleToken:
		return fmt.Errorf("%w: %q (token %d): %w", ErrKeyLost, key, token, err)
	case code == connect.CodeInvalidArgument:
		c.giveBack(claim, s, token)
		return err
	case errors.Is(err, ErrUnavailable):
		return fmt.Errorf("recording the result of %q: %w", key, err)
	}
	return fmt.Errorf("%w: recording the result of %q: %w", ErrUnavailable, key, err)
}

// giveBack abandons key under token, now or, if no node answers within a second, in
// the background, so that a failed run does not keep the key from the next one for as
// long as the Client's lease lives.
func (c *Client) giveBack(claim *keyClaim, s *lease, token uint64) {
	key := claim.key
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	_, err := call(ctx, c, repeatable, func(ctx context.Context) (*leaseholdv1.AbandonResponse, error) {
		return rpc(ctx, c, c.keys.Abandon, &leaseholdv1.AbandonRequest{Key: key, Token: token})
	})
	cancel()
	if errors.Is(err, ErrUnavailable) {
		claim.abandonInBackground(c, s)
	}
}

// keyClaim is one Once's turn at a key among the Once calls of its holder (claimKey):
// released when the Once returns, unless a background abandon (abandonKey) took it
// over — then when that ends. A Begin by the holder's lease answers the lease's own
// claim, so a later Once of the key let in while the abandon still ran would get that
// claim back, run fn under it, and have the abandon give it away beneath it.
type keyClaim struct {
	set    *leaseSet
	key    string
	handed bool // a background abandon holds the turn
}

func (k *keyClaim) release() {
	if !k.handed {
		k.set.releaseKey(k.key)
	}
}

// abandonInBackground runs abandonKey for lease s on a goroutine that holds the turn
// until it ends. Once per claim.
func (k *keyClaim) abandonInBackground(c *Client, s *lease) {
	if k.handed {
		return
	}
	k.handed = true
	go func() {
		defer k.set.releaseKey(k.key)
		c.abandonKey(s, k.key)
	}()
}

// abandonKey gives back the key lease s may have claimed by a Begin whose outcome was
// unknown: a Begin on the same lease answers the lease's own claim (NEW, with its
// token), which it then abandons. It tries while the lease lives; it stops when the key
// turns out to be someone else's or done, or on an error a retry cannot fix.
func (c *Client) abandonKey(s *lease, key string) {
	ctx, cancel := context.WithTimeout(context.Background(), s.remaining())
	defer cancel()
	resp, err := call(ctx, c, repeatable, func(ctx context.Context) (*leaseholdv1.BeginResponse, error) {
		return rpc(ctx, c, c.keys.Begin, &leaseholdv1.BeginRequest{Key: key, LeaseId: s.id})
	})
	if err != nil || resp.GetStatus() != leaseholdv1.KeyStatus_KEY_STATUS_NEW {
		return
	}
	_, _ = call(ctx, c, repeatable, func(ctx context.Context) (*leaseholdv1.AbandonResponse, error) {
		return rpc(ctx, c, c.keys.Abandon, &leaseholdv1.AbandonRequest{Key: key, Token: resp.GetToken()})
	})
}

// claimKey records that a Once of set's holder runs key, and reports false, with the
// token of that Once's claim (0 until the service answered it), when one already does.
func (set *leaseSet) claimKey(key string) (uint64, bool) {
	set.mu.Lock()
	defer set.mu.Unlock()
	if token, ok := set.keys[key]; ok {
		return token, false
	}
	if set.keys == nil {
		set.keys = make(map[string]uint64)
	}
	set.keys[key] = 0
	return 0, true
}

func (set *leaseSet) keyToken(key string, token uint64) {
	set.mu.Lock()
	defer set.mu.Unlock()
	set.keys[key] = token
}

func (set *leaseSet) releaseKey(key string) {
	set.mu.Lock()
	defer set.mu.Unlock()
	delete(set.keys, key)
}

func holderFrom(h *leaseholdv1.Holder) Holder {
	return Holder{Host: h.GetHost(), PID: h.GetPid(), Note: h.GetNote()}
}
