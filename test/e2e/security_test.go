package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/proc"
	"github.com/leasehold/leasehold/internal/tlsconf/tlstest"
)

// exitError is the CLI's exit code for an error the service answered.
const exitError = 1

// secured is what a secured server process and its CLI clients need: certificates and
// an auth file of two tokens, ops (admin) and ci (lock and read on jobs/).
type secured struct {
	nodes, clients *tlstest.CA
	node, client   tlstest.Cert
	authFile       string
	opsToken       string // file holding ops's token
	ciToken        string // file holding ci's token
}

func newSecured(t *testing.T) *secured {
	t.Helper()
	s := &secured{nodes: tlstest.NewCA(t, "nodes"), clients: tlstest.NewCA(t, "clients")}
	s.node = s.nodes.Issue(t, "node")
	s.client = s.clients.Issue(t, "cli")
	dir := t.TempDir()
	s.authFile = filepath.Join(dir, "auth.json")
	s.opsToken, s.ciToken = filepath.Join(dir, "ops.token"), filepath.Join(dir, "ci.token")
	writeFile(t, s.opsToken, "ops-secret\n")
	writeFile(t, s.ciToken, "ci-secret\n")
	writeFile(t, s.authFile, authJSON(map[string]string{"ops": "ops-secret", "ci": "ci-secret"}))
	return s
}

// authJSON is an auth file with ops as admin and ci with lock and read on jobs/, for
// whichever of them tokens holds.
func authJSON(tokens map[string]string) string {
	rules := map[string]string{"ops": `[{"prefix":"","allow":["admin"]}]`, "ci": `[{"prefix":"jobs/","allow":["lock","read"]}]`}
	var entries []string
	for _, name := range []string{"ops", "ci"} {
		if secret, ok := tokens[name]; ok {
			sum := sha256.Sum256([]byte(secret))
			entries = append(entries, fmt.Sprintf(`{"name":%q,"sha256":%q,"rules":%s}`, name, hex.EncodeToString(sum[:]), rules[name]))
		}
	}
	return `{"tokens":[` + strings.Join(entries, ",") + `]}`
}

func writeFile(t *testing.T, file, content string) {
	t.Helper()
	if err := os.WriteFile(file, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestSecuredServer runs `leasehold server` with TLS, client certificates and an auth
// file, and the CLI against it: the certificate and token flags work, a missing token
// and a forbidden action are refused with what is missing, an admin action is logged
// with the identity, and SIGHUP reloads the auth file (a removed token stops working).
func TestSecuredServer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	s := newSecured(t)
	ports, err := proc.FreePorts(3)
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	srv := StartProc(t, leaseholdBin, "server",
		"--addr", addr, "--raft-addr", fmt.Sprintf("127.0.0.1:%d", ports[1]), "--fast-lane-addr", fmt.Sprintf("127.0.0.1:%d", ports[2]),
		"--data-dir", filepath.Join(t.TempDir(), "data"),
		"--tls-cert", s.node.CertFile, "--tls-key", s.node.KeyFile, "--tls-client-ca", s.clients.CertFile,
		"--auth-file", s.authFile)
	tlsFlags := []string{"--addr", addr, "--cacert", s.nodes.CertFile, "--cert", s.client.CertFile, "--key", s.client.KeyFile}
	// cli runs the command words, then the flags, then tail (after the flags, so that
	// `lock`'s -- CMD keeps them).
	cli := func(token string, words []string, tail ...string) CLIResult {
		t.Helper()
		args := append(append([]string(nil), words...), tlsFlags...)
		if token != "" {
			args = append(args, "--auth-token-file", token)
		}
		return RunCLI(t, 20*time.Second, append(args, tail...)...)
	}
	w := func(words ...string) []string { return words }
	if !eventually(30*time.Second, func() bool { return cli(s.opsToken, w("status")).Code == 0 }) {
		t.Fatalf("the secured server never answered status; stderr:\n%s", srv.Stderr())
	}

	if r := cli(s.ciToken, w("lock"), "jobs/nightly", "--", "true"); r.Code != 0 {
		t.Errorf("ci: lock jobs/nightly: exit %d, stderr %q", r.Code, r.Stderr)
	}
	// Without a token the client certificate is the credential: its subject is unmapped.
	if r := cli("", w("locks")); r.Code != exitError || !strings.Contains(r.Stderr, `the client certificate's subject "cli" is not in the auth file`) {
		t.Errorf("no token: locks: exit %d, stderr %q; want %d and the unmapped subject", r.Code, r.Stderr, exitError)
	}
	if r := cli(s.ciToken, w("kv", "put"), "jobs/x", "1"); r.Code != exitError || !strings.Contains(r.Stderr, "token ci may not kv-write on jobs/x: no rule allows it") {
		t.Errorf("ci: kv put: exit %d, stderr %q", r.Code, r.Stderr)
	}
	if r := cli(s.ciToken, w("unlock", "jobs/nightly"), "--force", "--reason", "test"); r.Code != exitError || !strings.Contains(r.Stderr, "token ci may not admin") {
		t.Errorf("ci: unlock --force: exit %d, stderr %q", r.Code, r.Stderr)
	}
	if r := cli(s.opsToken, w("unlock", "jobs/nightly"), "--force", "--reason", "test"); r.Code == exitError && !strings.Contains(r.Stderr, "not held") {
		t.Errorf("ops: unlock --force: exit %d, stderr %q", r.Code, r.Stderr)
	}
	if !eventually(5*time.Second, func() bool {
		return strings.Contains(srv.Stderr(), `msg="admin action" identity="token ops" procedure=/leasehold.v1.LockService/ForceRelease`)
	}) {
		t.Errorf("the force release is not logged with the identity; stderr:\n%s", srv.Stderr())
	}
	snap := filepath.Join(t.TempDir(), "snap")
	if r := cli(s.opsToken, w("snapshot", "save", snap)); r.Code != 0 {
		t.Errorf("ops: snapshot save: exit %d, stderr %q", r.Code, r.Stderr)
	}
	if r := cli(s.ciToken, w("snapshot", "save", snap)); r.Code == 0 || !strings.Contains(r.Stderr, "403") {
		t.Errorf("ci: snapshot save: exit %d, stderr %q, want 403", r.Code, r.Stderr)
	}

	// SIGHUP: ci's token is taken out of the file.
	writeFile(t, s.authFile, authJSON(map[string]string{"ops": "ops-secret"}))
	srv.Signal(syscall.SIGHUP)
	if !eventually(10*time.Second, func() bool { return cli(s.ciToken, w("locks"), "jobs/").Code == exitError }) {
		t.Errorf("ci's token still works after SIGHUP; stderr:\n%s", srv.Stderr())
	}
	if r := cli(s.opsToken, w("locks")); r.Code != 0 {
		t.Errorf("ops after SIGHUP: exit %d, stderr %q", r.Code, r.Stderr)
	}
	if !strings.Contains(srv.Stderr(), "reloaded the TLS certificates and the auth file") {
		t.Errorf("the reload is not logged; stderr:\n%s", srv.Stderr())
	}
}

// TestRefusesExposedWithoutAuth checks that `leasehold server` on an address other than
// loopback without auth refuses to start, and says how to proceed.
func TestRefusesExposedWithoutAuth(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	ports, err := proc.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	r := RunCLI(t, 20*time.Second, "server", "--addr", fmt.Sprintf("0.0.0.0:%d", ports[0]), "--raft-addr", fmt.Sprintf("127.0.0.1:%d", ports[1]),
		"--fast-lane-addr", "off", "--data-dir", filepath.Join(t.TempDir(), "data"))
	if r.Code == 0 || !strings.Contains(r.Stderr, "--insecure-no-auth") || !strings.Contains(r.Stderr, "--auth-file") {
		t.Errorf("exposed without auth: exit %d, stderr %q", r.Code, r.Stderr)
	}
}
