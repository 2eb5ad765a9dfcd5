package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"slices"
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
	def := service.DefaultConfig() // every default below comes from the layers' own
	addr := fs.String("addr", def.Addr, "API address (Connect: gRPC, gRPC-Web, JSON over HTTP)")
	raftAddr := fs.String("raft-addr", def.Raft.RaftAddr, "raft transport address")
	logStore := fs.String("log-store", "auto", "raft log store: wal (one fsync per commit), bolt (raft-boltdb), or auto (bolt for a data dir that has raft.db, else wal)")
	fastAddr := fs.String("fast-lane-addr", "", "fast-lane address (binary protocol for the hot calls), or off (default: the host of --addr, port "+service.DefaultFastLanePort+")")
	fastAdvertise := fs.String("fast-lane-advertise", "", "fast-lane address clients dial (default: the fast lane's address; bound to 0.0.0.0 or [::], the host of --advertise-addr with the fast lane's port)")
	dataDir := fs.String("data-dir", "./leasehold-data", "directory for the raft log and snapshots")
	nodeID := fs.String("node-id", def.Raft.NodeID, "this node's id in the cluster")
	defTTL := fs.Duration("default-ttl", def.Server.DefaultTTL, "lease TTL when a client asks for 0")
	minTTL := fs.Duration("min-ttl", def.Server.MinTTL, "smallest lease TTL a client may ask for")
	maxTTL := fs.Duration("max-ttl", def.Server.MaxTTL, "largest lease TTL a client may ask for")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	advertise := fs.String("advertise-addr", "", "API address other nodes and clients use (default: the listen address)")
	raftAdvertise := fs.String("raft-advertise", "", "raft address other nodes dial (default: --raft-addr)")
	bootstrap := fs.Bool("bootstrap", true, "start a new cluster if the data dir is empty (off with --join)")
	enablePprof := fs.Bool("pprof", false, "serve Go's profiler under /debug/pprof/ on the API address (for diagnosing CPU or memory use)")
	join := fs.String("join", "", "API address of a cluster member to join through (implies --bootstrap=false)")
	recoverFlag := fs.Bool("recover", false, "rewrite the raft configuration of this stopped node, whose cluster lost its quorum, to this node alone (or to --peers), then exit; see docs/OPERATIONS.md")
	tokenGap := fs.Uint64("token-gap", 1<<32, "with --recover: continue the token sequence this far above the node's last token, so tokens the lost nodes issued are never issued again")
	idemKeys := fs.Int("idempotency-keys", 0, "done idempotency keys kept (their retention, counted), also the most in progress; 0 means 100000; the same on every node")
	idemBytes := fs.Int("idempotency-bytes", 0, "bytes of idempotency results kept at most; 0 means 64 MiB; the same on every node")
	ledgerPerLock := fs.Int("ledger-per-lock", 0, "tenures the ledger (leasehold history) keeps per lock; 0 means 16; the same on every node")
	ledgerTotal := fs.Int("ledger-total", 0, "tenures the ledger keeps in all, the oldest dropped first; 0 means 100000; the same on every node")
	watchRetention := fs.Int("watch-retention", 0, "lock events each node keeps for watch (a stream may start or resume this far back); 0 means 100000, about 18 MB")
	var peers peerFlags
	fs.Var(&peers, "peer", "static cluster member ID,RAFT_ADDR,API_ADDR[,FAST_LANE_ADDR] (repeat for each node, including this one)")
	fs.Var(peerList{&peers}, "peers", "static cluster members as one list: ID,RAFT_ADDR,API_ADDR[,FAST_LANE_ADDR];ID,...;...")
	security := registerServerSecurity(fs)
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
	if *recoverFlag {
		return recoverNode(replication.Config{NodeID: *nodeID, DataDir: *dataDir, RaftAddr: *raftAddr, RaftAdvertise: *raftAdvertise, LogStore: *logStore, Logger: log}, peers, *tokenGap)
	}
	cfg := service.Config{
		Addr:              *addr,
		Raft:              replication.Config{NodeID: *nodeID, DataDir: *dataDir, RaftAddr: *raftAddr, RaftAdvertise: *raftAdvertise, Bootstrap: *bootstrap && *join == "", LogStore: *logStore},
		Server:            server.Config{DefaultTTL: *defTTL, MinTTL: *minTTL, MaxTTL: *maxTTL, Version: version, NodeID: *nodeID, Logger: log, WatchRetention: *watchRetention},
		Logger:            log,
		AdvertiseAddr:     *advertise,
		Join:              *join,
		FastLaneAddr:      *fastAddr,
		FastLaneAdvertise: *fastAdvertise,
		Pprof:             *enablePprof,
	}
	cfg.Raft.Limits = core.Limits{IdempotencyKeys: *idemKeys, IdempotencyBytes: *idemBytes, LedgerPerLock: *ledgerPerLock, LedgerTotal: *ledgerTotal}
	if len(peers) > 0 {
		if *join != "" {
			fmt.Fprintln(os.Stderr, "leasehold server: --peer and --join exclude each other")
			return exitUsage
		}
		for _, p := range peers {
			cfg.Raft.Peers = append(cfg.Raft.Peers, replication.Peer{ID: p.id, RaftAddr: p.raft})
			cfg.StaticPeers = append(cfg.StaticPeers, core.Member{ID: p.id, APIAddr: p.api, FastLaneAddr: p.fast})
		}
	}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintf(os.Stderr, "leasehold server: %v\n", err)
		return exitUsage
	}
	var err error
	if cfg.TLS, cfg.Server.Auth, err = security.load(); err != nil {
		fmt.Fprintf(os.Stderr, "leasehold server: %v\n", err)
		return exitUsage
	}
	cfg.InsecureNoAuth = *security.insecure
	if err := serve(log, cfg); err != nil {
		log.Error("server stopped", "err", err)
		return exitError
	}
	return exitOK
}

// serve runs one node until SIGINT or SIGTERM, then shuts down gracefully: it stops
// accepting requests, lets requests in flight finish (up to 5s), and closes raft. SIGHUP
// reloads the TLS certificates and the auth file.
func serve(log *slog.Logger, cfg service.Config) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	n, err := service.Start(cfg)
	if err != nil {
		return err
	}
	log.Info("leasehold serving", "addr", n.Addr(), "fast_lane", n.FastLaneAddr(), "raft", n.Raft.RaftAddr(), "data_dir", cfg.Raft.DataDir, "node_id", cfg.Raft.NodeID, "version", version,
		"tls", cfg.TLS != nil && cfg.TLS.API(), "client_certs", cfg.TLS != nil && cfg.TLS.ClientCerts(), "peer_tls", cfg.TLS != nil && cfg.TLS.Peer(), "auth", cfg.Server.Auth != nil)
	for wait := true; wait; {
		select {
		case <-hup:
			if rerr := n.Reload(); rerr != nil {
				log.Error("reload failed; still using the old certificates and auth file where the new ones are not valid", "err", rerr)
			} else {
				log.Info("reloaded the TLS certificates and the auth file")
			}
		case <-ctx.Done():
			log.Info("shutting down")
			wait = false
		case err = <-n.Done():
			wait = false
		}
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if cerr := n.Close(sctx); cerr != nil && err == nil {
		err = cerr
	}
	return err
}

// recoverNode is `leasehold server --recover`: it rewrites the stopped node's raft
// configuration to itself alone, or to the --peers list, and exits.
func recoverNode(cfg replication.Config, peers peerFlags, tokenGap uint64) int {
	var members []replication.Peer
	for _, p := range peers {
		members = append(members, replication.Peer{ID: p.id, RaftAddr: p.raft})
	}
	rec, err := replication.RecoverCluster(cfg, members, tokenGap)
	if err != nil {
		fmt.Fprintf(os.Stderr, "leasehold server --recover: %v\n", err)
		return exitError
	}
	list := func(ss []replication.Server) string {
		var out []string
		for _, s := range ss {
			out = append(out, s.ID+" "+s.RaftAddr)
		}
		return strings.Join(out, ", ")
	}
	fmt.Printf("recovered %s: the configuration was [%s], it is now [%s]\n", cfg.DataDir, list(rec.Before), list(rec.After))
	fmt.Printf("the state holds the log up to index %d (term %d); the token sequence continues above %d\n", rec.LastIndex, rec.LastTerm, rec.LastToken)
	fmt.Println("start the node again WITHOUT --recover; add new nodes with --join")
	return exitOK
}

type peer struct{ id, raft, api, fast string }

// peerFlags collects repeated --peer ID,RAFT_ADDR,API_ADDR[,FAST_LANE_ADDR] flags.
type peerFlags []peer

func (p *peerFlags) String() string { return fmt.Sprint(*p) }

func (p *peerFlags) Set(v string) error {
	parts := strings.Split(v, ",")
	if len(parts) < 3 || len(parts) > 4 || slices.Contains(parts, "") {
		return fmt.Errorf("want ID,RAFT_ADDR,API_ADDR[,FAST_LANE_ADDR], got %q", v)
	}
	m := peer{id: parts[0], raft: parts[1], api: parts[2]}
	if len(parts) == 4 {
		m.fast = parts[3]
	}
	*p = append(*p, m)
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
