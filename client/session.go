package client

import "context"

// Session is a lock holder of its own that shares a Client's connections: the locks it
// takes hang on its own leases, never on the Client's or another Session's. Two Sessions
// contend for a lock as two separate clients would (one waits in the server's queue
// while the other holds it), and each gets its own fencing token; two Lock calls for one
// name through the same Session get the same grant, as through one Client — one token,
// and an Unlock of either ends both. It is to a Client what etcd's concurrency.Session
// is to a clientv3.Client.
//
// Use a Session per independent worker of one process (a pool of goroutines each of
// which must be fenced on its own) instead of a Client per worker: Sessions multiplex
// their requests over the Client's one fast-lane connection, which the server reads and
// answers in batches, where Clients would each open their own.
//
// A Session costs nothing until its first Lock grants its lease; from then on its
// leases are kept alive (one keepalive every TTL/3 each), even with no lock held, until
// Session.Close or Client.Close: close a Session you no longer need. Locks taken
// through a Session behave exactly like a Client's (Token, Context, Unlock). A Session
// is safe for concurrent use.
type Session struct {
	c   *Client
	set leaseSet
}

// NewSession returns a new Session on c. It grants no lease until its first Lock. A
// Session of a closed Client fails every Lock with ErrClosed.
func (c *Client) NewSession() *Session {
	s := &Session{c: c}
	c.mu.Lock()
	if c.closed {
		s.set.closed = true
	} else {
		c.sessions[s] = struct{}{}
	}
	c.mu.Unlock()
	return s
}

// Lock acquires the lock name on the Session's own lease. Options, waiting, retries and
// errors are those of Client.Lock.
func (s *Session) Lock(ctx context.Context, name string, opts ...LockOption) (*Lock, error) {
	return s.c.lock(ctx, &s.set, []string{name}, opts)
}

// LockSet acquires the lock set names on the Session's own lease, as Client.LockSet.
func (s *Session) LockSet(ctx context.Context, names []string, opts ...LockOption) (*Lock, error) {
	return s.c.lock(ctx, &s.set, names, opts)
}

// Close revokes the Session's leases, which releases every lock taken through it, and
// stops their keepalives; later Locks fail with ErrClosed. It waits at most until ctx
// ends; a lease it could not revoke expires on its own after its TTL. The Client and
// its other Sessions carry on. Closing the Client closes all its Sessions.
func (s *Session) Close(ctx context.Context) error {
	s.c.mu.Lock()
	delete(s.c.sessions, s)
	s.c.mu.Unlock()
	return s.c.revokeAll(ctx, &s.set)
}
