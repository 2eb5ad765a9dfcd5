package fence

import (
	"context"
	"errors"
	"fmt"
)

// Errors returned by the guards, the HTTP middleware, the Connect interceptors and the
// header parser. They are wrapped with context (%w); match them with errors.Is.
var (
	// ErrStale is returned when a write carries a token lower than the highest token the
	// resource has already accepted. The concrete error is a *StaleError naming both
	// tokens; errors.As gets it.
	ErrStale = errors.New("fence: stale fencing token")
	// ErrMalformedToken is returned when a fencing token cannot be used: the header value
	// does not parse (see ParseHeader), the token is 0, or the token is larger than the
	// guard can store (the SQL guard's limit is math.MaxInt64). The message says which.
	ErrMalformedToken = errors.New("fence: malformed fencing token")
	// ErrNoToken is returned when a request that must be fenced carries no fencing token,
	// or when a client transport or interceptor has no token to attach.
	ErrNoToken = errors.New("fence: no fencing token")
)

// Guard admits a write to resource only if token is not lower than the highest token it
// has accepted for resource.
//
// What a Guard promises: once Admit has returned nil for token T on a resource, it
// returns an error wrapping ErrStale (a *StaleError) for every token lower than T on that
// resource. An equal token is admitted again, because one holder writes many times under
// one grant. A higher token is admitted and becomes the new highest. Resources are
// independent of each other.
//
// What a Guard does not promise: it does not know whether the lease behind a token is
// still alive. The highest token it has seen may belong to a holder whose lease has
// already expired, and it will keep admitting that holder's writes until a newer holder
// writes once. A resource that must refuse writes from an expired holder even before its
// successor shows up lets the guard follow the service (Follow, for Memory and SQL: the
// ended token is rejected once its Watch event is delivered), or asks the lock service
// (CheckToken) before it commits. A Guard orders writes by token; it does not make them
// exclusive.
//
// Admit returns an error wrapping ErrMalformedToken for token 0 (never issued) and for
// tokens the guard cannot store, the context's error unchanged when ctx is done first,
// and any other error when the guard's storage fails; in every error case the write must
// not be performed.
type Guard interface {
	Admit(ctx context.Context, resource string, token uint64) error
}

// StaleError is the error a Guard returns for a token lower than the highest it has
// accepted. It matches ErrStale with errors.Is.
type StaleError struct {
	// Resource is the key whose highest token was higher than Token. On the client side
	// (ProblemFromResponse, ClientInterceptor) it is the resource the server reported.
	Resource string
	// Token is the rejected token.
	Token uint64
	// Highest is the highest token the resource had accepted when it rejected Token, or,
	// when a floor rejected it (Follow), the ended holder's token plus one. It is always
	// greater than Token.
	Highest uint64
}

// Error names the resource and both tokens, for example
// `fence: token 33 for "orders/42" is stale: highest accepted is 34`.
func (e *StaleError) Error() string {
	return fmt.Sprintf("fence: token %d for %q is stale: highest accepted is %d", e.Token, e.Resource, e.Highest)
}

// Is reports whether target is ErrStale, so that errors.Is(err, ErrStale) holds for every
// *StaleError.
func (e *StaleError) Is(target error) bool { return target == ErrStale }

// checkToken rejects token 0, which the lock service never issues.
func checkToken(token uint64) error {
	if token == 0 {
		return fmt.Errorf("%w: token 0 is never issued", ErrMalformedToken)
	}
	return nil
}

type contextKey struct{}

type fenceValue struct {
	lock  string
	token uint64
}

// newContext returns a copy of ctx carrying the admitted lock and token.
func newContext(ctx context.Context, lock string, token uint64) context.Context {
	return context.WithValue(ctx, contextKey{}, fenceValue{lock: lock, token: token})
}

// FromContext returns the lock name and token that the HTTP middleware or the Connect
// server interceptor admitted for the request whose context is ctx. ok is false when ctx
// did not come through either of them. A handler that writes in several steps can pass
// the token to a Guard again (for example the SQL guard inside its transaction).
func FromContext(ctx context.Context) (lock string, token uint64, ok bool) {
	v, ok := ctx.Value(contextKey{}).(fenceValue)
	return v.lock, v.token, ok
}
