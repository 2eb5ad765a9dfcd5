package server

import (
	"context"
	"time"
	"unicode/utf8"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/core"
	"github.com/leasehold/leasehold/leader"
	"github.com/leasehold/leasehold/watch"
)

// watchBatch is how many events of the history one read looks at, and so the most
// events one WatchResponse carries.
const watchBatch = 256

// watchCoalesce is how long a stream that was woken by a new event waits for more
// before it reads: under load one answer then carries many events, instead of every
// event waking every watcher and costing each a write (BenchmarkWatchCost: one
// watcher's cost to efficiency pairs at 64 workers fell from 58% to 42% of pairs/s with
// it). It is the latency Watch adds.
const watchCoalesce = 2 * time.Millisecond

// Watch serves LockService.Watch (G10): the events under the request's prefix from
// this node's history (package watch), in revision order, from its start revision or
// the next event. The first answer comes at once (with what there is to replay, or
// only where the stream stands); each later one carries the events read at once and
// the revision to resume from. It ends when the caller goes, when the start is no
// longer held (watch.ErrCompacted, or when the watcher has fallen that far behind), or,
// Unavailable (leader.ErrNotLeader), when this node stops leading: the client resumes
// at the new leader.
func (s *Server) Watch(ctx context.Context, req *leaseholdv1.WatchRequest, send func(*leaseholdv1.WatchResponse) error) error {
	prefix := req.GetPrefix()
	if len(prefix) > core.MaxNameLen || !utf8.ValidString(prefix) {
		return core.Invalid("prefix", "must be valid UTF-8 of at most %d bytes", core.MaxNameLen)
	}
	var cur watch.Cursor
	if st := req.GetStart(); st != nil {
		cur = watch.At(watch.Revision{Index: st.GetIndex(), Offset: st.GetOffset()})
	}
	stop, leading := s.leader.Serving()
	if !leading {
		return leader.ErrNotLeader
	}
	hub := s.leader.Events()
	if hub == nil {
		hub = watch.NewHub(1) // a leader without a history (tests): nothing to show
	}
	buf := make([]watch.Event, 0, watchBatch)
	started := false
	var coalesce *time.Timer
	for {
		evs, wait, err := hub.Read(&cur, prefix, buf)
		if err != nil {
			return err
		}
		if len(evs) > 0 || !started && cur.Started() {
			started = true
			resp := &leaseholdv1.WatchResponse{Next: revisionToProto(cur.Rev()), Events: make([]*leaseholdv1.WatchEvent, len(evs))}
			for i := range evs {
				resp.Events[i] = eventToProto(&evs[i])
			}
			if err := send(resp); err != nil {
				return err
			}
		}
		if wait == nil {
			continue
		}
		select {
		case <-wait:
		case <-stop:
			return leader.ErrNotLeader
		case <-ctx.Done():
			return ctx.Err()
		}
		if coalesce == nil {
			coalesce = time.NewTimer(watchCoalesce)
			defer coalesce.Stop()
		} else {
			coalesce.Reset(watchCoalesce)
		}
		select {
		case <-coalesce.C:
		case <-stop:
			return leader.ErrNotLeader
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func revisionToProto(r watch.Revision) *leaseholdv1.Revision {
	return &leaseholdv1.Revision{Index: r.Index, Offset: r.Offset}
}

func eventToProto(e *watch.Event) *leaseholdv1.WatchEvent {
	if e.Kind == core.EventEpoch {
		return &leaseholdv1.WatchEvent{Revision: revisionToProto(e.Rev), Kind: leaseholdv1.EventKind_EVENT_KIND_EPOCH,
			Class: leaseholdv1.LockClass(e.Class), Epoch: e.Epoch}
	}
	return &leaseholdv1.WatchEvent{
		Revision: revisionToProto(e.Rev),
		Kind:     leaseholdv1.EventKind(e.Kind),
		Name:     e.Name,
		Class:    leaseholdv1.LockClass(e.Class),
		Token:    e.Token,
		Holder:   holderToProto(e.Holder),
		Mode:     modeToProto(e.Mode),
		Limit:    e.Limit,
		Position: uint32(e.Position),
		Reason:   e.Note,
		Epoch:    e.Epoch,
	}
}

// History serves LockService.History: lock name's correctness tenures, read on the
// leader from its applied state (core.State.History), then, when the name has been in
// use as efficiency under this leader, the marker of what earlier leaders lost (unless
// nothing can have been lost) and this leader's efficiency tenures
// (leader.EfficiencyHistory). It fails with leader.ErrNotLeader when this node stopped
// leading after the request was routed here: only the leader knows its efficiency
// ledger.
func (s *Server) History(_ context.Context, req *leaseholdv1.HistoryRequest) (*leaseholdv1.HistoryResponse, error) {
	name := req.GetName()
	if err := core.ValidateName("name", name); err != nil {
		return nil, err
	}
	eff, err := s.leader.EfficiencyHistory(name)
	if err != nil {
		return nil, err
	}
	var tenures []core.Tenure
	s.raft.Read(func(st *core.State) { tenures = st.History(name) })
	resp := &leaseholdv1.HistoryResponse{Tenures: make([]*leaseholdv1.Tenure, 0, len(tenures)+len(eff.Tenures)+1)}
	for i := range tenures {
		resp.Tenures = append(resp.Tenures, tenureToProto(&tenures[i], leaseholdv1.LockClass_LOCK_CLASS_CORRECTNESS, ""))
	}
	if !eff.Served {
		return resp, nil
	}
	if eff.Lost {
		resp.Tenures = append(resp.Tenures, &leaseholdv1.Tenure{End: leaseholdv1.TenureEnd_TENURE_END_LEADER_LOST,
			EndUnixMs: eff.Since.UnixMilli(), Class: leaseholdv1.LockClass_LOCK_CLASS_EFFICIENCY, Epoch: eff.Epoch})
	}
	for i := range eff.Tenures {
		resp.Tenures = append(resp.Tenures, tenureToProto(&eff.Tenures[i], leaseholdv1.LockClass_LOCK_CLASS_EFFICIENCY, eff.Epoch))
	}
	return resp, nil
}

func tenureToProto(t *core.Tenure, class leaseholdv1.LockClass, epoch string) *leaseholdv1.Tenure {
	return &leaseholdv1.Tenure{
		Token: t.Token, Holder: holderToProto(t.Holder), Mode: modeToProto(t.Mode),
		StartUnixMs: t.StartMillis, EndUnixMs: t.EndMillis, End: tenureEnd(t.End), Reason: t.Note,
		Class: class, Epoch: epoch,
	}
}

func tenureEnd(k core.EventKind) leaseholdv1.TenureEnd {
	switch k {
	case core.EventReleased:
		return leaseholdv1.TenureEnd_TENURE_END_RELEASED
	case core.EventExpired:
		return leaseholdv1.TenureEnd_TENURE_END_EXPIRED
	case core.EventRevoked:
		return leaseholdv1.TenureEnd_TENURE_END_REVOKED
	case core.EventForceReleased:
		return leaseholdv1.TenureEnd_TENURE_END_FORCE_RELEASED
	case core.EventDisconnected:
		return leaseholdv1.TenureEnd_TENURE_END_DISCONNECTED
	}
	return leaseholdv1.TenureEnd_TENURE_END_UNSPECIFIED
}
