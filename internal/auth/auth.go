// Package auth decides who a caller is and what it may do (guarantee G11): identities
// come from bearer tokens (stored as SHA-256 hashes) and from client-certificate subjects,
// both listed in one JSON file, each with rules per name prefix that allow read, lock,
// kv-write or admin. It knows nothing of transports: package server finds the caller's
// credentials on each transport and asks Authenticator who that is, then asks the
// Identity whether it may call an RPC on a name.
//
// The file:
//
//	{"tokens":   [{"name": "ops", "sha256": "<hex of sha256(token)>",
//	               "rules": [{"prefix": "", "allow": ["admin"]}]},
//	              {"name": "ci", "sha256": "…",
//	               "rules": [{"prefix": "jobs/", "allow": ["lock", "read"]}],
//	               "quota": {"leases": 100}}],
//	 "subjects": [{"cn": "billing.example.com",
//	               "rules": [{"prefix": "billing/", "allow": ["lock", "kv-write", "read"]}]}],
//	 "default_quota": {"leases": 10000, "locks": 100000, "waiters": 10000}}
package auth

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"unicode/utf8"
)

// Errors of package auth. Both are wrapped with the reason: match them with errors.Is.
var (
	// ErrUnauthenticated is returned when a caller brings no credential, or one that
	// names nobody (an unknown token or certificate subject).
	ErrUnauthenticated = errors.New("auth: unauthenticated")
	// ErrPermissionDenied is returned when the caller is known but no rule of its
	// allows what it asked; the message names the identity, the permission and the name.
	ErrPermissionDenied = errors.New("auth: permission denied")
	// ErrQuota is returned when a call would take the caller past one of its quotas.
	// The error is a *QuotaError naming the quota.
	ErrQuota = errors.New("auth: quota exceeded")
	// ErrFile is returned by Load and Reload for a file that cannot be read or is not a
	// valid auth file; the message names the entry and field.
	ErrFile = errors.New("auth: bad auth file")
)

// Permission is what a caller may do on a name.
type Permission uint8

// The permissions, as the auth file spells them: read (describe, list, get, check a
// token, status), lock (leases, acquire, release), kv-write (put, delete) and admin
// (everything, including force release, membership, snapshots, /metrics and profiling).
const (
	Read    Permission = iota + 1 // "read"
	Lock                          // "lock"
	KVWrite                       // "kv-write"
	Admin                         // "admin"
)

var permissionNames = [...]string{Read: "read", Lock: "lock", KVWrite: "kv-write", Admin: "admin"}

func (p Permission) String() string {
	if p >= Read && p <= Admin {
		return permissionNames[p]
	}
	return fmt.Sprintf("permission(%d)", uint8(p))
}

// ParsePermission parses "read", "lock", "kv-write" or "admin".
func ParsePermission(s string) (Permission, error) {
	for p := Read; p <= Admin; p++ {
		if permissionNames[p] == s {
			return p, nil
		}
	}
	return 0, fmt.Errorf("unknown permission %q (want read, lock, kv-write or admin)", s)
}

// Rule allows some permissions on every name that starts with Prefix ("" is every name).
type Rule struct {
	Prefix string
	Allow  []Permission
}

func (r Rule) allows(p Permission) bool {
	for _, a := range r.Allow {
		if a == p || a == Admin {
			return true
		}
	}
	return false
}

// Quota bounds what one identity may hold on the leader at once. Zero fields take the
// file's default_quota, and then DefaultQuota.
type Quota struct {
	Leases  int `json:"leases,omitempty"`  // live leases granted to the identity
	Locks   int `json:"locks,omitempty"`   // locks held by those leases
	Waiters int `json:"waiters,omitempty"` // acquires of the identity in flight (each may wait in a queue)
}

// DefaultQuota is the quota of an identity whose entry and file name none. Each lease
// costs the leader about 3 KB, so 10 000 leases pin about 30 MB.
var DefaultQuota = Quota{Leases: 10000, Locks: 100000, Waiters: 10000}

func (q Quota) or(d Quota) Quota {
	if q.Leases <= 0 {
		q.Leases = d.Leases
	}
	if q.Locks <= 0 {
		q.Locks = d.Locks
	}
	if q.Waiters <= 0 {
		q.Waiters = d.Waiters
	}
	return q
}

// QuotaError is the error of a call that would exceed one of the caller's quotas.
type QuotaError struct {
	Who   string // "token ci"
	Quota string // "leases", "locks" or "waiters"
	Limit int
}

func (e *QuotaError) Error() string {
	return fmt.Sprintf("auth: %s may hold at most %d %s at once (its quota)", e.Who, e.Limit, e.Quota)
}

// Unwrap makes a QuotaError match ErrQuota.
func (e *QuotaError) Unwrap() error { return ErrQuota }

// Kind says how an identity was authenticated.
type Kind uint8

// Kinds of identity.
const (
	KindToken   Kind = iota + 1 // a bearer token of the file
	KindSubject                 // a client certificate whose subject the file maps
	KindPeer                    // another node, by its peer certificate: may do anything
)

func (k Kind) String() string {
	switch k {
	case KindToken:
		return "token"
	case KindSubject:
		return "subject"
	case KindPeer:
		return "peer"
	}
	return "identity"
}

// Identity is an authenticated caller and what it may do.
type Identity struct {
	Kind  Kind
	Name  string // the token's name, the certificate's common name, the peer's name
	Rules []Rule
	Quota Quota
}

// String names the identity as messages and logs do: "token ci", "subject billing".
func (id *Identity) String() string { return id.Kind.String() + " " + id.Name }

// Allow reports whether the identity may act with permission p on name. For an RPC that
// names nothing (named false; Grant, Status, AddMember…), admin needs a rule on the
// whole namespace (prefix ""), read is allowed by any rule (Status and Members name no
// lock or key), and the other permissions by any rule that allows them, whatever its
// prefix. The error wraps ErrPermissionDenied and says which rule is missing.
func (id *Identity) Allow(p Permission, name string, named bool) error {
	if id.Kind == KindPeer {
		return nil
	}
	for _, r := range id.Rules {
		switch {
		case named && !strings.HasPrefix(name, r.Prefix):
		case !named && p == Admin && r.Prefix != "":
		case !named && p == Read:
			return nil
		case r.allows(p):
			return nil
		}
	}
	if !named {
		if p == Admin {
			return fmt.Errorf("%w: %s may not %s: no rule allows admin on every name (prefix \"\")", ErrPermissionDenied, id, p)
		}
		return fmt.Errorf("%w: %s may not %s: no rule allows it", ErrPermissionDenied, id, p)
	}
	if name == "" {
		name = `"" (every name)`
	}
	return fmt.Errorf("%w: %s may not %s on %s: no rule allows it", ErrPermissionDenied, id, p, name)
}

// Peer returns the identity of another node of the cluster, authenticated by its peer
// certificate. A peer may do anything: it could as well write the raft log.
func Peer(name string) *Identity { return &Identity{Kind: KindPeer, Name: name} }

// Authenticator maps credentials to identities, from an auth file it can reload. It is
// safe for concurrent use; Reload swaps the table atomically, so a call sees the old
// file or the new one, never a mix.
type Authenticator struct {
	path    string
	current atomic.Pointer[table]
}

// table is one loaded auth file.
type table struct {
	gen      uint64
	tokens   map[[sha256.Size]byte]*Identity
	subjects map[string]*Identity
}

// Load reads the auth file at path. Errors wrap ErrFile.
func Load(path string) (*Authenticator, error) {
	a := &Authenticator{path: path}
	if err := a.Reload(); err != nil {
		return nil, err
	}
	return a, nil
}

// Reload reads the file again and, if it is valid, serves from it from now on. An
// invalid file changes nothing (the error says why, wrapping ErrFile).
func (a *Authenticator) Reload() error {
	b, err := os.ReadFile(a.path)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrFile, err)
	}
	t, err := parse(b)
	if err != nil {
		return fmt.Errorf("%w: %s: %w", ErrFile, a.path, err)
	}
	if old := a.current.Load(); old != nil {
		t.gen = old.gen + 1
	}
	a.current.Store(t)
	return nil
}

// Generation counts the reloads; callers that cache an identity look it up again when
// it changes.
func (a *Authenticator) Generation() uint64 { return a.current.Load().gen }

// Token returns the identity of a bearer token. An unknown token wraps
// ErrUnauthenticated. Tokens are compared by their SHA-256 hash, so the file holds no
// secret and a lookup's timing says nothing about the token itself.
func (a *Authenticator) Token(token string) (*Identity, error) {
	if id := a.current.Load().tokens[sha256.Sum256([]byte(token))]; id != nil {
		return id, nil
	}
	return nil, fmt.Errorf("%w: the bearer token is not in the auth file", ErrUnauthenticated)
}

// Subject returns the identity of a verified client certificate's common name. An
// unmapped subject wraps ErrUnauthenticated.
func (a *Authenticator) Subject(cn string) (*Identity, error) {
	if id := a.current.Load().subjects[cn]; id != nil {
		return id, nil
	}
	return nil, fmt.Errorf("%w: the client certificate's subject %q is not in the auth file", ErrUnauthenticated, cn)
}

// The file's JSON shape.
type fileJSON struct {
	Tokens []struct {
		Name   string     `json:"name"`
		SHA256 string     `json:"sha256"`
		Rules  []ruleJSON `json:"rules"`
		Quota  Quota      `json:"quota"`
	} `json:"tokens"`
	Subjects []struct {
		CN    string     `json:"cn"`
		Rules []ruleJSON `json:"rules"`
		Quota Quota      `json:"quota"`
	} `json:"subjects"`
	DefaultQuota Quota `json:"default_quota"`
}

type ruleJSON struct {
	Prefix string   `json:"prefix"`
	Allow  []string `json:"allow"`
}

// parse decodes and checks an auth file. Errors name the entry and field.
func parse(b []byte) (*table, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var f fileJSON
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("not valid JSON of an auth file: %w", err)
	}
	def := f.DefaultQuota.or(DefaultQuota)
	t := &table{tokens: make(map[[sha256.Size]byte]*Identity), subjects: make(map[string]*Identity)}
	names := make(map[string]bool)
	for i, e := range f.Tokens {
		where := fmt.Sprintf("tokens[%d]", i)
		if err := checkName(e.Name); err != nil {
			return nil, fmt.Errorf("%s.name: %w", where, err)
		}
		if names[e.Name] {
			return nil, fmt.Errorf("%s.name: %q is the name of another token", where, e.Name)
		}
		names[e.Name] = true
		h, err := hex.DecodeString(e.SHA256)
		if err != nil || len(h) != sha256.Size {
			return nil, fmt.Errorf("%s.sha256: must be the 64 hex characters of sha256(token)", where)
		}
		sum := [sha256.Size]byte(h)
		if t.tokens[sum] != nil {
			return nil, fmt.Errorf("%s.sha256: the same token as %s", where, t.tokens[sum])
		}
		rules, err := parseRules(where, e.Rules)
		if err != nil {
			return nil, err
		}
		t.tokens[sum] = &Identity{Kind: KindToken, Name: e.Name, Rules: rules, Quota: e.Quota.or(def)}
	}
	for i, e := range f.Subjects {
		where := fmt.Sprintf("subjects[%d]", i)
		if err := checkName(e.CN); err != nil {
			return nil, fmt.Errorf("%s.cn: %w", where, err)
		}
		if t.subjects[e.CN] != nil {
			return nil, fmt.Errorf("%s.cn: %q is listed twice", where, e.CN)
		}
		rules, err := parseRules(where, e.Rules)
		if err != nil {
			return nil, err
		}
		t.subjects[e.CN] = &Identity{Kind: KindSubject, Name: e.CN, Rules: rules, Quota: e.Quota.or(def)}
	}
	return t, nil
}

func parseRules(where string, in []ruleJSON) ([]Rule, error) {
	if len(in) == 0 {
		return nil, fmt.Errorf("%s.rules: an identity needs at least one rule", where)
	}
	out := make([]Rule, len(in))
	for i, r := range in {
		if !utf8.ValidString(r.Prefix) {
			return nil, fmt.Errorf("%s.rules[%d].prefix: must be valid UTF-8", where, i)
		}
		if len(r.Allow) == 0 {
			return nil, fmt.Errorf("%s.rules[%d].allow: names no permission (read, lock, kv-write, admin)", where, i)
		}
		out[i].Prefix = r.Prefix
		for j, s := range r.Allow {
			p, err := ParsePermission(s)
			if err != nil {
				return nil, fmt.Errorf("%s.rules[%d].allow[%d]: %w", where, i, j, err)
			}
			out[i].Allow = append(out[i].Allow, p)
		}
	}
	return out, nil
}

func checkName(s string) error {
	if s == "" || len(s) > 256 || !utf8.ValidString(s) || strings.ContainsAny(s, "\r\n") {
		return errors.New("must be 1 to 256 bytes of UTF-8 on one line")
	}
	return nil
}
