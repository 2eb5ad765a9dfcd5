package fence

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
)

// wantStale fails the test unless err is a *StaleError with the given fields.
func wantStale(t *testing.T, err error, resource string, token, highest uint64) {
	t.Helper()
	var stale *StaleError
	if !errors.As(err, &stale) {
		t.Fatalf("err = %v; want a *StaleError", err)
	}
	if !errors.Is(err, ErrStale) {
		t.Errorf("errors.Is(%v, ErrStale) = false", err)
	}
	want := StaleError{Resource: resource, Token: token, Highest: highest}
	if *stale != want {
		t.Errorf("stale error = %+v; want %+v", *stale, want)
	}
}

func TestStaleErrorMessage(t *testing.T) {
	err := &StaleError{Resource: "orders/42", Token: 33, Highest: 34}
	const want = `fence: token 33 for "orders/42" is stale: highest accepted is 34`
	if err.Error() != want {
		t.Errorf("Error() = %q; want %q", err.Error(), want)
	}
	if errors.Is(err, ErrMalformedToken) || errors.Is(err, ErrNoToken) {
		t.Error("StaleError matches another sentinel")
	}
}

func TestMemoryOrder(t *testing.T) {
	ctx := context.Background()
	g := NewMemory()
	if _, ok := g.Highest("orders/42"); ok {
		t.Fatal("Highest of an unknown resource reports a token")
	}
	for _, tok := range []uint64{5, 5, 7, 7, 8} {
		if err := g.Admit(ctx, "orders/42", tok); err != nil {
			t.Fatalf("Admit(%d): %v", tok, err)
		}
	}
	wantStale(t, g.Admit(ctx, "orders/42", 6), "orders/42", 6, 8)
	wantStale(t, g.Admit(ctx, "orders/42", 1), "orders/42", 1, 8)
	if h, _ := g.Highest("orders/42"); h != 8 {
		t.Errorf("Highest = %d after rejected tokens; want 8", h)
	}
	// Resources are independent.
	if err := g.Admit(ctx, "orders/43", 1); err != nil {
		t.Errorf("Admit on another resource: %v", err)
	}
	var zero Memory
	if err := zero.Admit(ctx, "r", 2); err != nil {
		t.Errorf("zero Memory: %v", err)
	}
	wantStale(t, zero.Admit(ctx, "r", 1), "r", 1, 2)
	if err := g.Admit(ctx, "orders/42", 0); !errors.Is(err, ErrMalformedToken) {
		t.Errorf("Admit(0) = %v; want ErrMalformedToken", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := g.Admit(cctx, "orders/42", 9); err != context.Canceled { //nolint:errorlint // unwrapped on purpose
		t.Errorf("Admit with a cancelled context = %v; want context.Canceled unchanged", err)
	}
	if h, _ := g.Highest("orders/42"); h != 8 {
		t.Errorf("Highest = %d after a cancelled Admit; want 8", h)
	}
}

// TestMemoryConcurrent has writers take tokens from one rising counter and admit them
// after random delays, so that tokens arrive out of order. The guard must accept a
// sequence that never goes down (checked under a lock that covers Admit and the log
// append, so the log is the admission order) and reject exactly the tokens below the
// highest admitted so far.
func TestMemoryConcurrent(t *testing.T) {
	ctx := context.Background()
	g := NewMemory()
	var counter atomic.Uint64
	var mu sync.Mutex
	var accepted []uint64
	var highest uint64 // highest admitted so far; guarded by mu
	var rejected atomic.Int64
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for range 500 {
				tok := counter.Add(1)
				for range r.IntN(200) { // a random pause between grant and write
					_ = r.Uint64()
				}
				mu.Lock()
				err := g.Admit(ctx, "hot", tok)
				if (err == nil) != (tok >= highest) {
					t.Errorf("Admit(%d) with highest %d = %v", tok, highest, err)
				}
				if err == nil {
					accepted = append(accepted, tok)
					highest = tok
				} else {
					var stale *StaleError
					if !errors.As(err, &stale) || stale.Highest <= tok || stale.Token != tok {
						t.Errorf("Admit(%d) = %v; want a *StaleError naming a higher token", tok, err)
					}
					rejected.Add(1)
				}
				mu.Unlock()
				// Same work without the outer lock, on a second resource, for the race detector.
				if err := g.Admit(ctx, "cold", tok); err != nil && !errors.Is(err, ErrStale) {
					t.Errorf("Admit(cold, %d) = %v", tok, err)
				}
			}
		}()
	}
	wg.Wait()
	for i := 1; i < len(accepted); i++ {
		if accepted[i] < accepted[i-1] {
			t.Fatalf("accepted token %d after %d", accepted[i], accepted[i-1])
		}
	}
	if h, _ := g.Highest("hot"); h != accepted[len(accepted)-1] {
		t.Errorf("Highest = %d; want the last accepted %d", h, accepted[len(accepted)-1])
	}
	if int(rejected.Load())+len(accepted) != 16*500 {
		t.Errorf("accepted %d + rejected %d != %d writes", len(accepted), rejected.Load(), 16*500)
	}
	t.Logf("accepted %d, rejected %d", len(accepted), rejected.Load())
}
