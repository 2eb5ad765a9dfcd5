package replication

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/leasehold/leasehold/core"
)

func encode(t testing.TB, c core.Command) []byte {
	t.Helper()
	b, err := core.EncodeCommand(c)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestBatchRoundTrip(t *testing.T) {
	cmds := [][]byte{
		encode(t, core.Command{Op: core.OpAcquire, Lease: core.LeaseID{1}, Name: "a", Class: core.Correctness}),
		encode(t, core.Command{Op: core.OpRelease, Lease: core.LeaseID{1}, Name: "a", Token: 7}),
		encode(t, core.Command{Op: core.OpPut, Name: "k", Value: bytes.Repeat([]byte{'v'}, 300)}),
	}
	entry := appendBatch(nil, cmds)
	if !isBatch(entry) {
		t.Fatal("a batch entry is not recognised as one")
	}
	for _, c := range cmds {
		if isBatch(c) {
			t.Fatalf("a single command (first byte %d) is taken for a batch", c[0])
		}
	}
	got, err := decodeBatch(entry)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(cmds) {
		t.Fatalf("decoded %d commands, want %d", len(got), len(cmds))
	}
	for i := range cmds {
		if !bytes.Equal(got[i], cmds[i]) {
			t.Fatalf("command %d changed in the round trip", i)
		}
	}
}

func TestDecodeBatchRejectsMalformed(t *testing.T) {
	one := encode(t, core.Command{Op: core.OpRelease, Lease: core.LeaseID{1}, Name: "a", Token: 7})
	good := appendBatch(nil, [][]byte{one, one})
	for name, data := range map[string][]byte{
		"empty":              nil,
		"no marker":          one,
		"marker only":        {batchMarker},
		"count of one":       appendBatch(nil, [][]byte{one})[:],
		"count beyond entry": {batchMarker, 100, 1, 2},
		"length past end":    append([]byte{batchMarker, 2, 200}, one...),
		"truncated":          good[:len(good)-1],
		"trailing bytes":     append(append([]byte{}, good...), 0),
		"bad varint":         {batchMarker, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
	} {
		if _, err := decodeBatch(data); !errors.Is(err, errBatchCorrupt) {
			t.Errorf("%s: got %v, want errBatchCorrupt", name, err)
		}
	}
}

// FuzzDecodeBatch: any entry either fails with errBatchCorrupt or splits into commands
// that encode back to the same bytes; nothing panics.
func FuzzDecodeBatch(f *testing.F) {
	one := encode(f, core.Command{Op: core.OpRelease, Lease: core.LeaseID{1}, Name: "a", Token: 7})
	f.Add(appendBatch(nil, [][]byte{one, one}))
	f.Add([]byte{batchMarker, 2, 0, 0})
	f.Add(one)
	f.Fuzz(func(t *testing.T, data []byte) {
		cmds, err := decodeBatch(data)
		if err != nil {
			if !errors.Is(err, errBatchCorrupt) {
				t.Fatalf("error %v is not errBatchCorrupt", err)
			}
			return
		}
		if again := appendBatch(nil, cmds); !bytes.Equal(again, data) && canonicalVarints(data) {
			t.Fatalf("re-encoding changed the entry: %x → %x", data, again)
		}
	})
}

// canonicalVarints reports whether appendBatch could have written data's framing: Go's
// Uvarint also reads over-long encodings (a trailing 0x80 0x00), which appendBatch
// never writes.
func canonicalVarints(data []byte) bool {
	cmds, err := decodeBatch(data)
	return err == nil && len(appendBatch(nil, cmds)) == len(data)
}

// submission is one entry the fake raft received.
type submission struct {
	data []byte
	done func(raft.ApplyFuture, error)
}

// fakeRaft records submissions; answer resolves one.
type fakeRaft struct {
	mu  sync.Mutex
	got []submission
}

func (r *fakeRaft) submit(data []byte, done func(raft.ApplyFuture, error)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, submission{data: data, done: done})
}

func (r *fakeRaft) submissions() []submission {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]submission(nil), r.got...)
}

// response is an applied future with the given state-machine response.
type response struct {
	raft.ApplyFuture
	r any
}

func (f response) Response() any { return f.r }

func waitOutcome(t *testing.T, p proposal) outcome {
	t.Helper()
	select {
	case o := <-p.done:
		return o
	case <-time.After(5 * time.Second):
		t.Fatal("no outcome")
		return outcome{}
	}
}

func newProposal(t testing.TB, token uint64) proposal {
	return proposal{data: encode(t, core.Command{Op: core.OpRelease, Lease: core.LeaseID{1}, Name: "a", Token: token}), done: make(chan outcome, 1)}
}

// TestBatcherGroupsUntilWritten: a proposal that finds nothing unwritten goes to raft
// at once and alone; proposals made before the write that carries it ends wait, and go
// as one batch entry when it does; each proposer gets its own result, or raft's error.
func TestBatcherGroupsUntilWritten(t *testing.T) {
	fr := &fakeRaft{}
	b := &batcher{submit: fr.submit}
	sent := func(want int) []submission {
		t.Helper()
		subs := fr.submissions()
		if len(subs) != want {
			t.Fatalf("%d entries sent, want %d", len(subs), want)
		}
		return subs
	}

	alone := newProposal(t, 1)
	b.propose(alone)
	if subs := sent(1); !bytes.Equal(subs[0].data, alone.data) {
		t.Fatal("a lone proposal was not sent as a plain command")
	}
	ps := []proposal{newProposal(t, 2), newProposal(t, 3), newProposal(t, 4)}
	for _, p := range ps {
		b.propose(p)
	}
	sent(1) // they wait: the lone entry is not written yet
	b.writesStarted.Add(1)
	b.writesEnded.Add(1)
	b.written() // the write that carried it ended
	subs := sent(2)
	cmds, err := decodeBatch(subs[1].data)
	if err != nil || len(cmds) != len(ps) {
		t.Fatalf("batch entry: %d commands, %v", len(cmds), err)
	}
	for i, p := range ps {
		if !bytes.Equal(cmds[i], p.data) {
			t.Fatalf("command %d of the batch is not proposal %d's", i, i)
		}
	}
	subs[0].done(response{r: core.Result{Token: 1}}, nil)
	if o := waitOutcome(t, alone); o.err != nil || o.res.Token != 1 {
		t.Fatalf("lone proposal: %+v", o)
	}
	subs[1].done(response{r: []core.Result{{Token: 12}, {Token: 13}, {Err: core.ErrLockHeld}}}, nil)
	for i, want := range []core.Result{{Token: 12}, {Token: 13}, {Err: core.ErrLockHeld}} {
		o := waitOutcome(t, ps[i])
		if o.err != nil || o.res.Token != want.Token || !errors.Is(o.res.Err, want.Err) {
			t.Fatalf("proposal %d got %+v, want %+v", i, o, want)
		}
	}

	// Raft's error reaches every proposer of an entry; an entry that fails before any
	// write carried it does not hold the next one back.
	first := newProposal(t, 5)
	b.propose(first)
	rest := []proposal{newProposal(t, 6), newProposal(t, 7)}
	for _, p := range rest {
		b.propose(p)
	}
	subs = sent(3)
	subs[2].done(nil, raft.ErrNotLeader)
	if o := waitOutcome(t, first); !errors.Is(o.err, raft.ErrNotLeader) {
		t.Fatalf("got %+v, want raft's error", o)
	}
	subs = sent(4)
	subs[3].done(nil, raft.ErrLeadershipLost)
	for i, p := range rest {
		if o := waitOutcome(t, p); !errors.Is(o.err, raft.ErrLeadershipLost) {
			t.Fatalf("proposal %d got %+v, want raft's error", i, o)
		}
	}

	// A write that started before an entry was sent did not carry it.
	b.writesStarted.Add(1)
	b.propose(newProposal(t, 8))
	waiting := newProposal(t, 9)
	b.propose(waiting)
	b.writesEnded.Add(1)
	b.written()
	sent(5)
	b.writesStarted.Add(1)
	b.writesEnded.Add(1)
	b.written()
	if subs = sent(6); !bytes.Equal(subs[5].data, waiting.data) {
		t.Fatal("the proposal that waited was not sent when the write carrying the entry ended")
	}

	// A write with nothing pending sends nothing.
	b.writesStarted.Add(1)
	b.writesEnded.Add(1)
	b.written()
	sent(6)
}

// TestBatcherHolds: while a proposer holds, a proposal that finds nothing unwritten
// waits instead of going alone; when the last hold ends, everything held goes as one
// entry. A hold with nothing proposed sends nothing, and a hold does not keep a batch
// from going when the write it waited for ends.
func TestBatcherHolds(t *testing.T) {
	fr := &fakeRaft{}
	b := &batcher{submit: fr.submit}
	unhold1, unhold2 := b.hold(), b.hold()
	ps := []proposal{newProposal(t, 1), newProposal(t, 2), newProposal(t, 3)}
	for _, p := range ps {
		b.propose(p)
	}
	if n := len(fr.submissions()); n != 0 {
		t.Fatalf("%d entries sent while held, want none", n)
	}
	unhold1()
	if n := len(fr.submissions()); n != 0 {
		t.Fatalf("%d entries sent with one hold left, want none", n)
	}
	unhold2()
	subs := fr.submissions()
	if len(subs) != 1 {
		t.Fatalf("%d entries sent after the last hold ended, want 1", len(subs))
	}
	if cmds, err := decodeBatch(subs[0].data); err != nil || len(cmds) != len(ps) {
		t.Fatalf("the held proposals went as %d commands (%v), want one entry of %d", len(cmds), err, len(ps))
	}

	b.hold()() // nothing proposed: nothing sent
	if n := len(fr.submissions()); n != 1 {
		t.Fatalf("%d entries sent, want still 1", n)
	}

	// The entry above is not written yet: with a hold, new proposals go when that write
	// ends, as without one.
	unhold := b.hold()
	b.propose(newProposal(t, 4))
	b.propose(newProposal(t, 5))
	b.writesStarted.Add(1)
	b.writesEnded.Add(1)
	b.written()
	if n := len(fr.submissions()); n != 2 {
		t.Fatalf("%d entries sent after the write ended under a hold, want 2", n)
	}
	unhold()
	if n := len(fr.submissions()); n != 2 {
		t.Fatalf("%d entries sent after the hold ended with nothing pending, want 2", n)
	}
}

// TestBatcherBounds: a batch that reaches its size bound goes at once, whatever is
// unwritten, so no entry grows past the bounds.
func TestBatcherBounds(t *testing.T) {
	fr := &fakeRaft{}
	b := &batcher{submit: fr.submit}
	for i := range maxBatchCommands + 1 {
		b.propose(newProposal(t, uint64(i+1)))
	}
	subs := fr.submissions()
	if len(subs) != 2 {
		t.Fatalf("%d entries sent, want 2 (the first proposal alone, then a full batch)", len(subs))
	}
	cmds, err := decodeBatch(subs[1].data)
	if err != nil || len(cmds) != maxBatchCommands {
		t.Fatalf("batch of %d commands (%v), want %d", len(cmds), err, maxBatchCommands)
	}
}

// TestDeliverMismatchedResponse: a response that does not fit the entry fails every
// proposer with errBatchCorrupt instead of handing out wrong results.
func TestDeliverMismatchedResponse(t *testing.T) {
	for name, r := range map[string]any{
		"too few results": []core.Result{{Token: 1}},
		"single result":   core.Result{Token: 1},
		"nothing":         nil,
	} {
		ps := []proposal{newProposal(t, 1), newProposal(t, 2)}
		deliver(ps, response{r: r}, nil)
		for i, p := range ps {
			if o := waitOutcome(t, p); !errors.Is(o.res.Err, errBatchCorrupt) {
				t.Fatalf("%s: proposal %d got %+v", name, i, o)
			}
		}
	}
}

func TestFSMAppliesBatchInOrder(t *testing.T) {
	f := &fsm{state: core.NewState(core.Limits{}), log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	lease := core.LeaseID{9}
	grant := encode(t, core.Command{Op: core.OpGrant, Lease: lease, TTLMillis: 10000})
	if r := f.Apply(&raft.Log{Type: raft.LogCommand, Index: 1, Data: grant}).(core.Result); r.Err != nil {
		t.Fatal(r.Err)
	}
	acq := func(name string) []byte {
		return encode(t, core.Command{Op: core.OpAcquire, Lease: lease, Name: name, Class: core.Correctness})
	}
	entry := appendBatch(nil, [][]byte{acq("x"), {2, 0xff}, acq("y"), acq("x")})
	res, ok := f.Apply(&raft.Log{Type: raft.LogCommand, Index: 2, Data: entry}).([]core.Result)
	if !ok || len(res) != 4 {
		t.Fatalf("batch response %T of %d", res, len(res))
	}
	if res[0].Err != nil || res[2].Err != nil || res[0].Token == 0 || res[2].Token <= res[0].Token {
		t.Fatalf("acquires x and y: %+v, %+v", res[0], res[2])
	}
	if !errors.Is(res[1].Err, core.ErrCorrupt) {
		t.Fatalf("a corrupt command inside the batch: %v, want core.ErrCorrupt", res[1].Err)
	}
	if res[3].Err != nil || res[3].Token != res[0].Token {
		t.Fatalf("a repeated acquire by the same lease: %+v, want the grant's token %d", res[3], res[0].Token)
	}

	before := f.applied
	r, ok := f.Apply(&raft.Log{Type: raft.LogCommand, Index: 3, Data: []byte{batchMarker, 9}}).(core.Result)
	if !ok || !errors.Is(r.Err, errBatchCorrupt) || f.applied != 3 || before != 2 {
		t.Fatalf("a corrupt batch: %+v (applied %d)", r, f.applied)
	}
}

// TestBatchEntryThroughRaft: commands proposed during a log write reach raft and the
// WAL as one entry; each proposer gets its own grant; and the entry replays into the
// same state after a restart.
func TestBatchEntryThroughRaft(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{DataDir: dir, RaftAddr: "127.0.0.1:0", Bootstrap: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	n := openLeader(t, cfg)
	ctx := context.Background()
	lease := core.LeaseID{1}
	if _, err := n.Apply(ctx, core.Command{Op: core.OpGrant, Lease: lease, TTLMillis: 600000}); err != nil {
		t.Fatal(err)
	}

	// Make the batcher believe an entry it sent is not written yet, so that the
	// proposals queue; then end a write that carried it. The pretend entry gets a
	// sequence number of its own: the grant's entry settles after its proposer hears
	// back, and that late settle must not release the queue.
	const k = 20
	n.batcher.mu.Lock()
	n.batcher.open, n.batcher.openAt = true, n.batcher.writesStarted.Load()
	n.batcher.seq++
	n.batcher.mu.Unlock()
	// The log's own last index, not raft's applied index, which raft updates on
	// another goroutine than the one that answers the proposers.
	before, err := n.logs.LastIndex()
	if err != nil {
		t.Fatal(err)
	}
	tokens := make([]uint64, k)
	errs := make(chan error, k)
	for i := range k {
		go func() {
			res, err := n.Apply(ctx, core.Command{Op: core.OpAcquire, Lease: lease, Name: fmt.Sprintf("lock/%d", i), Class: core.Correctness})
			if err == nil {
				err = res.Err
			}
			tokens[i] = res.Token
			errs <- err
		}()
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		n.batcher.mu.Lock()
		queued := len(n.batcher.pending)
		n.batcher.mu.Unlock()
		if queued == k {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d proposals queued", queued, k)
		}
		time.Sleep(time.Millisecond)
	}
	n.batcher.writesStarted.Add(1)
	n.batcher.writesEnded.Add(1)
	n.batcher.written()
	for range k {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	last, err := n.logs.LastIndex()
	if err != nil {
		t.Fatal(err)
	}
	if entries := last - before; entries != 1 {
		t.Fatalf("%d commands took %d log entries, want 1", k, entries)
	}
	seen := map[uint64]bool{}
	for i, tok := range tokens {
		if tok == 0 || seen[tok] {
			t.Fatalf("proposer %d got token %d (tokens %v)", i, tok, tokens)
		}
		seen[tok] = true
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}

	n = openLeader(t, cfg)
	defer n.Close()
	if err := n.Barrier(ctx); err != nil {
		t.Fatal(err)
	}
	n.Read(func(s *core.State) {
		for i, tok := range tokens {
			lk := s.Locks().Get(fmt.Sprintf("lock/%d", i))
			if lk == nil || lk.Hold == nil || lk.Hold.Token != tok {
				t.Fatalf("after replay lock/%d is %+v, want held with token %d", i, lk, tok)
			}
		}
	})
}

// openLeader opens a one-voter node and waits until it leads.
func openLeader(t *testing.T, cfg Config) *Node {
	t.Helper()
	n, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.WaitLeader(ctx); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestApplyThen: ApplyThen gives its callback what Apply returns — the command's result
// once committed, an encoding error at once on the caller's goroutine — exactly once.
func TestApplyThen(t *testing.T) {
	cfg := Config{DataDir: t.TempDir(), RaftAddr: "127.0.0.1:0", Bootstrap: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	n := openLeader(t, cfg)
	defer n.Close()
	type answer struct {
		res core.Result
		err error
	}
	then := func(cmd core.Command) chan answer {
		ch := make(chan answer, 2)
		n.ApplyThen(cmd, func(res core.Result, err error) { ch <- answer{res, err} })
		return ch
	}
	wait := func(ch chan answer) answer {
		t.Helper()
		select {
		case a := <-ch:
			return a
		case <-time.After(10 * time.Second):
			t.Fatal("ApplyThen never answered")
			return answer{}
		}
	}
	lease := core.LeaseID{7}
	if a := wait(then(core.Command{Op: core.OpGrant, Lease: lease, TTLMillis: 60000})); a.err != nil || a.res.Err != nil {
		t.Fatalf("grant: %+v", a)
	}
	ch := then(core.Command{Op: core.OpAcquire, Lease: lease, Name: "then/x", Class: core.Correctness})
	a := wait(ch)
	if a.err != nil || a.res.Err != nil || a.res.Token == 0 {
		t.Fatalf("acquire: %+v", a)
	}
	res, err := n.Apply(context.Background(), core.Command{Op: core.OpAcquire, Lease: lease, Name: "then/x", Class: core.Correctness})
	if err != nil || res.Token != a.res.Token {
		t.Fatalf("Apply of the same acquire: %+v, %v; want ApplyThen's token %d", res, err, a.res.Token)
	}
	bad := then(core.Command{Op: core.OpAcquire, Lease: lease, Name: strings.Repeat("n", 1<<17), Class: core.Correctness})
	select {
	case a := <-bad:
		if a.err == nil {
			t.Fatalf("a command that does not encode: %+v, want an error", a)
		}
	default:
		t.Fatal("a command that does not encode was not answered at once")
	}
	time.Sleep(10 * time.Millisecond)
	if len(ch) != 0 || len(bad) != 0 {
		t.Fatal("ApplyThen answered twice")
	}
}
