package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/api/leasehold/v1/leaseholdv1connect"
	"github.com/leasehold/leasehold/client"
)

// TestCLIOnce: `leasehold once KEY -- CMD` runs CMD with LEASEHOLD_KEY and
// LEASEHOLD_TOKEN and exits with its code; a later call does not run CMD, prints the
// stored output and exits with the stored code; a call while CMD runs elsewhere exits
// 75 naming the holder; a CMD that cannot start stores nothing; the server's
// --idempotency-keys bounds the retention.
func TestCLIOnce(t *testing.T) {
	s := StartServer(t, "--idempotency-keys", "4")
	const key = "e2e/once/run"
	r := RunCLI(t, 20*time.Second, "once", key, "--addr", s.Addr, "--", "sh", "-c", `echo "ran $LEASEHOLD_KEY $LEASEHOLD_TOKEN"; exit 3`)
	if r.Code != 3 || !strings.HasPrefix(r.Stdout, "ran "+key+" ") {
		t.Fatalf("first run: exit %d stdout %q stderr %q", r.Code, r.Stdout, r.Stderr)
	}
	again := RunCLI(t, 20*time.Second, "once", key, "--addr", s.Addr, "--", "sh", "-c", `echo "ran again"; exit 0`)
	if again.Code != 3 || again.Stdout != r.Stdout || !strings.Contains(again.Stderr, "done before") {
		t.Fatalf("second run: exit %d stdout %q stderr %q; want the stored exit 3 and output %q", again.Code, again.Stdout, again.Stderr, r.Stdout)
	}

	// In progress elsewhere: 75, and who.
	const busy = "e2e/once/busy"
	holder := StartProc(t, leaseholdBin, "once", busy, "--addr", s.Addr, "--note", "the first", "--",
		"sh", "-c", `trap "exit 42" TERM; echo READY; sleep 30 & wait`)
	holder.Expect("READY", 15*time.Second)
	r = RunCLI(t, 20*time.Second, "once", busy, "--addr", s.Addr, "--", "true")
	if r.Code != exitNotAcquired || !strings.Contains(r.Stderr, "running elsewhere") || !strings.Contains(r.Stderr, "(the first)") {
		t.Fatalf("while running elsewhere: exit %d stderr %q", r.Code, r.Stderr)
	}
	// SIGTERM reaches CMD; its exit is the stored outcome.
	holder.Signal(syscall.SIGTERM)
	if code := holder.Wait(10 * time.Second); code != 42 {
		t.Fatalf("holder exit %d after SIGTERM, want CMD's 42; stderr %q", code, holder.Stderr())
	}
	if r = RunCLI(t, 20*time.Second, "once", busy, "--addr", s.Addr, "--", "true"); r.Code != 42 {
		t.Fatalf("after the holder ended: exit %d stderr %q, want the stored 42", r.Code, r.Stderr)
	}

	// A CMD that cannot start leaves the key free.
	const nostart = "e2e/once/nostart"
	if r = RunCLI(t, 20*time.Second, "once", nostart, "--addr", s.Addr, "--", "/nonexistent/cmd"); r.Code != 127 {
		t.Fatalf("unstartable CMD: exit %d stderr %q", r.Code, r.Stderr)
	}
	if r = RunCLI(t, 20*time.Second, "once", nostart, "--addr", s.Addr, "--", "sh", "-c", "exit 5"); r.Code != 5 {
		t.Fatalf("after an unstartable CMD: exit %d stderr %q, want CMD's 5", r.Code, r.Stderr)
	}

	// Four done keys are kept: key, busy, nostart, and one more; a fifth ends key's
	// retention, and it runs again.
	for _, k := range []string{"e2e/once/r4", "e2e/once/r5"} {
		if r = RunCLI(t, 20*time.Second, "once", k, "--addr", s.Addr, "--", "true"); r.Code != 0 {
			t.Fatalf("%s: exit %d stderr %q", k, r.Code, r.Stderr)
		}
	}
	if r = RunCLI(t, 20*time.Second, "once", key, "--addr", s.Addr, "--", "sh", "-c", "exit 8"); r.Code != 8 {
		t.Fatalf("after its retention ended: exit %d stderr %q, want a new run's 8", r.Code, r.Stderr)
	}

	for _, args := range [][]string{
		{"once", key, "--addr", s.Addr},       // no -- CMD
		{"once", "--addr", s.Addr, "--", "x"}, // no KEY
		{"once", key, "--bogus", "--", "true"},
	} {
		if r := RunCLI(t, 20*time.Second, args...); r.Code != exitUsage {
			t.Errorf("leasehold %s: exit %d, want %d", strings.Join(args, " "), r.Code, exitUsage)
		}
	}
}

// TestOnceHolderKilled (G9 with real processes): `leasehold once` is killed with
// SIGKILL while its CMD works. Until the lease's TTL has passed the key stays in
// progress; then it is free, and the next `leasehold once` runs CMD under a larger
// token. The dead holder's Complete, sent late with its token, is rejected as stale and
// changes nothing. A holder paused past its TTL (SIGSTOP) finds on resuming that it
// lost the key: its CMD's group is killed, it exits 76, and its outcome is not stored.
func TestOnceHolderKilled(t *testing.T) {
	s := StartServer(t)
	c := s.Client(t)
	const key = "e2e/once/killed"
	dir := t.TempDir()
	info := filepath.Join(dir, "info")
	holder := StartProc(t, leaseholdBin, "once", key, "--addr", s.Addr, "--ttl", "1s", "--",
		"sh", "-c", `echo "$LEASEHOLD_TOKEN $$" > `+info+`.tmp && mv `+info+`.tmp `+info+`; exec sleep 60`)
	var deadToken uint64
	var cmdPid int
	readWhenWritten(t, info, &deadToken, &cmdPid)
	t.Cleanup(func() { _ = syscall.Kill(-cmdPid, syscall.SIGKILL) })
	holder.Signal(syscall.SIGKILL)
	killed := time.Now()
	_ = holder.Wait(5 * time.Second)
	_ = syscall.Kill(-cmdPid, syscall.SIGKILL) // the orphaned CMD: its work "died" too

	kctx, kcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer kcancel()
	if k, err := c.Key(kctx, key); time.Since(killed) < 900*time.Millisecond && (err != nil || k.Status != client.KeyInProgress || k.Token != deadToken) {
		t.Fatalf("right after the kill: %+v %v; want in progress under the dead holder's token %d until its TTL", k, err, deadToken)
	}
	var r CLIResult
	if !eventually(10*time.Second, func() bool {
		r = RunCLI(t, 20*time.Second, "once", key, "--addr", s.Addr, "--", "sh", "-c", `echo "second $LEASEHOLD_TOKEN"`)
		return r.Code != exitNotAcquired
	}) {
		t.Fatal("the key stayed in progress for 10s after its holder was killed")
	}
	var second uint64
	if _, err := fmt.Sscanf(r.Stdout, "second %d", &second); err != nil || r.Code != 0 || second <= deadToken {
		t.Fatalf("the next run: exit %d stdout %q stderr %q; want it to run under a token above the dead holder's %d", r.Code, r.Stdout, r.Stderr, deadToken)
	}
	t.Logf("the key was free again %v after the kill (TTL 1s)", time.Since(killed).Round(time.Millisecond))

	// The dead holder's late Complete.
	keys := leaseholdv1connect.NewIdempotencyServiceClient(http.DefaultClient, "http://"+s.Addr)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := keys.Complete(ctx, &leaseholdv1.CompleteRequest{Key: key, Token: deadToken, Result: []byte(`{"exitCode":0}`)})
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("the dead holder's late Complete: %v, want FailedPrecondition (stale token)", err)
	}
	k, err := c.Key(ctx, key)
	if err != nil || k.Status != client.KeyDone || k.Token != second || !strings.Contains(string(k.Result), `"exitCode":0`) {
		t.Fatalf("the key after the late Complete: %+v %v; want done by token %d", k, err, second)
	}

	// Paused past the TTL: loses the key, its group is killed, nothing is stored.
	const paused = "e2e/once/paused"
	pidfile := filepath.Join(dir, "pids")
	p := StartProc(t, leaseholdBin, "once", paused, "--addr", s.Addr, "--ttl", "1s", "--",
		"sh", "-c", `sleep 60 & echo "$$ $!" > `+pidfile+`.tmp && mv `+pidfile+`.tmp `+pidfile+`; wait`)
	var shPid, sleepPid int
	readWhenWritten(t, pidfile, &shPid, &sleepPid)
	t.Cleanup(func() { _ = syscall.Kill(-shPid, syscall.SIGKILL) })
	p.Signal(syscall.SIGSTOP)
	time.Sleep(2 * time.Second)
	if r := RunCLI(t, 20*time.Second, "once", paused, "--addr", s.Addr, "--", "sh", "-c", "exit 9"); r.Code != 9 {
		t.Errorf("while the holder is paused past its TTL: exit %d stderr %q, want CMD's 9", r.Code, r.Stderr)
	}
	p.Signal(syscall.SIGCONT)
	if code := p.Wait(10 * time.Second); code != exitLockLost {
		t.Errorf("the paused holder exited %d after SIGCONT, want %d; stderr %q", code, exitLockLost, p.Stderr())
	}
	for _, pid := range []int{shPid, sleepPid} {
		if !eventually(2*time.Second, func() bool { return processGone(pid) }) {
			t.Errorf("pid %d of the paused holder's CMD still runs", pid)
		}
	}
	if r := RunCLI(t, 20*time.Second, "once", paused, "--addr", s.Addr, "--", "true"); r.Code != 9 {
		t.Errorf("after the paused holder resumed: exit %d, want the stored 9", r.Code)
	}
}

// readWhenWritten waits up to 10 s for file to hold the values vals scan, and scans them.
func readWhenWritten(t *testing.T, file string, vals ...any) {
	t.Helper()
	if !eventually(10*time.Second, func() bool {
		b, err := os.ReadFile(file)
		if err != nil {
			return false
		}
		_, err = fmt.Sscan(string(b), vals...)
		return err == nil
	}) {
		t.Fatalf("CMD did not write %s within 10s", file)
	}
}
