// Package tlsconf holds a node's TLS material, read from PEM files and reloadable while
// the node runs: the API's certificate and the CA its clients' certificates must chain
// to (mTLS), and the peer certificate and CA that nodes authenticate each other with
// (raft, and requests one node forwards to the leader). Every tls.Config it returns
// reads the material current at each handshake, so Reload (on SIGHUP) takes effect for
// new connections without a restart; connections already open keep theirs.
package tlsconf

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
)

// ErrConfig is returned by Load and Reload for files that are missing, unreadable,
// or do not fit together; the message names the file or flag.
var ErrConfig = errors.New("tlsconf: bad TLS configuration")

// Files names the PEM files of one side of a node: its certificate chain and key, and the
// CA certificates the other side's certificates must chain to.
type Files struct {
	Cert, Key, CA string
}

func (f Files) empty() bool { return f == Files{} }

// Node is a node's TLS material. API is the API and fast lane's (Cert and Key: the
// server certificate; CA: the client CA, which makes client certificates mandatory);
// Peer is what nodes present to and require of each other (all three files, or none).
// A peer CA and a client CA must not share a certificate: a connection whose certificate
// chains to the peer CA is trusted as another node.
type Node struct {
	api, peer Files
	cur       atomic.Pointer[material]
}

type material struct {
	apiCert   *tls.Certificate
	peerCert  *tls.Certificate
	clientCAs []*x509.Certificate
	peerCAs   []*x509.Certificate
	apiPool   *x509.CertPool // the API verifies client certificates against client ∪ peer CAs
	peerPool  *x509.CertPool
}

// Load reads the files (see Node for which must go together). Errors wrap ErrConfig.
func Load(api, peer Files) (*Node, error) {
	switch {
	case (api.Cert == "") != (api.Key == ""):
		return nil, fmt.Errorf("%w: --tls-cert and --tls-key go together", ErrConfig)
	case api.CA != "" && api.Cert == "":
		return nil, fmt.Errorf("%w: --tls-client-ca needs --tls-cert and --tls-key (client certificates are checked over TLS)", ErrConfig)
	case !peer.empty() && (peer.Cert == "" || peer.Key == "" || peer.CA == ""):
		return nil, fmt.Errorf("%w: --peer-tls-cert, --peer-tls-key and --peer-tls-ca go together (nodes authenticate each other both ways)", ErrConfig)
	}
	n := &Node{api: api, peer: peer}
	if err := n.Reload(); err != nil {
		return nil, err
	}
	return n, nil
}

// Reload reads every file again and, if all are valid, uses them for every handshake
// from now on. On error nothing changes.
func (n *Node) Reload() error {
	var m material
	var err error
	if n.api.Cert != "" {
		if m.apiCert, err = loadPair(n.api.Cert, n.api.Key); err != nil {
			return err
		}
	}
	if n.api.CA != "" {
		if m.clientCAs, err = loadCAs(n.api.CA); err != nil {
			return err
		}
	}
	if n.peer.Cert != "" {
		if m.peerCert, err = loadPair(n.peer.Cert, n.peer.Key); err != nil {
			return err
		}
		if m.peerCAs, err = loadCAs(n.peer.CA); err != nil {
			return err
		}
	}
	for _, c := range m.clientCAs {
		for _, p := range m.peerCAs {
			if bytes.Equal(c.Raw, p.Raw) {
				return fmt.Errorf("%w: %s and %s share the CA %q: every client certificate would pass for a node; use a CA of their own for the nodes", ErrConfig, n.api.CA, n.peer.CA, c.Subject.CommonName)
			}
		}
	}
	m.peerPool = pool(m.peerCAs)
	m.apiPool = pool(append(append([]*x509.Certificate(nil), m.clientCAs...), m.peerCAs...))
	n.cur.Store(&m)
	return nil
}

func loadPair(cert, key string) (*tls.Certificate, error) {
	c, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		return nil, fmt.Errorf("%w: certificate %s with key %s: %w", ErrConfig, cert, key, err)
	}
	return &c, nil
}

func loadCAs(file string) ([]*x509.Certificate, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	var out []*x509.Certificate
	for {
		var blk *pem.Block
		if blk, b = pem.Decode(b); blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrConfig, file, err)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: %s holds no PEM certificate", ErrConfig, file)
	}
	return out, nil
}

func pool(certs []*x509.Certificate) *x509.CertPool {
	if len(certs) == 0 {
		return nil
	}
	p := x509.NewCertPool()
	for _, c := range certs {
		p.AddCert(c)
	}
	return p
}

// API reports whether the API and fast lane serve TLS.
func (n *Node) API() bool { return n.api.Cert != "" }

// ClientCerts reports whether API clients must present a certificate of the client CA.
func (n *Node) ClientCerts() bool { return n.api.CA != "" }

// Peer reports whether nodes authenticate each other with peer certificates.
func (n *Node) Peer() bool { return n.peer.Cert != "" }

// APIServer returns the server config of the API and the fast lane, offering
// nextProtos (ALPN). With a client CA every client must present a certificate that
// chains to it or to the peer CA; without one, only a certificate that is offered is
// checked (another node forwarding a request presents its peer certificate).
func (n *Node) APIServer(nextProtos ...string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: nextProtos,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			m := n.cur.Load()
			c := &tls.Config{
				MinVersion:   tls.VersionTLS12,
				NextProtos:   nextProtos,
				Certificates: []tls.Certificate{*m.apiCert},
				ClientCAs:    m.apiPool,
			}
			switch {
			case m.clientCAs != nil:
				c.ClientAuth = tls.RequireAndVerifyClientCert
			case m.peerCAs != nil:
				c.ClientAuth = tls.VerifyClientCertIfGiven
			}
			return c, nil
		},
	}
}

// PeerServer returns the server config of the raft port: the other node must present a
// certificate of the peer CA.
func (n *Node) PeerServer() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			m := n.cur.Load()
			return &tls.Config{
				MinVersion:   tls.VersionTLS12,
				Certificates: []tls.Certificate{*m.peerCert},
				ClientAuth:   tls.RequireAndVerifyClientCert,
				ClientCAs:    m.peerPool,
			}, nil
		},
	}
}

// PeerClient returns a config to dial another node's raft port with: the node's peer
// certificate, and the peer CA to verify the other's. Call it per connection: it holds
// the material current at the call.
func (n *Node) PeerClient() *tls.Config {
	m := n.cur.Load()
	return &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{*m.peerCert}, RootCAs: m.peerPool}
}

// ForwardClient returns a config to dial another node's API with (to forward a request
// to the leader): the peer certificate, if there is one, so that the leader knows the
// request comes from a node; and the peer CA to verify the leader's API certificate
// with, or the system's roots without peer TLS. Call it per connection.
func (n *Node) ForwardClient() *tls.Config {
	m := n.cur.Load()
	c := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: m.peerPool}
	if m.peerCert != nil {
		c.Certificates = []tls.Certificate{*m.peerCert}
	}
	return c
}

// PeerName reports whether a verified TLS connection's client certificate chains to the
// peer CA, and if so the certificate's common name: the connection is another node's.
func (n *Node) PeerName(cs *tls.ConnectionState) (string, bool) {
	if cs == nil {
		return "", false
	}
	m := n.cur.Load()
	for _, chain := range cs.VerifiedChains {
		root := chain[len(chain)-1]
		for _, ca := range m.peerCAs {
			if bytes.Equal(root.Raw, ca.Raw) {
				return chain[0].Subject.CommonName, true
			}
		}
	}
	return "", false
}

// ClientName returns the common name of a verified TLS connection's client certificate
// that does not chain to the peer CA ("" when there is none).
func (n *Node) ClientName(cs *tls.ConnectionState) string {
	if cs == nil || len(cs.VerifiedChains) == 0 {
		return ""
	}
	if _, peer := n.PeerName(cs); peer {
		return ""
	}
	return cs.VerifiedChains[0][0].Subject.CommonName
}
