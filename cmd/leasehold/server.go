package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/leasehold/leasehold/core"
	"github.com/leasehold/leasehold/leader"
	"github.com/leasehold/leasehold/replication"
	"github.com/leasehold/leasehold/server"
)

func runServer(args []string) int {
	fs := flag.NewFlagSet("server", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:7740", "API address (Connect: gRPC, gRPC-Web, JSON over HTTP)")
	raftAddr := fs.String("raft-addr", "127.0.0.1:7741", "raft transport address")
	dataDir := fs.String("data-dir", "./leasehold-data", "directory for the raft log and snapshots")
	nodeID := fs.String("node-id", "node1", "this node's id in the cluster")
	defTTL := fs.Duration("default-ttl", 10*time.Second, "lease TTL when a client asks for 0")
	minTTL := fs.Duration("min-ttl", 100*time.Millisecond, "smallest lease TTL a client may ask for")
	maxTTL := fs.Duration("max-ttl", time.Hour, "largest lease TTL a client may ask for")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintf(os.Stderr, "leasehold server: --log-level: %v\n", err)
		return exitUsage
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	scfg := server.Config{DefaultTTL: *defTTL, MinTTL: *minTTL, MaxTTL: *maxTTL, Version: version, NodeID: *nodeID}
	if err := scfg.Validate(); err != nil {
		fmt.Fprintf(os.Stderr, "leasehold server: %v\n", err)
		return exitUsage
	}
	if err := serve(log, *addr, *raftAddr, *dataDir, *nodeID, scfg); err != nil {
		log.Error("server stopped", "err", err)
		return exitError
	}
	return exitOK
}

// serve runs one node until SIGINT or SIGTERM, then shuts down gracefully: it stops
// accepting requests, lets requests in flight finish (up to 5s), and closes raft.
func serve(log *slog.Logger, addr, raftAddr, dataDir, nodeID string, scfg server.Config) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", addr, err)
	}
	changes := make(chan bool, 1)
	var l *leader.Leader
	node, err := replication.Open(replication.Config{
		NodeID:       nodeID,
		DataDir:      dataDir,
		RaftAddr:     raftAddr,
		Bootstrap:    true,
		Logger:       log,
		Observe:      func(e []core.Effect) { l.OnEffects(e) },
		LeaderChange: changes,
	})
	if err != nil {
		_ = ln.Close()
		return err
	}
	l = leader.New(node, leader.Config{Logger: log})
	srv, err := server.New(scfg, l, node)
	if err != nil {
		_ = node.Close()
		return err
	}
	runCtx, cancelRun := context.WithCancel(context.Background())
	defer cancelRun()
	go l.Run(runCtx, changes)

	httpSrv := &http.Server{
		Handler:           srv.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		Protocols:         new(http.Protocols),
	}
	httpSrv.Protocols.SetHTTP1(true)
	httpSrv.Protocols.SetUnencryptedHTTP2(true)
	errc := make(chan error, 1)
	go func() { errc <- httpSrv.Serve(ln) }()
	log.Info("leasehold serving", "addr", ln.Addr().String(), "raft", node.RaftAddr(), "data_dir", dataDir, "node_id", nodeID, "version", version)

	select {
	case <-ctx.Done():
		log.Info("shutting down")
	case err = <-errc:
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = httpSrv.Shutdown(sctx)
	cancelRun()
	l.Demote()
	if cerr := node.Close(); cerr != nil && err == nil {
		err = cerr
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}
