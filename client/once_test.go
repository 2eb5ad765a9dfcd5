package client_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold/api/leasehold/v1/leaseholdv1connect"
	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/internal/testnode"
)

// TestOnceRunsAtMostOnce (G9): eight Clients, four Sessions each, race Once on a few
// keys over and over. Each key's fn runs exactly once; every other call gets either the
// stored result or an *InProgressError naming the token of the run in progress, and
// once the run is done, every call gets its result.
func TestOnceRunsAtMostOnce(t *testing.T) {
	addr, c0, ctx := startClient(t)
	defer c0.Close(ctx)
	const clients, sessions, keys, rounds = 8, 4, 3, 5
	var runs [keys]atomic.Int32
	var tokens [keys]atomic.Uint64
	var wg sync.WaitGroup
	for i := range clients {
		c, err := client.Dial(ctx, addr, client.WithHolder(client.Holder{Host: "test", PID: uint32(i)}))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(ctx)
		for range sessions {
			s := c.NewSession()
			wg.Add(1)
			go func() {
				defer wg.Done()
				for r := range rounds * keys {
					k := r % keys
					key := fmt.Sprintf("once/%d", k)
					res, err := s.Once(ctx, key, func(ctx context.Context, token uint64) ([]byte, error) {
						runs[k].Add(1)
						tokens[k].Store(token)
						time.Sleep(20 * time.Millisecond) // long enough for others to find it in progress
						return []byte(fmt.Sprintf("result of %s under %d", key, token)), nil
					})
					var ip *client.InProgressError
					switch {
					case errors.As(err, &ip):
						if ip.Key != key || ip.Token == 0 || ip.Holder.Host != "test" {
							t.Errorf("in progress: %+v", ip)
						}
					case err != nil:
						t.Error(err)
					case string(res) != fmt.Sprintf("result of %s under %d", key, tokens[k].Load()):
						t.Errorf("%s: result %q, the run's token is %d", key, res, tokens[k].Load())
					}
				}
			}()
		}
	}
	wg.Wait()
	for k := range keys {
		if n := runs[k].Load(); n != 1 {
			t.Errorf("key %d ran %d times", k, n)
		}
		res, err := c0.Once(ctx, fmt.Sprintf("once/%d", k), func(context.Context, uint64) ([]byte, error) {
			t.Error("fn of a done key ran")
			return nil, nil
		})
		if err != nil || string(res) != fmt.Sprintf("result of once/%d under %d", k, tokens[k].Load()) {
			t.Errorf("key %d after the races: %q %v", k, res, err)
		}
		st, err := c0.Key(ctx, fmt.Sprintf("once/%d", k))
		if err != nil || st.Status != client.KeyDone || st.Token != tokens[k].Load() || string(st.Result) != string(res) {
			t.Errorf("Key: %+v %v", st, err)
		}
	}
}

// TestOnceSameClient: Once calls of one Client share its lease, yet only one of them
// runs fn; the others, while it runs, get an *InProgressError.
func TestOnceSameClient(t *testing.T) {
	_, c, ctx := startClient(t)
	defer c.Close(ctx)
	var runs atomic.Int32
	release := make(chan struct{})
	var wg sync.WaitGroup
	var busy atomic.Int32
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := c.Once(ctx, "same-client", func(context.Context, uint64) ([]byte, error) {
				runs.Add(1)
				<-release
				return []byte("r"), nil
			})
			if errors.Is(err, client.ErrInProgress) {
				busy.Add(1)
			} else if err != nil {
				t.Error(err)
			}
		}()
	}
	for busy.Load() < 7 && ctx.Err() == nil {
		time.Sleep(5 * time.Millisecond)
	}
	close(release)
	wg.Wait()
	if runs.Load() != 1 || busy.Load() != 7 {
		t.Fatalf("fn ran %d times, %d calls found the key in progress; want 1 and 7", runs.Load(), busy.Load())
	}
	res, err := c.Once(ctx, "same-client", func(context.Context, uint64) ([]byte, error) { return nil, errors.New("ran again") })
	if err != nil || string(res) != "r" {
		t.Fatalf("after: %q %v", res, err)
	}
}

// TestOnceFailureGivesBack: when fn fails (an error or a panic) nothing is stored, the
// key is free at once and the next Once runs fn again, under a larger token.
func TestOnceFailureGivesBack(t *testing.T) {
	_, c, ctx := startClient(t)
	defer c.Close(ctx)
	boom := errors.New("boom")
	var first uint64
	_, err := c.Once(ctx, "fails", func(_ context.Context, token uint64) ([]byte, error) {
		first = token
		return nil, boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Once returned %v, want fn's error", err)
	}
	if st, err := c.Key(ctx, "fails"); err != nil || st.Status != client.KeyAbsent {
		t.Fatalf("after a failure: %+v %v", st, err)
	}
	func() {
		defer func() {
			if r := recover(); r != "panic in fn" {
				t.Fatalf("recovered %v", r)
			}
		}()
		_, _ = c.Once(ctx, "fails", func(context.Context, uint64) ([]byte, error) { panic("panic in fn") })
	}()
	var second uint64
	res, err := c.Once(ctx, "fails", func(_ context.Context, token uint64) ([]byte, error) {
		second = token
		return []byte("ok"), nil
	})
	if err != nil || string(res) != "ok" || second <= first {
		t.Fatalf("retry after the failures: %q %v, token %d after %d", res, err, second, first)
	}
	// A result too large to store is a failure too.
	_, err = c.Once(ctx, "too-big", func(context.Context, uint64) ([]byte, error) { return make([]byte, 32<<10+1), nil })
	if err == nil {
		t.Fatal("a 32 KiB + 1 result was accepted")
	}
	if st, _ := c.Key(ctx, "too-big"); st.Status != client.KeyAbsent {
		t.Fatalf("after a too-large result: %+v", st)
	}
}

// TestOnceContextEndsWithLease: fn's context is cancelled when the key's lease ends
// (here: its Session is closed, which revokes the lease), with the lease's cause; fn's
// late result is then refused with ErrKeyLost, and the key is free for the next Once.
func TestOnceContextEndsWithLease(t *testing.T) {
	_, c, ctx := startClient(t)
	defer c.Close(ctx)
	s := c.NewSession()
	var cause error
	_, err := s.Once(ctx, "lease-ends", func(fctx context.Context, _ uint64) ([]byte, error) {
		if err := s.Close(ctx); err != nil { // returns once the service revoked the lease
			t.Error(err)
		}
		select {
		case <-fctx.Done():
			cause = context.Cause(fctx)
		case <-time.After(10 * time.Second):
		}
		return []byte("too late"), nil
	})
	if !errors.Is(cause, client.ErrLeaseRevoked) {
		t.Fatalf("fn's context ended with %v, want ErrLeaseRevoked", cause)
	}
	if !errors.Is(err, client.ErrKeyLost) {
		t.Fatalf("Once returned %v, want ErrKeyLost", err)
	}
	res, err := c.Once(ctx, "lease-ends", func(context.Context, uint64) ([]byte, error) { return []byte("second"), nil })
	if err != nil || string(res) != "second" {
		t.Fatalf("the next Once: %q %v", res, err)
	}
}

// heldTransport is an HTTP transport that can hold back one request of a given path:
// block keeps it unsent until its context ends, hold lets it through once release is closed.
type heldTransport struct {
	base    http.RoundTripper
	block   atomic.Pointer[string]
	hold    atomic.Pointer[string]
	arrived chan struct{}
	release chan struct{}
}

func newHeldTransport() *heldTransport {
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	return &heldTransport{base: tr, arrived: make(chan struct{}), release: make(chan struct{})}
}

func (g *heldTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if p := g.block.Load(); p != nil && *p == r.URL.Path && g.block.CompareAndSwap(p, nil) {
		<-r.Context().Done()
		return nil, r.Context().Err()
	}
	if p := g.hold.Load(); p != nil && *p == r.URL.Path && g.hold.CompareAndSwap(p, nil) {
		close(g.arrived)
		<-g.release
	}
	return g.base.RoundTrip(r)
}

// A Once whose Begin's outcome is unknown gives the key back in the background; until
// that is done, another Once of the key by the same holder is refused (ErrInProgress).
// Let in, it would get the lease's claim back from the service, run fn under it, and
// have the background abandon give the claim away beneath it — and another client run
// fn too while the first still ran.
func TestOnceWaitsForTheBackgroundAbandonOfItsKey(t *testing.T) {
	node := testnode.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	g := newHeldTransport()
	c, err := client.Dial(ctx, node.Addr(), client.WithoutFastLane(), client.WithHTTPClient(&http.Client{Transport: g}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	other, err := client.Dial(ctx, node.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(ctx)
	var runs atomic.Int32
	fn := func(context.Context, uint64) ([]byte, error) { runs.Add(1); return []byte("done"), nil }
	if _, err := c.Once(ctx, "onceabandon/warm", fn); err != nil { // the lease exists
		t.Fatal(err)
	}
	runs.Store(0)
	begin, abandon := leaseholdv1connect.IdempotencyServiceBeginProcedure, leaseholdv1connect.IdempotencyServiceAbandonProcedure
	g.block.Store(&begin)
	g.hold.Store(&abandon)
	short, cancelShort := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancelShort()
	if _, err := c.Once(short, "onceabandon/k", fn); err == nil {
		t.Fatal("the Once whose Begin never went out succeeded")
	}
	select {
	case <-g.arrived: // the background abandon claimed the key and is giving it back
	case <-time.After(5 * time.Second):
		t.Fatal("no background Abandon")
	}
	if _, err := c.Once(ctx, "onceabandon/k", fn); !errors.Is(err, client.ErrInProgress) {
		t.Fatalf("a Once of the key during its background abandon = %v, want ErrInProgress", err)
	}
	close(g.release)
	for {
		res, err := c.Once(ctx, "onceabandon/k", fn)
		if err == nil {
			if string(res) != "done" {
				t.Fatalf("result %q", res)
			}
			break
		}
		if !errors.Is(err, client.ErrInProgress) || ctx.Err() != nil {
			t.Fatalf("Once after the abandon: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if res, err := other.Once(ctx, "onceabandon/k", fn); err != nil || string(res) != "done" {
		t.Fatalf("another client's Once = %q, %v; want the stored result", res, err)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("fn ran %d times for one key", n)
	}
}
