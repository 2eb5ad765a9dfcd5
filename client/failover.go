package client

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
)

// failover is the list of nodes a Client knows and the one it talks to now. Every
// request goes to the current node (or to the node its context is pinned to, see
// withNode); the client stays on a node while it serves, and moves when a call's retry
// judges the node failed (see Client.judge): to the leader a not-leader answer names,
// or else to the next node not under suspicion. A node is suspect for a while after it
// stayed silent or refused a connection, so that the client does not come back to a
// node cut off the network while another answers. failover never resends a request
// itself: the retries (call, and the keepalive loop) do that for the calls that are safe
// to repeat.
type failover struct {
	base connect.HTTPClient
	now  atomic.Pointer[string] // the current node, read without the mutex by every call
	// suspects is len(suspect), so that a call on a healthy cluster never takes mu.
	suspects atomic.Int32
	// heard holds, per node, when it last answered anything (*atomic.Int64, monotonic
	// nanoseconds since clockBase): a node that answers other calls is slow, not silent.
	heard sync.Map

	mu      sync.Mutex
	addrs   []string             // the listed addresses, then leader hints not listed
	cur     int                  // index in addrs of the current node
	suspect map[string]time.Time // node → until when it is passed over
}

// placeholderHost is the host in the Connect clients' base URL; failover replaces it.
const placeholderHost = "leasehold.invalid"

// suspectFor is how long a node that stayed silent, refused a connection or was named
// unreachable by another node is passed over when choosing where to go next. It only
// orders the choice: when every node is suspect, the next one is tried all the same.
const suspectFor = 5 * time.Second

// maxNodes bounds the list: leader hints add addresses not listed, up to this many.
const maxNodes = 16

func newFailover(base connect.HTTPClient, addrs []string) *failover {
	f := &failover{base: base, addrs: addrs, suspect: make(map[string]time.Time)}
	f.now.Store(&addrs[0])
	return f
}

// Do sends req to its attempt's node, or to the current one.
func (f *failover) Do(req *http.Request) (*http.Response, error) {
	node := f.nodeFor(req.Context())
	r := req.Clone(req.Context())
	r.URL.Host = node
	r.Host = node
	return f.base.Do(r)
}

// current returns the node requests go to now.
func (f *failover) current() string { return *f.now.Load() }

// moveLocked makes addrs[i] the current node.
func (f *failover) moveLocked(i int) {
	f.cur = i
	node := f.addrs[i]
	f.now.Store(&node)
}

// suspectLocked marks node suspect for suspectFor.
func (f *failover) suspectLocked(node string) {
	f.suspect[node] = time.Now().Add(suspectFor)
	f.suspects.Store(int32(len(f.suspect)))
}

// nodeFor returns the node ctx is pinned to, or the current node.
func (f *failover) nodeFor(ctx context.Context) string {
	if n, ok := ctx.Value(nodeKey{}).(string); ok {
		return n
	}
	return f.current()
}

type nodeKey struct{}

// withNode pins the Connect requests made with ctx to node, wherever the client moves
// meanwhile: for what must ask one node in particular (its Status, for its fast lane).
func withNode(ctx context.Context, node string) context.Context {
	return context.WithValue(ctx, nodeKey{}, node)
}

// answered records that node answered a call (with an error of the service's or not).
func (f *failover) answered(node string) {
	now := int64(time.Since(clockBase))
	if v, ok := f.heard.Load(node); ok {
		v.(*atomic.Int64).Store(now)
	} else {
		t := new(atomic.Int64)
		t.Store(now)
		f.heard.Store(node, t)
	}
}

// heardSince reports whether node answered anything after t.
func (f *failover) heardSince(node string, t time.Time) bool {
	v, ok := f.heard.Load(node)
	return ok && v.(*atomic.Int64).Load() > int64(t.Sub(clockBase))
}

// served records that node served a call: it is no longer suspect.
func (f *failover) served(node string) {
	f.answered(node)
	if f.suspects.Load() == 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.suspect, node)
	now := time.Now()
	for n, until := range f.suspect {
		if now.After(until) {
			delete(f.suspect, n)
		}
	}
	f.suspects.Store(int32(len(f.suspect)))
}

// distrust marks node suspect (it stayed silent, refused, or another node could not
// reach it) and moves the client off it if it is the current node.
func (f *failover) distrust(node string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.suspectLocked(node)
	f.leaveLocked(node)
}

// distrustOnly marks node suspect without moving off it.
func (f *failover) distrustOnly(node string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.suspectLocked(node)
}

// leave moves the client off node, if it is the current node, to the next node not
// under suspicion.
func (f *failover) leave(node string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.leaveLocked(node)
}

func (f *failover) leaveLocked(node string) {
	if f.addrs[f.cur] != node {
		return // someone moved already
	}
	now := time.Now()
	for step := 1; step < len(f.addrs); step++ {
		i := (f.cur + step) % len(f.addrs)
		if until, ok := f.suspect[f.addrs[i]]; !ok || now.After(until) {
			f.moveLocked(i)
			return
		}
	}
	f.moveLocked((f.cur + 1) % len(f.addrs)) // all suspect: plain rotation
}

// follow moves the client from node to leader, the node that node named as the leader,
// unless leader is under suspicion (then it leaves node as leave does). A leader not in
// the list joins it.
func (f *failover) follow(node, leader string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if until, ok := f.suspect[leader]; leader == "" || leader == node || ok && time.Now().Before(until) {
		f.leaveLocked(node)
		return
	}
	if f.addrs[f.cur] != node {
		return
	}
	i := slices.Index(f.addrs, leader)
	if i < 0 {
		if len(f.addrs) >= maxNodes {
			f.leaveLocked(node)
			return
		}
		f.addrs = append(f.addrs, leader)
		i = len(f.addrs) - 1
	}
	f.moveLocked(i)
}

// splitAddrs parses "host:port,host:port" (or http:// URLs) into host:port entries.
func splitAddrs(s string) []string {
	var out []string
	for _, a := range strings.Split(s, ",") {
		a = strings.TrimSpace(a)
		a = strings.TrimPrefix(strings.TrimPrefix(a, "http://"), "https://")
		a = strings.TrimSuffix(a, "/")
		if a != "" && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}
