package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/leasehold/leasehold/client"
)

// TestReleaseOnDisconnectKill9 (G7): `leasehold lock --release-on-disconnect --ttl 30s`
// killed with SIGKILL frees its lock within a second — the server sees its connection
// end and revokes the lease — where without the option the lock stays held for the TTL.
func TestReleaseOnDisconnectKill9(t *testing.T) {
	s := StartServer(t)
	c := s.Client(t)
	for _, tc := range []struct {
		name  string
		bound bool
	}{{"e2e/rod/bound", true}, {"e2e/rod/plain", false}} {
		args := []string{"lock", tc.name, "--addr", s.Addr, "--ttl", "30s"}
		if tc.bound {
			args = append(args, "--release-on-disconnect")
		}
		pidfile := filepath.Join(t.TempDir(), "pid")
		lh := StartProc(t, leaseholdBin, append(args, "--", "sh", "-c", "echo $$ > "+pidfile+"; exec sleep 60")...)
		tok := waitHeld(t, c, tc.name)
		var cmdPid int
		if !eventually(10*time.Second, func() bool {
			b, err := os.ReadFile(pidfile)
			_, serr := fmt.Sscan(string(b), &cmdPid)
			return err == nil && serr == nil
		}) {
			t.Fatal("CMD did not write its pid")
		}
		t.Cleanup(func() { _ = syscall.Kill(cmdPid, syscall.SIGKILL) })

		lh.Signal(syscall.SIGKILL)
		killed := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		l, err := c.Lock(ctx, tc.name, client.Correctness, client.WaitFor(3*time.Second))
		cancel()
		took := time.Since(killed)
		switch {
		case tc.bound && err != nil:
			t.Fatalf("%s: not free 3s after its holder was killed: %v", tc.name, err)
		case tc.bound && took > time.Second:
			t.Errorf("%s: freed %v after the holder was killed, want within 1s", tc.name, took)
		case tc.bound && l.Token() <= tok:
			t.Errorf("G1: token %d after %d", l.Token(), tok)
		case !tc.bound && err == nil:
			t.Errorf("%s: without release on disconnect the lock was free %v after the kill, want held for the TTL", tc.name, took)
		}
		t.Logf("%s: after kill -9 of the holder: %v, %v", tc.name, took.Round(time.Millisecond), err)
		if l != nil {
			_ = l.Unlock(context.Background())
		}
	}
}
