package e2e

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestCLILockSet: `leasehold lock A B -- CMD` holds both names under one token for CMD
// (LEASEHOLD_LOCK lists them, sorted, separated by commas), a single lock of either
// name waits for it, and both are free once CMD ends.
func TestCLILockSet(t *testing.T) {
	s := StartServer(t)
	c := s.Client(t)
	holder := StartProc(t, leaseholdBin, "lock", "e2e/cli/set/b", "e2e/cli/set/a", "--addr", s.Addr, "--",
		"sh", "-c", `echo "HELD $LEASEHOLD_TOKEN $LEASEHOLD_LOCK"; sleep 30`)
	f := strings.Fields(holder.Expect("HELD ", 15*time.Second).Text)
	if len(f) != 3 || f[2] != "e2e/cli/set/a,e2e/cli/set/b" {
		t.Fatalf("CMD saw %q, want HELD TOKEN e2e/cli/set/a,e2e/cli/set/b", f)
	}
	for _, n := range []string{"e2e/cli/set/a", "e2e/cli/set/b"} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		info, err := c.Describe(ctx, n)
		cancel()
		if err != nil || !info.GetHeld() || info.GetToken() == 0 || f[1] != strconv.FormatUint(info.GetToken(), 10) {
			t.Fatalf("%s: %v, %v; want held under the set's token %s", n, info, err, f[1])
		}
	}
	if r := RunCLI(t, 20*time.Second, "lock", "e2e/cli/set/b", "--addr", s.Addr, "--wait", "0", "--", "true"); r.Code != exitNotAcquired {
		t.Errorf("a single lock of a name of the held set: exit %d, want %d (stderr %q)", r.Code, exitNotAcquired, r.Stderr)
	}
	holder.Signal(syscall.SIGTERM)
	holder.Wait(10 * time.Second)
	if r := RunCLI(t, 20*time.Second, "lock", "e2e/cli/set/a", "e2e/cli/set/b", "--addr", s.Addr, "--wait", "0", "--", "true"); r.Code != 0 {
		t.Errorf("the set after its holder ended: exit %d, stderr %q", r.Code, r.Stderr)
	}
}

// TestCLISharedAndLimit: two `leasehold lock --shared` hold one name at once and
// `leasehold locks` shows both; `--limit 2` lets two in and turns a third away; the
// two flags together are a usage error.
func TestCLISharedAndLimit(t *testing.T) {
	s := StartServer(t)
	var readers []*Proc
	for range 2 {
		p := StartProc(t, leaseholdBin, "lock", "e2e/cli/rw", "--shared", "--addr", s.Addr, "--", "sh", "-c", `echo "HELD $LEASEHOLD_TOKEN"; sleep 30`)
		p.Expect("HELD ", 15*time.Second)
		readers = append(readers, p)
	}
	r := RunCLI(t, 10*time.Second, "locks", "--addr", s.Addr, "e2e/cli/rw")
	t.Logf("leasehold locks:\n%s", r.Stdout)
	if !regexp.MustCompile(`(?m)^e2e/cli/rw\s.*\sshared\s*$`).MatchString(r.Stdout) || strings.Count(r.Stdout, " pid ") != 2 {
		t.Errorf("leasehold locks does not show a shared lock with its two holders")
	}
	if r := RunCLI(t, 20*time.Second, "lock", "e2e/cli/rw", "--addr", s.Addr, "--wait", "0", "--", "true"); r.Code != exitNotAcquired {
		t.Errorf("an exclusive lock beside two readers: exit %d, want %d", r.Code, exitNotAcquired)
	}
	for _, p := range readers {
		p.Signal(syscall.SIGTERM)
		p.Wait(10 * time.Second)
	}

	var slots []*Proc
	for range 2 {
		p := StartProc(t, leaseholdBin, "lock", "e2e/cli/pool", "--limit", "2", "--addr", s.Addr, "--", "sh", "-c", `echo "HELD $LEASEHOLD_TOKEN"; sleep 30`)
		p.Expect("HELD ", 15*time.Second)
		slots = append(slots, p)
	}
	if r := RunCLI(t, 20*time.Second, "lock", "e2e/cli/pool", "--limit", "2", "--addr", s.Addr, "--wait", "0", "--", "true"); r.Code != exitNotAcquired {
		t.Errorf("a third holder of a semaphore of 2: exit %d, want %d", r.Code, exitNotAcquired)
	}
	if r := RunCLI(t, 20*time.Second, "lock", "e2e/cli/pool", "--limit", "3", "--addr", s.Addr, "--wait", "0", "--", "true"); r.Code == 0 || !strings.Contains(r.Stderr, "mode") {
		t.Errorf("a semaphore of another size: exit %d, stderr %q; want a mode conflict", r.Code, r.Stderr)
	}
	for _, p := range slots {
		p.Signal(syscall.SIGTERM)
		p.Wait(10 * time.Second)
	}
	if r := RunCLI(t, 10*time.Second, "lock", "x", "--shared", "--limit", "2", "--addr", s.Addr, "--", "true"); r.Code != exitUsage {
		t.Errorf("--shared with --limit: exit %d, want %d", r.Code, exitUsage)
	}
}
