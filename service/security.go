package service

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

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

// localHosts guards h, the API of a node that serves loopback without authentication
// (the default), against DNS rebinding: a web page whose name its owner points at
// 127.0.0.1 is same-origin with the node, and its scripts could call every RPC and
// read the answers. Such a request names the page's host in its Host header; the
// node answers 421 to a Host that is neither an IP address, localhost nor the host
// the node advertises. A node with authentication, or serving another address, is
// served as it is.
func localHosts(cfg *Config, h http.Handler) http.Handler {
	if cfg.Server.Auth != nil || (cfg.TLS != nil && cfg.TLS.ClientCerts()) || !loopback(cfg.Addr) {
		return h
	}
	advertised, _, _ := net.SplitHostPort(cfg.AdvertiseAddr)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !localHost(r.Host, advertised) {
			// Not a byte more of the request is read: a stalled body holds nothing.
			_ = http.NewResponseController(w).SetReadDeadline(time.Now())
			if r.ProtoMajor == 1 {
				w.Header().Set("Connection", "close") // HTTP/2 resets the stream alone
			}
			http.Error(w, fmt.Sprintf("this node serves loopback without authentication and answers only requests for 127.0.0.1, localhost or %s, not %q (a web page cannot reach it through DNS rebinding)", cfg.AdvertiseAddr, r.Host), http.StatusMisdirectedRequest)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// localHost reports whether hostport, a request's Host, is one a page cannot rebind:
// an IP address (or none), localhost, or advertised.
func localHost(hostport, advertised string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")), ".")
	return host == "" || net.ParseIP(host) != nil || host == "localhost" || strings.EqualFold(host, advertised)
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
