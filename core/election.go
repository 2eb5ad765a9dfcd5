package core

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
)

// Elections (G8). An election is a named single-writer role: a lease campaigns for it
// with a value and waits, FIFO, until it leads; the leader may change its value
// (Proclaim) and resign; when its lease ends, the next candidate leads. Each
// leadership gets an epoch from the token sequence, so successive epochs of one
// election strictly increase and an epoch is a fencing token like any other. Every
// change — a leader, a proclaimed value, nobody leading — goes into the election
// history (electionhistory.go) that Observe resumes from.
//
// Election names are a namespace of their own: an election "x" and a lock "x" are
// unrelated.
const (
	// OpCampaign makes Lease a candidate for election Name with value Value (and
	// Holder): it leads at once when nobody does (Result.Token is its epoch), else it
	// queues when Wait (Result.Queued) or fails with ErrLockHeld. A campaign of a lease
	// that leads or waits already changes nothing and answers the same (idempotent).
	OpCampaign Op = 31
	// OpProclaim sets the value of election Name to Value; Lease must lead it under
	// epoch Token (else ErrNotHolder). A value other than the one it has is a change
	// (EffectProclaimed, and the history's); the same value changes nothing.
	OpProclaim Op = 32
	// OpResign ends Lease's leadership of Name under epoch Token (else ErrNotHolder);
	// the next candidate leads, with a new epoch.
	OpResign Op = 33
	// OpWithdraw takes Lease out of Name's queue of candidates. When Lease leads
	// already, it changes nothing and Result.Token is the epoch (the caller resigns);
	// when it neither leads nor waits, ErrNotWaiting.
	OpWithdraw Op = 34
)

// EffectElected reports that Lease leads election Name with epoch Token (it was
// queued, or campaigned when nobody led).
const EffectElected EffectKind = 30

// EffectLeaderless reports that election Name has no leader any more (its leader
// resigned or its lease ended with no candidate waiting). Token is the epoch that ended.
const EffectLeaderless EffectKind = 31

// Candidate is a lease campaigning for an election, or leading it (Epoch set).
type Candidate struct {
	Lease  LeaseID `json:"lease"`
	Epoch  uint64  `json:"epoch,omitempty"`
	Value  []byte  `json:"value,omitempty"`
	Holder Holder  `json:"holder,omitzero"`
}

// Election is one election as a snapshot records it, and as Elections.Get shows it.
type Election struct {
	Name       string      `json:"name"`
	Leader     *Candidate  `json:"leader,omitempty"`
	Candidates []Candidate `json:"candidates,omitempty"` // waiting, in campaign order
}

// Elections is the table of elections with a leader or a candidate.
type Elections struct {
	byName  map[string]*Election
	byLease map[LeaseID]map[string]struct{}
}

func newElections() *Elections {
	return &Elections{byName: make(map[string]*Election), byLease: make(map[LeaseID]map[string]struct{})}
}

// Get returns a copy of election name, or nil when nobody leads or campaigns.
func (t *Elections) Get(name string) *Election {
	e := t.byName[name]
	if e == nil {
		return nil
	}
	c := &Election{Name: e.Name, Candidates: slices.Clone(e.Candidates)}
	if e.Leader != nil {
		l := *e.Leader
		c.Leader = &l
	}
	return c
}

// Len returns the number of elections with a leader or a candidate.
func (t *Elections) Len() int { return len(t.byName) }

func (t *Elections) index(lease LeaseID, name string) {
	m := t.byLease[lease]
	if m == nil {
		m = make(map[string]struct{})
		t.byLease[lease] = m
	}
	m[name] = struct{}{}
}

func (t *Elections) unindex(lease LeaseID, name string) {
	if m := t.byLease[lease]; m != nil {
		delete(m, name)
		if len(m) == 0 {
			delete(t.byLease, lease)
		}
	}
}

func (e *Election) waiting(lease LeaseID) int {
	return slices.IndexFunc(e.Candidates, func(c Candidate) bool { return c.Lease == lease })
}

func (s *State) applyElection(c *Command) Result {
	t := s.elections
	if !s.live(c.Lease) {
		return Result{Err: s.leaseGone(c.Lease)}
	}
	e := t.byName[c.Name]
	switch c.Op {
	case OpCampaign:
		if e == nil {
			e = &Election{Name: c.Name}
			t.byName[c.Name] = e
		}
		switch {
		case e.Leader != nil && e.Leader.Lease == c.Lease:
			return Result{Token: e.Leader.Epoch, Again: true}
		case e.waiting(c.Lease) >= 0:
			return Result{Queued: true, Again: true, HolderToken: e.Leader.Epoch, Holder: e.Leader.Holder}
		case e.Leader == nil:
			epoch := s.Next()
			e.Leader = &Candidate{Lease: c.Lease, Epoch: epoch, Value: c.Value, Holder: c.Holder}
			t.index(c.Lease, c.Name)
			s.note(ElectionChange{Name: c.Name, Kind: ChangeElected, Epoch: epoch, Value: c.Value, Holder: c.Holder})
			return Result{Token: epoch, Effects: []Effect{{Kind: EffectElected, Lease: c.Lease, Name: c.Name, Token: epoch, Value: c.Value, Holder: c.Holder}}}
		case !c.Wait:
			return Result{Err: fmt.Errorf("%w: election %q is led", ErrLockHeld, c.Name), HolderToken: e.Leader.Epoch, Holder: e.Leader.Holder}
		case len(e.Candidates) >= s.limits.MaxWaitersPerLock:
			return Result{Err: fmt.Errorf("%w: election %q has %d candidates", ErrTooManyWaiters, c.Name, len(e.Candidates))}
		}
		e.Candidates = append(e.Candidates, Candidate{Lease: c.Lease, Value: c.Value, Holder: c.Holder})
		t.index(c.Lease, c.Name)
		return Result{Queued: true, HolderToken: e.Leader.Epoch, Holder: e.Leader.Holder}
	case OpProclaim:
		if e == nil || e.Leader == nil || e.Leader.Lease != c.Lease || e.Leader.Epoch != c.Token {
			return Result{Err: fmt.Errorf("%w: does not lead election %q under epoch %d", ErrNotHolder, c.Name, c.Token)}
		}
		if bytes.Equal(e.Leader.Value, c.Value) {
			return Result{Token: c.Token} // no news
		}
		e.Leader.Value = c.Value
		s.note(ElectionChange{Name: c.Name, Kind: ChangeProclaimed, Epoch: c.Token, Value: c.Value, Holder: e.Leader.Holder})
		return Result{Token: c.Token, Effects: []Effect{{Kind: EffectProclaimed, Lease: c.Lease, Name: c.Name, Token: c.Token, Value: c.Value, Holder: e.Leader.Holder}}}
	case OpResign:
		if e == nil || e.Leader == nil || e.Leader.Lease != c.Lease || e.Leader.Epoch != c.Token {
			return Result{Err: fmt.Errorf("%w: does not lead election %q under epoch %d", ErrNotHolder, c.Name, c.Token)}
		}
		var r Result
		s.unseat(e, EventReleased, &r)
		return r
	case OpWithdraw:
		switch {
		case e != nil && e.Leader != nil && e.Leader.Lease == c.Lease:
			return Result{Token: e.Leader.Epoch}
		case e == nil || e.waiting(c.Lease) < 0:
			return Result{Err: fmt.Errorf("%w: not a candidate for election %q", ErrNotWaiting, c.Name)}
		}
		e.Candidates = slices.Delete(e.Candidates, e.waiting(c.Lease), e.waiting(c.Lease)+1)
		t.unindex(c.Lease, c.Name)
		return Result{}
	}
	return Result{Err: fmt.Errorf("%w: unknown op %d", ErrInvalid, c.Op)}
}

// unseat ends e's leadership (how: the EventKind the history records) and seats the
// next candidate, if any, with a new epoch.
func (s *State) unseat(e *Election, how EventKind, r *Result) {
	t := s.elections
	t.unindex(e.Leader.Lease, e.Name)
	ended := e.Leader.Epoch
	e.Leader = nil
	if len(e.Candidates) == 0 {
		delete(t.byName, e.Name)
		s.note(ElectionChange{Name: e.Name, Kind: ChangeLeaderless, Epoch: ended, Ended: how})
		r.Effects = append(r.Effects, Effect{Kind: EffectLeaderless, Name: e.Name, Token: ended})
		return
	}
	next := e.Candidates[0]
	e.Candidates = slices.Delete(e.Candidates, 0, 1)
	next.Epoch = s.Next()
	e.Leader = &next
	s.note(ElectionChange{Name: e.Name, Kind: ChangeElected, Epoch: next.Epoch, Value: next.Value, Holder: next.Holder, Ended: how})
	r.Effects = append(r.Effects, Effect{Kind: EffectElected, Lease: next.Lease, Name: e.Name, Token: next.Epoch, Value: next.Value, Holder: next.Holder})
}

// leadershipEnd is how a leadership ends when its lease ends for a reason.
var leadershipEnd = map[EndReason]EventKind{EndExpired: EventExpired, EndRevoked: EventRevoked, EndDisconnected: EventDisconnected}

// dropLeaseElections takes an ended lease out of every election, in name order: the
// next candidate leads where it led (the history records how, the end of the lease).
func (s *State) dropLeaseElections(lease LeaseID, how EventKind, r *Result) {
	t := s.elections
	names := make([]string, 0, len(t.byLease[lease]))
	for n := range t.byLease[lease] {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		e := t.byName[n]
		if e.Leader != nil && e.Leader.Lease == lease {
			s.unseat(e, how, r)
			continue
		}
		if i := e.waiting(lease); i >= 0 {
			e.Candidates = slices.Delete(e.Candidates, i, i+1)
			t.unindex(lease, n)
		}
	}
}

// records returns the elections in name order, for a snapshot.
func (t *Elections) records() []Election {
	out := make([]Election, 0, len(t.byName))
	for _, e := range t.byName {
		out = append(out, *t.Get(e.Name))
	}
	slices.SortFunc(out, func(a, b Election) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// restoreElection adds e from a snapshot, checking it against the state restored so far.
func (s *State) restoreElection(e Election) error {
	t := s.elections
	bad := ValidateName("name", e.Name) != nil || t.byName[e.Name] != nil || e.Leader == nil ||
		e.Leader.Epoch == 0 || e.Leader.Epoch > s.seq || !s.live(e.Leader.Lease)
	seen := map[LeaseID]bool{}
	if !bad {
		seen[e.Leader.Lease] = true
	}
	for _, c := range e.Candidates {
		bad = bad || c.Epoch != 0 || !s.live(c.Lease) || seen[c.Lease]
		seen[c.Lease] = true
	}
	if bad {
		return fmt.Errorf("%w: bad election in snapshot", ErrCorrupt)
	}
	cp := e
	t.byName[e.Name] = &cp
	for id := range seen {
		t.index(id, e.Name)
	}
	return nil
}
