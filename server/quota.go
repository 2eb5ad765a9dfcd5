package server

import (
	"sync"

	"google.golang.org/protobuf/proto"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/core"
	"github.com/leasehold/leasehold/internal/auth"
)

// Quotas per identity (auth.Quota): with auth on, each identity may hold so many
// leases, its leases so many locks, and it may have so many acquires in flight (each
// of which may wait in a queue) on the node it calls. A call past one answers
// ResourceExhausted (auth.QuotaError) having done nothing. Like authorization, quotas
// are charged in the dispatch of both transports (charge), before the handler or a
// fast-lane shortcut runs, and settled when the answer is sent.
//
// What is counted is what this node granted since it started: the leases an identity
// was granted through it (checked against the replicated state when the count reaches
// the quota, so ended leases free their place), and the locks those leases hold. A new
// leader has counted nothing yet, so across a leader change an identity may hold its
// quota again beside the leases it already had, until those end. Peers (other nodes,
// by their peer certificates) have no quota: what they forward is charged to its caller.

// quotas is one node's count per identity.
type quotas struct {
	mu   sync.Mutex
	used map[*auth.Identity]*usage
}

// usage is what one identity holds, as far as this node counted.
type usage struct {
	leases   map[core.LeaseID]struct{}
	granting int // Grants in flight, counted against the lease quota
	locks    int // locks held: exact after a recount, then up by each Acquire's names
	acquires int // Acquires in flight
	asking   int // the names those Acquires ask for (a lock set's every one)
}

// charge checks that c may start req under its quotas and counts it; settle must be
// called with the answer once it is known (a nil settle needs no call). Identities are
// the auth file's: after a reload they start a new count.
func (s *Server) charge(c *principal, req proto.Message) (settle func(proto.Message, error), err error) {
	if !s.authOn() || c == nil || c.who == nil || c.who.Kind == auth.KindPeer {
		return nil, nil
	}
	switch r := req.(type) {
	case *leaseholdv1.GrantRequest:
		return s.chargeGrant(c.who)
	case *leaseholdv1.AcquireRequest:
		return s.chargeAcquire(c.who, max(1, len(r.GetNames())))
	}
	return nil, nil
}

func (s *Server) usageLocked(who *auth.Identity) *usage {
	if s.quotas.used == nil {
		s.quotas.used = make(map[*auth.Identity]*usage)
	}
	u := s.quotas.used[who]
	if u == nil {
		u = &usage{leases: make(map[core.LeaseID]struct{})}
		s.quotas.used[who] = u
	}
	return u
}

// chargeGrant admits a Grant while the identity's leases (and Grants in flight) are
// below its lease quota, forgetting the leases that ended when the count reaches it.
func (s *Server) chargeGrant(who *auth.Identity) (func(proto.Message, error), error) {
	q := &s.quotas
	q.mu.Lock()
	defer q.mu.Unlock()
	u := s.usageLocked(who)
	if len(u.leases)+u.granting >= who.Quota.Leases {
		s.raft.Read(func(st *core.State) {
			for id := range u.leases {
				if st.Lease(id) == nil {
					delete(u.leases, id)
				}
			}
		})
		if len(u.leases)+u.granting >= who.Quota.Leases {
			return nil, &auth.QuotaError{Who: who.String(), Quota: "leases", Limit: who.Quota.Leases}
		}
	}
	u.granting++
	return func(resp proto.Message, err error) {
		q.mu.Lock()
		defer q.mu.Unlock()
		u.granting--
		if g, ok := resp.(*leaseholdv1.GrantResponse); ok && err == nil {
			if id, perr := core.ParseLeaseID(g.GetLeaseId()); perr == nil {
				u.leases[id] = struct{}{}
			}
		}
	}, nil
}

// chargeAcquire admits an Acquire of names locks (a lock set's every name counts) while
// the identity's acquires in flight are below its waiter quota and its leases' locks,
// with the names asked for in flight, stay within its lock quota (recounted from the
// lock tables when the running count would pass it).
func (s *Server) chargeAcquire(who *auth.Identity, names int) (func(proto.Message, error), error) {
	q := &s.quotas
	q.mu.Lock()
	defer q.mu.Unlock()
	u := s.usageLocked(who)
	if u.acquires >= who.Quota.Waiters {
		return nil, &auth.QuotaError{Who: who.String(), Quota: "waiters", Limit: who.Quota.Waiters}
	}
	if u.locks+u.asking+names > who.Quota.Locks {
		u.locks = 0
		for id := range u.leases {
			u.locks += s.leader.LeaseLocks(id)
		}
		if u.locks+u.asking+names > who.Quota.Locks {
			return nil, &auth.QuotaError{Who: who.String(), Quota: "locks", Limit: who.Quota.Locks}
		}
	}
	u.acquires++
	u.asking += names
	return func(_ proto.Message, err error) {
		q.mu.Lock()
		defer q.mu.Unlock()
		u.acquires--
		u.asking -= names
		if err == nil {
			u.locks += names
		}
	}, nil
}
