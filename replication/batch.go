package replication

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/leasehold/leasehold/core"
)

// Group commit: many commands in one raft log entry.
//
// raft already writes every entry that queued during one log write with the next write
// (BatchApplyCh), but it still pays per entry: a future, a place in its queues, a
// record in the log, a msgpack encoding in every AppendEntries, a decode, a record and
// an apply on every follower. The batcher pays those once per group instead: while the
// latest entry it sent is not yet written, new commands wait in a group; when the write
// that carries that entry ends, the group goes to raft as one entry, in time for the
// next write. A command that finds nothing unwritten goes to raft at once, alone, so a
// lone caller waits no longer than before.

// batchMarker is the first byte of a log entry that holds a batch of commands. Command
// encodings start with their version byte (core: 1 or 2), so the two cannot be confused.
// Format:
//
//	byte     0xB1
//	uvarint  number of commands, at least 2
//	per command: uvarint length, then the command as core.EncodeCommand wrote it
//
// A batch of one is never written: a single command is its own entry, as it was before
// batches existed. A binary that predates batches skips batch entries as corrupt, so a
// cluster must not mix it with this one.
const batchMarker = 0xB1

// Bounds on one batch. A batch takes at least one command whatever its size.
const (
	maxBatchCommands = 1024
	maxBatchBytes    = 128 << 10
)

// errBatchCorrupt is the result of every command of a batch entry whose framing does
// not decode. Such an entry changes nothing, identically on every replica.
var errBatchCorrupt = errors.New("replication: batch entry does not decode")

// appendBatch appends the batch entry holding cmds (encoded commands, at least two).
func appendBatch(b []byte, cmds [][]byte) []byte {
	b = append(b, batchMarker)
	b = binary.AppendUvarint(b, uint64(len(cmds)))
	for _, c := range cmds {
		b = binary.AppendUvarint(b, uint64(len(c)))
		b = append(b, c...)
	}
	return b
}

// isBatch reports whether a log entry's data is a batch.
func isBatch(data []byte) bool { return len(data) > 0 && data[0] == batchMarker }

// decodeBatch splits a batch entry into its encoded commands (aliasing data). It fails
// with errBatchCorrupt on any malformed framing: a count below two or beyond what the
// entry can hold, a length past the end, or bytes left over.
func decodeBatch(data []byte) ([][]byte, error) {
	if !isBatch(data) {
		return nil, fmt.Errorf("%w: no batch marker", errBatchCorrupt)
	}
	b := data[1:]
	n, k := binary.Uvarint(b)
	// Every command takes at least two bytes (its length and a version byte).
	if k <= 0 || n < 2 || n > uint64(len(b))/2 {
		return nil, fmt.Errorf("%w: command count", errBatchCorrupt)
	}
	b = b[k:]
	cmds := make([][]byte, 0, n)
	for i := range n {
		l, k := binary.Uvarint(b)
		if k <= 0 || l > uint64(len(b)-k) {
			return nil, fmt.Errorf("%w: length of command %d", errBatchCorrupt, i)
		}
		cmds = append(cmds, b[k:k+int(l)])
		b = b[k+int(l):]
	}
	if len(b) != 0 {
		return nil, fmt.Errorf("%w: %d bytes after the last command", errBatchCorrupt, len(b))
	}
	return cmds, nil
}

// proposal is one command waiting for its commit. Its outcome goes to done or, for a
// proposer that does not wait (Node.ApplyThen), to then.
type proposal struct {
	data []byte
	done chan outcome // buffered: the outcome never waits for the proposer
	then func(outcome)
}

// settle hands p its outcome.
func (p proposal) settle(o outcome) {
	if p.then != nil {
		p.then(o)
		return
	}
	p.done <- o
}

// outcome is what a proposer learns: the command's result, or why its commit failed.
type outcome struct {
	res core.Result
	err error // raft's error for the entry; nil when it was applied
}

// batchEnqueueTimeout bounds how long handing a batch to raft may block. The next batch
// is handed over from inside raft's leader loop (batcher.written), which is also what
// empties raft's queue; the queue holds MaxAppendEntries entries and the batcher keeps
// about one batch in it, so the bound is never reached in practice, but it keeps a
// leader loop from waiting on itself. A batch that times out fails with ErrBusy: nothing of
// it was written.
const batchEnqueueTimeout = 50 * time.Millisecond

// batcher groups proposals into log entries (see the comment at the top of the file).
// submit hands an entry to raft and calls back with its outcome.
type batcher struct {
	submit func(data []byte, done func(raft.ApplyFuture, error))
	// observe, if set, gets how long each entry took from submit to its outcome, when
	// it was applied (Config.ObserveCommit).
	observe func(time.Duration)

	mu      sync.Mutex
	pending []proposal
	bytes   int
	open    bool   // the latest entry sent may not be written yet: new proposals wait
	holds   int    // proposers with more proposals on the way (hold): new proposals wait
	openAt  uint64 // log writes started when the latest entry was sent
	seq     uint64 // counts entries sent

	// Log writes started and finished, counted by the log store's wrapper (batchStore).
	// Raft writes one batch of entries at a time, in order.
	writesStarted, writesEnded atomic.Uint64
}

// propose queues p. It goes to raft at once when every entry sent before has been
// written; otherwise it waits for the next entry, which is sent when the write that
// carries the latest one ends (or when that entry fails).
func (b *batcher) propose(p proposal) {
	b.mu.Lock()
	b.pending = append(b.pending, p)
	b.bytes += len(p.data)
	if (b.open || b.holds > 0) && len(b.pending) < maxBatchCommands && b.bytes < maxBatchBytes {
		b.mu.Unlock()
		return
	}
	b.release()
}

// hold makes new proposals wait, as they do while an entry is being written, until
// the returned function is called (once): a proposer that knows more proposals are on
// the way — the fast-lane reader with more requests in its read buffer — lets them go
// to raft as one entry instead of the first alone and the rest after its write.
func (b *batcher) hold() (unhold func()) {
	b.mu.Lock()
	b.holds++
	b.mu.Unlock()
	return b.unhold
}

func (b *batcher) unhold() {
	b.mu.Lock()
	b.holds--
	if b.holds > 0 || b.open {
		b.mu.Unlock()
		return
	}
	b.release()
}

// written is called when a log write has ended. A write that started after the latest
// entry was sent carried it (raft writes everything queued when a write starts), so the
// next entry may go.
func (b *batcher) written() {
	ended := b.writesEnded.Load()
	b.mu.Lock()
	if !b.open || ended <= b.openAt {
		b.mu.Unlock()
		return
	}
	b.open = false
	b.release()
}

// settled is called when entry seq has an outcome. An entry that failed before any
// write carried it (not the leader, raft shutting down) must not hold the next back.
func (b *batcher) settled(seq uint64) {
	b.mu.Lock()
	if !b.open || seq != b.seq {
		b.mu.Unlock()
		return
	}
	b.open = false
	b.release()
}

// release sends the pending proposals as the next entry, if there are any. b.mu is
// held, and released. It runs on the caller's goroutine, even raft's leader loop
// (written): handing the entry over from there puts it in raft's queue before the loop
// looks at the queue again, with no goroutine to wake (see batchEnqueueTimeout).
func (b *batcher) release() {
	if len(b.pending) == 0 {
		b.mu.Unlock()
		return
	}
	batch := b.pending
	b.pending, b.bytes = nil, 0
	b.open = true
	b.openAt = b.writesStarted.Load()
	b.seq++
	seq := b.seq
	b.mu.Unlock()
	b.send(batch, seq)
}

// send hands batch to raft as one entry and delivers each proposal's outcome.
func (b *batcher) send(batch []proposal, seq uint64) {
	var data []byte
	if len(batch) == 1 {
		data = batch[0].data
	} else {
		size := 1 + binary.MaxVarintLen64
		cmds := make([][]byte, len(batch))
		for i, p := range batch {
			cmds[i] = p.data
			size += binary.MaxVarintLen64 + len(p.data)
		}
		data = appendBatch(make([]byte, 0, size), cmds)
	}
	start := time.Now()
	b.submit(data, func(f raft.ApplyFuture, err error) {
		if err == nil && b.observe != nil {
			b.observe(time.Since(start))
		}
		deliver(batch, f, err)
		b.settled(seq)
	})
}

// deliver gives every proposal of a batch its outcome: its own result when the entry
// was applied, raft's error for all when it was not.
func deliver(batch []proposal, f raft.ApplyFuture, err error) {
	if err != nil {
		for _, p := range batch {
			p.settle(outcome{err: err})
		}
		return
	}
	switch r := f.Response().(type) {
	case core.Result:
		if len(batch) == 1 {
			batch[0].settle(outcome{res: r})
			return
		}
	case []core.Result:
		if len(r) == len(batch) {
			for i, p := range batch {
				p.settle(outcome{res: r[i]})
			}
			// raft's log cache keeps the newest entries' futures, and with them this
			// response: without the clear, each cached entry would keep its commands'
			// effects and strings alive after every proposer has had its result.
			clear(r)
			return
		}
	}
	// The state machine answered with a shape that does not fit the entry: the entry
	// was written but did not apply as the batch (cannot happen with this fsm).
	for _, p := range batch {
		p.settle(outcome{res: core.Result{Err: errBatchCorrupt}})
	}
}

// batchStore wraps the log store to tell the batcher when a log write starts and ends.
type batchStore struct {
	raft.LogStore
	b *batcher
}

func (s batchStore) StoreLog(l *raft.Log) error { return s.StoreLogs([]*raft.Log{l}) }

// IsMonotonic passes on the wrapped store's raft.MonotonicLogStore answer, which the
// embedded interface would hide: raft's log cache asks the store beneath it, and a
// store that cannot hold a gap (replication/wal) needs raft to delete its whole log when
// it installs a snapshot, or the entries after the snapshot never fit.
func (s batchStore) IsMonotonic() bool {
	m, ok := s.LogStore.(raft.MonotonicLogStore)
	return ok && m.IsMonotonic()
}

func (s batchStore) StoreLogs(logs []*raft.Log) error {
	s.b.writesStarted.Add(1)
	err := s.LogStore.StoreLogs(logs)
	s.b.writesEnded.Add(1)
	s.b.written()
	return err
}
