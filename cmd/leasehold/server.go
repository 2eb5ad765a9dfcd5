package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/leasehold/leasehold/core"
	"github.com/leasehold/leasehold/replication"
	"github.com/leasehold/leasehold/server"
	"github.com/leasehold/leasehold/service"
)

func runServer(args []string) int {
	fs := flag.NewFlagSet("server", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:7740", "API address (Connect: gRPC, gRPC-Web, JSON over HTTP)")
	raftAddr := fs.String("raft-addr", "127.0.0.1:7741", "raft transport address")
	logStore := fs.String("log-store", "auto", "raft log store: wal (one fsync per commit), bolt (raft-boltdb), or auto (bolt for a data dir that has raft.db, else wal)")
	fastAddr := fs.String("fast-lane-addr", "127.0.0.1:7742", "fast-lane address (binary protocol for the hot calls), or off")
	dataDir := fs.String("data-dir", "./leasehold-data", "directory for the raft log and snapshots")
	nodeID := fs.String("node-id", "node1", "this node's id in the cluster")
	defTTL := fs.Duration("default-ttl", 10*time.Second, "lease TTL when a client asks for 0")
	minTTL := fs.Duration("min-ttl", 100*time.Millisecond, "smallest lease TTL a client may ask for")
	maxTTL := fs.Duration("max-ttl", time.Hour, "largest lease TTL a client may ask for")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	advertise := fs.String("advertise-addr", "", "API address other nodes and clients use (default: the listen address)")
	raftAdvertise := fs.String("raft-advertise", "", "raft address other nodes dial (default: --raft-addr)")
	bootstrap := fs.Bool("bootstrap", true, "start a new cluster if the data dir is empty (off with --join)")
	enablePprof := fs.Bool("pprof", false, "serve Go's profiler under /debug/pprof/ on the API address (for diagnosing CPU or memory use)")
	join := fs.String("join", "", "API address of a cluster member to join through (implies --bootstrap=false)")
	idemKeys := fs.Int("idempotency-keys", 0, "done idempotency keys kept (their retention, counted), also the most in progress; 0 means 100000; the same on every node")
	idemBytes := fs.Int("idempotency-bytes", 0, "bytes of idempotency results kept at most; 0 means 64 MiB; the same on every node")
	var peers peerFlags
	fs.Var(&peers, "peer", "static cluster member ID,RAFT_ADDR,API_ADDR (repeat for each node, including this one)")
	fs.Var(peerList{&peers}, "peers", "static cluster members as one list: ID,RAFT_ADDR,API_ADDR;ID,RAFT_ADDR,API_ADDR;...")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "leasehold server: unexpected argument %q\n", fs.Arg(0))
		return exitUsage
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintf(os.Stderr, "leasehold server: --log-level: %v\n", err)
		return exitUsage
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	cfg := service.Config{
		Addr:          *addr,
		Raft:          replication.Config{NodeID: *nodeID, DataDir: *dataDir, RaftAddr: *raftAddr, RaftAdvertise: *raftAdvertise, Bootstrap: *bootstrap && *join == "", LogStore: *logStore},
		Server:        server.Config{DefaultTTL: *defTTL, MinTTL: *minTTL, MaxTTL: *maxTTL, Version: version, NodeID: *nodeID},
		Logger:        log,
		AdvertiseAddr: *advertise,
		Join:          *join,
		FastLaneAddr:  *fastAddr,
		Pprof:         *enablePprof,
	}
	cfg.Raft.Limits = core.Limits{IdempotencyKeys: *idemKeys, IdempotencyBytes: *idemBytes}
	if len(peers) > 0 {
		if *join != "" {
			fmt.Fprintln(os.Stderr, "leasehold server: --peer and --join exclude each other")
			return exitUsage
		}
		cfg.StaticPeers = map[string]string{}
		for _, p := range peers {
			cfg.Raft.Peers = append(cfg.Raft.Peers, replication.Peer{ID: p.id, RaftAddr: p.raft})
			cfg.StaticPeers[p.id] = p.api
		}
	}
	if err := cfg.Server.Validate(); err != nil {
		fmt.Fprintf(os.Stderr, "leasehold server: %v\n", err)
		return exitUsage
	}
	if err := serve(log, cfg); err != nil {
		log.Error("server stopped", "err", err)
		return exitError
	}
	return exitOK
}

// serve runs one node until SIGINT or SIGTERM, then shuts down gracefully: it stops
// accepting requests, lets requests in flight finish (up to 5s), and closes raft.
func serve(log *slog.Logger, cfg service.Config) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	n, err := service.Start(cfg)
	if err != nil {
		return err
	}
	log.Info("leasehold serving", "addr", n.Addr(), "fast_lane", n.FastLaneAddr(), "raft", n.Raft.RaftAddr(), "data_dir", cfg.Raft.DataDir, "node_id", cfg.Raft.NodeID, "version", version)
	select {
	case <-ctx.Done():
		log.Info("shutting down")
	case err = <-n.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if cerr := n.Close(sctx); cerr != nil && err == nil {
		err = cerr
	}
	return err
}

type peer struct{ id, raft, api string }

// peerFlags collects repeated --peer ID,RAFT_ADDR,API_ADDR flags.
type peerFlags []peer

func (p *peerFlags) String() string { return fmt.Sprint(*p) }

func (p *peerFlags) Set(v string) error {
	parts := strings.Split(v, ",")
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
		return fmt.Errorf("want ID,RAFT_ADDR,API_ADDR, got %q", v)
	}
	*p = append(*p, peer{id: parts[0], raft: parts[1], api: parts[2]})
	return nil
}

// peerList is --peers: the whole static membership in one flag, members separated by ';'.
type peerList struct{ p *peerFlags }

func (l peerList) String() string {
	if l.p == nil {
		return ""
	}
	return l.p.String()
}

func (l peerList) Set(v string) error {
	for _, m := range strings.Split(v, ";") {
		if m = strings.TrimSpace(m); m != "" {
			if err := l.p.Set(m); err != nil {
				return err
			}
		}
	}
	return nil
}
