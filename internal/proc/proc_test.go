package proc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func sh(t *testing.T, log, script string) *Process {
	t.Helper()
	p, err := Start(Options{Name: "sh", Argv: []string{"/bin/sh", "-c", script}, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Kill() })
	return p
}

// TestStopEscalates: Stop ends a process that ignores SIGTERM with SIGKILL after the
// grace period, and one that is paused (SIGSTOP) as well.
func TestStopEscalates(t *testing.T) {
	log := filepath.Join(t.TempDir(), "log")
	p := sh(t, log, `trap '' TERM; echo ready; while :; do sleep 0.05; done`)
	for !strings.Contains(p.LogTail(5), "\nready") { // the trap is set (the first line is the command)
		if ok, err := p.Exited(); ok {
			t.Fatalf("sh exited: %v", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := p.Stop(300 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 300*time.Millisecond {
		t.Fatalf("stopped after %v, before the grace period ended; log:\n%s", took, p.LogTail(10))
	}
	if ok, _ := p.Exited(); !ok || p.ExitCode() != -1 {
		t.Fatalf("exited %v with code %d, want killed by a signal (-1)", ok, p.ExitCode())
	}
	if tail := p.LogTail(5); !strings.Contains(tail, "starting /bin/sh") || !strings.Contains(tail, "exited: signal: killed") {
		t.Fatalf("log lacks the start and exit lines:\n%s", tail)
	}
}

// TestAddrInUseIsRecognised: a process that exits saying it could not bind is reported
// as ErrExited wrapping ErrAddrInUse — from its own output only, not an earlier
// incarnation's in the same log.
func TestAddrInUseIsRecognised(t *testing.T) {
	log := filepath.Join(t.TempDir(), "log")
	ctx := context.Background()
	p := sh(t, log, `echo "listen tcp 127.0.0.1:1: bind: address already in use" >&2; exit 1`)
	err := p.WaitTCP(ctx, "127.0.0.1:1")
	if !errors.Is(err, ErrExited) || !errors.Is(err, ErrAddrInUse) {
		t.Fatalf("WaitTCP: %v, want ErrExited and ErrAddrInUse", err)
	}
	p = sh(t, log, `echo "something else went wrong" >&2; exit 1`)
	err = p.WaitTCP(ctx, "127.0.0.1:1")
	if !errors.Is(err, ErrExited) || errors.Is(err, ErrAddrInUse) {
		t.Fatalf("WaitTCP after another failure: %v, want ErrExited alone", err)
	}
}

// TestRetryPorts: an attempt that lost the race for its ports is made again with new
// ones, up to five in all; any other outcome ends the retries at once.
func TestRetryPorts(t *testing.T) {
	lost := fmt.Errorf("%w: %w", ErrExited, ErrAddrInUse)
	var seen [][]int
	err := RetryPorts(2, func(ports []int) error {
		seen = append(seen, ports)
		if len(seen) < 3 {
			return lost
		}
		return nil
	})
	if err != nil || len(seen) != 3 || len(seen[0]) != 2 || seen[0][0] == seen[0][1] {
		t.Fatalf("RetryPorts: %v after %d attempts with %v, want success on the third with two distinct ports each", err, len(seen), seen)
	}
	calls := 0
	if err := RetryPorts(1, func([]int) error { calls++; return lost }); !errors.Is(err, ErrAddrInUse) || calls != portAttempts {
		t.Fatalf("always losing: %v after %d attempts, want ErrAddrInUse after %d", err, calls, portAttempts)
	}
	calls = 0
	other := errors.New("other")
	if err := RetryPorts(1, func([]int) error { calls++; return other }); !errors.Is(err, other) || calls != 1 {
		t.Fatalf("another failure: %v after %d attempts, want it at once", err, calls)
	}
}

// TestServerTakesOtherPorts: a `leasehold server` whose picked API port is taken before
// it binds it is started again on other ports, and serves; a restart keeps the ports.
func TestServerTakesOtherPorts(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs leasehold")
	}
	root, err := ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "leasehold")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := Build(ctx, root, bin, "./cmd/leasehold"); err != nil {
		t.Fatal(err)
	}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	first := true
	freePorts = func(n int) ([]int, error) {
		ports, err := FreePorts(n)
		if err == nil && first {
			first = false
			ports[0] = taken.Addr().(*net.TCPAddr).Port // someone else got there first
		}
		return ports, err
	}
	defer func() { freePorts = FreePorts }()
	s := &Server{Bin: bin, Dir: filepath.Join(dir, "data"), Log: filepath.Join(dir, "server.log")}
	defer func() { _ = s.Kill() }()
	if err := s.Start(ctx); err != nil {
		t.Fatalf("%v\nlog:\n%s", err, Tail(s.Log, 40))
	}
	if s.API == taken.Addr().String() {
		t.Fatalf("the server was left on the taken port %s", s.API)
	}
	if err := s.WaitHealthy(ctx); err != nil {
		t.Fatal(err)
	}
	api := s.API
	if err := s.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := s.Start(ctx); err != nil || s.API != api {
		t.Fatalf("restart: %v on %s, want the same address %s", err, s.API, api)
	}
	if b, _ := os.ReadFile(s.Log); strings.Count(string(b), "==== ") != 5 {
		t.Fatalf("want three starts and two exits in the log:\n%s", b)
	}
}
