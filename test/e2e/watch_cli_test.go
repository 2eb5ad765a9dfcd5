package e2e

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestCLIWatch: `leasehold watch PREFIX --output json` prints one JSON object per event
// and line, as the changes happen; `--from` replays the history from a revision, and
// the text form shows the same events.
func TestCLIWatch(t *testing.T) {
	s := StartServer(t)
	w := StartProc(t, leaseholdBin, "watch", "e2e/watch/", "--addr", s.Addr, "--output", "json")
	time.Sleep(500 * time.Millisecond) // the stream starts at the next event
	r := RunCLI(t, 15*time.Second, "lock", "e2e/watch/a", "--addr", s.Addr, "--class", "correctness", "--", "true")
	if r.Code != 0 {
		t.Fatalf("leasehold lock: exit %d, stderr %q", r.Code, r.Stderr)
	}
	type event struct {
		Revision struct {
			Index  string `json:"index"`
			Offset int    `json:"offset"`
		} `json:"revision"`
		Kind  string `json:"kind"`
		Name  string `json:"name"`
		Token string `json:"token"`
	}
	var got []event
	for _, want := range []string{"EVENT_KIND_ACQUIRED", "EVENT_KIND_RELEASED"} {
		line := w.Expect("{", 15*time.Second).Text
		var e event
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("not one JSON object: %q: %v", line, err)
		}
		if e.Kind != want || e.Name != "e2e/watch/a" || e.Token == "" {
			t.Fatalf("event %q, want %s of e2e/watch/a with its token", line, want)
		}
		got = append(got, e)
	}
	w.Kill()
	replay := StartProc(t, leaseholdBin, "watch", "--addr", s.Addr, "e2e/watch/", "--from", got[0].Revision.Index)
	want := got[0].Revision.Index + ".0\tacquired\te2e/watch/a\tcorrectness\ttoken " + got[0].Token
	if line := replay.Expect(got[0].Revision.Index+".", 15*time.Second).Text; !strings.HasPrefix(line, want) {
		t.Fatalf("leasehold watch --from %s printed %q first, want %q…", got[0].Revision.Index, line, want)
	}
	if line := replay.Expect(got[1].Revision.Index+".", 15*time.Second).Text; !strings.Contains(line, "\treleased\te2e/watch/a\t") {
		t.Fatalf("leasehold watch --from: second line %q, want the release", line)
	}
	replay.Kill()

	// The ledger of the same lock.
	h := RunCLI(t, 10*time.Second, "history", "e2e/watch/a", "--addr", s.Addr)
	if h.Code != 0 || !strings.HasPrefix(h.Stdout, "TOKEN") || !regexp.MustCompile(`(?m)^`+got[0].Token+`\s+.*\sexclusive\s.*\sreleased$`).MatchString(h.Stdout) {
		t.Fatalf("leasehold history: exit %d, stdout %q, stderr %q", h.Code, h.Stdout, h.Stderr)
	}
	h = RunCLI(t, 10*time.Second, "history", "--output", "json", "--addr", s.Addr, "e2e/watch/a")
	var ledger struct {
		Tenures []struct {
			Token string `json:"token"`
			End   string `json:"end"`
		} `json:"tenures"`
	}
	if err := json.Unmarshal([]byte(h.Stdout), &ledger); err != nil || len(ledger.Tenures) != 1 ||
		ledger.Tenures[0].Token != got[0].Token || ledger.Tenures[0].End != "TENURE_END_RELEASED" {
		t.Fatalf("leasehold history --output json: %q (%v)", h.Stdout, err)
	}
}

// TestCLIHistoryEfficiency: `leasehold history` of an efficiency lock shows the
// leader's tenures of it, with their class; after the server restarts (its memory, and
// so the efficiency ledger, gone), a line "lost with the leader" with the new leader's
// epoch comes before the new tenures, and none of the old ones; `--output json` has
// TENURE_END_LEADER_LOST.
func TestCLIHistoryEfficiency(t *testing.T) {
	s := StartServer(t)
	const name = "e2e/history/eff"
	lock := func() {
		t.Helper()
		if r := RunCLI(t, 15*time.Second, "lock", name, "--addr", s.Addr, "--class", "efficiency", "--", "true"); r.Code != 0 {
			t.Fatalf("leasehold lock: exit %d, stderr %q", r.Code, r.Stderr)
		}
	}
	type ledger struct {
		Tenures []struct {
			Token string `json:"token"`
			End   string `json:"end"`
			Class string `json:"class"`
			Epoch string `json:"epoch"`
		} `json:"tenures"`
	}
	history := func() (text string, js ledger) {
		t.Helper()
		h := RunCLI(t, 10*time.Second, "history", name, "--addr", s.Addr)
		if h.Code != 0 || !strings.HasPrefix(h.Stdout, "TOKEN") {
			t.Fatalf("leasehold history: exit %d, stdout %q, stderr %q", h.Code, h.Stdout, h.Stderr)
		}
		j := RunCLI(t, 10*time.Second, "history", "--output", "json", "--addr", s.Addr, name)
		if err := json.Unmarshal([]byte(j.Stdout), &js); err != nil {
			t.Fatalf("leasehold history --output json: %q (%v)", j.Stdout, err)
		}
		return h.Stdout, js
	}
	lock()
	text, js := history()
	if len(js.Tenures) != 1 || js.Tenures[0].End != "TENURE_END_RELEASED" || js.Tenures[0].Class != "LOCK_CLASS_EFFICIENCY" ||
		!regexp.MustCompile(`(?m)^`+js.Tenures[0].Token+`\s+.*\sexclusive\s+efficiency\s.*\sreleased$`).MatchString(text) || strings.Contains(text, "lost with the leader") {
		t.Fatalf("the first leader's efficiency ledger: %q, %+v; want one released efficiency tenure, nothing lost", text, js)
	}
	old := js.Tenures[0].Token

	s.Stop(10 * time.Second)
	s.Restart()
	lock()
	text, js = history()
	if len(js.Tenures) != 2 || js.Tenures[0].End != "TENURE_END_LEADER_LOST" || js.Tenures[0].Epoch == "" || (js.Tenures[0].Token != "" && js.Tenures[0].Token != "0") ||
		js.Tenures[1].End != "TENURE_END_RELEASED" || js.Tenures[1].Token == old || js.Tenures[1].Epoch != js.Tenures[0].Epoch {
		t.Fatalf("after a restart, --output json: %+v; want the lost-with-the-leader entry, then the new tenure only", js)
	}
	lines := strings.Split(strings.TrimSpace(text), "\n")
	if len(lines) != 3 || !strings.Contains(lines[1], "efficiency") || !strings.Contains(lines[1], "lost with the leader") ||
		!strings.Contains(lines[1], js.Tenures[0].Epoch) || !strings.HasPrefix(lines[2], js.Tenures[1].Token+" ") {
		t.Fatalf("after a restart, leasehold history printed %q; want the lost-with-the-leader line, then the new tenure", text)
	}
}
