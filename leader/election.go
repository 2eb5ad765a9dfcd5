package leader

import (
	"context"
	"errors"

	"github.com/leasehold/leasehold/core"
)

// Elections (G8): Campaign waits, FIFO, until the lease leads the election; the
// replicated state (core/election.go) seats the next candidate when a leader resigns
// or its lease ends, and its EffectElected wakes that candidate's Campaign here.

// electionKey is the key of a Campaign's wait in waits: a byte no lock name may
// contain keeps elections apart from locks of the same name.
func electionKey(name string) string { return "\x00election:" + name }

// Leadership is who leads an election.
type Leadership struct {
	Epoch  uint64
	Lease  core.LeaseID
	Value  []byte
	Holder core.Holder
}

// Campaign makes lease a candidate for election name with value, and waits until it
// leads; it returns the leadership's epoch, a token from the sequence that every later
// leadership of the election exceeds. A Campaign by a lease that leads already returns
// its epoch at once (a repeat is harmless). When ctx ends first — even while the
// campaign commits — the lease leaves the queue, and resigns if the leadership raced
// the end, unless another Campaign of the same lease for the name owns them (undo.go);
// it returns ctx's error.
//
// Errors: *LeaseGoneError (the lease is unknown or ended, before or while waiting),
// ErrNotLeader (this node does not lead, or stopped while the Campaign waited),
// ErrUndoing (another Campaign of the lease for the name is being taken back: retry),
// core.ErrTooManyWaiters, core.ErrInvalid, the log's errors (outcome unknown), ctx's.
func (l *Leader) Campaign(ctx context.Context, lease core.LeaseID, name string, value []byte, holder core.Holder) (uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err // nothing proposed
	}
	key := electionKey(name)
	l.mu.Lock()
	if !l.active {
		l.mu.Unlock()
		return 0, ErrNotLeader
	}
	ch, ok := l.waits.addUnlessUndoing(lease, key)
	l.mu.Unlock()
	if !ok {
		return 0, ErrUndoing
	}
	defer l.waits.remove(lease, key, ch)
	tb := takeBack{
		lease: lease, key: key, what: "election", name: name,
		leave: core.Command{Op: core.OpWithdraw, Lease: lease, Name: name},
		end: func(epoch uint64) core.Command {
			return core.Command{Op: core.OpResign, Lease: lease, Name: name, Token: epoch}
		},
	}
	// As acquireCorrectness: the outcome is seen even when ctx ends first.
	cmd := core.Command{Op: core.OpCampaign, Lease: lease, Name: name, Value: value, Holder: holder, Wait: true}
	res, err, left := l.applyUnlessLeft(ctx, cmd, func(res core.Result, err error) {
		l.abandonedCommit(tb, ch, res, err)
	})
	if left {
		return 0, err
	}
	if err != nil {
		return 0, err
	}
	if err := l.electionErr(lease, res.Err); err != nil || !res.Queued {
		if err == nil && !l.waits.answer(lease, key, ch, res.Token != 0) {
			return 0, ErrUndoing // another attempt's undo is taking this leadership back
		}
		return res.Token, err
	}
	select {
	case o := <-ch:
		return o.token, o.err
	case <-ctx.Done():
		if o, ok := arrived(ch); ok {
			return o.token, o.err // came as the caller left: answered (see commitWait.leave)
		}
		// The caller is gone: leave the queue — and resign, if the leadership raced the
		// end — unless another attempt of this campaign waits.
		l.undo(tb, ch, 0, true)
		return 0, ctx.Err()
	}
}

// Proclaim sets the value of election name, which lease must lead under epoch.
// Errors: core.ErrNotHolder (it does not lead under that epoch), *LeaseGoneError,
// ErrNotLeader, the log's errors.
func (l *Leader) Proclaim(ctx context.Context, lease core.LeaseID, name string, epoch uint64, value []byte) error {
	return l.applyElection(ctx, core.Command{Op: core.OpProclaim, Lease: lease, Name: name, Token: epoch, Value: value})
}

// Resign ends lease's leadership of election name under epoch; the next candidate
// leads. Errors: Proclaim's.
func (l *Leader) Resign(ctx context.Context, lease core.LeaseID, name string, epoch uint64) error {
	return l.applyElection(ctx, core.Command{Op: core.OpResign, Lease: lease, Name: name, Token: epoch})
}

func (l *Leader) applyElection(ctx context.Context, c core.Command) error {
	if !l.Active() {
		return ErrNotLeader
	}
	res, err := l.log.Apply(ctx, c)
	if err != nil {
		return err
	}
	return l.electionErr(c.Lease, res.Err)
}

// electionErr maps an election command's error: a lease not found says why it ended.
func (l *Leader) electionErr(lease core.LeaseID, err error) error {
	if errors.Is(err, core.ErrLeaseNotFound) {
		return l.gone(lease)
	}
	return err
}

// LeaderOf returns who leads election name, as this node's replicated state says,
// and false when nobody does.
func (l *Leader) LeaderOf(name string) (Leadership, bool) {
	var ld Leadership
	var ok bool
	l.log.Read(func(s *core.State) {
		if e := s.Elections().Get(name); e != nil && e.Leader != nil {
			ld, ok = Leadership{Epoch: e.Leader.Epoch, Lease: e.Leader.Lease, Value: e.Leader.Value, Holder: e.Leader.Holder}, true
		}
	})
	return ld, ok
}

// ElectionChange is one change Observe reports: a leadership (Leads; a Proclaim of a
// new value repeats the leadership's epoch), or that nobody leads any more (Epoch is
// the leadership that ended). Rev is its place in the election history
// (core.State.ElectionChanges), Ended how the leadership before it ended
// (core.ElectionChange.Ended), WallMillis when it was proposed. A stream's first "who
// leads now" has Rev the history's revision then, no Ended or WallMillis, and, when
// nobody leads, the epoch of the last leadership the history holds (0 if none). Lease
// is not set.
type ElectionChange struct {
	Leads bool
	Leadership
	Rev        uint64
	Ended      core.EventKind
	WallMillis int64
}

// changeOf is the ElectionChange of a change of the history.
func changeOf(c *core.ElectionChange) ElectionChange {
	return ElectionChange{Leads: c.Kind != core.ChangeLeaderless, Leadership: Leadership{Epoch: c.Epoch, Value: c.Value, Holder: c.Holder},
		Rev: c.Rev, Ended: c.Ended, WallMillis: c.WallMillis}
}

// observer is one Observe stream: woken by OnEffects (under Leader.mu) when its
// election changes.
type observer struct {
	wake chan struct{} // holds one signal: the election changed
}

// observedLocked wakes every observer of election name.
func (l *Leader) observedLocked(name string) {
	for o := range l.observers[name] {
		select {
		case o.wake <- struct{}{}:
		default:
		}
	}
}

// Observe calls send with the changes of election name, in log order, each once: the
// changes after revision after when resume (a resume point an earlier stream reached,
// on any node: the history is the same on every node), else who leads now first,
// then every later change. It reads them from the replicated election history
// (core.State.ElectionChanges), so a stream misses nothing between its start and its
// end, and two streams, the second resumed where the first stopped, miss and repeat
// nothing. It returns when ctx ends (ctx's error), when send fails (its error), or
// with a *core.HistoryCompactedError when the changes after its point are no longer
// held — at the start of a resume, or when the stream fell that far behind while it
// sent. It serves on any node that applies the log; the server routes it to the
// leader. A resume point this node has not applied yet (it is behind the node that
// gave it) is waited for: the changes up to it are not sent again.
func (l *Leader) Observe(ctx context.Context, name string, after uint64, resume bool, send func(ElectionChange) error) error {
	o := &observer{wake: make(chan struct{}, 1)}
	l.mu.Lock()
	if l.observers == nil {
		l.observers = make(map[string]map[*observer]struct{})
	}
	if l.observers[name] == nil {
		l.observers[name] = make(map[*observer]struct{})
	}
	l.observers[name][o] = struct{}{}
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		delete(l.observers[name], o)
		if len(l.observers[name]) == 0 {
			delete(l.observers, name)
		}
		l.mu.Unlock()
	}()
	// Read after registering: a change applied since wakes o, and is read from the
	// history after the point reached.
	if !resume {
		var now ElectionChange
		l.log.Read(func(s *core.State) {
			after = s.ElectionRev()
			now.Rev = after
			if e := s.Elections().Get(name); e != nil && e.Leader != nil {
				now.Leads, now.Leadership = true, Leadership{Epoch: e.Leader.Epoch, Value: e.Leader.Value, Holder: e.Leader.Holder}
			} else if c, ok := s.LastElectionChange(name); ok {
				now.Epoch = c.Epoch // the leadership that ended last
			}
		})
		if err := send(now); err != nil {
			return err
		}
	}
	var buf []core.ElectionChange
	for {
		var err error
		l.log.Read(func(s *core.State) { buf, err = s.ElectionChanges(name, after, buf[:0]) })
		if err != nil {
			return err
		}
		for i := range buf {
			if err := send(changeOf(&buf[i])); err != nil {
				return err
			}
			after = buf[i].Rev
		}
		clear(buf) // the values go with the sends
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-o.wake:
		}
	}
}
