package client_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/internal/testnode"
)

// TestExplainedAnswers: a try-once or timed-out Lock of a held lock fails with a
// HeldError that says who holds it (token, holder, since when for a correctness lock),
// how many wait and where the caller stood, and why — alike over the fast lane and
// over Connect, for both classes.
func TestExplainedAnswers(t *testing.T) {
	n := testnode.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dialWith := func(opts ...client.Option) *client.Client {
		c, err := client.Dial(ctx, n.Addr(), opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close(context.Background()) })
		return c
	}
	holder := dialWith(client.WithHolder(client.Holder{Note: "the holder"}))
	for _, tr := range []struct {
		name string
		opts []client.Option
	}{{"fastlane", nil}, {"connect", []client.Option{client.WithoutFastLane()}}} {
		for _, class := range []struct {
			name string
			opt  client.LockOption
		}{{"correctness", client.Correctness}, {"efficiency", client.Efficiency}} {
			name := fmt.Sprintf("explain/%s/%s", tr.name, class.name)
			before := time.Now().Add(-10 * time.Millisecond)
			held, err := holder.Lock(ctx, name, class.opt)
			if err != nil {
				t.Fatal(err)
			}
			caller := dialWith(tr.opts...)
			heldErr := func(what string, err error) *client.HeldError {
				t.Helper()
				var he *client.HeldError
				if !errors.As(err, &he) || !errors.Is(err, client.ErrNotAcquired) {
					t.Fatalf("%s %s: %v, want a *HeldError", name, what, err)
				}
				if len(he.Holders) != 1 || he.Holders[0].Token != held.Token() || he.Holders[0].Holder.Note != "the holder" {
					t.Fatalf("%s %s: holders %+v, want token %d of the holder", name, what, he.Holders, held.Token())
				}
				if since := he.Holders[0].Since; since.Before(before) || since.After(time.Now()) {
					t.Fatalf("%s %s: held since %v, want the grant's time", name, what, since)
				}
				return he
			}
			// Try once: held, nobody waiting, the caller not queued.
			_, err = caller.Lock(ctx, name, class.opt, client.TryOnce)
			if he := heldErr("try-once", err); he.Reason != "held" || he.QueueLength != 0 || he.Position != 0 {
				t.Fatalf("%s try-once: %+v", name, he)
			}
			// In the other mode.
			_, err = caller.Lock(ctx, name, class.opt, client.Shared, client.TryOnce)
			if he := heldErr("shared try-once", err); he.Reason != "mode_conflict" || !strings.Contains(err.Error(), "other mode") {
				t.Fatalf("%s shared try-once: %+v (%v)", name, he, err)
			}
			// A wait that runs out behind another waiter: the caller was second of two.
			first := dialWith(tr.opts...)
			waiting := make(chan error, 1)
			go func() {
				_, err := first.Lock(ctx, name, class.opt, client.WaitFor(3*time.Second))
				waiting <- err
			}()
			time.Sleep(300 * time.Millisecond) // first is queued
			_, err = caller.Lock(ctx, name, class.opt, client.WaitFor(500*time.Millisecond))
			he := heldErr("timed-out wait", err)
			if he.Reason != "held" || he.QueueLength != 2 || he.Position != 2 || !strings.Contains(err.Error(), "this caller was number 2") {
				t.Fatalf("%s timed-out wait: %+v (%v)", name, he, err)
			}
			if err := held.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-waiting; err != nil {
				t.Fatalf("%s: the first waiter: %v", name, err)
			}
		}
	}
}
