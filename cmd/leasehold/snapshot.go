package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/leasehold/leasehold/core"
	"github.com/leasehold/leasehold/replication"
)

const snapshotUsage = `usage:
  leasehold snapshot save FILE [--addr HOST:PORT]
      write the cluster's whole state (from the leader, at a linearizable point) to FILE
  leasehold snapshot restore FILE --data-dir DIR [--node-id ID] [--raft-addr ADDR]
      seed a NEW data dir with FILE as a one-node cluster; start 'leasehold server' on it
      with the same --node-id and --raft-addr, then join other nodes to it`

func runSnapshot(args []string) int {
	if len(args) < 2 || (args[0] != "save" && args[0] != "restore") {
		fmt.Fprintln(os.Stderr, snapshotUsage)
		return exitUsage
	}
	sub, file := args[0], args[1]
	fs := flag.NewFlagSet("snapshot "+sub, flag.ContinueOnError)
	addr := addrFlag(fs)
	dataDir := fs.String("data-dir", "", "restore: the new data directory (must be empty)")
	nodeID := fs.String("node-id", replication.DefaultNodeID, "restore: the node id the restored node will run with")
	raftAddr := fs.String("raft-addr", replication.DefaultRaftAddr, "restore: the raft address the restored node will run with")
	gap := fs.Uint64("token-gap", 1<<32, "restore: continue the token sequence this far above the backup's last token,\nso tokens issued after the backup are never issued again")
	if err := fs.Parse(args[2:]); err != nil || fs.NArg() > 0 {
		fmt.Fprintln(os.Stderr, snapshotUsage)
		return exitUsage
	}
	if sub == "save" {
		return snapshotSave(*addr, file)
	}
	if *dataDir == "" {
		fmt.Fprintln(os.Stderr, "leasehold snapshot restore: --data-dir is required")
		return exitUsage
	}
	b, err := os.ReadFile(file)
	if err != nil {
		fmt.Fprintf(os.Stderr, "leasehold snapshot restore: %v\n", err)
		return exitError
	}
	if err := replication.RestoreDataDir(*dataDir, *nodeID, *raftAddr, b, core.Limits{}, *gap); err != nil {
		fmt.Fprintf(os.Stderr, "leasehold snapshot restore: %v\n", err)
		return exitError
	}
	fmt.Printf("restored %s into %s; start it with:\n  leasehold server --data-dir %s --node-id %s --raft-addr %s\n", file, *dataDir, *dataDir, *nodeID, *raftAddr)
	return exitOK
}

func snapshotSave(addr, file string) int {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var lastErr error
	for _, a := range strings.Split(addr, ",") {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+strings.TrimSpace(a)+"/admin/snapshot", nil)
		if err != nil {
			fmt.Fprintf(os.Stderr, "leasehold snapshot save: %v\n", err)
			return exitUsage
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			lastErr = err
			continue
		}
		if resp.StatusCode != http.StatusOK {
			msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
			resp.Body.Close()
			lastErr = fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(msg)))
			continue
		}
		tmp, err := os.CreateTemp(filepath.Dir(file), ".snapshot-*")
		if err != nil {
			resp.Body.Close()
			fmt.Fprintf(os.Stderr, "leasehold snapshot save: %v\n", err)
			return exitError
		}
		n, err := io.Copy(tmp, resp.Body)
		resp.Body.Close()
		if err == nil {
			err = tmp.Sync()
		}
		if cerr := tmp.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = os.Rename(tmp.Name(), file)
		}
		if err != nil {
			_ = os.Remove(tmp.Name())
			fmt.Fprintf(os.Stderr, "leasehold snapshot save: %v\n", err)
			return exitError
		}
		fmt.Printf("saved %d bytes to %s\n", n, file)
		return exitOK
	}
	fmt.Fprintf(os.Stderr, "leasehold snapshot save: %v\n", lastErr)
	return exitUnavailable
}
