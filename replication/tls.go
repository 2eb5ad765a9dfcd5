package replication

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/hashicorp/raft"
)

// PeerTLS runs raft between nodes over mutually authenticated TLS (docs/SECURITY.md).
type PeerTLS struct {
	// Listen is the raft port's server config. It should require and verify a client
	// certificate (the other node's), as tlsconf.Node.PeerServer does.
	Listen *tls.Config
	// Dial returns the config to dial another node with; it is called per connection,
	// so that reloaded certificates take effect. An empty ServerName is set to the host
	// of the address dialled: peer certificates must be valid for it.
	Dial func() *tls.Config
}

// tlsStream is a raft.StreamLayer over TLS.
type tlsStream struct {
	net.Listener
	advertise net.Addr
	dial      func() *tls.Config
}

// tlsTransport is raft's network transport over TLS on bind (advertised as advertise
// when set), with the settings of tc.
func tlsTransport(bind string, advertise net.Addr, p *PeerTLS, tc *raft.NetworkTransportConfig) (*raft.NetworkTransport, error) {
	ln, err := net.Listen("tcp", bind)
	if err != nil {
		return nil, err
	}
	s := &tlsStream{Listener: tls.NewListener(ln, p.Listen), advertise: advertise, dial: p.Dial}
	if a, ok := s.Addr().(*net.TCPAddr); !ok || a.IP == nil || a.IP.IsUnspecified() {
		_ = ln.Close()
		return nil, errors.New("raft address is not advertisable: set RaftAdvertise")
	}
	c := *tc
	c.Stream = s
	return raft.NewNetworkTransportWithConfig(&c), nil
}

// Dial opens a TLS connection to another node's raft port, handshake included, within
// timeout.
func (s *tlsStream) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	cfg := s.dial()
	if cfg.ServerName == "" {
		host, _, err := net.SplitHostPort(string(address))
		if err != nil {
			return nil, fmt.Errorf("replication: raft address %q: %w", address, err)
		}
		cfg.ServerName = host
	}
	return tls.DialWithDialer(&net.Dialer{Timeout: timeout}, "tcp", string(address), cfg)
}

// Addr is the address other nodes reach this one at.
func (s *tlsStream) Addr() net.Addr {
	if s.advertise != nil {
		return s.advertise
	}
	return s.Listener.Addr()
}
