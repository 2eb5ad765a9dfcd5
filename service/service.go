// Package service assembles one leasehold node: the replicated log (replication), the
// leader runtime (leader) and the RPC handlers (server), served over HTTP/1.1 and
// unencrypted HTTP/2 on one listener. The CLI's `server` and `demo` commands, the
// benchmarks and the tests all start nodes through it.
package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"sync"
	"time"

	"connectrpc.com/connect"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/core"
	"github.com/leasehold/leasehold/internal/tlsconf"
	"github.com/leasehold/leasehold/leader"
	"github.com/leasehold/leasehold/metrics"
	"github.com/leasehold/leasehold/replication"
	"github.com/leasehold/leasehold/server"
	"github.com/leasehold/leasehold/watch"
)

// Config configures a node. Raft.DataDir is required; every other zero field stands for
// its default (DefaultConfig).
type Config struct {
	// Addr is the API listen address. Default 127.0.0.1:7740; port 0 picks one.
	Addr string
	// Raft configures the replicated log (DataDir, RaftAddr, NodeID, Bootstrap, ...).
	// Observe and LeaderChange are set by Start.
	Raft replication.Config
	// Server bounds requests (TTLs, waits, sizes).
	Server server.Config
	// Logger, default slog.Default().
	Logger *slog.Logger
	// AdvertiseAddr is the API address other nodes and clients use to reach this node.
	// Default: the address the listener got.
	AdvertiseAddr string
	// Join, if set, is the API address of a cluster member: the node asks it to add this
	// node (retrying until it succeeds or the node closes; see AddMember). A node that
	// holds the data of another cluster than the member's does not ask. Set
	// Raft.Bootstrap to false with it.
	Join string
	// FastLaneAddr is where the fast lane listens (docs/PROTOCOL.md). Default: the host
	// of Addr with port 7742; port 0 picks one; "off" disables it.
	FastLaneAddr string
	// FastLaneAdvertise is the fast-lane address clients are told to dial (Status,
	// Members). Default: the address the fast lane got, except that a fast lane bound to
	// 0.0.0.0 or [::] advertises the host of AdvertiseAddr with its own port.
	FastLaneAdvertise string
	// StaticPeers are registered (id → API and fast-lane address) by whichever node
	// leads, for a cluster started with a static configuration (Raft.Peers).
	StaticPeers []core.Member
	// Pprof serves Go's profiler (net/http/pprof) under /debug/pprof/ on the API
	// address. Off by default: profiles expose internals and cost CPU while they run.
	// With Server.Auth, only admins may fetch them.
	Pprof bool
	// TLS, if set, serves the API and the fast lane over TLS (and requires client
	// certificates when it has a client CA), and runs raft and forwarding between nodes
	// over mutual TLS when it has peer certificates (security.go).
	TLS *tlsconf.Node
	// InsecureNoAuth allows serving an address other than loopback without
	// authentication (no Server.Auth nor client CA on the API and fast lane, no peer TLS
	// on raft). Without it, Start refuses to.
	InsecureNoAuth bool
}

// DefaultAddr is the API address of a node started with no Addr, and DefaultFastLanePort
// the fast lane's port on the host of Addr.
const (
	DefaultAddr         = "127.0.0.1:7740"
	DefaultFastLanePort = "7742"
)

// DefaultConfig returns the configuration that a zero Config stands for (with
// Raft.DataDir, which has no default, still empty): every layer's defaults.
func DefaultConfig() Config {
	return Config{
		Addr:   DefaultAddr,
		Raft:   replication.DefaultConfig(),
		Server: server.DefaultConfig(),
		Logger: slog.Default(),
	}.WithDefaults()
}

// WithDefaults returns c with every zero field that has a default set to it, in every
// layer. The fast lane listens on the host of Addr, port DefaultFastLanePort, unless
// told otherwise; the addresses that depend on the listeners (AdvertiseAddr,
// FastLaneAdvertise) are left to Start.
func (c Config) WithDefaults() Config {
	if c.Addr == "" {
		c.Addr = DefaultAddr
	}
	if c.FastLaneAddr == "" {
		host, _, _ := net.SplitHostPort(c.Addr)
		c.FastLaneAddr = net.JoinHostPort(host, DefaultFastLanePort)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	c.Raft = c.Raft.WithDefaults()
	c.Server = c.Server.WithDefaults()
	return c
}

// Validate checks c with its defaults, every layer's rules and those that span
// layers: a lease must be able to outlive an election (the default TTL above the raft
// election timeout), and Join and Bootstrap exclude each other. It does not change c.
// Warnings lists what is allowed but unwise.
func (c Config) Validate() error {
	c = c.WithDefaults()
	if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		return fmt.Errorf("service: API address %q: %w", c.Addr, err)
	}
	if c.FastLaneAddr != "off" {
		if _, _, err := net.SplitHostPort(c.FastLaneAddr); err != nil {
			return fmt.Errorf("service: fast-lane address %q (or \"off\"): %w", c.FastLaneAddr, err)
		}
	}
	if err := c.Server.Validate(); err != nil {
		return err
	}
	if err := c.Raft.Validate(); err != nil {
		return err
	}
	switch {
	case c.Join != "" && c.Raft.Bootstrap:
		return errors.New("service: a node that joins a cluster must not bootstrap one (Join with Raft.Bootstrap)")
	case c.Join != "" && len(c.StaticPeers) > 0:
		return errors.New("service: Join and StaticPeers exclude each other")
	case c.Server.DefaultTTL <= c.Raft.ElectionTimeout:
		return fmt.Errorf("service: the default lease TTL %v is not longer than the election timeout %v: every leader change would end such leases (OPERATIONS.md, \"Lease TTL versus election timeout\")", c.Server.DefaultTTL, c.Raft.ElectionTimeout)
	}
	return nil
}

// Warnings lists what c allows but OPERATIONS.md advises against: a default lease TTL
// below ten election timeouts, with which clients give their locks up during an
// ordinary leader change (G4b). The minimum TTL is not checked: it bounds what a client
// may ask for, as a guard against mistakes, and a short lease is the client's choice.
func (c Config) Warnings() []string {
	c = c.WithDefaults()
	var w []string
	if ride := 10 * c.Raft.ElectionTimeout; c.Server.DefaultTTL < ride {
		w = append(w, fmt.Sprintf("the default lease TTL %v is below %v (ten election timeouts): clients will give their locks up during a leader change", c.Server.DefaultTTL, ride))
	}
	return w
}

// Node is a running leasehold node.
type Node struct {
	Raft   *replication.Node
	Leader *leader.Leader
	Server *server.Server

	addr     string
	fastAddr string
	fastLn   net.Listener
	http     *http.Server
	cancel   context.CancelFunc
	serveErr chan error
	reload   []func() error // security.go
}

// Start opens the data dir, starts raft and the leader runtime, and serves the API. It
// returns once the listener is open; the node serves requests once it is leader (see
// WaitReady).
func Start(cfg Config) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Server.Logger == nil {
		cfg.Server.Logger = cfg.Logger // the admin log goes where the node's log goes
	}
	cfg = cfg.WithDefaults()
	for _, w := range cfg.Warnings() {
		cfg.Logger.Warn("configuration: " + w)
	}
	if err := checkExposure(&cfg); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("service: listen on %s: %w", cfg.Addr, err)
	}
	var fastLn net.Listener
	if cfg.FastLaneAddr != "off" {
		if fastLn, err = net.Listen("tcp", cfg.FastLaneAddr); err != nil {
			_ = ln.Close()
			return nil, fmt.Errorf("service: fast lane: listen on %s: %w", cfg.FastLaneAddr, err)
		}
	}
	changes := make(chan bool, 1)
	rc := cfg.Raft
	limit := newConnLimit(cfg.Server.MaxConnsPerClient, cfg.Logger) // both ports share it (G6)
	n := &Node{addr: ln.Addr().String(), fastLn: fastLn, serveErr: make(chan error, 1), reload: cfg.reloaders()}
	if cfg.AdvertiseAddr == "" {
		cfg.AdvertiseAddr = n.addr
	}
	if fastLn != nil {
		n.fastAddr = fastLn.Addr().String()
		if cfg.FastLaneAdvertise == "" {
			cfg.FastLaneAdvertise = advertised(n.fastAddr, cfg.AdvertiseAddr)
		}
		cfg.Server.FastLaneAddr = cfg.FastLaneAdvertise
		if isLoopback(cfg.FastLaneAdvertise) && !isLoopback(cfg.AdvertiseAddr) {
			cfg.Logger.Warn("the fast lane is advertised on loopback but the API is not: clients on other hosts will use Connect; set --fast-lane-addr (and --fast-lane-advertise)",
				"fast_lane", cfg.FastLaneAdvertise, "api", cfg.AdvertiseAddr)
		}
	}
	cfg.Server.APIAddr = cfg.AdvertiseAddr
	if cfg.Server.NodeID == "" {
		cfg.Server.NodeID = rc.NodeID
	}
	rc.Logger = cfg.Logger
	cfg.Server.TLS, rc.PeerTLS = cfg.TLS, cfg.peerTLS()
	rc.Observe = func(e []core.Effect) { n.Leader.OnEffects(e) }
	rc.ObserveHoldEnds = func(e []core.EndedHold) { n.Leader.OnHoldEnds(e) }
	rc.Events = watch.NewHub(cfg.Server.WatchRetention)
	rc.LeaderChange = changes
	m := metrics.New()
	rc.ObserveCommit, rc.ObserveSync, cfg.Server.Registry = m.Commit, m.Fsync, m.Registry()
	self := core.Member{ID: rc.NodeID, APIAddr: cfg.AdvertiseAddr, FastLaneAddr: cfg.Server.FastLaneAddr}
	n.Leader = leader.New(nil, leader.Config{Limits: rc.Limits, Logger: cfg.Logger, Observer: m, Events: rc.Events, OnPromote: func(ctx context.Context) {
		n.onPromote(ctx, self, cfg.StaticPeers, cfg.Logger)
	}})
	n.Raft, err = replication.Open(rc)
	if err != nil {
		_ = ln.Close()
		if fastLn != nil {
			_ = fastLn.Close()
		}
		return nil, err
	}
	n.Leader.SetLog(n.Raft)
	n.Server, err = server.New(cfg.Server, n.Leader, n.Raft)
	if err != nil {
		_ = ln.Close()
		if fastLn != nil {
			_ = fastLn.Close()
		}
		_ = n.Raft.Close()
		return nil, err
	}
	var ctx context.Context
	ctx, n.cancel = context.WithCancel(context.Background())
	go n.Leader.Run(ctx, changes)
	handler := n.Server.Handler()
	if cfg.Pprof {
		handler = withPprof(handler, n.Server.AdminOnly)
	}
	handler = localHosts(&cfg, handler)
	// No ReadTimeout or WriteTimeout here: they would cut off waiting Acquires and
	// streams. The server's handler sets them per request (server/guard.go).
	n.http = &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: cfg.Server.ReadHeaderTimeout,
		IdleTimeout:       cfg.Server.IdleTimeout,
		MaxHeaderBytes:    64 << 10,
		Protocols:         cfg.protocols(),
		ErrorLog:          slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn), // refused TLS handshakes, say
	}
	// TLS, when the node serves it, wraps the connections the limit admitted.
	go func() { n.serveErr <- n.http.Serve(cfg.secure(limit.wrap(ln), "h2", "http/1.1")) }()
	if fastLn != nil {
		go func() {
			if err := n.Server.ServeFastLane(cfg.secure(limit.wrap(fastLn)), cfg.Logger); err != nil {
				cfg.Logger.Error("fast lane stopped", "err", err)
			}
		}()
	}
	if cfg.Join != "" {
		go n.join(ctx, cfg.Join, rc.NodeID, n.Raft.RaftAddr(), cfg.AdvertiseAddr, cfg.Logger)
	}
	return n, nil
}

// onPromote records this node's (and static peers') addresses in the replicated state
// and names a new cluster, each retried while this node leads.
func (n *Node) onPromote(ctx context.Context, self core.Member, peers []core.Member, log *slog.Logger) {
	want := []core.Member{self}
	for _, p := range peers {
		if p.ID != self.ID {
			want = append(want, p)
		}
	}
	for _, m := range want {
		retry(ctx, log, "register node "+m.ID+"'s addresses", func() error {
			return n.Server.Register(ctx, m.ID, m.APIAddr, m.FastLaneAddr)
		})
	}
	// Last, so that a node WaitReady returned for has its addresses registered too.
	retry(ctx, log, "name the cluster", func() error { return n.Server.NameCluster(ctx) })
}

// retry calls fn until it succeeds or ctx ends, logging each failure.
func retry(ctx context.Context, log *slog.Logger, what string, fn func() error) {
	for ctx.Err() == nil {
		err := fn()
		if err == nil {
			return
		}
		log.Warn("could not "+what+", retrying", "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// join asks the cluster member at seed to add this node, until it succeeds or ctx ends.
// A node that holds the data of a cluster sends its ID with the request, so a seed of
// another cluster refuses it; a Status answer naming another cluster stops the join.
func (n *Node) join(ctx context.Context, seed, id, raftAddr, apiAddr string, log *slog.Logger) {
	c := n.Server.PeerCluster(seed)
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		own := n.Server.ClusterID()
		if st, err := c.Status(rctx, &leaseholdv1.StatusRequest{}); err == nil && own != "" && st.GetClusterId() != "" && st.GetClusterId() != own {
			cancel()
			log.Error("not joining: this node holds the data of another cluster than the seed's; give it an empty data dir to join",
				"seed", seed, "seed_cluster", st.GetClusterId(), "own_cluster", own)
			return
		}
		actx, info := connect.NewClientContext(rctx)
		if own != "" {
			info.RequestHeader().Set(server.ClusterIDHeader, own)
		}
		_, err := c.AddMember(actx, &leaseholdv1.AddMemberRequest{NodeId: id, RaftAddr: raftAddr, ApiAddr: apiAddr})
		cancel()
		if err == nil {
			log.Info("joined the cluster", "seed", seed, "node_id", id)
			return
		}
		log.Warn("join failed, retrying", "seed", seed, "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// isLoopback reports whether addr's host is a loopback IP or "localhost".
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if ip := net.ParseIP(host); ip != nil {
		return ip.IsLoopback()
	}
	return host == "localhost"
}

// advertised is the address to advertise for a listener that got addr: addr itself,
// or, for one bound to 0.0.0.0 or [::], the host of the API address others use
// (apiAdvertise) with addr's port.
func advertised(addr, apiAdvertise string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		if apiHost, _, err := net.SplitHostPort(apiAdvertise); err == nil {
			return net.JoinHostPort(apiHost, port)
		}
	}
	return addr
}

// Addr returns the API address the node listens on.
func (n *Node) Addr() string { return n.addr }

// FastLaneAddr returns the fast lane's address ("" when disabled).
func (n *Node) FastLaneAddr() string { return n.fastAddr }

// WaitReady waits until the node serves as leader and the cluster has its ID.
func (n *Node) WaitReady(ctx context.Context) error {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for !n.Leader.Active() || n.Server.ClusterID() == "" {
		select {
		case <-ctx.Done():
			return fmt.Errorf("service: not serving as leader: %w", ctx.Err())
		case err := <-n.serveErr:
			return fmt.Errorf("service: HTTP server stopped: %w", err)
		case <-t.C:
		}
	}
	return nil
}

// Done returns a channel that receives the HTTP server's error if it stops by itself.
func (n *Node) Done() <-chan error { return n.serveErr }

// Close stops accepting requests, lets requests in flight finish until ctx ends (on the
// fast lane too, where requests that arrive meanwhile are refused unstarted), stops
// the leader runtime and closes raft. It does not revoke any lease: after a restart the
// leases count down again from their full TTL.
func (n *Node) Close(ctx context.Context) error {
	var drain sync.WaitGroup
	if n.fastLn != nil {
		_ = n.fastLn.Close()
		// Requests in flight are answered; later ones are refused, unstarted, so that
		// clients send them to another node (server.ErrShuttingDown).
		drain.Go(func() { _ = n.Server.DrainFastLane(ctx) })
	}
	// Streams would keep Shutdown waiting: end them first (before the Demote, which
	// would end a Watch with not_leader), and their callers resume elsewhere.
	n.Server.EndStreams()
	n.Leader.Demote() // fail waiting acquires (Unavailable: clients retry after the restart)
	herr := n.http.Shutdown(ctx)
	if errors.Is(herr, context.DeadlineExceeded) || errors.Is(herr, context.Canceled) {
		herr = n.http.Close()
	}
	drain.Wait()
	n.cancel()
	n.Leader.Demote()
	return errors.Join(herr, n.Raft.Close())
}

// withPprof serves net/http/pprof's handlers under /debug/pprof/, each through guard,
// and h elsewhere.
func withPprof(h http.Handler, guard func(http.Handler) http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/", h)
	mux.Handle("/debug/pprof/", guard(http.HandlerFunc(pprof.Index)))
	mux.Handle("/debug/pprof/cmdline", guard(http.HandlerFunc(pprof.Cmdline)))
	mux.Handle("/debug/pprof/profile", guard(http.HandlerFunc(pprof.Profile)))
	mux.Handle("/debug/pprof/symbol", guard(http.HandlerFunc(pprof.Symbol)))
	mux.Handle("/debug/pprof/trace", guard(http.HandlerFunc(pprof.Trace)))
	return mux
}
