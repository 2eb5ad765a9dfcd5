package client_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/api/leasehold/v1/leaseholdv1connect"
	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/internal/clustertest"
	"github.com/leasehold/leasehold/internal/testnode"
	"github.com/leasehold/leasehold/server"
	"github.com/leasehold/leasehold/service"
)

// fromStart is a revision below every entry: a watch from the start of the history.
var fromStart = &leaseholdv1.Revision{Index: 1}

// watcher collects a Watch's events in the background.
type watcher struct {
	mu     sync.Mutex
	events []*leaseholdv1.WatchEvent
	err    error
	done   chan struct{}
	cancel context.CancelFunc
}

func startWatch(t *testing.T, c *client.Client, prefix string, opts ...client.WatchOption) *watcher {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &watcher{done: make(chan struct{}), cancel: cancel}
	go func() {
		defer close(w.done)
		for e, err := range c.Watch(ctx, prefix, opts...) {
			w.mu.Lock()
			if err != nil {
				w.err = err
			} else {
				w.events = append(w.events, e)
			}
			w.mu.Unlock()
		}
	}()
	t.Cleanup(func() { cancel(); <-w.done })
	return w
}

// until waits for cond over the events collected so far, and returns them.
func (w *watcher) until(t *testing.T, what string, cond func([]*leaseholdv1.WatchEvent) bool) []*leaseholdv1.WatchEvent {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		w.mu.Lock()
		evs, err := append([]*leaseholdv1.WatchEvent(nil), w.events...), w.err
		w.mu.Unlock()
		if cond(evs) {
			return evs
		}
		if err != nil {
			t.Fatalf("watch ended waiting for %s: %v", what, err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s; %d events", what, len(evs))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func atLeast(n int) func([]*leaseholdv1.WatchEvent) bool {
	return func(evs []*leaseholdv1.WatchEvent) bool { return len(evs) >= n }
}

func dialWatch(t *testing.T, addrs string) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, addrs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

func revLess(a, b *leaseholdv1.Revision) bool {
	return a.GetIndex() < b.GetIndex() || a.GetIndex() == b.GetIndex() && a.GetOffset() < b.GetOffset()
}

// checkHistory checks G10's order on evs: revisions strictly increase (none repeated),
// and every lock's holds begin and end in turn: an end names the token of the hold it
// ends.
func checkHistory(t *testing.T, evs []*leaseholdv1.WatchEvent) {
	t.Helper()
	held := map[string]uint64{}
	for i, e := range evs {
		if i > 0 && !revLess(evs[i-1].GetRevision(), e.GetRevision()) {
			t.Fatalf("event %d: revision %v after %v", i, e.GetRevision(), evs[i-1].GetRevision())
		}
		switch e.GetKind() {
		case leaseholdv1.EventKind_EVENT_KIND_ACQUIRED:
			if tok, ok := held[e.GetName()]; ok {
				t.Fatalf("event %d: %s acquired with token %d while held with %d", i, e.GetName(), e.GetToken(), tok)
			}
			held[e.GetName()] = e.GetToken()
		case leaseholdv1.EventKind_EVENT_KIND_RELEASED, leaseholdv1.EventKind_EVENT_KIND_EXPIRED,
			leaseholdv1.EventKind_EVENT_KIND_REVOKED, leaseholdv1.EventKind_EVENT_KIND_FORCE_RELEASED:
			if tok, ok := held[e.GetName()]; !ok || tok != e.GetToken() {
				t.Fatalf("event %d: %s %v with token %d, held with %d (%v)", i, e.GetName(), e.GetKind(), e.GetToken(), tok, ok)
			}
			delete(held, e.GetName())
		}
	}
}

// sameEvents fails unless a and b are the same events.
func sameEvents(t *testing.T, what string, a, b []*leaseholdv1.WatchEvent) {
	t.Helper()
	if len(a) != len(b) {
		t.Fatalf("%s: %d events and %d", what, len(a), len(b))
	}
	for i := range a {
		if fmt.Sprint(a[i]) != fmt.Sprint(b[i]) {
			t.Fatalf("%s: event %d differs:\n%v\n%v", what, i, a[i], b[i])
		}
	}
}

// TestWatchDirectAndForwarded: a watch on the leader and one on a follower (which opens
// the stream at the leader and relays it) see the same history, in order, each event
// once, with the tokens the lock holders got, for both classes.
func TestWatchDirectAndForwarded(t *testing.T) {
	c := clustertest.MakeCluster(t, 3, clustertest.Options{})
	lead := c.Leader()
	follower := c.Others(lead)[0]
	direct := startWatch(t, dialWatch(t, lead.Addr()), "w/", client.WatchFrom(fromStart))
	relayed := startWatch(t, dialWatch(t, follower.Addr()), "w/", client.WatchFrom(fromStart))
	user := dialWatch(t, c.Addrs())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var tokens []uint64
	for i := range 10 {
		class := client.Correctness
		if i%3 == 0 {
			class = client.Efficiency
		}
		l, err := user.Lock(ctx, fmt.Sprintf("w/%d", i%4), class)
		if err != nil {
			t.Fatal(err)
		}
		tokens = append(tokens, l.Token())
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := user.Lock(ctx, "other/x", client.Correctness); err != nil { // outside the prefix
			t.Fatal(err)
		}
	}
	locks := func(evs []*leaseholdv1.WatchEvent) []*leaseholdv1.WatchEvent {
		var out []*leaseholdv1.WatchEvent
		for _, e := range evs {
			if e.GetKind() != leaseholdv1.EventKind_EVENT_KIND_EPOCH {
				out = append(out, e)
			}
		}
		return out
	}
	enough := func(evs []*leaseholdv1.WatchEvent) bool { return len(locks(evs)) >= 2*len(tokens) }
	a := direct.until(t, "the direct watch's events", enough)
	b := relayed.until(t, "the relayed watch's events", enough)
	sameEvents(t, "direct and relayed", a, b)
	checkHistory(t, a)
	evs := locks(a)
	for i, tok := range tokens {
		acq, rel := evs[2*i], evs[2*i+1]
		if acq.GetKind() != leaseholdv1.EventKind_EVENT_KIND_ACQUIRED || acq.GetToken() != tok ||
			rel.GetKind() != leaseholdv1.EventKind_EVENT_KIND_RELEASED || rel.GetToken() != tok {
			t.Fatalf("lock %d (token %d): events %v, %v", i, tok, acq, rel)
		}
		if !strings.HasPrefix(acq.GetName(), "w/") {
			t.Fatalf("event outside the prefix: %v", acq)
		}
	}
	if evs[0].GetClass() != leaseholdv1.LockClass_LOCK_CLASS_EFFICIENCY || evs[0].GetEpoch() == "" {
		t.Fatalf("efficiency event %v: want its class and the leader's epoch", evs[0])
	}
	if a[0].GetKind() != leaseholdv1.EventKind_EVENT_KIND_EPOCH {
		t.Fatalf("first event %v: want the epoch's start before its first efficiency event", a[0])
	}
}

// TestWatchAcrossLeaderChange is G10 under load: workers take and give back correctness
// locks while the leader is cut off and a new one elected; the watch resumes by itself
// and yields, in order, every grant a worker got, none twice — the same history as an
// unbroken watch read afterwards from the new leader.
func TestWatchAcrossLeaderChange(t *testing.T) {
	c := clustertest.MakeCluster(t, 3, clustertest.Options{})
	watched := startWatch(t, dialWatch(t, c.Addrs()), "g/", client.WatchFrom(fromStart))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var (
		mu      sync.Mutex
		granted []uint64
		wg      sync.WaitGroup
	)
	stop := make(chan struct{})
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			user := dialWatch(t, c.Addrs())
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				l, err := user.Lock(ctx, fmt.Sprintf("g/%d", (w+i)%5), client.Correctness)
				if err != nil {
					if ctx.Err() != nil {
						return
					}
					continue
				}
				mu.Lock()
				granted = append(granted, l.Token())
				mu.Unlock()
				_ = l.Unlock(ctx)
			}
		}()
	}
	time.Sleep(700 * time.Millisecond)
	old := c.Leader()
	c.Partition(old)
	c.Leader(c.Others(old)...)
	time.Sleep(700 * time.Millisecond)
	c.Heal()
	time.Sleep(500 * time.Millisecond)
	close(stop)
	wg.Wait()
	mu.Lock()
	want := map[uint64]bool{}
	for _, tok := range granted {
		want[tok] = true
	}
	mu.Unlock()
	if len(want) < 20 {
		t.Fatalf("only %d grants under load", len(want))
	}
	evs := watched.until(t, "an event for every grant", func(evs []*leaseholdv1.WatchEvent) bool {
		seen := 0
		for _, e := range evs {
			if e.GetKind() == leaseholdv1.EventKind_EVENT_KIND_ACQUIRED && want[e.GetToken()] {
				seen++
			}
		}
		return seen == len(want)
	})
	checkHistory(t, evs)
	// The history is complete once every release the workers made is in it too; an
	// unbroken watch from the new leader must then read the same.
	time.Sleep(300 * time.Millisecond)
	watched.mu.Lock()
	evs = append([]*leaseholdv1.WatchEvent(nil), watched.events...)
	watched.mu.Unlock()
	lead := c.Leader()
	unbroken := startWatch(t, dialWatch(t, lead.Addr()), "g/", client.WatchFrom(fromStart))
	sameEvents(t, "resumed and unbroken", evs, unbroken.until(t, "the unbroken history", atLeast(len(evs)))[:len(evs)])
	t.Logf("%d grants, %d events; leader %s → %s", len(want), len(evs), old.ID, lead.ID)
}

// TestWatchCompacted: a start below the retained history is refused, FailedPrecondition
// "compacted", naming the oldest revision held — never served with a gap.
func TestWatchCompacted(t *testing.T) {
	n := testnode.StartWith(t, func(cfg *service.Config) { cfg.Server = server.Config{WatchRetention: 4} })
	c := dialWatch(t, n.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range 5 {
		l, err := c.Lock(ctx, fmt.Sprintf("c/%d", i), client.Correctness)
		if err != nil {
			t.Fatal(err)
		}
		_ = l.Unlock(ctx)
	}
	for e, err := range c.Watch(ctx, "", client.WatchFrom(fromStart)) {
		if err == nil {
			t.Fatalf("watch from the start of a 4-event history yielded %v", e)
		}
		if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "oldest revision held is") {
			t.Fatalf("watch below the history: %v, want FailedPrecondition naming the oldest revision held", err)
		}
		var ce *connect.Error
		if !errors.As(err, &ce) {
			t.Fatalf("%v is not a *connect.Error", err)
		}
		break
	}
}

// TestWatchEndsAtShutdown: a node that shuts down ends its Watch streams at once with
// Unavailable "shutting_down" (so the watcher resumes at another node) instead of
// holding its graceful shutdown for the whole deadline.
func TestWatchEndsAtShutdown(t *testing.T) {
	n := testnode.Start(t)
	locks := leaseholdv1connect.NewLockServiceClient(http.DefaultClient, "http://"+n.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := locks.Watch(ctx, &leaseholdv1.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if !st.Receive() { // the first answer: the stream stands
		t.Fatalf("no first answer: %v", st.Err())
	}
	ended := make(chan error, 1)
	go func() {
		for st.Receive() {
		}
		ended <- st.Err()
	}()
	start := time.Now()
	if err := n.Close(ctx); err != nil {
		t.Fatalf("close: %v", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("close took %v with a watch open", took)
	}
	err = <-ended
	var ce *connect.Error
	if !errors.As(err, &ce) || ce.Code() != connect.CodeUnavailable || !strings.Contains(err.Error(), "shutting down") {
		t.Fatalf("the stream ended with %v, want Unavailable shutting_down", err)
	}
}
