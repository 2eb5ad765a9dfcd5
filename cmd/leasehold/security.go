package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"

	"github.com/spf13/pflag"

	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/internal/auth"
	"github.com/leasehold/leasehold/internal/tlsconf"
)

// clientSecurity holds the flags of the client command being run that say how to reach
// the server securely; addrFlag registers them next to --addr on every client command,
// all bound to these variables, and dial uses them. A CLI run parses one command's
// flags, and every registration sets the same defaults, so one set serves it.
var clientSecurity struct {
	caCert, cert, key, tokenFile string
}

// registerSecurityFlags registers --cacert, --cert, --key and --auth-token-file on fs,
// with their defaults from LEASEHOLD_CACERT, LEASEHOLD_CERT and LEASEHOLD_KEY.
func registerSecurityFlags(fs *pflag.FlagSet) {
	s := &clientSecurity
	fs.StringVar(&s.caCert, "cacert", os.Getenv("LEASEHOLD_CACERT"), "reach the server over TLS, verifying it with this CA certificate (PEM) (env LEASEHOLD_CACERT)")
	fs.StringVar(&s.cert, "cert", os.Getenv("LEASEHOLD_CERT"), "client certificate (PEM) for a server that requires one (env LEASEHOLD_CERT)")
	fs.StringVar(&s.key, "key", os.Getenv("LEASEHOLD_KEY"), "key of --cert (PEM) (env LEASEHOLD_KEY)")
	fs.StringVar(&s.tokenFile, "auth-token-file", "", "file holding the bearer token to authenticate with (default: the token in env LEASEHOLD_AUTH_TOKEN)")
}

// securityOptions are the client options the security flags ask for.
func securityOptions() ([]client.Option, error) {
	var opts []client.Option
	tc, err := clientTLS()
	if err != nil {
		return nil, err
	}
	if tc != nil {
		opts = append(opts, client.WithTLS(tc))
	}
	token, err := clientToken()
	if err != nil {
		return nil, err
	}
	if token != "" {
		opts = append(opts, client.WithToken(token))
	}
	return opts, nil
}

// clientTLS is the TLS config the flags ask for, nil for none.
func clientTLS() (*tls.Config, error) {
	s := clientSecurity
	if s.caCert == "" && s.cert == "" {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if s.caCert != "" {
		b, err := os.ReadFile(s.caCert)
		if err != nil {
			return nil, fmt.Errorf("--cacert: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("--cacert: %s holds no PEM certificate", s.caCert)
		}
	}
	if (s.cert == "") != (s.key == "") {
		return nil, errors.New("--cert and --key go together")
	}
	if s.cert != "" {
		pair, err := tls.LoadX509KeyPair(s.cert, s.key)
		if err != nil {
			return nil, fmt.Errorf("--cert/--key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// clientToken is the bearer token: from --auth-token-file, else LEASEHOLD_AUTH_TOKEN.
func clientToken() (string, error) {
	if f := clientSecurity.tokenFile; f != "" {
		b, err := os.ReadFile(f)
		if err != nil {
			return "", fmt.Errorf("--auth-token-file: %w", err)
		}
		token := strings.TrimSpace(string(b))
		if token == "" {
			return "", fmt.Errorf("--auth-token-file: %s is empty", f)
		}
		return token, nil
	}
	return strings.TrimSpace(os.Getenv("LEASEHOLD_AUTH_TOKEN")), nil
}

// adminHTTP is an HTTP client and URL scheme for the admin endpoints (/admin/snapshot),
// with the security flags' TLS, and a function that adds the token to a request.
func adminHTTP() (*http.Client, string, func(*http.Request), error) {
	tc, err := clientTLS()
	if err != nil {
		return nil, "", nil, err
	}
	token, err := clientToken()
	if err != nil {
		return nil, "", nil, err
	}
	authorize := func(r *http.Request) {
		if token != "" {
			r.Header.Set("Authorization", "Bearer "+token)
		}
	}
	// A follower redirects to the leader, which needs the token too (net/http drops it
	// on a redirect to another host).
	redirect := func(r *http.Request, via []*http.Request) error {
		if len(via) >= 10 {
			return errors.New("stopped after 10 redirects")
		}
		authorize(r)
		return nil
	}
	if tc == nil {
		return &http.Client{CheckRedirect: redirect}, "http", authorize, nil
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: tc, ForceAttemptHTTP2: true}, CheckRedirect: redirect}, "https", authorize, nil
}

// serverSecurity holds the server's TLS and auth flags.
type serverSecurity struct {
	cert, key, clientCA, peerCert, peerKey, peerCA, authFile *string
	insecure                                                 *bool
}

func registerServerSecurity(fs *pflag.FlagSet) serverSecurity {
	return serverSecurity{
		cert:     fs.String("tls-cert", "", "serve the API and the fast lane over TLS with this certificate (PEM; reloaded on SIGHUP)"),
		key:      fs.String("tls-key", "", "key of --tls-cert (PEM)"),
		clientCA: fs.String("tls-client-ca", "", "require API and fast-lane clients to present a certificate of this CA (mTLS; the auth file's subjects map them to rules)"),
		peerCert: fs.String("peer-tls-cert", "", "certificate this node presents to other nodes (raft, forwarded requests); must be valid for its raft and API hosts"),
		peerKey:  fs.String("peer-tls-key", "", "key of --peer-tls-cert"),
		peerCA:   fs.String("peer-tls-ca", "", "CA of the nodes' certificates: raft accepts only nodes with one (and it must differ from --tls-client-ca)"),
		authFile: fs.String("auth-file", "", "JSON file of tokens and certificate subjects with their rules (docs/SECURITY.md); every call must then authenticate. Reloaded on SIGHUP"),
		insecure: fs.Bool("insecure-no-auth", false, "allow serving an address other than loopback without authentication (anyone who reaches it can do anything)"),
	}
}

// load reads the files the flags name: the TLS material (nil for none) and the auth
// file (nil for none).
func (f serverSecurity) load() (*tlsconf.Node, *auth.Authenticator, error) {
	var tc *tlsconf.Node
	api := tlsconf.Files{Cert: *f.cert, Key: *f.key, CA: *f.clientCA}
	peer := tlsconf.Files{Cert: *f.peerCert, Key: *f.peerKey, CA: *f.peerCA}
	if api != (tlsconf.Files{}) || peer != (tlsconf.Files{}) {
		var err error
		if tc, err = tlsconf.Load(api, peer); err != nil {
			return nil, nil, err
		}
	}
	var a *auth.Authenticator
	if *f.authFile != "" {
		var err error
		if a, err = auth.Load(*f.authFile); err != nil {
			return nil, nil, err
		}
	}
	return tc, a, nil
}
