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

// Snapshot takes a point-in-time copy of the state (applies wait meanwhile); raft then
// encodes it into the sink with Persist while applies go on.
func (f *fsm) Snapshot() (raft.FSMSnapshot, error) {
	f.mu.RLock()
	v := f.state.SnapshotView()
	f.mu.RUnlock()
	return stateSnapshot{v}, nil
}

func (f *fsm) Restore(r io.ReadCloser) error {
	defer r.Close()
	s, err := core.ReadSnapshot(r, f.limits)
	if err != nil {
		return fmt.Errorf("replication: restore snapshot: %w", err)
	}
	f.mu.Lock()
	f.state = s
	f.mu.Unlock()
	return nil
}

// stateSnapshot streams a core.SnapshotView into raft's sink.
type stateSnapshot struct{ view *core.SnapshotView }

func (s stateSnapshot) Persist(sink raft.SnapshotSink) error {
	if _, err := s.view.WriteTo(sink); err != nil {
		_ = sink.Cancel()
		return fmt.Errorf("replication: write snapshot: %w", err)
	}
	return sink.Close()
}

func (stateSnapshot) Release() {}
