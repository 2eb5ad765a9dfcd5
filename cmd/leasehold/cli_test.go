package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/internal/testnode"
)

// cli runs the CLI in-process on args and returns its exit code, stdout and stderr.
func cli(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = runWith(args, &out, &errb)
	return code, out.String(), errb.String()
}

// TestUsageErrors: bad flags, bad flag values and wrong arguments exit 64 (not cobra's
// 1) with a message that names what is wrong; none of them reaches a server.
func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string // in stderr
	}{
		{nil, "Usage:"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"lock", "x", "--bogus", "--", "true"}, "--bogus"},
		{[]string{"lock", "--bogus", "x", "--", "true"}, "--bogus"},
		{[]string{"lock", "x", "--ttl", "soon", "--", "true"}, "--ttl"},
		{[]string{"lock", "x", "--class", "sometimes", "--", "true"}, "--class"},
		{[]string{"lock", "x", "--wait", "soon", "--", "true"}, "--wait"},
		{[]string{"lock", "x", "--wait", "-1s", "--", "true"}, "--wait"},
		{[]string{"lock", "x", "--shared", "--limit", "3", "--", "true"}, "--shared and --limit"},
		{[]string{"lock", "x"}, "after --"},
		{[]string{"lock", "x", "--"}, "nothing to run after --"},
		{[]string{"lock", "--", "true"}, "NAME"},
		{[]string{"once", "a", "b", "--", "true"}, "exactly one KEY"},
		{[]string{"once", "--", "true"}, "NAME"},
		{[]string{"locks", "a/", "b/"}, "at most 1 arg"},
		{[]string{"locks", "--output", "yaml"}, "--output"},
		{[]string{"status", "-o", "xml"}, "--output"},
		{[]string{"status", "extra"}, "unknown command"},
		{[]string{"unlock", "x"}, "--force"},
		{[]string{"kv"}, "Usage:"},
		{[]string{"kv", "frob"}, `unknown command "frob"`},
		{[]string{"kv", "put", "k"}, "2 arg"},
		{[]string{"kv", "put", "k", "v", "--fence", "nonsense"}, "--fence"},
		{[]string{"kv", "put", "k", "v", "--if-version", "x"}, "--if-version"},
		{[]string{"members", "add", "n2"}, "3 arg"},
		{[]string{"snapshot", "restore", "f"}, "--data-dir"},
		{[]string{"server", "--no-such-flag"}, "--no-such-flag"},
		{[]string{"server", "--peer", "a,b"}, "--peer"},
		{[]string{"verify"}, "--url"},
		{[]string{"verify", "--dsn", "file:x.db"}, "--table"},
		{[]string{"verify", "--url", "http://x", "--create"}, "need --dsn"},
		{[]string{"verify", "--dsn", "mysql://x", "--table", "t"}, "Driver"},
		{[]string{"verify", "--dsn", "file:x.db", "--table", "t;drop"}, "table name"},
		{[]string{"completion", "tcsh"}, "tcsh"},
	} {
		code, _, stderr := cli(t, tc.args...)
		if code != exitUsage || !strings.Contains(stderr, tc.want) {
			t.Errorf("leasehold %s: exit %d, stderr %q; want exit %d and %q in stderr", strings.Join(tc.args, " "), code, stderr, exitUsage, tc.want)
		}
	}
}

// TestNegativeFlagValues: a negative --ttl, --limit or --lock-delay is a bad value:
// exit 64 with the flag named, before any server is dialled.
func TestNegativeFlagValues(t *testing.T) {
	for _, args := range [][]string{
		{"lock", "x", "--ttl", "-1s", "--", "true"},
		{"lock", "x", "--limit", "-1", "--", "true"},
		{"lock", "x", "--lock-delay", "-5s", "--", "true"},
		{"once", "k", "--ttl", "-1s", "--", "true"},
		{"elect", "e", "--ttl", "-1s", "--", "true"},
	} {
		flagName := args[2]
		code, _, stderr := cli(t, append([]string{args[0], args[1], "--addr", "127.0.0.1:1"}, args[2:]...)...)
		if code != exitUsage || !strings.Contains(stderr, flagName) {
			t.Errorf("leasehold %s: exit %d, stderr %q; want exit %d naming %s", strings.Join(args, " "), code, stderr, exitUsage, flagName)
		}
	}
}

// TestLockHelpListsEveryFlag: `leasehold lock -h` shows every flag of lock, whatever
// else is on the line, and exits 0.
func TestLockHelpListsEveryFlag(t *testing.T) {
	for _, args := range [][]string{{"lock", "-h"}, {"lock", "--help"}, {"lock", "x", "-h"}, {"help", "lock"}} {
		code, stdout, _ := cli(t, args...)
		if code != exitOK {
			t.Errorf("leasehold %s: exit %d", strings.Join(args, " "), code)
		}
		for _, flag := range []string{"--class", "--ttl", "--wait", "--shared", "--limit", "--note", "--lock-delay", "--addr", "--cacert", "--cert", "--key", "--auth-token-file", "-- CMD [ARG...]"} {
			if !strings.Contains(stdout, flag) {
				t.Errorf("leasehold %s does not list %s:\n%s", strings.Join(args, " "), flag, stdout)
			}
		}
	}
}

// TestHiddenCommands: the commands leasehold runs itself are not in the help, but run.
func TestHiddenCommands(t *testing.T) {
	_, stdout, _ := cli(t, "help")
	for _, hidden := range []string{"verify-writer", demoWorkerCmd, runGuardCmd} {
		if strings.Contains(stdout, hidden) {
			t.Errorf("help lists the hidden command %s:\n%s", hidden, stdout)
		}
	}
	for _, shown := range []string{"server", "lock", "once", "locks", "unlock", "kv", "status", "members", "snapshot", "demo", "verify", "completion", "version"} {
		if !strings.Contains(stdout, "\n  "+shown+" ") {
			t.Errorf("help does not list %s:\n%s", shown, stdout)
		}
	}
	if code, _, stderr := cli(t, demoWorkerCmd, "--nope"); code != exitUsage || !strings.Contains(stderr, "--nope") {
		t.Errorf("%s --nope: exit %d, %q; the hidden command is not there", demoWorkerCmd, code, stderr)
	}
	if code, _, stderr := cli(t, runGuardCmd, "true"); code != exitUsage || !strings.Contains(stderr, "not by hand") {
		t.Errorf("%s true, by hand: exit %d, %q; want a usage error", runGuardCmd, code, stderr)
	}
}

func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}} {
		code, stdout, _ := cli(t, args...)
		if code != exitOK || stdout != "leasehold "+version+"\n" {
			t.Errorf("leasehold %s: exit %d, %q", strings.Join(args, " "), code, stdout)
		}
	}
}

// TestCompletion: `leasehold completion SHELL` writes cobra's completion script.
func TestCompletion(t *testing.T) {
	for shell, want := range map[string]string{
		"bash": "__start_leasehold",
		"zsh":  "#compdef leasehold",
		"fish": "complete -c leasehold",
	} {
		code, stdout, stderr := cli(t, "completion", shell)
		if code != exitOK || !strings.Contains(stdout, want) {
			t.Errorf("completion %s: exit %d, stderr %q; the script lacks %q", shell, code, stderr, want)
		}
	}
}

// TestCompletionAnswers: what the scripts ask the binary for (cobra's hidden __complete)
// names the commands, the flags, and the values of the flags that have a fixed set.
func TestCompletionAnswers(t *testing.T) {
	for _, tc := range []struct {
		line []string
		want []string
	}{
		{[]string{"lo"}, []string{"lock\t", "locks\t"}},
		{[]string{"k"}, []string{"kv\t"}},
		{[]string{"kv", ""}, []string{"get\t", "put\t", "del\t", "ls\t"}},
		{[]string{"lock", "x", "--sh"}, []string{"--shared\t"}},
		{[]string{"lock", "x", "--class", ""}, []string{"correctness\n", "efficiency\n"}},
		{[]string{"locks", "-o", ""}, []string{"text\n", "json\n"}},
		{[]string{"status", "--output", ""}, []string{"text\n", "json\n"}},
		{[]string{"server", "--log-level", ""}, []string{"debug\n", "warn\n"}},
		{[]string{"completion", ""}, []string{"bash\t", "zsh\t", "fish\t"}},
	} {
		code, stdout, stderr := cli(t, append([]string{"__complete"}, tc.line...)...)
		for _, w := range tc.want {
			if code != exitOK || !strings.Contains(stdout, w) {
				t.Errorf("completing %q: exit %d, %q (%s); want %q offered", strings.Join(tc.line, " "), code, stdout, stderr, strings.TrimSpace(w))
			}
		}
		for _, hidden := range []string{"verify-writer", demoWorkerCmd, runGuardCmd} {
			if strings.Contains(stdout, hidden) {
				t.Errorf("completing %q offers the hidden %s", strings.Join(tc.line, " "), hidden)
			}
		}
	}
}

// TestLockArguments: flags may come before, between and after the names; everything
// after the first -- goes to CMD untouched, flags, -h and further -- included.
func TestLockArguments(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node")
	}
	addr := testnode.Start(t).Addr()
	out := filepath.Join(t.TempDir(), "out")
	// CMD writes its environment's lock name and its arguments, one a line.
	script := []string{"sh", "-c", `{ echo "$LEASEHOLD_LOCK"; for a in "$@"; do echo "$a"; done; } > ` + out, "sh"}
	for _, tc := range []struct {
		name       string
		args       []string // before CMD
		lock, cmdA string   // want LEASEHOLD_LOCK, and CMD's arguments joined by |
		tail       []string // CMD's own arguments
	}{
		{"flags after the name", []string{"t/a", "--addr", addr, "--ttl", "2s"}, "t/a", "", nil},
		{"flags before the name", []string{"--addr", addr, "--class", "efficiency", "t/b"}, "t/b", "", nil},
		{"flags between names", []string{"t/c", "--addr=" + addr, "t/d", "--wait", "5s"}, "t/c,t/d", "", nil},
		{"CMD's flags untouched", []string{"t/e", "--addr", addr}, "t/e", "--addr|x|-h|--|--ttl=1", []string{"--addr", "x", "-h", "--", "--ttl=1"}},
	} {
		_ = os.Remove(out)
		args := append(append(append([]string{"lock"}, tc.args...), "--"), script...)
		args = append(args, tc.tail...)
		code, _, stderr := cli(t, args...)
		if code != exitOK {
			t.Errorf("%s: leasehold %s: exit %d, %s", tc.name, strings.Join(args, " "), code, stderr)
			continue
		}
		b, err := os.ReadFile(out)
		if err != nil {
			t.Errorf("%s: CMD did not run: %v", tc.name, err)
			continue
		}
		lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
		if lines[0] != tc.lock || strings.Join(lines[1:], "|") != tc.cmdA {
			t.Errorf("%s: CMD saw LEASEHOLD_LOCK %q and arguments %q; want %q and %q", tc.name, lines[0], strings.Join(lines[1:], "|"), tc.lock, tc.cmdA)
		}
	}
	// once: the same splitting, one KEY.
	_ = os.Remove(out)
	code, _, stderr := cli(t, append([]string{"once", "--ttl", "2s", "t/once", "--addr", addr, "--"}, append(script, "-x")...)...)
	if b, _ := os.ReadFile(out); code != exitOK || string(b) != "\n-x\n" {
		t.Errorf("once: exit %d (%s), CMD wrote %q", code, stderr, b)
	}
}

// TestOutputJSON: every listing and status print, with --output json or -o json, one
// JSON document that is the API's response message in the protobuf JSON mapping. On the
// same node: shell completion offers its lock names and keys.
func TestOutputJSON(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node")
	}
	addr := testnode.Start(t).Addr()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close(context.Background()) }()
	l, err := c.Lock(ctx, "json/a", client.Correctness, client.WithNote("held by the test"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(ctx, "json/k", []byte("v1"), client.Fenced(l)); err != nil {
		t.Fatal(err)
	}

	parse := func(args []string, m proto.Message) bool {
		t.Helper()
		code, stdout, stderr := cli(t, args...)
		if code != exitOK {
			t.Errorf("leasehold %s: exit %d, %s", strings.Join(args, " "), code, stderr)
			return false
		}
		if err := protojson.Unmarshal([]byte(stdout), m); err != nil {
			t.Errorf("leasehold %s: not one %T in JSON: %v\n%s", strings.Join(args, " "), m, err, stdout)
			return false
		}
		return true
	}

	var locks leaseholdv1.ListResponse
	if parse([]string{"locks", "json/", "--addr", addr, "--output", "json"}, &locks) {
		if len(locks.GetLocks()) != 1 || locks.GetLocks()[0].GetName() != "json/a" || locks.GetLocks()[0].GetToken() != l.Token() ||
			!locks.GetLocks()[0].GetHeld() || locks.GetLocks()[0].GetHolder().GetNote() != "held by the test" {
			t.Errorf("locks -o json: %v; want json/a held with token %d", &locks, l.Token())
		}
	}
	var st leaseholdv1.StatusResponse
	if parse([]string{"status", "--addr", addr, "-o", "json"}, &st) {
		if st.GetRole() != "leader" || st.GetLocks() != 1 || st.GetLastToken() < l.Token() {
			t.Errorf("status -o json: %v", &st)
		}
	}
	var members leaseholdv1.MembersResponse
	if parse([]string{"members", "list", "-o", "json", "--addr", addr}, &members) {
		if len(members.GetMembers()) != 1 || !members.GetMembers()[0].GetLeader() {
			t.Errorf("members list -o json: %v", &members)
		}
	}
	var kvs leaseholdv1.KVServiceListResponse
	if parse([]string{"kv", "ls", "json/", "--addr", addr, "-o", "json"}, &kvs) {
		if len(kvs.GetItems()) != 1 || kvs.GetItems()[0].GetKey() != "json/k" || string(kvs.GetItems()[0].GetValue()) != "v1" || kvs.GetItems()[0].GetFenceToken() != l.Token() {
			t.Errorf("kv ls -o json: %v", &kvs)
		}
	}
	var got leaseholdv1.GetResponse
	if parse([]string{"kv", "get", "json/k", "--addr", addr, "-o", "json"}, &got) {
		if !got.GetFound() || string(got.GetValue()) != "v1" || got.GetFenceToken() != l.Token() || got.GetFenceLock() != "json/a" {
			t.Errorf("kv get -o json: %v", &got)
		}
	}
	// Absent: the document still comes, and the exit code says not found.
	code, stdout, _ := cli(t, "kv", "get", "json/absent", "--addr", addr, "-o", "json")
	got.Reset()
	if err := protojson.Unmarshal([]byte(stdout), &got); code != exitError || err != nil || got.GetFound() {
		t.Errorf("kv get of an absent key -o json: exit %d, %v, %q", code, err, stdout)
	}
	// Zero values are present: a script can rely on every field.
	_, stdout, _ = cli(t, "locks", "nothing/", "--addr", addr, "-o", "json")
	if !strings.Contains(stdout, `"truncated": false`) || !strings.Contains(stdout, `"locks": []`) {
		t.Errorf("locks -o json of no locks lacks its zero fields: %s", stdout)
	}
	// Completion offers the server's lock names and keys.
	for _, tc := range [][]string{{"unlock", "--addr", addr, "json/", "json/a\n"}, {"locks", "--addr", addr, "js", "json/a\n"}, {"kv", "get", "--addr", addr, "json/", "json/k\n"}} {
		line, want := tc[:len(tc)-1], tc[len(tc)-1]
		if code, stdout, _ := cli(t, append([]string{"__complete"}, line...)...); code != exitOK || !strings.Contains(stdout, want) {
			t.Errorf("completing %q: exit %d, %q; want %q offered", strings.Join(line, " "), code, stdout, want)
		}
	}
	start := time.Now()
	if code, stdout, _ := cli(t, "__complete", "unlock", "--addr", testnode.FreeAddr(t), ""); code != exitOK || strings.Contains(stdout, "json/") || time.Since(start) > 3*time.Second {
		t.Errorf("completing against no server: exit %d, %q after %v", code, stdout, time.Since(start))
	}
	// Text stays the default.
	if _, stdout, _ := cli(t, "locks", "--addr", addr); !strings.HasPrefix(stdout, "NAME") {
		t.Errorf("locks without --output is not the table: %q", stdout)
	}
}

// TestEnvironmentDefaults: LEASEHOLD_ADDR is --addr's default, and the flag wins.
func TestEnvironmentDefaults(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node")
	}
	addr := testnode.Start(t).Addr()
	t.Setenv("LEASEHOLD_ADDR", addr)
	if code, stdout, stderr := cli(t, "status"); code != exitOK || !strings.Contains(stdout, "leader") {
		t.Errorf("status with LEASEHOLD_ADDR: exit %d, %s", code, stderr)
	}
	t.Setenv("LEASEHOLD_ADDR", "127.0.0.1:1")
	if code, _, stderr := cli(t, "status", "--addr", addr); code != exitOK {
		t.Errorf("status --addr over LEASEHOLD_ADDR: exit %d, %s", code, stderr)
	}
	t.Setenv("LEASEHOLD_CACERT", filepath.Join(t.TempDir(), "missing.pem"))
	if code, _, _ := cli(t, "status", "--addr", addr); code != exitUsage {
		t.Errorf("status with LEASEHOLD_CACERT naming a missing file: exit %d, want %d", code, exitUsage)
	}
}
