package fence

import (
	"log/slog"
	"net/http"

	"connectrpc.com/connect"
)

// Option configures Middleware and ServerInterceptor. Options that concern only one of
// them say so and are ignored by the other.
type Option func(*options)

type options struct {
	httpResource    func(r *http.Request, lock string) (string, error)
	connectResource func(spec connect.Spec, header http.Header, lock string) (string, error)
	logger          *slog.Logger
	idem            idemOptions // Idempotency's (idempotency.go)
}

func newOptions(opts []Option) *options {
	o := &options{logger: slog.Default(), idem: defaultIdemOptions()}
	for _, opt := range opts {
		if opt != nil {
			opt(o)
		}
	}
	return o
}

// WithResource makes Middleware fence the resource f returns instead of the lock name.
// f gets the request and the lock name from its header, and runs only for requests whose
// header parsed. If f returns an error, the request is answered 400 with the error's text
// and the handler is not called. Middleware must run where f can see what it needs (for
// example on a handler registered with http.ServeMux, for r.PathValue). ServerInterceptor
// ignores this option.
func WithResource(f func(r *http.Request, lock string) (string, error)) Option {
	return func(o *options) { o.httpResource = f }
}

// WithConnectResource makes ServerInterceptor fence the resource f returns instead of the
// lock name. f gets the procedure's Spec, the request headers and the lock name; it runs
// before the request message is read, so it cannot look at the message. If f returns an
// error the call fails with CodeInvalidArgument and the handler is not called. Middleware
// ignores this option.
func WithConnectResource(f func(spec connect.Spec, header http.Header, lock string) (string, error)) Option {
	return func(o *options) { o.connectResource = f }
}

// WithLogger sets where Middleware and ServerInterceptor log a Guard's internal failures
// (never stale or malformed tokens, which are the client's business). The default is
// slog.Default(); nil keeps the default.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) {
		if l != nil {
			o.logger = l
		}
	}
}
