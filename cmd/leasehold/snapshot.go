package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/leasehold/leasehold/core"
	"github.com/leasehold/leasehold/replication"
)

// newSnapshotCmd is `leasehold snapshot save|restore FILE`.
func newSnapshotCmd() *cobra.Command {
	snapshot := &cobra.Command{
		Use:   "snapshot save|restore FILE",
		Short: "back up the whole state; restore into a new data dir",
		Args:  cobra.NoArgs,
		RunE:  usageOnly,
	}
	var addr string
	save := &cobra.Command{
		Use:   "save FILE",
		Short: "write the cluster's whole state (from the leader, at a linearizable point) to FILE",
		Long: `Writes the cluster's whole state, from the leader at a linearizable point, to FILE.
--addr may list several nodes, separated by commas: the first that answers is used.`,
		Args: cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error { return exitWith(snapshotSave(addr, args[0])) },
	}
	addrFlag(save.Flags(), &addr)

	var dataDir, nodeID, raftAddr *string
	var gap *uint64
	restore := &cobra.Command{
		Use:   "restore FILE --data-dir DIR [--node-id ID] [--raft-addr ADDR]",
		Short: "seed a NEW data dir with FILE as a one-node cluster",
		Long: `Seeds a NEW data dir with FILE as a one-node cluster; start 'leasehold server' on it
with the same --node-id and --raft-addr, then join other nodes to it.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if *dataDir == "" {
				return errors.New("--data-dir is required")
			}
			file := args[0]
			b, err := os.ReadFile(file)
			if err != nil {
				fmt.Fprintf(os.Stderr, "leasehold snapshot restore: %v\n", err)
				return exitWith(exitError)
			}
			if err := replication.RestoreDataDir(*dataDir, *nodeID, *raftAddr, b, core.Limits{}, *gap); err != nil {
				fmt.Fprintf(os.Stderr, "leasehold snapshot restore: %v\n", err)
				return exitWith(exitError)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "restored %s into %s; start it with:\n  leasehold server --data-dir %s --node-id %s --raft-addr %s\n", file, *dataDir, *dataDir, *nodeID, *raftAddr)
			return nil
		},
	}
	fs := restore.Flags()
	dataDir = fs.String("data-dir", "", "the new data directory (must be empty; required)")
	nodeID = fs.String("node-id", replication.DefaultNodeID, "the node id the restored node will run with")
	raftAddr = fs.String("raft-addr", replication.DefaultRaftAddr, "the raft address the restored node will run with")
	gap = fs.Uint64("token-gap", 1<<32, "continue the token sequence this far above the backup's last token,\nso tokens issued after the backup are never issued again")
	snapshot.AddCommand(save, restore)
	return snapshot
}

func snapshotSave(addr, file string) int {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	hc, scheme, authorize, err := adminHTTP()
	if err != nil {
		fmt.Fprintf(os.Stderr, "leasehold snapshot save: %v\n", err)
		return exitUsage
	}
	var lastErr error
	for _, a := range strings.Split(addr, ",") {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, scheme+"://"+strings.TrimSpace(a)+"/admin/snapshot", nil)
		if err != nil {
			fmt.Fprintf(os.Stderr, "leasehold snapshot save: %v\n", err)
			return exitUsage
		}
		authorize(req)
		resp, err := hc.Do(req)
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
