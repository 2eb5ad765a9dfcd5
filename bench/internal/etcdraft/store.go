package etcdraft

import (
	"fmt"

	"github.com/hashicorp/raft"
	pb "go.etcd.io/raft/v3/raftpb"

	"github.com/leasehold/leasehold/replication/wal"
)

// LogStore is what the prototype needs of a durable log: replication/wal's Log, the log
// the server runs on, has it. StoreLogs must return only once the batch is on stable
// storage; tests wrap it to hold a node's disk writes back.
type LogStore interface {
	StoreLogs(logs []*raft.Log) error
	DeleteRange(lo, hi uint64) error
	LastIndex() (uint64, error)
	SetUint64(key []byte, val uint64) error
	Close() error
}

var _ LogStore = (*wal.Log)(nil)

// Keys of the hard state in the log's stable store. The commit index is not kept: raft
// learns it again from the leader (it may restart below it, never above).
var (
	keyTerm = []byte("EtcdRaftTerm")
	keyVote = []byte("EtcdRaftVote")
)

// durable writes one Ready's log entries and hard state to a LogStore.
type durable struct {
	log        LogStore
	term, vote uint64 // as last stored
}

// hardStateChanged reports whether hs changes the term or vote: those must be durable
// before this node sends anything (a vote, or a message in the new term).
func (d *durable) hardStateChanged(hs *pb.HardState) bool {
	return hs != nil && (hs.GetTerm() != d.term || hs.GetVote() != d.vote)
}

// saveHardState stores hs's term and vote if they changed.
func (d *durable) saveHardState(hs *pb.HardState) error {
	if !d.hardStateChanged(hs) {
		return nil
	}
	if err := d.log.SetUint64(keyTerm, hs.GetTerm()); err != nil {
		return fmt.Errorf("etcdraft: save term: %w", err)
	}
	if err := d.log.SetUint64(keyVote, hs.GetVote()); err != nil {
		return fmt.Errorf("etcdraft: save vote: %w", err)
	}
	d.term, d.vote = hs.GetTerm(), hs.GetVote()
	return nil
}

// saveEntries appends ents durably, first cutting any suffix of the stored log they
// replace (a follower's entries that a new leader overwrites).
func (d *durable) saveEntries(ents []*pb.Entry) error {
	if len(ents) == 0 {
		return nil
	}
	first := ents[0].GetIndex()
	last, err := d.log.LastIndex()
	if err != nil {
		return fmt.Errorf("etcdraft: log last index: %w", err)
	}
	if last >= first {
		if err := d.log.DeleteRange(first, last); err != nil {
			return fmt.Errorf("etcdraft: cut log suffix from %d: %w", first, err)
		}
	}
	logs := make([]*raft.Log, len(ents))
	recs := make([]raft.Log, len(ents))
	for i, e := range ents {
		typ := raft.LogCommand
		if e.GetType() != pb.EntryNormal {
			typ = raft.LogConfiguration
		}
		recs[i] = raft.Log{Index: e.GetIndex(), Term: e.GetTerm(), Type: typ, Data: e.GetData()}
		logs[i] = &recs[i]
	}
	if err := d.log.StoreLogs(logs); err != nil {
		return fmt.Errorf("etcdraft: store entries %d–%d: %w", first, ents[len(ents)-1].GetIndex(), err)
	}
	return nil
}
