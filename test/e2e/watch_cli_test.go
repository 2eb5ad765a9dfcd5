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
