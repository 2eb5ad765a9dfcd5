package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/leasehold/leasehold/core"
	"github.com/leasehold/leasehold/replication"
	"github.com/leasehold/leasehold/server"
	"github.com/leasehold/leasehold/service"
)

// newServerCmd is `leasehold server [flags]`: run a node until SIGINT or SIGTERM.
func newServerCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "server [flags]",
		Short: "run a node (defaults: API 127.0.0.1:7740, raft 127.0.0.1:7741, data ./leasehold-data)",
		Args:  cobra.NoArgs,
	}
	var f serverFlags
	fs := cmd.Flags()
	def := service.DefaultConfig() // every default below comes from the layers' own
	fs.StringVar(&f.addr, "addr", def.Addr, "API address (Connect: gRPC, gRPC-Web, JSON over HTTP)")
	fs.StringVar(&f.raftAddr, "raft-addr", def.Raft.RaftAddr, "raft transport address")
	fs.StringVar(&f.logStore, "log-store", "auto", "raft log store: wal (one fsync per commit), bolt (raft-boltdb), or auto (bolt for a data dir that has raft.db, else wal)")
	fs.StringVar(&f.fastAddr, "fast-lane-addr", "", "fast-lane address (binary protocol for the hot calls), or off (default: the host of --addr, port "+service.DefaultFastLanePort+")")
	fs.StringVar(&f.fastAdvertise, "fast-lane-advertise", "", "fast-lane address clients dial (default: the fast lane's address; bound to 0.0.0.0 or [::], the host of --advertise-addr with the fast lane's port)")
	fs.StringVar(&f.dataDir, "data-dir", "./leasehold-data", "directory for the raft log and snapshots")
	fs.StringVar(&f.nodeID, "node-id", def.Raft.NodeID, "this node's id in the cluster")
	fs.DurationVar(&f.defTTL, "default-ttl", def.Server.DefaultTTL, "lease TTL when a client asks for 0")
	fs.DurationVar(&f.minTTL, "min-ttl", def.Server.MinTTL, "smallest lease TTL a client may ask for")
	fs.DurationVar(&f.maxTTL, "max-ttl", def.Server.MaxTTL, "largest lease TTL a client may ask for")
	fs.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&f.advertise, "advertise-addr", "", "API address other nodes and clients use (default: the listen address)")
	fs.StringVar(&f.raftAdvertise, "raft-advertise", "", "raft address other nodes dial (default: --raft-addr)")
	fs.BoolVar(&f.bootstrap, "bootstrap", true, "start a new cluster if the data dir is empty (off with --join)")
	fs.StringVar(&f.memoryLimit, "memory-limit", "", "soft limit of the Go runtime's memory (as GOMEMLIMIT: 240MiB, 1GiB, or bytes): the GC runs more often as the heap nears it instead of letting it grow to twice what is live (GOGC); empty keeps GOMEMLIMIT's or none. See docs/OPERATIONS.md (memory) before setting it near the live heap")
	fs.BoolVar(&f.enablePprof, "pprof", false, "serve Go's profiler under /debug/pprof/ on the API address (for diagnosing CPU or memory use)")
	fs.StringVar(&f.join, "join", "", "API address of a cluster member to join through (implies --bootstrap=false)")
	fs.BoolVar(&f.recoverFlag, "recover", false, "rewrite the raft configuration of this stopped node, whose cluster lost its quorum, to this node alone (or to --peers), then exit; see docs/OPERATIONS.md")
	fs.Uint64Var(&f.tokenGap, "token-gap", 1<<32, "with --recover: continue the token sequence this far above the node's last token, so tokens the lost nodes issued are never issued again")
	fs.IntVar(&f.idemKeys, "idempotency-keys", 0, "done idempotency keys kept (their retention, counted), also the most in progress; 0 means 100000; the same on every node")
	fs.IntVar(&f.idemBytes, "idempotency-bytes", 0, "bytes of idempotency results kept at most; 0 means 64 MiB; the same on every node")
	fs.IntVar(&f.ledgerPerLock, "ledger-per-lock", 0, "tenures the ledger (leasehold history) keeps per lock; 0 means 16; the same on every node")
	fs.IntVar(&f.ledgerTotal, "ledger-total", 0, "tenures the ledger keeps in all, the oldest dropped first; 0 means 100000; the same on every node")
	fs.IntVar(&f.electionHistory, "election-history", 0, "changes the election history (observe resumes from it) keeps per election; 0 means 64; the same on every node")
	fs.IntVar(&f.electionHistoryTotal, "election-history-total", 0, "changes the election history keeps in all, the oldest dropped first; 0 means 10000; the same on every node")
	fs.IntVar(&f.electionHistoryBytes, "election-history-bytes", 0, "bytes of election changes (names, values, holders, 168 a change) kept at most; 0 means 16 MiB; the same on every node")
	fs.DurationVar(&f.boundIdle, "bound-idle-timeout", def.Server.BoundIdleTimeout, "close a fast-lane connection holding release-on-disconnect leases that stays silent this long, and revoke them (at least 1s; the Go client probes every 500ms)")
	fs.IntVar(&f.watchRetention, "watch-retention", 0, "lock events each node keeps for watch (a stream may start or resume this far back); 0 means 100000, about 18 MB")
	fs.Var(&f.peers, "peer", "static cluster member ID,RAFT_ADDR,API_ADDR[,FAST_LANE_ADDR] (repeat for each node, including this one)")
	fs.Var(peerList{&f.peers}, "peers", "static cluster members as one list: ID,RAFT_ADDR,API_ADDR[,FAST_LANE_ADDR];ID,...;...")
	f.security = registerServerSecurity(fs)
	completeFlag(cmd, "log-level", "debug", "info", "warn", "error")
	completeFlag(cmd, "log-store", "auto", "wal", "bolt")
	cmd.RunE = func(*cobra.Command, []string) error { return exitWith(runServer(f)) }
	return cmd
}

// serverFlags are the flags of `leasehold server`.
type serverFlags struct {
	addr          string
	raftAddr      string
	logStore      string
	fastAddr      string
	fastAdvertise string
	dataDir       string
	nodeID        string
	defTTL        time.Duration
	boundIdle     time.Duration // server.Config.BoundIdleTimeout
	minTTL        time.Duration
	maxTTL        time.Duration
	logLevel      string
	advertise     string
	raftAdvertise string
	bootstrap     bool
	enablePprof   bool
	memoryLimit   string // runtime/debug.SetMemoryLimit, as GOMEMLIMIT
	join          string
	recoverFlag   bool
	tokenGap      uint64
	idemKeys      int
	idemBytes     int
	// ledgerPerLock, ledgerTotal and watchRetention bound the ledger and Watch's history.
	ledgerPerLock, ledgerTotal, watchRetention int
	// electionHistory, electionHistoryTotal and electionHistoryBytes bound the
	// election history (core.Limits).
	electionHistory, electionHistoryTotal, electionHistoryBytes int
	peers                                                       peerFlags
	security                                                    serverSecurity
}

// runServer runs a node as the flags say and returns the exit code.
func runServer(f serverFlags) int {
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.logLevel)); err != nil {
		fmt.Fprintf(os.Stderr, "leasehold server: --log-level: %v\n", err)
		return exitUsage
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	if f.memoryLimit != "" {
		limit, err := parseMemoryLimit(f.memoryLimit)
		if err != nil {
			fmt.Fprintf(os.Stderr, "leasehold server: --memory-limit: %v\n", err)
			return exitUsage
		}
		debug.SetMemoryLimit(limit)
		log.Info("memory limit set", "bytes", limit)
	}
	if f.recoverFlag {
		return recoverNode(replication.Config{NodeID: f.nodeID, DataDir: f.dataDir, RaftAddr: f.raftAddr, RaftAdvertise: f.raftAdvertise, LogStore: f.logStore, Logger: log}, f.peers, f.tokenGap)
	}
	cfg := service.Config{
		Addr: f.addr,
		Raft: replication.Config{NodeID: f.nodeID, DataDir: f.dataDir, RaftAddr: f.raftAddr, RaftAdvertise: f.raftAdvertise, Bootstrap: f.bootstrap && f.join == "", LogStore: f.logStore},
		Server: server.Config{DefaultTTL: f.defTTL, MinTTL: f.minTTL, MaxTTL: f.maxTTL, Version: version, NodeID: f.nodeID, Logger: log, WatchRetention: f.watchRetention,
			BoundIdleTimeout: f.boundIdle},
		Logger:            log,
		AdvertiseAddr:     f.advertise,
		Join:              f.join,
		FastLaneAddr:      f.fastAddr,
		FastLaneAdvertise: f.fastAdvertise,
		Pprof:             f.enablePprof,
	}
	cfg.Raft.Limits = core.Limits{IdempotencyKeys: f.idemKeys, IdempotencyBytes: f.idemBytes, LedgerPerLock: f.ledgerPerLock, LedgerTotal: f.ledgerTotal,
		ElectionHistory: f.electionHistory, ElectionHistoryTotal: f.electionHistoryTotal, ElectionHistoryBytes: f.electionHistoryBytes}
	if len(f.peers) > 0 {
		if f.join != "" {
			fmt.Fprintln(os.Stderr, "leasehold server: --peer and --join exclude each other")
			return exitUsage
		}
		for _, p := range f.peers {
			cfg.Raft.Peers = append(cfg.Raft.Peers, replication.Peer{ID: p.id, RaftAddr: p.raft})
			cfg.StaticPeers = append(cfg.StaticPeers, core.Member{ID: p.id, APIAddr: p.api, FastLaneAddr: p.fast})
		}
	}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintf(os.Stderr, "leasehold server: %v\n", err)
		return exitUsage
	}
	var err error
	if cfg.TLS, cfg.Server.Auth, err = f.security.load(); err != nil {
		fmt.Fprintf(os.Stderr, "leasehold server: %v\n", err)
		return exitUsage
	}
	cfg.InsecureNoAuth = *f.security.insecure
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
func (p *peerFlags) Type() string   { return "ID,RAFT,API[,FAST]" }

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

func (l peerList) Type() string { return "ID,RAFT,API[,FAST];..." }

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

// minMemoryLimit is the smallest --memory-limit taken: below it the GC would run all
// the time for any node.
const minMemoryLimit = 16 << 20

// parseMemoryLimit parses a --memory-limit: a number of bytes with an optional suffix
// B, KiB, MiB, GiB or TiB, as GOMEMLIMIT is written, at least minMemoryLimit.
func parseMemoryLimit(s string) (int64, error) {
	num, unit := s, int64(1)
	for _, u := range []struct {
		suffix string
		size   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40}, {"B", 1}} {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			num, unit = n, u.size
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n <= 0 || n > (1<<62)/unit {
		return 0, fmt.Errorf("%q is not a size such as 240MiB, 1GiB or a number of bytes", s)
	}
	if n*unit < minMemoryLimit {
		return 0, fmt.Errorf("%s is below the smallest limit taken, 16MiB", s)
	}
	return n * unit, nil
}
