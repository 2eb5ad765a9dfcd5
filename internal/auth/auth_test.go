package auth

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func hash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// TestParseNamesTheField checks that every kind of bad auth file is refused with the
// entry and field it is about.
func TestParseNamesTheField(t *testing.T) {
	h := hash("x")
	for _, c := range []struct{ file, want string }{
		{`{`, "not valid JSON"},
		{`{"token":[]}`, `unknown field "token"`},
		{`{"tokens":[{"sha256":"` + h + `","rules":[{"allow":["read"]}]}]}`, "tokens[0].name"},
		{`{"tokens":[{"name":"a","sha256":"abc","rules":[{"allow":["read"]}]}]}`, "tokens[0].sha256"},
		{`{"tokens":[{"name":"a","sha256":"` + h + `"}]}`, "tokens[0].rules"},
		{`{"tokens":[{"name":"a","sha256":"` + h + `","rules":[{"prefix":"p/"}]}]}`, "tokens[0].rules[0].allow"},
		{`{"tokens":[{"name":"a","sha256":"` + h + `","rules":[{"allow":["write"]}]}]}`, `tokens[0].rules[0].allow[0]: unknown permission "write"`},
		{`{"tokens":[{"name":"a","sha256":"` + h + `","rules":[{"allow":["read"]}]},{"name":"a","sha256":"` + hash("y") + `","rules":[{"allow":["read"]}]}]}`, "tokens[1].name"},
		{`{"tokens":[{"name":"a","sha256":"` + h + `","rules":[{"allow":["read"]}]},{"name":"b","sha256":"` + h + `","rules":[{"allow":["read"]}]}]}`, "tokens[1].sha256: the same token as token a"},
		{`{"subjects":[{"cn":"","rules":[{"allow":["read"]}]}]}`, "subjects[0].cn"},
	} {
		_, err := parse([]byte(c.file))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error containing %q", c.file, err, c.want)
		}
	}
}

// TestAllow checks the rules: prefixes, admin implying every permission on its names,
// and the RPCs that name nothing.
func TestAllow(t *testing.T) {
	ci := &Identity{Kind: KindToken, Name: "ci", Rules: []Rule{{Prefix: "jobs/", Allow: []Permission{Lock, Read}}}}
	teamAdmin := &Identity{Kind: KindToken, Name: "team", Rules: []Rule{{Prefix: "team/", Allow: []Permission{Admin}}}}
	root := &Identity{Kind: KindToken, Name: "root", Rules: []Rule{{Prefix: "", Allow: []Permission{Admin}}}}
	for _, c := range []struct {
		id    *Identity
		p     Permission
		name  string
		named bool
		ok    bool
	}{
		{ci, Lock, "jobs/1", true, true},
		{ci, Read, "jobs/1", true, true},
		{ci, KVWrite, "jobs/1", true, false},
		{ci, Lock, "orders/1", true, false},
		{ci, Lock, "job", true, false},
		{ci, Lock, "", false, true},   // Grant
		{ci, Read, "", false, true},   // Status
		{ci, Admin, "", false, false}, // membership
		{teamAdmin, KVWrite, "team/x", true, true},
		{teamAdmin, KVWrite, "other/x", true, false},
		{teamAdmin, Admin, "", false, false},
		{root, Admin, "", false, true},
		{root, KVWrite, "anything", true, true},
		{Peer("n2"), Admin, "", false, true},
	} {
		err := c.id.Allow(c.p, c.name, c.named)
		if (err == nil) != c.ok {
			t.Errorf("%s %v on %q (named %v): %v, want allowed %v", c.id, c.p, c.name, c.named, err, c.ok)
		}
		if err != nil && !errors.Is(err, ErrPermissionDenied) {
			t.Errorf("%v does not match ErrPermissionDenied", err)
		}
	}
	err := ci.Allow(KVWrite, "orders/1", true)
	if want := "token ci may not kv-write on orders/1: no rule allows it"; err == nil || !strings.HasSuffix(err.Error(), want) {
		t.Errorf("message %q, want it to end with %q", err, want)
	}
}

// TestReloadKeepsTheOldFileOnError checks that Reload swaps in a valid file and keeps
// serving the old one when the new one is invalid.
func TestReloadKeepsTheOldFileOnError(t *testing.T) {
	file := filepath.Join(t.TempDir(), "auth.json")
	write := func(s string) {
		if err := os.WriteFile(file, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(`{"tokens":[{"name":"a","sha256":"` + hash("secret-a") + `","rules":[{"allow":["read"]}]}]}`)
	a, err := Load(file)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Token("secret-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Token("secret-b"); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("unknown token: %v", err)
	}
	write(`{"tokens":[`)
	if err := a.Reload(); !errors.Is(err, ErrFile) {
		t.Fatalf("invalid file: %v", err)
	}
	if _, err := a.Token("secret-a"); err != nil {
		t.Fatalf("after a failed reload: %v", err)
	}
	gen := a.Generation()
	write(`{"tokens":[{"name":"b","sha256":"` + hash("secret-b") + `","rules":[{"allow":["read"]}]}]}`)
	if err := a.Reload(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Token("secret-a"); !errors.Is(err, ErrUnauthenticated) {
		t.Errorf("a removed token: %v", err)
	}
	if id, err := a.Token("secret-b"); err != nil || id.Quota != DefaultQuota || a.Generation() == gen {
		t.Errorf("the new token: %v %v, generation %d", id, err, a.Generation())
	}
}
