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

// Apply applies one log entry: a command, answered with its core.Result, or a batch of
// commands (batch.go), applied in order and answered with a []core.Result. Readers see
// an entry whole: a batch applies under one hold of the lock.
func (f *fsm) Apply(l *raft.Log) any {
	if l.Type != raft.LogCommand {
		return nil
	}
	if !isBatch(l.Data) {
		var res [1]core.Result
		f.applyAll(l.Index, [][]byte{l.Data}, res[:])
		return res[0]
	}
	cmds, err := decodeBatch(l.Data)
	if err != nil {
		// Skipped identically on every replica, like a corrupt command.
		f.log.Error("skipping undecodable batch entry", "index", l.Index, "err", err)
		f.applyAll(l.Index, nil, nil)
		return core.Result{Err: err}
	}
	res := make([]core.Result, len(cmds))
	f.applyAll(l.Index, cmds, res)
	return res
}

// applyAll applies the encoded commands of the entry at index, in order, into res, and
// then hands their effects to observe.
func (f *fsm) applyAll(index uint64, cmds [][]byte, res []core.Result) {
	f.mu.Lock()
	for i, data := range cmds {
		cmd, err := core.DecodeCommand(data)
		if err != nil {
			// A corrupt command is skipped identically on every replica: the state
			// does not change, and the proposer (if any) gets the error.
			res[i].Err = err
			f.log.Error("skipping undecodable command", "index", index, "command", i, "err", err)
			continue
		}
		res[i] = f.state.Apply(cmd)
	}
	f.applied = index
	f.mu.Unlock()
	if f.observe != nil {
		for _, r := range res {
			if len(r.Effects) > 0 {
				f.observe(r.Effects)
			}
		}
	}
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
