package client_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/leasehold/leasehold/client"
)

var lockClasses = []struct {
	name  string
	class client.LockOption
}{{"efficiency", client.Efficiency}, {"correctness", client.Correctness}}

// TestSharedAndSemaphore: Shared holders hold together, each with its own token; a
// writer waits for them, and a reader that comes after the waiting writer waits too; a
// Semaphore lets n in; asking for a name as another kind is ErrModeConflict.
func TestSharedAndSemaphore(t *testing.T) {
	_, c, ctx := startClient(t)
	defer c.Close(ctx)
	for _, tc := range lockClasses {
		t.Run(tc.name, func(t *testing.T) {
			name := "modes/" + tc.name
			a, b, w, late := c.NewSession(), c.NewSession(), c.NewSession(), c.NewSession()
			ra, err := a.Lock(ctx, name, tc.class, client.Shared)
			if err != nil {
				t.Fatal(err)
			}
			rb, err := b.Lock(ctx, name, tc.class, client.Shared)
			if err != nil || rb.Token() <= ra.Token() {
				t.Fatalf("second reader: %v, %v", rb, err)
			}
			if again, err := a.Lock(ctx, name, tc.class, client.Shared, client.TryOnce); err != nil || again.Token() != ra.Token() {
				t.Fatalf("the reader again: %v, %v; want its grant %d", again, err, ra.Token())
			}
			if _, err := w.Lock(ctx, name, tc.class, client.Semaphore(2)); !errors.Is(err, client.ErrModeConflict) {
				t.Fatalf("a semaphore over a readers-writer lock: %v, want ErrModeConflict", err)
			}
			info, err := c.Describe(ctx, name)
			if err != nil || len(info.GetHolders()) != 2 {
				t.Fatalf("Describe: %v, %v", info, err)
			}
			granted := make(chan *client.Lock, 1)
			go func() {
				l, err := w.Lock(ctx, name, tc.class)
				if err != nil {
					t.Error(err)
				}
				granted <- l
			}()
			waitFor(t, func() bool { info, _ := c.Describe(ctx, name); return info.GetWaiters() == 1 })
			if _, err := late.Lock(ctx, name, tc.class, client.Shared, client.TryOnce); !errors.Is(err, client.ErrNotAcquired) {
				t.Fatalf("a reader behind a waiting writer: %v, want ErrNotAcquired", err)
			}
			if err := ra.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			if err := rb.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			lw := <-granted
			if lw == nil || lw.Token() <= rb.Token() {
				t.Fatalf("the writer: %v", lw)
			}
			if err := lw.Unlock(ctx); err != nil {
				t.Fatal(err)
			}

			sem := name + "/pool"
			s1, err := a.Lock(ctx, sem, tc.class, client.Semaphore(2))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := b.Lock(ctx, sem, tc.class, client.Semaphore(2)); err != nil {
				t.Fatal(err)
			}
			if _, err := late.Lock(ctx, sem, tc.class, client.Semaphore(2), client.TryOnce); !errors.Is(err, client.ErrNotAcquired) {
				t.Fatalf("a third holder of a semaphore of 2: %v", err)
			}
			if err := s1.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := late.Lock(ctx, sem, tc.class, client.Semaphore(2), client.TryOnce); err != nil {
				t.Fatalf("a holder after a slot was freed: %v", err)
			}
			for _, s := range []*client.Session{a, b, w, late} {
				_ = s.Close(ctx)
			}
		})
	}
}

// TestLockSet: a LockSet holds all its names under one token; one Unlock frees them all;
// a set that overlaps what its holder has is ErrSetConflict; a set with a held name
// says which; losing one name (an operator's force release) ends the set's Context.
func TestLockSet(t *testing.T) {
	_, c, ctx := startClient(t)
	defer c.Close(ctx)
	for _, tc := range lockClasses {
		t.Run(tc.name, func(t *testing.T) {
			p := "sets/" + tc.name + "/"
			a, b := c.NewSession(), c.NewSession()
			set, err := a.LockSet(ctx, []string{p + "b", p + "a", p + "c"}, tc.class, client.LockTTL(time.Second))
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(set.Names(), []string{p + "a", p + "b", p + "c"}) || set.Name() != p+"a" {
				t.Fatalf("Names %v, Name %q", set.Names(), set.Name())
			}
			for _, n := range set.Names() {
				if info, err := c.Describe(ctx, n); err != nil || info.GetToken() != set.Token() {
					t.Fatalf("%s: %v, %v; want held under %d", n, info, err, set.Token())
				}
			}
			if _, err := a.LockSet(ctx, []string{p + "c", p + "d"}, tc.class, client.LockTTL(time.Second)); !errors.Is(err, client.ErrSetConflict) {
				t.Fatalf("an overlapping set of the same holder: %v, want ErrSetConflict", err)
			}
			var held *client.HeldError
			if _, err := b.LockSet(ctx, []string{p + "z", p + "c"}, tc.class, client.TryOnce); !errors.As(err, &held) || held.Name != p+"c" || held.HolderToken != set.Token() {
				t.Fatalf("a set with a held name: %v, want a HeldError on %sc under %d", err, p, set.Token())
			}
			if err := set.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			if info, _ := c.Describe(ctx, p+"c"); info.GetHeld() {
				t.Fatalf("%sc held after the set's Unlock", p)
			}
			if _, err := c.LockSet(ctx, nil, tc.class); !errors.Is(err, client.ErrNoNames) {
				t.Fatalf("LockSet of no names: %v", err)
			}

			set, err = b.LockSet(ctx, []string{p + "x", p + "y"}, tc.class, client.LockTTL(time.Second))
			if err != nil {
				t.Fatal(err)
			}
			if _, _, err := c.ForceRelease(ctx, p+"y", "test"); err != nil {
				t.Fatal(err)
			}
			select {
			case <-set.Context().Done():
			case <-time.After(5 * time.Second):
				t.Fatal("the set's Context survived the force release of one of its names")
			}
			if err := context.Cause(set.Context()); !errors.Is(err, client.ErrReleasedByOperator) {
				t.Fatalf("cause %v, want ErrReleasedByOperator", err)
			}
			if info, _ := c.Describe(ctx, p+"x"); info.GetHeld() {
				t.Fatalf("%sx still held after the force release of its set", p)
			}
			_ = a.Close(ctx)
			_ = b.Close(ctx)
		})
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
