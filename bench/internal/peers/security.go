package peers

import (
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/internal/tlsconf/tlstest"
)

// security is how a leasehold system is secured: TLS on the API and the fast lane (and
// peer TLS between the nodes of a cluster), and an auth file whose one token the
// workers authenticate with. A system name asks for it with suffixes:
// "leasehold-efficiency+tls", "+auth", "+tls+auth".
type security struct {
	tls, auth bool

	args   []string    // the server's flags
	tlsCfg *tls.Config // the clients'
	token  string
}

// parseSecurity splits "leasehold-efficiency+tls+auth" into its base name and security.
func parseSecurity(name string) (string, security, error) {
	base, mods, _ := strings.Cut(name, "+")
	var s security
	if mods == "" {
		return base, s, nil
	}
	for _, m := range strings.Split(mods, "+") {
		switch m {
		case "tls":
			s.tls = true
		case "auth":
			s.auth = true
		default:
			return "", s, fmt.Errorf("peers: %s: unknown suffix %q (want +tls, +auth)", name, m)
		}
	}
	return base, s, nil
}

// suffix is the name suffix of s ("", "+tls", "+auth", "+tls+auth").
func (s security) suffix() string {
	out := ""
	if s.tls {
		out += "+tls"
	}
	if s.auth {
		out += "+auth"
	}
	return out
}

// describe says how the system is secured, for the report.
func (s security) describe() string {
	var parts []string
	if s.tls {
		parts = append(parts, "TLS on the API, the fast lane and raft (ECDSA P-256 certificates, TLS 1.3)")
	}
	if s.auth {
		parts = append(parts, "an auth file, every worker authenticated by a bearer token (Connect header, fast-lane hello) and authorized per request")
	}
	if len(parts) == 0 {
		return ""
	}
	return "; secured: " + strings.Join(parts, "; ")
}

// prepare makes the certificates and auth file under dir and sets the server's flags
// and the clients' options.
func (s *security) prepare(dir string) (err error) {
	if !s.tls && !s.auth {
		return nil
	}
	dir = filepath.Join(dir, "security")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("peers: making certificates: %v", r)
		}
	}()
	if s.tls {
		tb := &certDir{dir: dir}
		ca := tlstest.NewCA(tb, "bench")
		cert := ca.Issue(tb, "node")
		s.args = append(s.args, "--tls-cert", cert.CertFile, "--tls-key", cert.KeyFile,
			"--peer-tls-cert", cert.CertFile, "--peer-tls-key", cert.KeyFile, "--peer-tls-ca", ca.CertFile)
		s.tlsCfg = ca.ClientConfig()
	}
	if s.auth {
		s.token = "bench-token"
		sum := sha256.Sum256([]byte(s.token))
		file := filepath.Join(dir, "auth.json")
		if err := os.WriteFile(file, []byte(`{"tokens":[{"name":"bench","sha256":"`+hex.EncodeToString(sum[:])+`","rules":[{"prefix":"","allow":["admin"]}]}]}`), 0o600); err != nil {
			return err
		}
		s.args = append(s.args, "--auth-file", file)
	}
	return nil
}

// clientOptions are the options of every client of the system.
func (s security) clientOptions() []client.Option {
	var opts []client.Option
	if s.tlsCfg != nil {
		opts = append(opts, client.WithTLS(s.tlsCfg))
	}
	if s.token != "" {
		opts = append(opts, client.WithToken(s.token))
	}
	return opts
}

// httpGet is an HTTP GET of path on the API at addr, over TLS and with the token when
// the system has them.
func (s security) httpGet(addr, path string) (*http.Request, *http.Client, error) {
	scheme, hc := "http", http.DefaultClient
	if s.tlsCfg != nil {
		scheme, hc = "https", &http.Client{Transport: &http.Transport{TLSClientConfig: s.tlsCfg}}
	}
	req, err := http.NewRequest(http.MethodGet, scheme+"://"+addr+path, nil)
	if err != nil {
		return nil, nil, err
	}
	if s.token != "" {
		req.Header.Set("Authorization", "Bearer "+s.token)
	}
	return req, hc, nil
}

// certDir gives tlstest a directory of the benchmark's; its Fatal panics (recovered by
// prepare).
type certDir struct {
	dir string
	n   int
}

func (*certDir) Helper() {}

func (*certDir) Fatal(args ...any) { panic(fmt.Sprint(args...)) }

func (d *certDir) TempDir() string {
	d.n++
	dir := filepath.Join(d.dir, fmt.Sprint(d.n))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		panic(err)
	}
	return dir
}
