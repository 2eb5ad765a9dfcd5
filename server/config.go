// Package server implements leasehold's RPC services on top of the leader runtime:
// it validates every request (each violation is InvalidArgument naming the field),
// routes it, and maps errors to codes in one table. Handlers have plain
// (context, request) → (response, error) signatures, so that Connect and any other
// transport share them.
package server

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/leasehold/leasehold/internal/auth"
	"github.com/leasehold/leasehold/internal/tlsconf"
	"github.com/leasehold/leasehold/watch"
)

// Config bounds what clients may ask for. The zero value is a valid configuration: each
// zero field stands for its default (DefaultConfig).
type Config struct {
	// DefaultTTL is used when a Grant asks for 0. Default 10s.
	DefaultTTL time.Duration
	// MinTTL and MaxTTL bound lease TTLs. Defaults 100ms and 1h.
	MinTTL, MaxTTL time.Duration
	// MaxWait bounds an Acquire's wait_ms. Default 1h.
	MaxWait time.Duration
	// MaxLockDelay bounds lock_delay_ms. Default 60s.
	MaxLockDelay time.Duration
	// MaxRequestBytes bounds an encoded request. Default 64 KiB.
	MaxRequestBytes int
	// WatchRetention is how many lock events each node keeps for Watch (G10): a stream
	// may start or resume at any revision of the last WatchRetention events, and one
	// that asks for an older revision fails FailedPrecondition "compacted". Default
	// 100,000 (watch.DefaultRetention), about 18 MB (docs/OPERATIONS.md).
	WatchRetention int

	// Slow and idle clients (G6). The API port's HTTP server (service) and the fast lane
	// apply these; zero takes the default.

	// ReadHeaderTimeout bounds how long a request's headers may take to arrive (on a new
	// HTTP/1.1 connection: from its start). Default 10s.
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds how long a request's body may take to arrive after its
	// headers, for every request but those of streaming RPCs (a server stream is not
	// cut off for being long). Default 10s.
	ReadTimeout time.Duration
	// WriteTimeout bounds how long an answer (not a stream's) may take to be written
	// once it starts, and how long a write on a fast-lane connection may block. A
	// client that stops reading loses its connection then. It does not bound how long
	// an Acquire waits for its lock. Default 10s.
	WriteTimeout time.Duration
	// IdleTimeout is how long a connection may stay silent before the server closes
	// it: an HTTP/1.1 keep-alive connection between requests, an HTTP/2 connection with
	// no stream open, a fast-lane connection with no request in flight. It is longer
	// than Go's HTTP client keeps idle connections (90s), so that the client, not the
	// server, closes them. Default 2m.
	IdleTimeout time.Duration
	// BoundIdleTimeout is how long a fast-lane connection that holds release-on-
	// disconnect leases (G7) may stay silent, whatever is in flight on it, before the
	// server closes it and revokes those leases: a client whose path was cut looks,
	// over TCP, like one that is quiet. The Go client sends a probe every 500 ms on
	// such a connection and gives the leases up itself after 2 s unacknowledged, so
	// it hears first. Default 5s; at least 1s, so that the probes keep a healthy
	// connection (`leasehold server --bound-idle-timeout`).
	BoundIdleTimeout time.Duration
	// MaxConnsPerClient bounds the connections one client IP address may hold open to
	// the API port and the fast lane together; more are closed as soon as they are
	// accepted. Clients behind one NAT or proxy share the bound. Default 512; negative:
	// no bound.
	MaxConnsPerClient int
	// Version is reported by Status.
	Version string
	// NodeID names this node in Status.
	NodeID string
	// APIAddr is this node's API address as other nodes and clients reach it; it is
	// registered in the cluster so followers can forward to the leader.
	APIAddr string
	// FastLaneAddr is reported by Status so clients can find the fast lane.
	FastLaneAddr string
	// Auth, if set, authenticates every caller on every transport and authorizes every
	// RPC by its rules (G11, docs/SECURITY.md). Nil: anyone may do anything.
	Auth *auth.Authenticator
	// TLS, if set, is the node's TLS material: the server uses it to recognise other
	// nodes (peer certificates) and to forward requests to the leader over TLS. The
	// listeners themselves are the caller's (service).
	TLS *tlsconf.Node
	// Logger receives the log of admin actions. Default slog.Default().
	Logger *slog.Logger
	// Registry is where the server registers its metrics and what /metrics serves: the
	// node's (package metrics), which holds the leader's and the log's series too. Nil
	// means a registry of the server's own.
	Registry *prometheus.Registry
}

// DefaultConfig returns the configuration that a zero Config stands for: every field
// that has a default, set to it. Version, NodeID, APIAddr, FastLaneAddr, Auth, TLS and
// Registry have none.
func DefaultConfig() Config {
	return Config{
		DefaultTTL:        10 * time.Second,
		MinTTL:            100 * time.Millisecond,
		MaxTTL:            time.Hour,
		MaxWait:           time.Hour,
		MaxLockDelay:      time.Minute,
		MaxRequestBytes:   64 << 10,
		WatchRetention:    watch.DefaultRetention,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		BoundIdleTimeout:  5 * time.Second,
		MaxConnsPerClient: 512,
		Logger:            slog.Default(),
	}
}

// WithDefaults returns c with every zero field that has a default set to it
// (DefaultConfig). It changes nothing else: a value out of range stays, for Validate to
// refuse.
func (c Config) WithDefaults() Config {
	d := DefaultConfig()
	def := func(v *time.Duration, dv time.Duration) {
		if *v == 0 {
			*v = dv
		}
	}
	def(&c.DefaultTTL, d.DefaultTTL)
	def(&c.MinTTL, d.MinTTL)
	def(&c.MaxTTL, d.MaxTTL)
	def(&c.MaxWait, d.MaxWait)
	def(&c.MaxLockDelay, d.MaxLockDelay)
	def(&c.ReadHeaderTimeout, d.ReadHeaderTimeout)
	def(&c.ReadTimeout, d.ReadTimeout)
	def(&c.WriteTimeout, d.WriteTimeout)
	def(&c.IdleTimeout, d.IdleTimeout)
	def(&c.BoundIdleTimeout, d.BoundIdleTimeout)
	if c.MaxRequestBytes == 0 {
		c.MaxRequestBytes = d.MaxRequestBytes
	}
	if c.MaxConnsPerClient == 0 {
		c.MaxConnsPerClient = d.MaxConnsPerClient
	}
	if c.WatchRetention == 0 {
		c.WatchRetention = d.WatchRetention
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate checks c, with its defaults (WithDefaults), against the rules that span
// fields. It does not change c. Errors name the setting.
func (c Config) Validate() error {
	c = c.WithDefaults()
	switch {
	case c.MinTTL < time.Millisecond:
		return errors.New("server: minimum TTL must be at least 1ms")
	case c.MinTTL > c.MaxTTL:
		return fmt.Errorf("server: minimum TTL %v exceeds maximum %v", c.MinTTL, c.MaxTTL)
	case c.DefaultTTL < c.MinTTL || c.DefaultTTL > c.MaxTTL:
		return fmt.Errorf("server: default TTL %v is outside [%v, %v]", c.DefaultTTL, c.MinTTL, c.MaxTTL)
	case c.MaxWait < 0 || c.MaxLockDelay < 0:
		return errors.New("server: maximum wait and lock-delay must not be negative")
	case c.MaxRequestBytes < 1024:
		return errors.New("server: request size limit must be at least 1 KiB")
	case c.WatchRetention < 1:
		return errors.New("server: watch retention must be at least 1 event")
	case c.ReadHeaderTimeout < 0 || c.ReadTimeout < 0 || c.WriteTimeout < 0 || c.IdleTimeout < 0 || c.BoundIdleTimeout < 0:
		return errors.New("server: connection timeouts must not be negative")
	case c.BoundIdleTimeout > 0 && c.BoundIdleTimeout < time.Second:
		return fmt.Errorf("server: the bound idle timeout %v is below 1s (the Go client probes a bound connection every 500 ms)", c.BoundIdleTimeout)
	}
	return nil
}
