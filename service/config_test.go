package service

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/replication"
	"github.com/leasehold/leasehold/server"
)

// TestConfigDefaults: a zero Config (with a data dir) is valid and stands for
// DefaultConfig; Validate changes nothing; every layer's defaults are its own.
func TestConfigDefaults(t *testing.T) {
	zero := Config{Raft: replication.Config{DataDir: "d"}}
	if err := zero.Validate(); err != nil {
		t.Fatalf("the zero config is invalid: %v", err)
	}
	if !reflect.DeepEqual(zero, Config{Raft: replication.Config{DataDir: "d"}}) {
		t.Fatal("Validate changed the config")
	}
	got, want := zero.WithDefaults(), DefaultConfig()
	want.Raft.DataDir = "d"
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("zero.WithDefaults() = %+v\nwant DefaultConfig() = %+v", got, want)
	}
	if again := got.WithDefaults(); !reflect.DeepEqual(again, got) {
		t.Fatal("WithDefaults is not idempotent")
	}
	if got.Server != server.DefaultConfig() {
		t.Fatalf("server defaults %+v, want server.DefaultConfig()", got.Server)
	}
	if got.FastLaneAddr != "127.0.0.1:"+DefaultFastLanePort || got.Raft.RaftAddr != replication.DefaultRaftAddr || got.Raft.NodeID != replication.DefaultNodeID {
		t.Fatalf("addresses: fast lane %q, raft %q, node %q", got.FastLaneAddr, got.Raft.RaftAddr, got.Raft.NodeID)
	}
	if w := got.Warnings(); len(w) != 0 {
		t.Fatalf("the defaults warn: %q", w)
	}
}

// TestConfigCrossLayer: rules that span layers are checked.
func TestConfigCrossLayer(t *testing.T) {
	base := Config{Raft: replication.Config{DataDir: "d"}}
	for name, c := range map[string]struct {
		mut  func(*Config)
		want string
	}{
		"ttl within an election": {func(c *Config) {
			c.Server.DefaultTTL, c.Server.MinTTL, c.Raft.ElectionTimeout = 400*time.Millisecond, 100*time.Millisecond, 500*time.Millisecond
		}, "not longer than the election timeout"},
		"join and bootstrap": {func(c *Config) { c.Join, c.Raft.Bootstrap = "h:1", true }, "must not bootstrap"},
		"bad addr":           {func(c *Config) { c.Addr = "nohost" }, "API address"},
		"bad fast lane":      {func(c *Config) { c.FastLaneAddr = "nope" }, "fast-lane address"},
		"server rule":        {func(c *Config) { c.Server.MinTTL, c.Server.MaxTTL = time.Hour, time.Minute }, "minimum TTL"},
		"bound idle timeout": {func(c *Config) { c.Server.BoundIdleTimeout = 100 * time.Millisecond }, "bound idle timeout"},
		"raft rule":          {func(c *Config) { c.Raft.LeaderLeaseTimeout = time.Hour }, "leader lease timeout"},
	} {
		cfg := base
		c.mut(&cfg)
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Validate = %v, want an error saying %q", name, err, c.want)
		}
	}
	short := base
	short.Server.DefaultTTL = 2 * time.Second
	if err := short.Validate(); err != nil {
		t.Fatal(err)
	}
	if w := short.Warnings(); len(w) != 1 || !strings.Contains(w[0], "leader change") {
		t.Fatalf("a 2s default TTL with 500ms elections: warnings %q", w)
	}
}
