package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/internal/testnode"
	"github.com/leasehold/leasehold/service"
)

// TestObserveCLI: `leasehold observe` shows who leads now; with --after 0 it replays
// the election's changes — the leader, its proclaimed value, nobody after it resigned
// — each JSON line with its epoch, value, holder and revision, and --after the last
// revision shown goes on from there; a resume point no longer held fails "compacted".
func TestObserveCLI(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node")
	}
	addr := testnode.StartWith(t, func(cfg *service.Config) { cfg.Raft.Limits.ElectionHistory = 4 }).Addr()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close(context.Background()) }()
	var epoch uint64
	if err := c.Elect(ctx, "cli/svc", []byte("v1"), func(ctx context.Context, l client.Leadership) error {
		epoch = l.Epoch()
		return l.Proclaim(ctx, []byte("v2"))
	}); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := cli(t, "observe", "cli/svc", "--addr", addr, "--count", "1")
	if code != exitOK || !strings.HasSuffix(stdout, "\tno leader (epoch "+fmt.Sprint(epoch)+" ended)\n") {
		t.Fatalf("observe --count 1: exit %d, %q %s", code, stdout, stderr)
	}
	code, stdout, stderr = cli(t, "observe", "cli/svc", "--addr", addr, "--after", "0", "--count", "3", "-o", "json")
	if code != exitOK {
		t.Fatalf("observe --after 0: exit %d, %s", code, stderr)
	}
	lines := strings.Split(strings.TrimSuffix(stdout, "\n"), "\n")
	if len(lines) != 3 {
		t.Fatalf("observe --after 0 --count 3: %q", stdout)
	}
	var msgs []*leaseholdv1.ObserveResponse
	for _, line := range lines {
		m := &leaseholdv1.ObserveResponse{}
		if err := protojson.Unmarshal([]byte(line), m); err != nil {
			t.Fatalf("not an ObserveResponse: %s: %v", line, err)
		}
		msgs = append(msgs, m)
	}
	for i, want := range []struct {
		leads bool
		value string
		ended leaseholdv1.TenureEnd
	}{{true, "v1", 0}, {true, "v2", 0}, {false, "", leaseholdv1.TenureEnd_TENURE_END_RELEASED}} {
		m := msgs[i]
		if m.GetHasLeader() != want.leads || string(m.GetValue()) != want.value || m.GetEnded() != want.ended || m.GetEpoch() != epoch ||
			m.GetRevision() == 0 || want.leads && m.GetHolder().GetPid() == 0 || m.GetUnixMs() == 0 {
			t.Errorf("line %d = %s, want %+v under epoch %d", i+1, lines[i], want, epoch)
		}
	}

	// Four more changes: the history keeps 4 of the election, so the first three are
	// gone.
	if err := c.Elect(ctx, "cli/svc", []byte("w1"), func(ctx context.Context, l client.Leadership) error {
		return l.Proclaim(ctx, []byte("w2"))
	}); err != nil {
		t.Fatal(err)
	}
	last := msgs[2].GetRevision()
	code, stdout, _ = cli(t, "observe", "cli/svc", "--addr", addr, "--after", fmt.Sprint(msgs[1].GetRevision()), "--count", "1")
	if code != exitOK || !strings.Contains(stdout, "no leader") || !strings.Contains(stdout, "resigned") {
		t.Errorf("observe --after the second revision: exit %d, %q", code, stdout)
	}
	code, stdout, _ = cli(t, "observe", "cli/svc", "--addr", addr, "--after", fmt.Sprint(last), "--count", "1")
	if code != exitOK || !strings.Contains(stdout, `value "w1"`) {
		t.Errorf("observe --after the last revision: exit %d, %q", code, stdout)
	}
	if err := c.Elect(ctx, "cli/svc", []byte("x1"), func(context.Context, client.Leadership) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if code, stdout, _ = cli(t, "observe", "cli/svc", "--addr", addr, "--after", "0"); code != 1 || stdout != "" {
		t.Errorf("observe --after 0 past the retention: exit %d, %q; want 1 (compacted) and nothing shown", code, stdout)
	}
}

// TestServerBoundIdleTimeoutFlag: --bound-idle-timeout reaches server.Config: a value
// below 1s is refused as a usage error before anything starts.
func TestServerBoundIdleTimeoutFlag(t *testing.T) {
	done := make(chan int, 1)
	go func() {
		code, _, _ := cli(t, "server", "--bound-idle-timeout", "100ms", "--data-dir", t.TempDir(),
			"--addr", "127.0.0.1:0", "--raft-addr", "127.0.0.1:0", "--fast-lane-addr", "127.0.0.1:0")
		done <- code
	}()
	select {
	case code := <-done:
		if code != exitUsage {
			t.Fatalf("server --bound-idle-timeout 100ms: exit %d, want %d", code, exitUsage)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("server --bound-idle-timeout 100ms started: the flag did not reach the config")
	}
}
