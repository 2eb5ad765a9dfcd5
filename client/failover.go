package client

import (
	"net/http"
	"strings"
	"sync/atomic"

	"connectrpc.com/connect"
)

// failover sends every request to the current node of a list, and moves to the next
// node after a transport failure (connection refused, reset, timeout). It never resends
// a request itself: the callers' retry loops do that for the calls that are safe to
// repeat (Acquire is idempotent per lease; KeepAlive and Release are harmless to repeat).
type failover struct {
	base  connect.HTTPClient
	addrs []string
	cur   atomic.Int32
}

// placeholderHost is the host in the Connect clients' base URL; failover replaces it.
const placeholderHost = "leasehold.invalid"

func newFailover(base connect.HTTPClient, addrs []string) *failover {
	return &failover{base: base, addrs: addrs}
}

func (f *failover) Do(req *http.Request) (*http.Response, error) {
	i := f.cur.Load()
	r := req.Clone(req.Context())
	r.URL.Host = f.addrs[int(i)%len(f.addrs)]
	r.Host = r.URL.Host
	resp, err := f.base.Do(r)
	if err != nil {
		f.cur.CompareAndSwap(i, (i+1)%int32(len(f.addrs)))
	}
	return resp, err
}

// current returns the node requests go to now.
func (f *failover) current() string { return f.addrs[int(f.cur.Load())%len(f.addrs)] }

// next moves to the next node (after an Unavailable answer, say).
func (f *failover) next() {
	i := f.cur.Load()
	f.cur.CompareAndSwap(i, (i+1)%int32(len(f.addrs)))
}

// splitAddrs parses "host:port,host:port" (or http:// URLs) into host:port entries.
func splitAddrs(s string) []string {
	var out []string
	for _, a := range strings.Split(s, ",") {
		a = strings.TrimSpace(a)
		a = strings.TrimPrefix(strings.TrimPrefix(a, "http://"), "https://")
		a = strings.TrimSuffix(a, "/")
		if a != "" {
			out = append(out, a)
		}
	}
	return out
}
