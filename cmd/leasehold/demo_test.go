package main

import (
	"context"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/proc"
)

// buildBinary builds the leasehold binary for a test.
func buildBinary(t *testing.T) string {
	t.Helper()
	root, err := proc.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "leasehold")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := proc.Build(ctx, root, bin, "./cmd/leasehold"); err != nil {
		t.Fatal(err)
	}
	return bin
}

// TestDemo runs `leasehold demo` as a user would: it must finish in under 15 seconds,
// exit 0, show the unfenced run corrupting the data and the fenced run rejecting the
// paused client's write with both tokens named.
func TestDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real processes")
	}
	bin := buildBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	start := time.Now()
	out, err := exec.CommandContext(ctx, bin, "demo").CombinedOutput()
	took := time.Since(start)
	if err != nil {
		t.Fatalf("leasehold demo: %v (after %v)\n%s", err, took, out)
	}
	s := string(out)
	for _, want := range []string{
		"A is paused (SIGSTOP)",
		"the data is corrupted",
		"REJECTED: token 3 is lower than 4",
		"B's update stands",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("demo output lacks %q:\n%s", want, s)
		}
	}
	t.Logf("demo took %v", took)
}

// TestDemoUsesFreePorts: the demo's embedded node listens only on ports the kernel picks
// (port 0), never on a default port a running server holds (it failed with "address
// already in use" beside the quick-start server, on the fast-lane port).
func TestDemoUsesFreePorts(t *testing.T) {
	cfg := demoNodeConfig(t.TempDir())
	for what, addr := range map[string]string{"API": cfg.Addr, "fast lane": cfg.FastLaneAddr, "raft": cfg.Raft.RaftAddr} {
		host, port, err := net.SplitHostPort(addr)
		if err != nil || port != "0" || host != "127.0.0.1" {
			t.Errorf("the demo's %s address is %q, want 127.0.0.1:0", what, addr)
		}
	}
}
