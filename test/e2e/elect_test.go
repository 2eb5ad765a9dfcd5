package e2e

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// electProc starts `leasehold elect svc` with args, whose CMD prints "lead EPOCH PID"
// and sleeps; the CMD is killed when the test ends, even when leasehold was killed
// with SIGKILL (it then outlives it).
func electProc(t *testing.T, s *Server, name, value string, args ...string) *Proc {
	t.Helper()
	argv := append([]string{"elect", name, "--addr", s.Addr, "--value", value}, args...)
	argv = append(argv, "--", "sh", "-c", `echo "lead $LEASEHOLD_TOKEN $$"; exec sleep 60`)
	return StartProc(t, leaseholdBin, argv...)
}

// leadLine waits for p's CMD to say it leads and returns the epoch; its pid is killed
// when the test ends.
func leadLine(t *testing.T, p *Proc, within time.Duration) (uint64, time.Time) {
	t.Helper()
	l := p.Expect("lead ", within)
	var epoch uint64
	var pid int
	if _, err := fmt.Sscanf(l.Text, "lead %d %d", &epoch, &pid); err != nil {
		t.Fatalf("CMD printed %q: %v", l.Text, err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	return epoch, l.At
}

// TestCLIElect (G8): `leasehold elect` runs CMD only while it leads, with
// LEASEHOLD_TOKEN = the epoch; `leasehold leader` shows the leader's epoch and value; a
// leader killed with SIGKILL is replaced by the next candidate, with a higher epoch,
// after its TTL — or at once with --release-on-disconnect. It logs the hand-over
// times (the numbers in docs/PERFORMANCE.md).
func TestCLIElect(t *testing.T) {
	s := StartServer(t)
	obs := StartProc(t, leaseholdBin, "observe", "e2e/elect/ttl", "--addr", s.Addr, "-o", "json")
	obs.Expect(`{`, 10*time.Second) // nobody leads yet
	for _, tc := range []struct {
		name  string
		extra []string
		max   time.Duration
	}{
		{"e2e/elect/ttl", []string{"--ttl", "2s"}, 3 * time.Second},
		{"e2e/elect/rod", []string{"--ttl", "30s", "--release-on-disconnect"}, time.Second},
	} {
		first := electProc(t, s, tc.name, "one", tc.extra...)
		e1, _ := leadLine(t, first, 10*time.Second)
		second := electProc(t, s, tc.name, "two", tc.extra...)
		select {
		case l := <-second.Lines:
			t.Fatalf("%s: the second candidate's CMD ran while the first leads: %q", tc.name, l.Text)
		case <-time.After(time.Second):
		}
		r := RunCLI(t, 10*time.Second, "leader", tc.name, "--addr", s.Addr, "--output", "json")
		var out struct { // the protobuf JSON mapping: uint64 as a string, bytes base64
			HasLeader bool   `json:"hasLeader"`
			Epoch     string `json:"epoch"`
			Value     []byte `json:"value"`
		}
		if err := json.Unmarshal([]byte(r.Stdout), &out); err != nil || r.Code != 0 || !out.HasLeader || out.Epoch != strconv.FormatUint(e1, 10) || string(out.Value) != "one" {
			t.Fatalf("%s: leader = %q (exit %d), want epoch %d value one", tc.name, r.Stdout, r.Code, e1)
		}

		first.Signal(syscall.SIGKILL)
		killed := time.Now()
		e2, at := leadLine(t, second, 10*time.Second)
		took := at.Sub(killed)
		t.Logf("%s (%v): hand-over %v after kill -9 of the leader", tc.name, tc.extra, took.Round(time.Millisecond))
		if e2 <= e1 {
			t.Errorf("G8: epoch %d after %d", e2, e1)
		}
		if took > tc.max {
			t.Errorf("%s: hand-over took %v, want under %v", tc.name, took, tc.max)
		}
		if r := RunCLI(t, 10*time.Second, "leader", tc.name, "--addr", s.Addr); r.Code != 0 || !strings.Contains(r.Stdout, "epoch "+strconv.FormatUint(e2, 10)) {
			t.Errorf("%s: leader after the hand-over = %q, want epoch %d", tc.name, r.Stdout, e2)
		}
		second.Signal(syscall.SIGTERM) // reaches CMD; leasehold resigns and exits
		if code := second.Wait(10 * time.Second); code == exitLockLost {
			t.Errorf("%s: the second leader exited %d", tc.name, code)
		}
	}
	// `leasehold observe` showed the ttl election's two leaders and then nobody, in order.
	var seen []string
	for len(seen) < 3 {
		seen = append(seen, obs.Expect(`{`, 10*time.Second).Text)
	}
	for i, want := range []string{`"hasLeader":true`, `"hasLeader":true`} {
		if !strings.Contains(seen[i], want) {
			t.Errorf("observe line %d = %s, want %s", i+1, seen[i], want)
		}
	}
	if strings.Contains(seen[2], `"hasLeader":true`) {
		t.Errorf("observe line 3 = %s, want nobody leading", seen[2])
	}
	if r := RunCLI(t, 10*time.Second, "leader", "e2e/elect/ttl", "--addr", s.Addr); r.Code != exitNotAcquired {
		t.Errorf("leader of an election nobody leads: exit %d, want %d", r.Code, exitNotAcquired)
	}
}
