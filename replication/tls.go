package replication

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"time"
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

// dialer returns the stream's dial over TLS: a connection to another node's raft port,
// handshake included, within timeout, and the TCP connection under it.
func (p *PeerTLS) dialer() func(address string, timeout time.Duration) (c, raw net.Conn, err error) {
	return func(address string, timeout time.Duration) (net.Conn, net.Conn, error) {
		cfg := p.Dial()
		if cfg.ServerName == "" {
			host, _, err := net.SplitHostPort(address)
			if err != nil {
				return nil, nil, fmt.Errorf("replication: raft address %q: %w", address, err)
			}
			cfg.ServerName = host
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		raw, err := (&net.Dialer{}).DialContext(ctx, "tcp", address)
		if err != nil {
			return nil, nil, err
		}
		c := tls.Client(raw, cfg)
		if err := c.HandshakeContext(ctx); err != nil {
			_ = raw.Close()
			return nil, nil, err
		}
		return c, raw, nil
	}
}
