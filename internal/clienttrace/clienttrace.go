// Package clienttrace lets code inside this module watch the Go client's failed
// attempts: the failover benchmark (test/nemesis) takes from it the moment the client
// noticed that the leader was gone. It is not API: nothing outside the module can
// import it, and with no watcher set each failed attempt costs one atomic load.
package clienttrace

import (
	"context"
	"sync/atomic"
)

// Failure is called with the context of the call (its values are the caller's), the
// node the attempt went to and the attempt's error.
type Failure func(ctx context.Context, node string, err error)

var watcher atomic.Pointer[Failure]

// Watch makes f see every failed attempt of every client in this process, until the
// returned function is called. f must be quick and must not block; it runs on the
// caller's goroutine.
func Watch(f Failure) (stop func()) {
	watcher.Store(&f)
	return func() { watcher.CompareAndSwap(&f, nil) }
}

// AttemptFailed reports a failed attempt on node to the watcher, if there is one.
func AttemptFailed(ctx context.Context, node string, err error) {
	if f := watcher.Load(); f != nil {
		(*f)(ctx, node, err)
	}
}
