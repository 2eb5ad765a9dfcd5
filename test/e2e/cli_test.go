package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leasehold/leasehold/client"
)

// Exit codes of the leasehold CLI (cmd/leasehold/main.go).
const (
	exitUsage       = 64
	exitUnavailable = 69
	exitNotAcquired = 75
	exitLockLost    = 76
)

// waitHeld waits until lock name is held and returns its token.
func waitHeld(t *testing.T, c *client.Client, name string) uint64 {
	t.Helper()
	var tok uint64
	ok := eventually(10*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		info, err := c.Describe(ctx, name)
		if err == nil && info.GetHeld() {
			tok = info.GetToken()
			return true
		}
		return false
	})
	if !ok {
		t.Fatalf("%s not held within 10s", name)
	}
	return tok
}

// TestCLILockRunsCommand: `leasehold lock NAME -- CMD` passes LEASEHOLD_TOKEN and
// LEASEHOLD_LOCK to CMD, returns CMD's exit code, and releases the lock afterwards.
func TestCLILockRunsCommand(t *testing.T) {
	s := StartServer(t)
	r := RunCLI(t, 20*time.Second, "lock", "e2e/cli/run", "--addr", s.Addr, "--",
		"sh", "-c", `echo "$LEASEHOLD_TOKEN $LEASEHOLD_LOCK"; exit 7`)
	if r.Code != 7 {
		t.Fatalf("exit %d, want CMD's 7; stderr %q", r.Code, r.Stderr)
	}
	f := strings.Fields(r.Stdout)
	if len(f) != 2 {
		t.Fatalf("stdout %q, want \"TOKEN NAME\"", r.Stdout)
	}
	tok, err := strconv.ParseUint(f[0], 10, 64)
	if err != nil || tok == 0 {
		t.Errorf("LEASEHOLD_TOKEN = %q, want a positive integer", f[0])
	}
	if f[1] != "e2e/cli/run" {
		t.Errorf("LEASEHOLD_LOCK = %q, want e2e/cli/run", f[1])
	}
	// Released on exit: a second run gets it at once, with a larger token. (Flags may
	// come before the name too.)
	r2 := RunCLI(t, 20*time.Second, "lock", "--addr", s.Addr, "--wait", "0", "e2e/cli/run", "--",
		"sh", "-c", `echo "$LEASEHOLD_TOKEN"`)
	if r2.Code != 0 {
		t.Fatalf("second run: exit %d, stderr %q", r2.Code, r2.Stderr)
	}
	if tok2, _ := strconv.ParseUint(strings.TrimSpace(r2.Stdout), 10, 64); tok2 <= tok {
		t.Errorf("second token %q is not above the first %d", strings.TrimSpace(r2.Stdout), tok)
	}
}

// TestCLILockHeldExits75: while one `leasehold lock X` holds X, another with --wait 0
// or a short wait exits 75 and names the holder.
func TestCLILockHeldExits75(t *testing.T) {
	s := StartServer(t)
	c := s.Client(t)
	const name = "e2e/cli/held"
	holder := StartProc(t, leaseholdBin, "lock", name, "--addr", s.Addr, "--note", "the-holder", "--", "sleep", "5")
	tok := waitHeld(t, c, name)

	for _, wait := range []string{"0", "300ms"} {
		r := RunCLI(t, 20*time.Second, "lock", name, "--addr", s.Addr, "--wait", wait, "--", "true")
		t.Logf("--wait %s: exit %d after %v; stderr %q", wait, r.Code, r.Took.Round(time.Millisecond), r.Stderr)
		if r.Code != exitNotAcquired {
			t.Errorf("--wait %s: exit %d, want %d", wait, r.Code, exitNotAcquired)
		}
		for _, want := range []string{fmt.Sprintf("pid %d", holder.Pid()), "the-holder", strconv.FormatUint(tok, 10)} {
			if !strings.Contains(r.Stderr, want) {
				t.Errorf("--wait %s: stderr %q does not name the holder (%q)", wait, r.Stderr, want)
			}
		}
		if wait == "300ms" && r.Took < 300*time.Millisecond {
			t.Errorf("--wait 300ms gave up after %v", r.Took)
		}
	}
	// The holder's command is unaffected, and its lock is released when it ends.
	holder.Signal(syscall.SIGTERM)
	if code := holder.Wait(10 * time.Second); code != 128+int(syscall.SIGTERM) {
		t.Errorf("holder exit %d after SIGTERM, want %d (sleep killed by the forwarded SIGTERM)", code, 128+int(syscall.SIGTERM))
	}
	if r := RunCLI(t, 20*time.Second, "lock", name, "--addr", s.Addr, "--wait", "0", "--", "true"); r.Code != 0 {
		t.Errorf("after the holder ended: exit %d, stderr %q", r.Code, r.Stderr)
	}
}

// TestCLILockLostKillsProcessGroup: when `leasehold lock` is paused past its TTL, on
// resuming it finds the lock lost, kills CMD's whole process group (the child shell and
// its background grandchild) and exits 76.
func TestCLILockLostKillsProcessGroup(t *testing.T) {
	s := StartServer(t)
	c := s.Client(t)
	const name = "e2e/cli/lost"
	pidfile := filepath.Join(t.TempDir(), "pids")
	lh := StartProc(t, leaseholdBin, "lock", name, "--addr", s.Addr, "--ttl", "1s", "--",
		"sh", "-c", `sleep 60 & echo "$$ $!" > `+pidfile+`.tmp && mv `+pidfile+`.tmp `+pidfile+`; wait`)
	tok := waitHeld(t, c, name)
	var shPid, sleepPid int
	if !eventually(10*time.Second, func() bool {
		b, err := os.ReadFile(pidfile)
		if err != nil {
			return false
		}
		_, err = fmt.Sscan(string(b), &shPid, &sleepPid)
		return err == nil
	}) {
		t.Fatal("CMD did not write its pids within 10s")
	}
	t.Cleanup(func() {
		_ = syscall.Kill(sleepPid, syscall.SIGKILL)
		_ = syscall.Kill(shPid, syscall.SIGKILL)
	})

	lh.Signal(syscall.SIGSTOP)
	stopped := time.Now()
	time.Sleep(2 * time.Second)
	// Meanwhile the lease expired on the server: someone else can take the lock.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	other, err := c.Lock(ctx, name, client.Correctness, client.WaitFor(3*time.Second))
	if err != nil {
		t.Errorf("lock %s while the paused holder's lease should have expired: %v", name, err)
	} else if other.Token() <= tok {
		t.Errorf("G1: token %d after %d", other.Token(), tok)
	}
	lh.Signal(syscall.SIGCONT)
	resumed := time.Now()
	code := lh.Wait(10 * time.Second)
	t.Logf("stopped for %v; leasehold exited %d %v after SIGCONT; stderr %q",
		resumed.Sub(stopped).Round(time.Millisecond), code, time.Since(resumed).Round(time.Millisecond), lh.Stderr())
	if code != exitLockLost {
		t.Errorf("exit %d, want %d (lock lost)", code, exitLockLost)
	}
	for _, p := range []struct {
		what string
		pid  int
	}{{"child shell", shPid}, {"grandchild sleep 60", sleepPid}} {
		if !eventually(2*time.Second, func() bool { return processGone(p.pid) }) {
			t.Errorf("%s (pid %d) still runs after leasehold lost the lock", p.what, p.pid)
		}
	}
}

// TestCLILockForwardsSignals: SIGTERM to `leasehold lock` reaches CMD, whose exit code
// is returned, and the lock is released at once.
func TestCLILockForwardsSignals(t *testing.T) {
	s := StartServer(t)
	c := s.Client(t)
	const name = "e2e/cli/signals"
	lh := StartProc(t, leaseholdBin, "lock", name, "--addr", s.Addr, "--",
		"sh", "-c", `trap "exit 42" TERM; echo READY; sleep 30 & wait`)
	lh.Expect("READY", 15*time.Second)
	waitHeld(t, c, name)
	lh.Signal(syscall.SIGTERM)
	if code := lh.Wait(10 * time.Second); code != 42 {
		t.Errorf("exit %d, want CMD's 42 from its TERM trap; stderr %q", code, lh.Stderr())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	l, err := c.Lock(ctx, name, client.Correctness, client.TryOnce)
	if err != nil {
		t.Fatalf("the lock was not released when CMD exited: %v", err)
	}
	_ = l.Unlock(ctx)
}

// TestCLILocksAndStatus: `leasehold locks` lists held locks with class, holder and
// token; `leasehold status` reports the single node as leader.
func TestCLILocksAndStatus(t *testing.T) {
	s := StartServer(t)
	c := s.Client(t)
	host, _ := os.Hostname()
	held := map[string]*Proc{}
	for _, class := range []string{"correctness", "efficiency"} {
		name := "e2e/cli/list/" + class
		held[class] = StartProc(t, leaseholdBin, "lock", name, "--addr", s.Addr, "--class", class, "--",
			"sh", "-c", `echo "TOKEN $LEASEHOLD_TOKEN"; sleep 30`)
	}
	toks := map[string]string{}
	for class, p := range held {
		toks[class] = strings.TrimPrefix(p.Expect("TOKEN ", 15*time.Second).Text, "TOKEN ")
	}
	waitHeld(t, c, "e2e/cli/list/correctness")

	r := RunCLI(t, 10*time.Second, "locks", "--addr", s.Addr, "e2e/cli/list/")
	t.Logf("leasehold locks:\n%s", r.Stdout)
	if r.Code != 0 {
		t.Fatalf("leasehold locks: exit %d, stderr %q", r.Code, r.Stderr)
	}
	lines := strings.Split(r.Stdout, "\n")
	if len(lines) == 0 || !strings.HasPrefix(lines[0], "NAME") {
		t.Errorf("no header line in %q", r.Stdout)
	}
	for class, p := range held {
		name := "e2e/cli/list/" + class
		want := regexp.MustCompile(`^` + regexp.QuoteMeta(name) + `\s+` + class + `\s+` +
			regexp.QuoteMeta(fmt.Sprintf("%s pid %d", host, p.Pid())) + `\s+` + toks[class] + `\s`)
		found := false
		for _, l := range lines {
			found = found || want.MatchString(l)
		}
		if !found {
			t.Errorf("no line for %s matching %q", name, want)
		}
	}

	r = RunCLI(t, 10*time.Second, "status", "--addr", s.Addr)
	t.Logf("leasehold status:\n%s", r.Stdout)
	if r.Code != 0 {
		t.Fatalf("leasehold status: exit %d, stderr %q", r.Code, r.Stderr)
	}
	if !regexp.MustCompile(`(?m)^role\s+leader\s*$`).MatchString(r.Stdout) {
		t.Errorf("status does not show role leader")
	}
	if !regexp.MustCompile(`(?m)^locks\s+2\s*$`).MatchString(r.Stdout) {
		t.Errorf("status does not count the 2 held locks")
	}
}

// TestCLIExitCodes: an unreachable server exits 69, bad flags and arguments 64.
func TestCLIExitCodes(t *testing.T) {
	dead := fmt.Sprintf("127.0.0.1:%d", freePort(t)) // nothing listens there
	for _, args := range [][]string{
		{"status", "--addr", dead},
		{"locks", "--addr", dead},
		{"lock", "e2e/x", "--addr", dead, "--", "true"},
		{"unlock", "e2e/x", "--force", "--reason", "test", "--addr", dead},
	} {
		r := RunCLI(t, 20*time.Second, args...)
		if r.Code != exitUnavailable {
			t.Errorf("leasehold %s: exit %d, want %d; stderr %q", strings.Join(args, " "), r.Code, exitUnavailable, r.Stderr)
		}
	}
	for _, args := range [][]string{
		{},
		{"frobnicate"},
		{"lock", "e2e/x", "--bogus", "--", "true"},
		{"lock", "e2e/x", "--addr", dead},       // no -- CMD
		{"lock", "e2e/x", "--addr", dead, "--"}, // nothing after --
		{"lock", "--addr", dead, "--", "true"},  // no NAME
		{"lock", "e2e/x", "--class", "sometimes", "--addr", dead, "--", "true"},
		{"lock", "e2e/x", "--wait", "soon", "--addr", dead, "--", "true"},
		{"lock", "e2e/x", "--wait", "-1s", "--addr", dead, "--", "true"},
		{"locks", "--nope"},
		{"locks", "--addr", dead, "a/", "b/"}, // one PREFIX at most
		{"status", "--bogus"},
		{"status", "--addr", dead, "extra"}, // status takes no arguments
		{"unlock", "e2e/x", "--addr", dead}, // no --force
		{"server", "--no-such-flag"},
	} {
		r := RunCLI(t, 20*time.Second, args...)
		if r.Code != exitUsage {
			t.Errorf("leasehold %s: exit %d, want %d; stderr %q", strings.Join(args, " "), r.Code, exitUsage, r.Stderr)
		}
	}
}
