package main

import (
	"strings"
	"testing"

	"github.com/leasehold/leasehold/bench/internal/run"
)

// TestMedianRounds: each system and scenario keeps its round of median pairs/s (a
// failed round never counts), rows stay in first-seen order, and the note lists every
// round; one round is passed through unchanged, with no note.
func TestMedianRounds(t *testing.T) {
	r := func(sys, sc string, pps float64, failed string) run.Result {
		return run.Result{System: sys, Scenario: sc, PairsPerSec: pps, Failed: failed}
	}
	rounds := [][]run.Result{
		{r("a", "x", 300, ""), r("a", "y", 10, ""), r("b", "x", 5, "")},
		{r("a", "x", 100, ""), r("a", "y", 0, "boom"), r("b", "x", 7, "")},
		{r("a", "x", 200, ""), r("a", "y", 30, ""), r("b", "x", 6, "")},
	}
	kept, note := medianRounds(rounds)
	want := []struct {
		sys, sc string
		pps     float64
	}{{"a", "x", 200}, {"a", "y", 10}, {"b", "x", 6}}
	if len(kept) != len(want) {
		t.Fatalf("kept %d rows, want %d", len(kept), len(want))
	}
	for i, w := range want {
		if k := kept[i]; k.System != w.sys || k.Scenario != w.sc || k.PairsPerSec != w.pps || k.Failed != "" {
			t.Errorf("row %d: %s %s %.0f %q, want %s %s %.0f", i, k.System, k.Scenario, k.PairsPerSec, k.Failed, w.sys, w.sc, w.pps)
		}
	}
	for _, s := range []string{"3 times", "a x: 300, 100, 200", "a y: 10, failed, 30", "b x: 5, 7, 6"} {
		if !strings.Contains(note, s) {
			t.Errorf("note %q lacks %q", note, s)
		}
	}

	one, note := medianRounds(rounds[1:2])
	if note != "" || len(one) != 3 || one[1].Failed != "boom" {
		t.Fatalf("one round: %+v, note %q; want the round as it was and no note", one, note)
	}
}

// TestBusy: a load average above 0.5 marks a run NOISY; an unreadable one does not.
func TestBusy(t *testing.T) {
	for in, want := range map[string]bool{"0.42 0.30 0.25": false, "0.50 1 1": false, "0.51 0 0": true, "12.71 9.02 7.35": true, "": false, "x": false} {
		if _, got := busy(in); got != want {
			t.Errorf("busy(%q) = %v, want %v", in, got, want)
		}
	}
}
