package e2e

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/leasehold/leasehold/client"
)

// TestKVLinearizableAcrossKill9 runs a concurrent history of Get, Put, compare-and-set
// and fenced Put against one real server, kills it with kill -9 in the middle, restarts
// it, and checks the whole history with porcupine: every acknowledged write survives, and
// the store behaves as one copy of the data across the crash (G3, G5). Calls that failed
// may or may not have taken effect; the model allows both.
func TestKVLinearizableAcrossKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("kills and restarts a server")
	}
	srv := StartServer(t)
	// The writers' fence tokens are made up here (handed out "a while ago"); the store
	// refuses a token the cluster never issued, so one efficiency grant first reserves a
	// block of tokens (the leader's ReserveBlock, 2^20) above every one they use.
	{
		c := srv.Client(t)
		l, err := c.Lock(context.Background(), "kv/reserve", client.Efficiency, client.TryOnce)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Unlock(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	const (
		workers = 6
		runFor  = 4 * time.Second
	)
	keys := []string{"kv/a", "kv/b", "kv/c", "kv/d", "kv/e", "kv/f"}
	var (
		mu      sync.Mutex
		history []porcupine.Operation
		tokens  atomic.Uint64 // fence tokens handed to writers; some arrive late (stale)
		wg      sync.WaitGroup
	)
	start := time.Now()
	now := func() int64 { return int64(time.Since(start)) }
	record := func(id int, in kvIn, call int64, out kvOut) {
		ret := now()
		if out.unknown {
			ret = math.MaxInt64 // it may take effect at any time after the call
		}
		mu.Lock()
		history = append(history, porcupine.Operation{ClientId: id, Input: in, Call: call, Output: out, Return: ret})
		mu.Unlock()
	}
	stop := make(chan struct{})
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var opts []client.Option
			if w%2 == 1 {
				opts = append(opts, client.WithoutFastLane())
			}
			c := srv.Client(t, opts...)
			r := rand.New(rand.NewPCG(uint64(w), uint64(start.UnixNano())))
			lastVersion := map[string]uint64{}
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				key := keys[r.IntN(len(keys))]
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				call := now()
				switch p := r.IntN(100); {
				case p < 40:
					v, err := c.Get(ctx, key)
					if err != nil {
						// A failed read changed nothing: leave it out of the history.
						cancel()
						time.Sleep(100 * time.Millisecond)
						continue
					}
					lastVersion[key] = v.Version
					record(w, kvIn{key: key, get: true}, call, kvOut{found: v.Found, value: string(v.Data), version: v.Version, fence: v.FenceToken})
				default:
					in := kvIn{key: key, value: fmt.Sprintf("w%d-%d", w, n)}
					var opts []client.WriteOption
					if p >= 70 && p < 85 {
						v := lastVersion[key]
						in.cas, in.ifVersion = true, v
						opts = append(opts, client.IfVersion(v))
					}
					if p >= 85 {
						// A fenced writer whose token was handed out a while ago.
						tok := tokens.Add(1)
						if r.IntN(3) == 0 && tok > 3 {
							tok -= uint64(1 + r.IntN(3))
						}
						in.token = tok
						opts = append(opts, client.FencedBy("kv/lock", tok))
					}
					ver, err := c.Put(ctx, key, []byte(in.value), opts...)
					out := putOutcome(ver, err)
					record(w, in, call, out)
					if out.unknown {
						// The server is probably down: wait instead of piling up writes
						// whose outcome nobody can know.
						time.Sleep(100 * time.Millisecond)
					}
				}
				cancel()
			}
		}()
	}
	time.Sleep(runFor / 2)
	srv.Kill9()
	time.Sleep(200 * time.Millisecond)
	srv.Restart()
	time.Sleep(runFor / 2)
	close(stop)
	wg.Wait()

	// Final reads after everything: what the store holds now is part of the history.
	c := srv.Client(t)
	for _, key := range keys {
		call := now()
		v, err := c.Get(context.Background(), key)
		if err != nil {
			t.Fatalf("final read of %s: %v", key, err)
		}
		record(99, kvIn{key: key, get: true}, call, kvOut{found: v.Found, value: string(v.Data), version: v.Version, fence: v.FenceToken})
	}
	counts := map[string]int{}
	for _, op := range history {
		in, out := op.Input.(kvIn), op.Output.(kvOut)
		switch {
		case out.unknown:
			counts["unknown"]++
		case in.get:
			counts["get"]++
		case out.stale:
			counts["stale"]++
		case out.mismatch:
			counts["mismatch"]++
		default:
			counts["write"]++
		}
	}
	t.Logf("%d operations: %v", len(history), counts)
	if counts["write"] < 50 || counts["get"] < 50 || counts["stale"] == 0 {
		t.Fatalf("the run did not exercise the store: %v", counts)
	}
	res, info := porcupine.CheckOperationsVerbose(kvModel, history, 60*time.Second)
	switch res {
	case porcupine.Illegal:
		t.Errorf("the KV history is not linearizable")
		if path := t.TempDir() + "/kv-history.html"; porcupine.VisualizePath(kvModel, info, path) == nil {
			t.Logf("visualization: %s", path)
		}
	case porcupine.Unknown:
		t.Errorf("the linearizability check gave no verdict within 60s (%d operations)", len(history))
	}
}

// kvIn is one KV call.
type kvIn struct {
	key       string
	get       bool
	value     string
	cas       bool
	ifVersion uint64
	token     uint64 // fence token; 0 when unfenced
}

// kvOut is its answer. unknown: the call failed and may or may not have taken effect.
type kvOut struct {
	unknown  bool
	found    bool
	value    string
	version  uint64
	fence    uint64 // Get: highest accepted fence; stale Put: highest
	stale    bool
	mismatch bool
}

func putOutcome(version uint64, err error) kvOut {
	var stale *client.StaleTokenError
	var mismatch *client.VersionMismatchError
	switch {
	case err == nil:
		return kvOut{version: version}
	case errors.As(err, &stale):
		return kvOut{stale: true, fence: stale.Highest}
	case errors.As(err, &mismatch):
		return kvOut{mismatch: true, version: mismatch.Current}
	}
	return kvOut{unknown: true}
}

// kvState is one key. Versions are store revisions, so a key's version only grows; after
// a write whose answer was lost the new version is unknown (known false), only that it
// is above ver.
type kvState struct {
	exists bool
	value  string
	ver    uint64
	known  bool
	fence  uint64
}

var kvModel = (&porcupine.NondeterministicModel{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var order []string
		for _, op := range history {
			k := op.Input.(kvIn).key
			if _, ok := byKey[k]; !ok {
				order = append(order, k)
			}
			byKey[k] = append(byKey[k], op)
		}
		out := make([][]porcupine.Operation, 0, len(order))
		for _, k := range order {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() []any { return []any{kvState{known: true}} },
	Step: func(state, input, output any) []any {
		var next []any
		for _, s := range kvStep(state.(kvState), input.(kvIn), output.(kvOut)) {
			next = append(next, s)
		}
		return next
	},
	Equal: func(a, b any) bool { return a.(kvState) == b.(kvState) },
	DescribeOperation: func(input, output any) string {
		in, out := input.(kvIn), output.(kvOut)
		if in.get {
			return fmt.Sprintf("get %s -> %v %q v%d f%d", in.key, out.found, out.value, out.version, out.fence)
		}
		return fmt.Sprintf("put %s=%q cas=%v/%d tok=%d -> %+v", in.key, in.value, in.cas, in.ifVersion, in.token, out)
	},
	DescribeState: func(state any) string {
		s := state.(kvState)
		return fmt.Sprintf("%v %q v%d(%v) f%d", s.exists, s.value, s.ver, s.known, s.fence)
	},
}).ToModel()

// kvStep returns every state the key can be in after in produced out from s.
func kvStep(s kvState, in kvIn, out kvOut) []kvState {
	if in.get {
		if out.unknown {
			return []kvState{s}
		}
		if out.found != s.exists || out.fence != s.fence {
			return nil
		}
		if !s.exists {
			if out.version != 0 {
				return nil
			}
			return []kvState{s}
		}
		if out.value != s.value || (s.known && out.version != s.ver) || (!s.known && out.version <= s.ver) {
			return nil
		}
		s.ver, s.known = out.version, true
		return []kvState{s}
	}
	fenceOK := in.token == 0 || in.token >= s.fence
	// Whether the compare-and-set matches: yes, no, or either when the version is unknown.
	casYes, casNo := true, false
	if in.cas {
		switch {
		case !s.exists:
			casYes, casNo = in.ifVersion == 0, in.ifVersion != 0
		case s.known:
			casYes, casNo = in.ifVersion == s.ver, in.ifVersion != s.ver
		default:
			casYes, casNo = in.ifVersion > s.ver, true
		}
	}
	applied := func(version uint64, known bool) kvState {
		n := kvState{exists: true, value: in.value, ver: version, known: known, fence: s.fence}
		if in.token != 0 {
			n.fence = in.token
		}
		return n
	}
	switch {
	case out.unknown:
		next := []kvState{s}
		if fenceOK && casYes {
			next = append(next, applied(s.ver, false))
		}
		return next
	case out.stale:
		if in.token != 0 && in.token < s.fence && out.fence == s.fence {
			return []kvState{s}
		}
		return nil
	case out.mismatch:
		if !fenceOK || !casNo {
			return nil
		}
		if s.exists && (s.known && out.version != s.ver || !s.known && out.version <= s.ver) {
			return nil
		}
		if !s.exists && out.version != 0 {
			return nil
		}
		if s.exists {
			s.ver, s.known = out.version, true
		}
		return []kvState{s}
	default:
		if !fenceOK || !casYes || out.version <= s.ver {
			return nil
		}
		return []kvState{applied(out.version, true)}
	}
}

// TestKVModel checks the model itself on small histories it must accept and reject.
func TestKVModel(t *testing.T) {
	put := func(v string, tok uint64) kvIn { return kvIn{key: "k", value: v, token: tok} }
	get := kvIn{key: "k", get: true}
	op := func(in kvIn, out kvOut, call, ret int64) porcupine.Operation {
		return porcupine.Operation{Input: in, Output: out, Call: call, Return: ret}
	}
	ok := []porcupine.Operation{
		op(put("a", 5), kvOut{version: 1}, 0, 1),
		op(put("b", 3), kvOut{stale: true, fence: 5}, 2, 3),
		op(get, kvOut{found: true, value: "a", version: 1, fence: 5}, 4, 5),
	}
	if !porcupine.CheckOperations(kvModel, ok) {
		t.Fatal("a legal history was rejected")
	}
	bad := []porcupine.Operation{
		op(put("a", 5), kvOut{version: 1}, 0, 1),
		op(put("b", 3), kvOut{version: 2}, 2, 3), // a stale token accepted
	}
	if porcupine.CheckOperations(kvModel, bad) {
		t.Fatal("a stale fenced write that was accepted passed the model")
	}
	lost := []porcupine.Operation{
		op(put("a", 0), kvOut{version: 1}, 0, 1),
		op(get, kvOut{found: false}, 2, 3), // an acknowledged write lost
	}
	if porcupine.CheckOperations(kvModel, lost) {
		t.Fatal("a lost acknowledged write passed the model")
	}
	maybe := []porcupine.Operation{
		op(put("a", 0), kvOut{unknown: true}, 0, math.MaxInt64),
		op(get, kvOut{found: true, value: "a", version: 7}, 2, 3),
		op(get, kvOut{found: true, value: "a", version: 7}, 4, 5),
	}
	if !porcupine.CheckOperations(kvModel, maybe) {
		t.Fatal("a write whose answer was lost, then seen, was rejected")
	}
}
