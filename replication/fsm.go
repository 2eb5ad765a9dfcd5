package replication

import (
	"fmt"
	"io"
	"log/slog"
	"sync"

	"github.com/hashicorp/raft"

	"github.com/leasehold/leasehold/core"
	"github.com/leasehold/leasehold/watch"
)

// fsm adapts core.State to raft.FSM. Raft calls Apply, Snapshot and Restore from one
// goroutine; readers take mu for reading.
type fsm struct {
	mu      sync.RWMutex
	state   *core.State
	applied uint64 // index of the last applied entry
	limits  core.Limits
	observe func([]core.Effect)
	// events, if set, gets each command entry's lock events (recorded into pending).
	events  *watch.Hub
	pending []core.Event
	// holdEnds, if set, gets each entry's ended holds (recorded into ended).
	holdEnds func([]core.EndedHold)
	ended    []core.EndedHold
	log      *slog.Logger
	// clusterID is the state's cluster ID as last seen; when it changes, saveClusterID
	// (if set) keeps it outside the state too (see presetClusterID).
	clusterID     string
	saveClusterID func(string)
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
	if f.events != nil {
		f.events.Entry(index, f.pending)
		clear(f.pending) // the hub keeps copies; the strings go with them
		f.pending = f.pending[:0]
	}
	named := f.namedLocked()
	// The ends are handed on after the lock is let go, in the slice the next entry
	// fills again: applies are serial, so that is after holdEnds returned.
	ended := f.ended
	f.ended = f.ended[:0]
	f.mu.Unlock()
	f.save(named)
	if f.observe != nil {
		for _, r := range res {
			if len(r.Effects) > 0 {
				f.observe(r.Effects)
			}
		}
	}
	if len(ended) > 0 {
		f.holdEnds(ended)
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
	f.setState(s)
	if f.events != nil {
		f.events.Reset()
	}
	named := f.namedLocked()
	f.mu.Unlock()
	f.save(named)
	return nil
}

// setState makes s the state, recording its lock events for the hub and its ends of
// holds for holdEnds; f.mu is held (or f is not in use yet).
func (f *fsm) setState(s *core.State) {
	f.state = s
	if f.events != nil {
		s.Record(func(e core.Event) { f.pending = append(f.pending, e) })
	}
	if f.holdEnds != nil {
		s.OnHoldEnd(func(h core.EndedHold) { f.ended = append(f.ended, h) })
	}
}

// namedLocked returns the state's cluster ID if it is new since the last call, else "".
func (f *fsm) namedLocked() string {
	id := f.state.ClusterID()
	if id == f.clusterID {
		return ""
	}
	f.clusterID = id
	return id
}

func (f *fsm) save(id string) {
	if id != "" && f.saveClusterID != nil {
		f.saveClusterID(id)
	}
}

// presetClusterID gives the state the cluster ID this node applied before it last
// stopped, when the state restored from the newest snapshot does not have it yet (the
// entry that named the cluster comes after that snapshot, and a follower applies it
// only once the leader tells it the commit index). It is the committed ID, so the log
// entry that names it is a no-op when it is applied again; until then the node can
// already tell which cluster it belongs to.
func (f *fsm) presetClusterID(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.state.ClusterID() == "" {
		if res := f.state.Apply(core.Command{Op: core.OpSetClusterID, ClusterID: id}); res.Err != nil {
			f.log.Error("ignoring the saved cluster ID", "id", id, "err", res.Err)
			return
		}
	}
	f.clusterID = f.state.ClusterID()
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
