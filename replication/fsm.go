package replication

import (
	"fmt"
	"io"
	"log/slog"
	"sync"

	"github.com/hashicorp/raft"

	"github.com/leasehold/leasehold/core"
)

// fsm adapts core.State to raft.FSM. Raft calls Apply, Snapshot and Restore from one
// goroutine; readers take mu for reading.
type fsm struct {
	mu      sync.RWMutex
	state   *core.State
	applied uint64 // index of the last applied entry
	limits  core.Limits
	observe func([]core.Effect)
	log     *slog.Logger
}

func (f *fsm) Apply(l *raft.Log) any {
	if l.Type != raft.LogCommand {
		return nil
	}
	cmd, err := core.DecodeCommand(l.Data)
	var res core.Result
	f.mu.Lock()
	if err != nil {
		// A corrupt entry is skipped identically on every replica: the state does not
		// change, and the proposer (if any) gets the error.
		res.Err = err
	} else {
		res = f.state.Apply(cmd)
	}
	f.applied = l.Index
	f.mu.Unlock()
	if err != nil {
		f.log.Error("skipping undecodable log entry", "index", l.Index, "err", err)
	}
	if len(res.Effects) > 0 && f.observe != nil {
		f.observe(res.Effects)
	}
	return res
}

func (f *fsm) Snapshot() (raft.FSMSnapshot, error) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	b, err := f.state.MarshalSnapshot()
	if err != nil {
		return nil, err
	}
	return snapshotBytes(b), nil
}

func (f *fsm) Restore(r io.ReadCloser) error {
	defer r.Close()
	b, err := io.ReadAll(r)
	if err != nil {
		return fmt.Errorf("replication: read snapshot: %w", err)
	}
	s, err := core.RestoreState(b, f.limits)
	if err != nil {
		return fmt.Errorf("replication: restore snapshot: %w", err)
	}
	f.mu.Lock()
	f.state = s
	f.mu.Unlock()
	return nil
}

type snapshotBytes []byte

func (b snapshotBytes) Persist(sink raft.SnapshotSink) error {
	if _, err := sink.Write(b); err != nil {
		_ = sink.Cancel()
		return fmt.Errorf("replication: write snapshot: %w", err)
	}
	return sink.Close()
}

func (b snapshotBytes) Release() {}
