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
	"time"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/core"
	"github.com/leasehold/leasehold/internal/tlsconf"
	"github.com/leasehold/leasehold/leader"
	"github.com/leasehold/leasehold/replication"
	"github.com/leasehold/leasehold/server"
)

// Config configures a node. DataDir is required; the rest has defaults.
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
	// node as a voter (retrying until it succeeds or the node closes). Set
	// Raft.Bootstrap to false with it.
	Join string
	// FastLaneAddr is where the fast lane listens (docs/PROTOCOL.md). Default
	// 127.0.0.1:7742; port 0 picks one; "off" disables it.
	FastLaneAddr string
	// StaticPeers are registered (id → API address) by whichever node leads, for a
	// cluster started with a static configuration (Raft.Peers).
	StaticPeers map[string]string
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
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:7740"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.FastLaneAddr == "" {
		cfg.FastLaneAddr = "127.0.0.1:7742"
	}
	if cfg.Server.Logger == nil {
		cfg.Server.Logger = cfg.Logger
	}
	if err := cfg.Server.Validate(); err != nil {
		return nil, err
	}
	if err := checkExposure(&cfg); err != nil {
		return nil, err
	}
	ln, err := cfg.listen(cfg.Addr, "h2", "http/1.1")
	if err != nil {
		return nil, fmt.Errorf("service: listen on %s: %w", cfg.Addr, err)
	}
	var fastLn net.Listener
	if cfg.FastLaneAddr != "off" {
		if fastLn, err = cfg.listen(cfg.FastLaneAddr); err != nil {
			_ = ln.Close()
			return nil, fmt.Errorf("service: fast lane: listen on %s: %w", cfg.FastLaneAddr, err)
		}
	}
	changes := make(chan bool, 1)
	rc := cfg.Raft
	if rc.NodeID == "" {
		rc.NodeID = "node1"
	}
	n := &Node{addr: ln.Addr().String(), fastLn: fastLn, serveErr: make(chan error, 1), reload: cfg.reloaders()}
	if fastLn != nil {
		n.fastAddr = fastLn.Addr().String()
		cfg.Server.FastLaneAddr = n.fastAddr
	}
	if cfg.AdvertiseAddr == "" {
		cfg.AdvertiseAddr = n.addr
	}
	cfg.Server.APIAddr = cfg.AdvertiseAddr
	if cfg.Server.NodeID == "" {
		cfg.Server.NodeID = rc.NodeID
	}
	rc.Logger = cfg.Logger
	cfg.Server.TLS, rc.PeerTLS = cfg.TLS, cfg.peerTLS()
	rc.Observe = func(e []core.Effect) { n.Leader.OnEffects(e) }
	rc.LeaderChange = changes
	n.Leader = leader.New(nil, leader.Config{Limits: rc.Limits, Logger: cfg.Logger, OnPromote: func(ctx context.Context) {
		n.registerAll(ctx, rc.NodeID, cfg.AdvertiseAddr, cfg.StaticPeers, cfg.Logger)
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
	n.http = &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 10 * time.Second,
		Protocols:         cfg.protocols(),
		ErrorLog:          slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn), // refused TLS handshakes, say
	}
	go func() { n.serveErr <- n.http.Serve(ln) }()
	if fastLn != nil {
		go func() {
			if err := n.Server.ServeFastLane(fastLn, cfg.Logger); err != nil {
				cfg.Logger.Error("fast lane stopped", "err", err)
			}
		}()
	}
	if cfg.Join != "" {
		go n.join(ctx, cfg.Join, rc.NodeID, n.Raft.RaftAddr(), cfg.AdvertiseAddr, cfg.Logger)
	}
	return n, nil
}

// registerAll records this node's (and static peers') API address in the replicated
// state, retrying while this node leads.
func (n *Node) registerAll(ctx context.Context, id, addr string, peers map[string]string, log *slog.Logger) {
	want := map[string]string{id: addr}
	for pid, paddr := range peers {
		if pid != id {
			want[pid] = paddr
		}
	}
	for pid, paddr := range want {
		for ctx.Err() == nil {
			err := n.Server.Register(ctx, pid, paddr)
			if err == nil {
				break
			}
			log.Warn("could not register node address, retrying", "node", pid, "addr", paddr, "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
}

// join asks the cluster member at seed to add this node, until it succeeds or ctx ends.
func (n *Node) join(ctx context.Context, seed, id, raftAddr, apiAddr string, log *slog.Logger) {
	c := n.Server.PeerCluster(seed)
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		_, err := c.AddMember(rctx, &leaseholdv1.AddMemberRequest{NodeId: id, RaftAddr: raftAddr, ApiAddr: apiAddr})
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

// Addr returns the API address the node listens on.
func (n *Node) Addr() string { return n.addr }

// FastLaneAddr returns the fast lane's address ("" when disabled).
func (n *Node) FastLaneAddr() string { return n.fastAddr }

// WaitReady waits until the node serves as leader.
func (n *Node) WaitReady(ctx context.Context) error {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for !n.Leader.Active() {
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

// Close stops accepting requests, lets requests in flight finish until ctx ends, stops
// the leader runtime and closes raft. It does not revoke any lease: after a restart the
// leases count down again from their full TTL.
func (n *Node) Close(ctx context.Context) error {
	if n.fastLn != nil {
		_ = n.fastLn.Close() // connections end when their requests fail or finish
	}
	n.Leader.Demote() // fail waiting acquires (Unavailable: clients retry after the restart)
	herr := n.http.Shutdown(ctx)
	if errors.Is(herr, context.DeadlineExceeded) || errors.Is(herr, context.Canceled) {
		herr = n.http.Close()
	}
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
