package service

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"

	"github.com/leasehold/leasehold/replication"
)

// errExposed is returned by Start for a node that would serve an address other than
// loopback without authentication, unless Config.InsecureNoAuth.
var errExposed = errors.New("service: refusing to serve without authentication")

// checkExposure refuses a node that would serve an address other than loopback without
// authentication — the API and fast lane without Server.Auth or a client CA, raft
// without peer TLS — unless InsecureNoAuth, and then says so loudly in the log. It also
// warns about tokens sent in clear text.
func checkExposure(cfg *Config) error {
	callers := cfg.Server.Auth != nil || (cfg.TLS != nil && cfg.TLS.ClientCerts())
	peers := cfg.TLS != nil && cfg.TLS.Peer()
	raftAddr := cfg.Raft.RaftAddr
	if raftAddr == "" {
		raftAddr = "127.0.0.1:7741"
	}
	var open []string
	for _, p := range []struct {
		what, addr string
		authed     bool
	}{
		{"API (--addr)", cfg.Addr, callers},
		{"fast lane (--fast-lane-addr)", cfg.FastLaneAddr, callers},
		{"raft (--raft-addr)", raftAddr, peers},
	} {
		if p.addr != "off" && !p.authed && !loopback(p.addr) {
			open = append(open, p.what+" on "+p.addr)
		}
	}
	if len(open) > 0 {
		if !cfg.InsecureNoAuth {
			return fmt.Errorf("%w: %s would let anyone who reaches it take, release and force-release any lock, read and write every key and change the membership; give --auth-file (tokens, or client certificates with --tls-client-ca) for the API and fast lane and --peer-tls-cert/--peer-tls-key/--peer-tls-ca for raft (docs/SECURITY.md), or --insecure-no-auth to serve them open", errExposed, strings.Join(open, ", "))
		}
		for _, o := range open {
			cfg.Logger.Warn("INSECURE: serving without authentication (--insecure-no-auth): anyone who reaches this address can do anything", "port", o)
		}
	}
	if cfg.Server.Auth != nil && (cfg.TLS == nil || !cfg.TLS.API()) && !loopback(cfg.Addr) {
		cfg.Logger.Warn("auth is on but the API serves no TLS: bearer tokens cross the network in clear text (give --tls-cert and --tls-key)", "addr", cfg.Addr)
	}
	if cfg.TLS != nil && cfg.TLS.API() && !peers {
		cfg.Logger.Info("the API serves TLS without peer TLS: a follower forwarding a request verifies the leader's API certificate against the system's roots (give --peer-tls-* to verify it against the nodes' CA)")
	}
	if cfg.Server.Auth != nil && !peers && !loopback(raftAddr) {
		cfg.Logger.Warn("auth is on but raft has no peer TLS: anyone who reaches the raft port can rewrite the cluster's state", "raft", raftAddr)
	}
	return nil
}

// loopback reports whether addr ("host:port") can be reached only from this machine.
// A host name other than localhost counts as reachable from elsewhere.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// secure serves ln's connections over TLS, offering nextProtos, when the node serves
// TLS; else it returns ln.
func (cfg *Config) secure(ln net.Listener, nextProtos ...string) net.Listener {
	if cfg.TLS == nil || !cfg.TLS.API() {
		return ln
	}
	return tls.NewListener(ln, cfg.TLS.APIServer(nextProtos...))
}

// protocols are the HTTP versions the API serves: HTTP/1.1 and HTTP/2, over TLS or
// without (h2c).
func (cfg *Config) protocols() *http.Protocols {
	p := new(http.Protocols)
	p.SetHTTP1(true)
	if cfg.TLS != nil && cfg.TLS.API() {
		p.SetHTTP2(true)
	} else {
		p.SetUnencryptedHTTP2(true)
	}
	return p
}

// peerTLS is raft's TLS, when the node has peer certificates.
func (cfg *Config) peerTLS() *replication.PeerTLS {
	if cfg.TLS == nil || !cfg.TLS.Peer() {
		return nil
	}
	return &replication.PeerTLS{Listen: cfg.TLS.PeerServer(), Dial: cfg.TLS.PeerClient}
}

// reloaders are what Reload reads again.
func (cfg *Config) reloaders() []func() error {
	var r []func() error
	if cfg.TLS != nil {
		r = append(r, cfg.TLS.Reload)
	}
	if cfg.Server.Auth != nil {
		r = append(r, cfg.Server.Auth.Reload)
	}
	return r
}

// Reload reads the TLS certificates and keys and the auth file again (on SIGHUP). What
// is valid takes effect at once — new connections get the new certificates, and every
// request is authorized by the new file, on connections already open too; what is not
// valid is reported and the old stays in use.
func (n *Node) Reload() error {
	var errs []error
	for _, r := range n.reload {
		errs = append(errs, r())
	}
	return errors.Join(errs...)
}
