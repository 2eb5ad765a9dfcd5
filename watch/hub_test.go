package watch

import (
	"errors"
	"fmt"
	"runtime"
	"testing"

	"github.com/leasehold/leasehold/core"
)

func acquired(name string, tok uint64) core.Event {
	return core.Event{Kind: core.EventAcquired, Name: name, Class: core.Correctness, Token: tok, Holder: core.Holder{Host: "worker-7.example", PID: 4242}}
}

// readAll reads c to the end of what h holds.
func readAll(t *testing.T, h *Hub, c *Cursor, prefix string) []Event {
	t.Helper()
	var out []Event
	for {
		evs, wait, err := h.Read(c, prefix, make([]Event, 0, 3))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, evs...)
		if wait != nil {
			return out
		}
	}
}

// TestHubOrderAndResume: events come in revision order, each once, filtered by prefix;
// a cursor resumed at the revision after the last event read goes on where it stopped.
func TestHubOrderAndResume(t *testing.T) {
	h := NewHub(100)
	var now Cursor
	if evs, wait, _ := h.Read(&now, "", nil); len(evs) != 0 || wait == nil || now.Started() {
		t.Fatalf("an empty hub that has seen no entry: %v %v started %v", evs, wait, now.Started())
	}
	h.Entry(3, []core.Event{acquired("a/1", 1), acquired("b/1", 2)})
	h.Publish(acquired("a/2", 3), "ep")
	h.Entry(5, nil)
	h.Entry(6, []core.Event{acquired("a/3", 4)})
	all := readAll(t, h, &Cursor{rev: Revision{}, set: true}, "a/")
	want := []Revision{{3, 0}, {3, 2}, {6, 0}}
	if len(all) != len(want) {
		t.Fatalf("got %v", all)
	}
	for i, e := range all {
		if e.Rev != want[i] {
			t.Fatalf("event %d at %v, want %v", i, e.Rev, want[i])
		}
	}
	if all[1].Epoch != "ep" {
		t.Fatalf("the leader's event lost its epoch: %+v", all[1])
	}
	resumed := At(all[0].Rev.Next())
	if rest := readAll(t, h, &resumed, "a/"); len(rest) != 2 || rest[0].Rev != all[1].Rev {
		t.Fatalf("resumed after %v: %v", all[0].Rev, rest)
	}
	// "Now" starts after what is there.
	readAll(t, h, &now, "")
	h.Entry(7, []core.Event{acquired("a/4", 5)})
	if evs := readAll(t, h, &now, ""); len(evs) != 1 || evs[0].Rev != (Revision{7, 0}) {
		t.Fatalf("a cursor started now read %v", evs)
	}
}

// TestHubCompacted: beyond the retention the oldest events go; a cursor below them
// fails naming the oldest revision held, and a restore starts the history anew.
func TestHubCompacted(t *testing.T) {
	h := NewHub(3)
	for i := range 5 {
		h.Entry(uint64(10+i), []core.Event{acquired("x", uint64(i+1))})
	}
	c := At(Revision{Index: 10})
	_, _, err := h.Read(&c, "", nil)
	var ce *CompactedError
	if !errors.As(err, &ce) || !errors.Is(err, ErrCompacted) || ce.Oldest != (Revision{12, 0}) {
		t.Fatalf("read below the retention: %v", err)
	}
	ok := At(Revision{Index: 12})
	if evs := readAll(t, h, &ok, ""); len(evs) != 3 {
		t.Fatalf("read at the oldest revision held: %v", evs)
	}
	h.Reset()
	h.Entry(40, []core.Event{acquired("x", 9)})
	after := At(Revision{Index: 20})
	if _, _, err := h.Read(&after, "", nil); !errors.As(err, &ce) || ce.Oldest != (Revision{40, 0}) {
		t.Fatalf("read from before a restore: %v, want compacted at 40.0", err)
	}
}

// TestRetainedEventBytes measures what one retained event costs (docs/OPERATIONS.md):
// a full hub of events with a 16-byte name and a holder description.
func TestRetainedEventBytes(t *testing.T) {
	const n = 100_000
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	h := NewHub(n)
	for i := range n {
		e := acquired(fmt.Sprintf("orders/%09d", i), uint64(i))
		e.Holder.Host = fmt.Sprintf("worker-%d.example", i%100) // strings of their own, as decoded commands have
		h.Entry(uint64(i+1), []core.Event{e})
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	per := float64(after.HeapAlloc-before.HeapAlloc) / n
	t.Logf("%.0f bytes per retained event (%d events: %.1f MB)", per, n, per*n/1e6)
	runtime.KeepAlive(h)
}
