package client_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/internal/testnode"
)

// term is one call of an Elect function: its epoch, and when it ran.
type term struct {
	who        string
	epoch      uint64
	start, end time.Time
}

// candidate runs Elect on c in the background; each leadership is recorded in terms
// and announced on led, and its function returns when done is told to.
type candidate struct {
	who  string
	led  chan client.Leadership
	done chan struct{} // a receive ends the current term's function (nil error)
	out  chan error    // Elect's return
}

func campaign(ctx context.Context, c *client.Client, who string, mu *sync.Mutex, terms *[]term, opts ...client.ElectOption) *candidate {
	cd := &candidate{who: who, led: make(chan client.Leadership, 4), done: make(chan struct{}), out: make(chan error, 1)}
	go func() {
		cd.out <- c.Elect(ctx, "svc", []byte(who), func(ctx context.Context, l client.Leadership) error {
			t := term{who: who, epoch: l.Epoch(), start: time.Now()}
			cd.led <- l
			var err error
			select {
			case <-ctx.Done():
				err = ctx.Err()
			case <-cd.done:
			}
			t.end = time.Now()
			mu.Lock()
			*terms = append(*terms, t)
			mu.Unlock()
			return err
		}, opts...)
	}()
	return cd
}

func leads(t *testing.T, cd *candidate) client.Leadership {
	t.Helper()
	select {
	case l := <-cd.led:
		return l
	case <-time.After(10 * time.Second):
		t.Fatalf("%s does not lead", cd.who)
		return nil
	}
}

func notLeading(t *testing.T, cds ...*candidate) {
	t.Helper()
	for _, cd := range cds {
		select {
		case l := <-cd.led:
			t.Fatalf("%s leads (epoch %d) while another does", cd.who, l.Epoch())
		case <-time.After(300 * time.Millisecond):
		}
	}
}

// TestElect (G8): candidates lead one at a time, FIFO, each with a higher epoch; Leader
// shows the leader's value and Proclaim changes it; a leader whose function returns
// resigns and the next leads at once; a leader whose connection breaks (with
// ElectReleaseOnDisconnect) loses the leadership — its function's ctx says
// ErrDisconnected — and campaigns again behind the others.
func TestElect(t *testing.T) {
	n := testnode.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dial := func() *client.Client {
		c, err := client.Dial(ctx, n.Addr(), client.WithTTL(30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close(context.Background()) })
		return c
	}
	ca, cb, cc := dial(), dial(), dial()
	var mu sync.Mutex
	var terms []term

	// An observer on its own client sees every change, once, in order.
	type seen struct {
		epoch uint64
		value string
		ok    bool
	}
	events := make(chan seen, 64)
	octx, ostop := context.WithCancel(context.Background())
	defer ostop()
	co := dial()
	go func() {
		_ = co.Observe(octx, "svc", func(l client.ElectionLeader, ok bool) error {
			events <- seen{l.Epoch, string(l.Value), ok}
			return nil
		})
	}()
	if first := <-events; first.ok {
		t.Fatalf("Observe before anyone campaigns: %+v, want nobody", first)
	}

	a := campaign(ctx, ca, "a", &mu, &terms)
	la := leads(t, a)
	b := campaign(ctx, cb, "b", &mu, &terms, client.ElectReleaseOnDisconnect)
	notLeading(t, b)
	c := campaign(ctx, cc, "c", &mu, &terms)
	notLeading(t, c)

	ld, ok, err := ca.Leader(ctx, "svc")
	if err != nil || !ok || ld.Epoch != la.Epoch() || string(ld.Value) != "a" {
		t.Fatalf("Leader = %+v %v %v, want a's epoch %d and value", ld, ok, err, la.Epoch())
	}
	if err := la.Proclaim(ctx, []byte("a2")); err != nil {
		t.Fatal(err)
	}
	if ld, _, _ := cc.Leader(ctx, "svc"); string(ld.Value) != "a2" {
		t.Fatalf("value after Proclaim %q", ld.Value)
	}

	a.done <- struct{}{} // a's work is done: it resigns, Elect returns nil
	if err := <-a.out; err != nil {
		t.Fatalf("Elect of a = %v", err)
	}
	lb := leads(t, b)
	if lb.Epoch() <= la.Epoch() {
		t.Fatalf("G8: epoch %d after %d", lb.Epoch(), la.Epoch())
	}
	if err := la.Proclaim(ctx, []byte("late")); !errors.Is(err, client.ErrLockLost) {
		t.Fatalf("Proclaim after resigning = %v, want ErrLockLost", err)
	}

	client.BreakFastLaneForTest(cb) // b's connection breaks: the server revokes at once
	select {
	case <-lb.Context().Done():
	case <-time.After(2 * time.Second):
		t.Fatal("b's leadership context is alive 2s after its connection broke")
	}
	if cause := context.Cause(lb.Context()); !errors.Is(cause, client.ErrDisconnected) {
		t.Fatalf("cause %v, want ErrDisconnected", cause)
	}
	lc := leads(t, c)
	if lc.Epoch() <= lb.Epoch() {
		t.Fatalf("G8: epoch %d after %d", lc.Epoch(), lb.Epoch())
	}
	notLeading(t, b) // b campaigns again, behind c
	c.done <- struct{}{}
	lb2 := leads(t, b)
	if lb2.Epoch() <= lc.Epoch() {
		t.Fatalf("G8: epoch %d after %d", lb2.Epoch(), lc.Epoch())
	}
	cancel() // b told to stop
	if err := <-b.out; !errors.Is(err, context.Canceled) {
		t.Fatalf("Elect of b after its ctx ended = %v", err)
	}
	ctx = context.Background()

	want := []seen{{la.Epoch(), "a", true}, {la.Epoch(), "a2", true}, {lb.Epoch(), "b", true}, {lc.Epoch(), "c", true}, {lb2.Epoch(), "b", true}, {lb2.Epoch(), "", false}}
	for i, w := range want {
		select {
		case got := <-events:
			if got != w {
				t.Fatalf("Observe change %d = %+v, want %+v (all: %+v)", i, got, w, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("Observe: change %d (%+v) not seen", i, w)
		}
	}
	select {
	case got := <-events:
		t.Fatalf("Observe: a change too many: %+v", got)
	case <-time.After(300 * time.Millisecond):
	}

	mu.Lock()
	defer mu.Unlock()
	for i := 1; i < len(terms); i++ {
		prev, cur := terms[i-1], terms[i]
		if cur.epoch <= prev.epoch {
			t.Fatalf("G8: epochs go back: %+v then %+v", prev, cur)
		}
		// Only the disconnected term may overlap the next, by the G7 window: the server
		// revoked at once, the client noticed at its next probe of the connection.
		if over := prev.end.Sub(cur.start); over > 0 && (prev.epoch != lb.Epoch() || over > time.Second) {
			t.Fatalf("terms overlap by %v: %+v then %+v", over, prev, cur)
		}
	}
	if len(terms) != 4 {
		t.Fatalf("%d terms, want 4 (a, b, c, b): %+v", len(terms), terms)
	}
}
