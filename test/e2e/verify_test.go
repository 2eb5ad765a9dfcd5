package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestVerifyCLI runs `leasehold verify` as a user would, against both demo resources
// served by `leasehold demo-resource`: the built binary re-executes itself as the
// writers, stops them with SIGSTOP and checks the history. The unfenced resource must
// fail (exit 1, a stale write shown), the fenced one pass (exit 0).
func TestVerifyCLI(t *testing.T) {
	if testing.Short() {
		t.Skip("runs writer processes for several seconds")
	}
	s := StartServer(t)
	for _, c := range []struct {
		flag     string
		code     int
		contains string
	}{
		{"", 1, "accepted a stale token"},
		{"--fenced", 0, "verdict: PASS"},
	} {
		addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
		args := []string{"demo-resource", "--listen", addr}
		if c.flag != "" {
			args = append(args, c.flag)
		}
		res := StartProc(t, leaseholdBin, args...)
		if !eventually(5*time.Second, func() bool { return strings.Contains(res.Stderr(), "demo resource on") }) {
			t.Fatalf("demo-resource %s did not start: %s", c.flag, res.Stderr())
		}
		r := RunCLI(t, 2*time.Minute, "verify", "--addr", s.Addr, "--url", "http://"+addr+"/write",
			"--duration", "6s", "--ttl", "300ms", "--pause-chance", "0.3", "--seed", "7")
		if r.Code != c.code || !strings.Contains(r.Stdout, c.contains) {
			t.Errorf("verify against demo-resource %s: exit %d, want %d with %q\nstdout:\n%s\nstderr:\n%s", c.flag, r.Code, c.code, c.contains, r.Stdout, r.Stderr)
		}
		res.Kill()
	}
}
