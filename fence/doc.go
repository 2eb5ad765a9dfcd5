// Package fence is the resource side of leasehold's fencing: it lets the thing a lock
// protects — a database table, an HTTP or gRPC service — refuse writes from a client that
// no longer holds the lock.
//
// # Why fencing
//
// A lock service can only promise that it believes one client holds a lease. It cannot
// stop a client that has been paused — a long GC pause, swapping, a VM migration, a
// laptop lid — for longer than its lease. While it was paused its lease expired and the
// lock went to someone else; when it wakes up it carries on with its critical section
// without knowing that time passed, and now two clients write. No protocol inside the lock
// service fixes this, because the pause is in the client. Only the resource, at the moment
// of the write, can tell the old holder from the new one.
//
// So every grant carries a fencing token, a number that only grows: the next holder
// always gets a larger token than the one before it (guarantee G1). The client sends its
// token with every write, and the resource remembers the highest token it has accepted
// and rejects any write that carries a lower one. The paused client's first write after
// the new holder's first write is refused with a clear error (ErrStale) instead of
// silently overwriting newer data (guarantee G5).
//
// # What each piece promises
//
//   - A Guard admits a token for a resource only if it is not lower than the highest it
//     has admitted for that resource; an equal token is admitted, since one holder writes
//     many times. It orders writes by token. It does not know whether the token's lease is
//     still alive: until the next holder writes once, the old holder's token is the
//     highest and is admitted. A resource that must refuse an expired holder even then
//     runs Follow, or asks the lock service (CheckToken) before it commits.
//   - Follow makes Memory or SQL (through SQL.Floors) follow the service's Watch: when a
//     correctness lock's exclusive hold ends, it raises the lock's floor so that the
//     ended holder's token is rejected at once, before anyone else writes. What remains
//     is the delivery of the event (milliseconds; see Follow).
//   - Memory keeps the highest tokens in process memory: fine for a resource that lives
//     and dies with the process, forgotten on restart.
//   - SQL keeps them in a table of the caller's database and checks inside the caller's
//     own transaction, so the check and the write commit or roll back together and, per
//     resource, committed writes are ordered by token. This is the strongest form here.
//   - Middleware (HTTP) and ServerInterceptor (Connect/gRPC) check the Fencing-Token
//     header before the handler runs and answer stale, malformed and missing tokens with
//     clear errors. They check before the write, not with it: two overlapping requests
//     can still land out of order. Handlers that need strict ordering use SQL inside their
//     transaction with the token from FromContext.
//   - Transport (HTTP) and ClientInterceptor (Connect/gRPC) attach the token on the client
//     side and never send a fenced request without one; ProblemFromResponse and
//     ClientInterceptor turn the server's stale answer back into a *StaleError.
//
// # What cannot be fenced
//
// Fencing works only where the resource checks the token. A third-party API that accepts
// any request — a payment provider, an email sender, an object store without conditional
// writes — cannot be fenced, and a paused client may still call it after its lease
// expired. For those, make the operation safe to repeat with an idempotency key derived
// from the work (not from the holder), and take the lock with a lock-delay, so that after
// an expiry nobody else gets the lock until the old holder has had time to notice its lost
// lease and stop. Both narrow the window; neither closes it.
//
// # Idempotency
//
// A fence orders writers; it does not stop a task from running twice across an
// ownership hand-off (the newer owner runs it again, legitimately). SQLKeys records an
// idempotency key with the owner's token in the transaction that does the work, so the
// effect and the record commit together and a second Claim finds the key done.
// Idempotency is HTTP middleware for the Idempotency-Key header (the IETF httpapi
// draft) over an IdempotencyStore, which *client.Client implements with leasehold's
// IdempotencyService: a retry gets the stored response, a request while the first runs
// 409, a different request with the same key 422.
//
// # Wire format
//
// A token travels as "<lock>=<token>" (for example "orders/42=34") in the HTTP header
// Fencing-Token or the gRPC/Connect metadata key fencing-token; see ParseHeader.
package fence
