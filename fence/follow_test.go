package fence

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"iter"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/internal/clustertest"
	"github.com/leasehold/leasehold/internal/reason"
	"github.com/leasehold/leasehold/internal/testnode"
	"github.com/leasehold/leasehold/server"
	"github.com/leasehold/leasehold/service"
)

// floorGuard is one guard under test: its Floorer and how a write is admitted.
type floorGuard struct {
	name   string
	floors Floorer
	admit  func(ctx context.Context, resource string, token uint64) error
}

func memoryFloorGuard() floorGuard {
	m := NewMemory()
	return floorGuard{name: "memory", floors: m, admit: m.Admit}
}

// sqlFloorGuard admits each token in a transaction of its own, as a fenced write does.
func sqlFloorGuard(t *testing.T, env *sqlEnv) floorGuard {
	g := env.newGuard(t)
	return floorGuard{name: env.dialect.String(), floors: g.Floors(env.db), admit: func(ctx context.Context, resource string, token uint64) error {
		return admitTx(ctx, env, g, resource, token)
	}}
}

// followNode starts a leasehold node and a client of it, closed at cleanup.
func followNode(t *testing.T) (*service.Node, *client.Client, context.Context) {
	t.Helper()
	if testing.Short() {
		t.Skip("runs a leasehold node")
	}
	node := testnode.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	c, err := client.Dial(ctx, node.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(ctx) })
	return node, c, ctx
}

// floorGuards: memory, SQLite, and PostgreSQL when LEASEHOLD_TEST_POSTGRES is set.
func floorGuards(t *testing.T) []floorGuard {
	gs := []floorGuard{memoryFloorGuard(), sqlFloorGuard(t, openSQLite(t))}
	if testing.Short() {
		return gs
	}
	if os.Getenv(postgresEnv) == "" && os.Getenv("CI") == "" {
		t.Logf("%s is not set: the PostgreSQL guard is not tested here (eval \"$(bash scripts/postgres.sh)\")", postgresEnv)
		return gs
	}
	return append(gs, sqlFloorGuard(t, openPostgres(t)))
}

func floorStale(t *testing.T, g floorGuard, resource string, token uint64) {
	t.Helper()
	if err := g.admit(context.Background(), resource, token); !errors.Is(err, ErrStale) {
		t.Fatalf("%s: admit %q token %d: %v, want stale", g.name, resource, token, err)
	}
}

func floorAdmitted(t *testing.T, g floorGuard, resource string, token uint64) {
	t.Helper()
	if err := g.admit(context.Background(), resource, token); err != nil {
		t.Fatalf("%s: admit %q token %d: %v, want admitted", g.name, resource, token, err)
	}
}

// TestFloor: a floor rejects the ended token and every lower one, admits the next,
// never goes down, creates a resource never seen, and Resources lists by prefix.
func TestFloor(t *testing.T) {
	ctx := context.Background()
	for _, g := range floorGuards(t) {
		t.Run(g.name, func(t *testing.T) {
			floorAdmitted(t, g, "f/a", 5)
			if err := g.floors.Floor(ctx, "f/a", 7); err != nil {
				t.Fatal(err)
			}
			floorStale(t, g, "f/a", 7)
			floorStale(t, g, "f/a", 5)
			if err := g.floors.Floor(ctx, "f/a", 3); err != nil { // lower: no change
				t.Fatal(err)
			}
			floorStale(t, g, "f/a", 7)
			floorAdmitted(t, g, "f/a", 8)
			floorAdmitted(t, g, "f/a", 8) // an equal token again
			if err := g.floors.Floor(ctx, "f/new", 9); err != nil {
				t.Fatal(err)
			}
			floorStale(t, g, "f/new", 9)
			floorAdmitted(t, g, "g/other", 1)
			got, err := g.floors.Resources(ctx, "f/")
			if err != nil {
				t.Fatal(err)
			}
			slices.Sort(got)
			if want := []string{"f/a", "f/new"}; !slices.Equal(got, want) {
				t.Fatalf("Resources(f/) = %v, want %v", got, want)
			}
			all, err := g.floors.Resources(ctx, "")
			if err != nil || len(all) != 3 {
				t.Fatalf(`Resources("") = %v, %v; want 3`, all, err)
			}
		})
	}
}

// followed starts Follow for guard on the node's locks under prefix and waits until it
// is ready; raised gets every floor.
func followed(t *testing.T, c Watcher, prefix string, g Floorer, raised func(Raised)) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- Follow(ctx, c, prefix, g, OnReady(func() { close(ready) }), OnFloor(raised))
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Follow ended with %v, want context.Canceled", err)
		}
	})
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("Follow ended before it was ready: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("Follow not ready after 10 s")
	}
}

// floorWaiter collects Follow's floors and waits for one.
type floorWaiter struct {
	mu     sync.Mutex
	floors []Raised
	moved  chan struct{}
}

func newFloorWaiter() *floorWaiter { return &floorWaiter{moved: make(chan struct{}, 1)} }

func (w *floorWaiter) raised(r Raised) {
	w.mu.Lock()
	w.floors = append(w.floors, r)
	w.mu.Unlock()
	select {
	case w.moved <- struct{}{}:
	default:
	}
}

// wait returns once a floor of resource at or above ended is in place.
func (w *floorWaiter) wait(t *testing.T, resource string, ended uint64) Raised {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		w.mu.Lock()
		for _, r := range w.floors {
			if r.Resource == resource && r.Ended >= ended {
				w.mu.Unlock()
				return r
			}
		}
		w.mu.Unlock()
		select {
		case <-w.moved:
		case <-deadline:
			t.Fatalf("no floor of %q at %d or above within 10 s", resource, ended)
		}
	}
}

// TestFollowFloorsEndedHolds: with Follow, the token of a hold that was released,
// force-released or revoked is rejected before anybody else writes; the next holder's
// token is admitted; shared holds and efficiency locks raise no floor.
func TestFollowFloorsEndedHolds(t *testing.T) {
	node, c, ctx := followNode(t)
	for _, g := range floorGuards(t) {
		t.Run(g.name, func(t *testing.T) {
			prefix := "ff-" + g.name + "/"
			w := newFloorWaiter()
			followed(t, c, prefix, g.floors, w.raised)

			l, err := c.Lock(ctx, prefix+"released", client.Correctness)
			if err != nil {
				t.Fatal(err)
			}
			floorAdmitted(t, g, l.Name(), l.Token())
			if err := l.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			if r := w.wait(t, l.Name(), l.Token()); r.Kind != leaseholdv1.EventKind_EVENT_KIND_RELEASED {
				t.Errorf("floor raised by %v, want RELEASED", r.Kind)
			}
			floorStale(t, g, l.Name(), l.Token())
			next, err := c.Lock(ctx, l.Name(), client.Correctness)
			if err != nil {
				t.Fatal(err)
			}
			floorAdmitted(t, g, next.Name(), next.Token())

			if _, _, err := c.ForceRelease(ctx, next.Name(), "test"); err != nil {
				t.Fatal(err)
			}
			w.wait(t, next.Name(), next.Token())
			floorStale(t, g, next.Name(), next.Token())

			// A holder that never wrote is fenced too (the resource is created).
			other, err := client.Dial(ctx, node.Addr())
			if err != nil {
				t.Fatal(err)
			}
			silent, err := other.Lock(ctx, prefix+"silent", client.Correctness)
			if err != nil {
				t.Fatal(err)
			}
			_ = other.Close(ctx) // revokes its lease
			w.wait(t, silent.Name(), silent.Token())
			floorStale(t, g, silent.Name(), silent.Token())

			// Shared: two readers; the younger one's release must not fence the older.
			r1, err := c.Lock(ctx, prefix+"shared", client.Correctness, client.Shared)
			if err != nil {
				t.Fatal(err)
			}
			r2, err := c.Lock(ctx, prefix+"shared", client.Correctness, client.Shared)
			if err != nil {
				t.Fatal(err)
			}
			if err := r2.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			// Efficiency locks are not followed.
			eff, err := c.Lock(ctx, prefix+"efficiency", client.Efficiency)
			if err != nil {
				t.Fatal(err)
			}
			floorAdmitted(t, g, eff.Name(), eff.Token())
			_ = eff.Unlock(ctx)
			marker, err := c.Lock(ctx, prefix+"marker", client.Correctness) // events are in order: past it, r2's is applied
			if err != nil {
				t.Fatal(err)
			}
			_ = marker.Unlock(ctx)
			w.wait(t, marker.Name(), marker.Token())
			floorAdmitted(t, g, r1.Name(), r1.Token())
			floorAdmitted(t, g, eff.Name(), eff.Token())
			_ = r1.Unlock(ctx)
		})
	}
}

// compactingWatcher is a Watcher whose first watch loses every event until lose is
// closed and then fails "compacted", as a watcher fallen behind the retained history.
type compactingWatcher struct {
	*client.Client
	lose chan struct{}
	once sync.Once
}

func (w *compactingWatcher) Watch(ctx context.Context, prefix string, opts ...client.WatchOption) iter.Seq2[*leaseholdv1.WatchEvent, error] {
	first := false
	w.once.Do(func() { first = true })
	if !first {
		return w.Client.Watch(ctx, prefix, opts...)
	}
	return func(yield func(*leaseholdv1.WatchEvent, error) bool) {
		select {
		case <-w.lose:
		case <-ctx.Done():
			yield(nil, ctx.Err())
			return
		}
		err := connect.NewError(connect.CodeFailedPrecondition, errors.New("watch: compacted: the oldest revision held is 999:0"))
		if d, derr := connect.NewErrorDetail(&leaseholdv1.ErrorDetail{Reason: reason.Compacted}); derr == nil {
			err.AddDetail(d)
		}
		yield(nil, err)
	}
}

// TestFollowAfterCompacted: events lost to a "compacted" watch do not lose floors: Follow
// re-reads the lock state — a free lock the guard knows gets the last token issued, a
// held one the token below its holder's — and watches on.
func TestFollowAfterCompacted(t *testing.T) {
	_, c, ctx := followNode(t)
	for _, g := range floorGuards(t) {
		t.Run(g.name, func(t *testing.T) {
			prefix := "fc-" + g.name + "/"
			cw := &compactingWatcher{Client: c, lose: make(chan struct{})}
			w := newFloorWaiter()
			followed(t, cw, prefix, g.floors, w.raised)

			gone, err := c.Lock(ctx, prefix+"gone", client.Correctness)
			if err != nil {
				t.Fatal(err)
			}
			floorAdmitted(t, g, gone.Name(), gone.Token())
			_ = gone.Unlock(ctx) // its event is lost
			held, err := c.Lock(ctx, prefix+"held", client.Correctness)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = held.Unlock(ctx) }()
			close(cw.lose)
			w.wait(t, gone.Name(), gone.Token())
			w.wait(t, held.Name(), held.Token()-1)
			floorStale(t, g, gone.Name(), gone.Token())
			floorAdmitted(t, g, held.Name(), held.Token())

			// And it watches on after the re-read.
			l, err := c.Lock(ctx, prefix+"after", client.Correctness)
			if err != nil {
				t.Fatal(err)
			}
			_ = l.Unlock(ctx)
			w.wait(t, l.Name(), l.Token())
			floorStale(t, g, l.Name(), l.Token())
		})
	}
}

// TestFollowAcrossLeaderChange: for each guard, on a three-node cluster whose leader is
// cut off while eight workers take and give back locks, Follow's watch resumes on the new leader and
// misses no end: afterwards every released token is rejected for its lock, and no
// holder's own write was ever rejected while it held its lock.
func TestFollowAcrossLeaderChange(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a three-node cluster")
	}
	for _, g := range floorGuards(t) {
		t.Run(g.name, func(t *testing.T) { testFollowAcrossLeaderChange(t, g) })
	}
}

func testFollowAcrossLeaderChange(t *testing.T, g floorGuard) {
	cl := clustertest.MakeCluster(t, 3, clustertest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dial := func() *client.Client {
		c, err := client.Dial(ctx, cl.Addrs())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close(context.Background()) })
		return c
	}
	w := newFloorWaiter()
	followed(t, dial(), "lc/", g.floors, w.raised)

	var (
		mu       sync.Mutex
		released = map[string]uint64{} // lock -> highest token released
		wg       sync.WaitGroup
	)
	stop := make(chan struct{})
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			user := dial()
			for j := 0; ; j++ {
				select {
				case <-stop:
					return
				default:
				}
				l, err := user.Lock(ctx, fmt.Sprintf("lc/%d", (i+j)%5), client.Correctness, client.WaitFor(5*time.Second))
				if err != nil {
					if ctx.Err() != nil {
						return
					}
					continue
				}
				if err := g.admit(ctx, l.Name(), l.Token()); err != nil && l.Context().Err() == nil {
					t.Errorf("holder of %s (token %d) was rejected while holding: %v", l.Name(), l.Token(), err)
				}
				if err := l.Unlock(ctx); err == nil {
					mu.Lock()
					released[l.Name()] = max(released[l.Name()], l.Token())
					mu.Unlock()
				}
			}
		}()
	}
	time.Sleep(700 * time.Millisecond)
	old := cl.Leader()
	cl.Partition(old)
	cl.Leader(cl.Others(old)...)
	time.Sleep(700 * time.Millisecond)
	cl.Heal()
	time.Sleep(500 * time.Millisecond)
	close(stop)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if len(released) == 0 {
		t.Fatal("no lock was released")
	}
	for name, tok := range released {
		w.wait(t, name, tok)
		floorStale(t, g, name, tok)
	}
	w.mu.Lock()
	n := len(w.floors)
	w.mu.Unlock()
	t.Logf("%d floors raised; leader %s cut off", n, old.ID)
}

// TestIsCompacted: the server's answer to a watch below its retained history is what
// Follow takes for "compacted" (and re-reads the state on); other errors are not.
func TestIsCompacted(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a leasehold node")
	}
	node := testnode.StartWith(t, func(cfg *service.Config) { cfg.Server = server.Config{WatchRetention: 4} })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, node.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close(ctx) }()
	for i := range 5 {
		l, err := c.Lock(ctx, fmt.Sprintf("ic/%d", i), client.Correctness)
		if err != nil {
			t.Fatal(err)
		}
		_ = l.Unlock(ctx)
	}
	for _, err := range c.Watch(ctx, "", client.WatchFrom(&leaseholdv1.Revision{Index: 1})) {
		if !isCompacted(err) {
			t.Fatalf("watch below the history: %v, not taken for compacted", err)
		}
		break
	}
	for _, err := range []error{nil, context.Canceled, connect.NewError(connect.CodeFailedPrecondition, errors.New("class_conflict")),
		connect.NewError(connect.CodeUnavailable, errors.New("oldest revision held"))} {
		if isCompacted(err) {
			t.Errorf("isCompacted(%v) = true", err)
		}
	}
}

// BenchmarkFloor: one Floor, the write Follow makes per exclusive grant and per end,
// on 64 resources in turn. PostgreSQL runs when LEASEHOLD_TEST_POSTGRES is set.
func BenchmarkFloor(b *testing.B) {
	for _, g := range []struct{ name, driver, dsn string }{
		{"memory", "", ""},
		{"sqlite", "sqlite", "file:" + filepath.Join(b.TempDir(), "f.db") + "?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)"},
		{"postgres", "pgx", os.Getenv(postgresEnv)},
	} {
		b.Run(g.name, func(b *testing.B) {
			var f Floorer = NewMemory()
			if g.driver != "" {
				f = benchSQLFloors(b, g.driver, g.dsn)
			}
			ctx := context.Background()
			var n uint64
			for b.Loop() {
				n++
				if err := f.Floor(ctx, fmt.Sprintf("b/%d", n%64), n); err != nil {
					b.Fatal(err)
				}
			}
		})
		if g.driver == "" {
			continue
		}
		// A round of 64 floors, as Follow writes the events that waited: ns/op is per floor.
		b.Run(g.name+"-round64", func(b *testing.B) {
			fl := &follower{guard: benchSQLFloors(b, g.driver, g.dsn), o: followOptions{logger: slog.Default()}}
			ctx := context.Background()
			floors := make([]Raised, 64)
			var n uint64
			for b.Loop() {
				n++
				if n%64 == 0 {
					for i := range floors {
						floors[i] = Raised{Resource: fmt.Sprintf("b/%d", i), Ended: n + uint64(i)}
					}
					if err := fl.raise(ctx, floors); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}

func benchSQLFloors(b *testing.B, driver, dsn string) Floorer {
	if dsn == "" {
		b.Skip(postgresEnv + " is not set")
	}
	db, err := sql.Open(driver, dsn)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = db.Close() })
	d := SQLite
	if driver == "pgx" {
		d = Postgres
	}
	table := fmt.Sprintf("fence_bench_%d", time.Now().UnixNano())
	g, err := NewSQL(d, table)
	if err != nil {
		b.Fatal(err)
	}
	if err := g.Migrate(context.Background(), db); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _, _ = db.Exec("DROP TABLE " + table) })
	return g.Floors(db)
}

// TestFloorBatch: the floors Follow writes together — the highest per resource of a
// round, in one transaction for the SQL guard — are each in place afterwards.
func TestFloorBatch(t *testing.T) {
	var r round
	for _, f := range []Raised{{Resource: "fb/a", Ended: 5}, {Resource: "fb/b", Ended: 7}, {Resource: "fb/a", Ended: 9}, {Resource: "fb/a", Ended: 6}} {
		r.add(f)
	}
	if want := []Raised{{Resource: "fb/a", Ended: 9}, {Resource: "fb/b", Ended: 7}}; !slices.Equal(r.floors, want) {
		t.Fatalf("round = %v, want %v", r.floors, want)
	}
	ctx := context.Background()
	for _, g := range floorGuards(t) {
		t.Run(g.name, func(t *testing.T) {
			var got []Raised
			f := &follower{guard: g.floors, o: followOptions{logger: slog.Default(), onFloor: func(r Raised) { got = append(got, r) }}}
			if err := f.raise(ctx, r.floors); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, r.floors) {
				t.Errorf("hook got %v, want %v", got, r.floors)
			}
			floorStale(t, g, "fb/a", 9)
			floorStale(t, g, "fb/b", 7)
			floorAdmitted(t, g, "fb/a", 10)
			floorAdmitted(t, g, "fb/b", 8)
		})
	}
}

// cutProxy forwards TCP connections to target until cut closes them all at once and
// stops accepting: the path between a client and its node, cut.
func cutProxy(t *testing.T, target string) (addr string, cut func()) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, u)
			mu.Unlock()
			go func() { _, _ = io.Copy(u, c); _ = u.Close() }()
			go func() { _, _ = io.Copy(c, u); _ = c.Close() }()
		}
	}()
	cut = func() {
		_ = ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	}
	t.Cleanup(cut)
	return ln.Addr().String(), cut
}

// A ReleaseOnDisconnect hold ends with a DISCONNECTED event when its holder's connection
// goes (G7); Follow floors it like any other end, so the cut-off holder — the client most
// likely to be still writing — is rejected before anyone else writes.
func TestFollowFloorsADisconnectedHold(t *testing.T) {
	node, c, ctx := followNode(t)
	for _, g := range []floorGuard{memoryFloorGuard(), sqlFloorGuard(t, openSQLite(t))} {
		t.Run(g.name, func(t *testing.T) {
			prefix := "fd-" + g.name + "/"
			w := newFloorWaiter()
			followed(t, c, prefix, g.floors, w.raised)
			addr, cut := cutProxy(t, node.Addr())
			holder, err := client.Dial(ctx, addr, client.WithoutFastLane(), client.WithTTL(30*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			bound, err := holder.Lock(ctx, prefix+"bound", client.Correctness, client.ReleaseOnDisconnect)
			if err != nil {
				t.Fatal(err)
			}
			floorAdmitted(t, g, bound.Name(), bound.Token())
			cut()
			if r := w.wait(t, bound.Name(), bound.Token()); r.Kind != leaseholdv1.EventKind_EVENT_KIND_DISCONNECTED {
				t.Errorf("floor raised by %v, want DISCONNECTED", r.Kind)
			}
			floorStale(t, g, bound.Name(), bound.Token())
		})
	}
}

// Every event kind is either the end of a hold, which floors its token, or not; a kind
// added to the API without a decision here fails this test.
func TestFloorOfEveryEventKind(t *testing.T) {
	ends := map[leaseholdv1.EventKind]bool{
		leaseholdv1.EventKind_EVENT_KIND_RELEASED:       true,
		leaseholdv1.EventKind_EVENT_KIND_EXPIRED:        true,
		leaseholdv1.EventKind_EVENT_KIND_REVOKED:        true,
		leaseholdv1.EventKind_EVENT_KIND_FORCE_RELEASED: true,
		leaseholdv1.EventKind_EVENT_KIND_DISCONNECTED:   true,
		leaseholdv1.EventKind_EVENT_KIND_ACQUIRED:       false, // floors the token below
		leaseholdv1.EventKind_EVENT_KIND_QUEUED:         false,
		leaseholdv1.EventKind_EVENT_KIND_WAIT_ENDED:     false,
		leaseholdv1.EventKind_EVENT_KIND_EPOCH:          false,
		leaseholdv1.EventKind_EVENT_KIND_UNSPECIFIED:    false,
	}
	for v := range leaseholdv1.EventKind_name {
		k := leaseholdv1.EventKind(v)
		end, known := ends[k]
		if !known {
			t.Errorf("%v: not classified as the end of a hold or not", k)
			continue
		}
		e := &leaseholdv1.WatchEvent{Kind: k, Name: "x", Token: 7,
			Mode: leaseholdv1.LockMode_LOCK_MODE_EXCLUSIVE, Class: leaseholdv1.LockClass_LOCK_CLASS_CORRECTNESS}
		_, floor, ok := floorOf(e)
		switch {
		case end && (!ok || floor != 7):
			t.Errorf("%v of an exclusive correctness hold: floor %d, %v; want 7", k, floor, ok)
		case k == leaseholdv1.EventKind_EVENT_KIND_ACQUIRED && (!ok || floor != 6):
			t.Errorf("%v: floor %d, %v; want 6", k, floor, ok)
		case !end && k != leaseholdv1.EventKind_EVENT_KIND_ACQUIRED && ok:
			t.Errorf("%v raised a floor (%d)", k, floor)
		}
	}
}
