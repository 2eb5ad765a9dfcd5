// Package server implements leasehold's RPC services on top of the leader runtime:
// it validates every request (each violation is InvalidArgument naming the field),
// routes it, and maps errors to codes in one table. Handlers have plain
// (context, request) → (response, error) signatures, so that Connect and any other
// transport share them.
package server

import (
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Config bounds what clients may ask for. The zero value takes the defaults.
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
	// Version is reported by Status.
	Version string
	// NodeID names this node in Status.
	NodeID string
	// APIAddr is this node's API address as other nodes and clients reach it; it is
	// registered in the cluster so followers can forward to the leader.
	APIAddr string
	// FastLaneAddr is reported by Status so clients can find the fast lane.
	FastLaneAddr string
	// Registry is where the server registers its metrics and what /metrics serves: the
	// node's (package metrics), which holds the leader's and the log's series too. Nil
	// means a registry of the server's own.
	Registry *prometheus.Registry
}

// Validate fills defaults and checks rules that span fields.
func (c *Config) Validate() error {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.DefaultTTL, 10*time.Second)
	def(&c.MinTTL, 100*time.Millisecond)
	def(&c.MaxTTL, time.Hour)
	def(&c.MaxWait, time.Hour)
	def(&c.MaxLockDelay, time.Minute)
	if c.MaxRequestBytes == 0 {
		c.MaxRequestBytes = 64 << 10
	}
	switch {
	case c.MinTTL < time.Millisecond:
		return errors.New("server: minimum TTL must be at least 1ms")
	case c.MinTTL > c.MaxTTL:
		return fmt.Errorf("server: minimum TTL %v exceeds maximum %v", c.MinTTL, c.MaxTTL)
	case c.DefaultTTL < c.MinTTL || c.DefaultTTL > c.MaxTTL:
		return fmt.Errorf("server: default TTL %v is outside [%v, %v]", c.DefaultTTL, c.MinTTL, c.MaxTTL)
	case c.MaxRequestBytes < 1024:
		return errors.New("server: request size limit must be at least 1 KiB")
	}
	return nil
}
