package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/fence"
)

// groupWrite is one write a member sent to the fenced store.
type groupWrite struct {
	partition int
	member    string
	epoch     uint64
	call, ret time.Time // the member's call (its wall clock) and the store's answer
	accepted  bool
}

// fencedStore is the resource of the group tests: a store with one fenced key per
// partition (package fence's Memory guard, the partition's epoch as the token), which
// records every write.
type fencedStore struct {
	guard *fence.Memory
	url   string

	mu     sync.Mutex
	writes []groupWrite
}

func startFencedStore(t *testing.T) *fencedStore {
	t.Helper()
	st := &fencedStore{guard: fence.NewMemory()}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	st.url = "http://" + ln.Addr().String() + "/write"
	srv := &http.Server{Handler: http.HandlerFunc(st.serve), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return st
}

func (st *fencedStore) serve(w http.ResponseWriter, r *http.Request) {
	p, err1 := strconv.Atoi(r.URL.Query().Get("p"))
	epoch, err2 := strconv.ParseUint(r.Header.Get("Fencing-Token"), 10, 64)
	callNs, err3 := strconv.ParseInt(r.Header.Get("X-Call-Ns"), 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		http.Error(w, "bad write", http.StatusBadRequest)
		return
	}
	err := st.guard.Admit(r.Context(), fmt.Sprintf("part/%d", p), epoch)
	st.mu.Lock()
	st.writes = append(st.writes, groupWrite{partition: p, member: r.URL.Query().Get("m"), epoch: epoch,
		call: time.Unix(0, callNs), ret: time.Now(), accepted: err == nil})
	st.mu.Unlock()
	if err != nil {
		http.Error(w, err.Error(), http.StatusConflict)
	}
}

// last returns, per partition, its last accepted write.
func (st *fencedStore) last() map[int]groupWrite {
	st.mu.Lock()
	defer st.mu.Unlock()
	out := map[int]groupWrite{}
	for _, w := range st.writes {
		if w.accepted {
			out[w.partition] = w
		}
	}
	return out
}

// ownerLog follows the service's view of a group (Status, every 20 ms) and checks, as
// it goes, that it never shows two owners of a partition: each (partition, epoch) has
// one owner in every view, and a partition's epoch never goes back.
type ownerLog struct {
	t      *testing.T
	mu     sync.Mutex
	owners map[int]map[uint64]string // partition → epoch → member
	latest map[int]uint64
	views  int
}

func followOwners(ctx context.Context, t *testing.T, c *client.Client, group string) *ownerLog {
	o := &ownerLog{t: t, owners: map[int]map[uint64]string{}, latest: map[int]uint64{}}
	go func() {
		for ctx.Err() == nil {
			st, err := c.GroupStatus(ctx, group)
			if err == nil {
				o.mu.Lock()
				o.views++
				for _, p := range st.GetPartitions() {
					n, e := int(p.GetPartition()), p.GetEpoch()
					if o.owners[n] == nil {
						o.owners[n] = map[uint64]string{}
					}
					if was, ok := o.owners[n][e]; ok && was != p.GetOwner() && p.GetOwner() != "" {
						t.Errorf("G2: partition %d epoch %d shown owned by %s and by %s", n, e, was, p.GetOwner())
					}
					if p.GetOwner() != "" {
						o.owners[n][e] = p.GetOwner()
					}
					if e < o.latest[n] {
						t.Errorf("G8: partition %d went from epoch %d back to %d", n, o.latest[n], e)
					}
					o.latest[n] = e
				}
				o.mu.Unlock()
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	return o
}

// TestGroupFencedStore runs four member processes (test/cmd/groupmember) of one group
// writing to a fenced store, one key per partition with the partition's epoch as the
// token, through three faults: a member killed with SIGKILL, one stopped with SIGSTOP
// past its TTL (and resumed), one added; then a planned leave (SIGTERM). It checks that
// the service never showed two owners of a partition and that its epochs never went
// back (G2, G8, from Status every 20 ms), that every accepted write's epoch is one the
// service assigned to that very member, that porcupine finds the store's history of
// every partition linearizable as a fenced register, and that every partition
// was written again by a live member after each fault. It logs the hand-over times.
func TestGroupFencedStore(t *testing.T) {
	s := StartServer(t)
	c := s.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const group, parts, ttl, drain = "e2e/orders", 12, time.Second, time.Second
	if err := c.CreateGroup(ctx, group, parts, drain); err != nil {
		t.Fatal(err)
	}
	store := startFencedStore(t)
	owners := followOwners(ctx, t, c, group)
	members := map[string]*Proc{}
	start := func(name string) {
		members[name] = StartProc(t, groupmemberBin, "--addr", s.Addr, "--group", group, "--member", name,
			"--ttl", ttl.String(), "--store", store.url)
	}
	// movedFrom waits until every partition whose last accepted write was name's has an
	// accepted write of another member, and returns how long that took.
	movedFrom := func(name string, since time.Time) time.Duration {
		t.Helper()
		var mine []int
		for p, w := range store.last() {
			if w.member == name {
				mine = append(mine, p)
			}
		}
		if len(mine) == 0 {
			t.Fatalf("%s wrote no partition", name)
		}
		if !eventually(10*time.Second, func() bool {
			last := store.last()
			for _, p := range mine {
				if last[p].member == name {
					return false
				}
			}
			return true
		}) {
			t.Fatalf("%s's partitions %v were not written by another member within 10s", name, mine)
		}
		return time.Since(since)
	}
	allWritten := func(what string) {
		t.Helper()
		if !eventually(10*time.Second, func() bool { return len(store.last()) == parts }) {
			t.Fatalf("%s: only %d of %d partitions written", what, len(store.last()), parts)
		}
	}

	for _, m := range []string{"m1", "m2", "m3"} {
		start(m)
	}
	allWritten("three members")
	time.Sleep(500 * time.Millisecond)

	killed := time.Now()
	members["m1"].Signal(syscall.SIGKILL)
	t.Logf("hand-over after kill -9 (TTL %v): %v", ttl, movedFrom("m1", killed).Round(time.Millisecond))

	paused := time.Now()
	members["m2"].Signal(syscall.SIGSTOP)
	t.Logf("hand-over after SIGSTOP (TTL %v): %v", ttl, movedFrom("m2", paused).Round(time.Millisecond))
	time.Sleep(time.Until(paused.Add(3 * ttl)))
	resumed := time.Now()
	members["m2"].Signal(syscall.SIGCONT)

	start("m4")
	if !eventually(10*time.Second, func() bool {
		for _, w := range store.last() {
			if w.member == "m4" {
				return true
			}
		}
		return false
	}) {
		t.Fatal("m4 never wrote")
	}
	time.Sleep(500 * time.Millisecond)

	left := time.Now()
	members["m3"].Signal(syscall.SIGTERM)
	t.Logf("hand-over after a planned leave: %v", movedFrom("m3", left).Round(time.Millisecond))
	if code := members["m3"].Wait(10 * time.Second); code != 0 {
		t.Errorf("m3 exited %d after SIGTERM", code)
	}
	allWritten("after the faults")
	for _, m := range []string{"m2", "m4"} {
		members[m].Signal(syscall.SIGTERM)
		members[m].Wait(10 * time.Second)
	}
	cancel()

	// The checks over the whole run.
	store.mu.Lock()
	writes := slices.Clone(store.writes)
	store.mu.Unlock()
	owners.mu.Lock()
	defer owners.mu.Unlock()
	assigned := map[int]map[uint64]string{} // from the members' own ASSIGNED lines
	for name, p := range members {
		for _, line := range p.Stdout() {
			var part int
			var epoch uint64
			if n, _ := fmt.Sscanf(line, "ASSIGNED %d %d", &part, &epoch); n == 2 {
				if assigned[part] == nil {
					assigned[part] = map[uint64]string{}
				}
				if other, ok := assigned[part][epoch]; ok {
					t.Errorf("G2: partition %d epoch %d assigned to %s and %s", part, epoch, other, name)
				}
				assigned[part][epoch] = name
				if seen, ok := owners.owners[part][epoch]; ok && seen != name {
					t.Errorf("G2: %s was assigned partition %d at epoch %d, the service showed it %s's", name, part, epoch, seen)
				}
			}
		}
	}
	var accepted, rejected, lateM2 int
	for _, w := range writes {
		if !w.accepted {
			rejected++
			if w.member == "m2" && w.call.After(resumed) {
				lateM2++
			}
			continue
		}
		accepted++
		if owner := assigned[w.partition][w.epoch]; owner != w.member {
			t.Errorf("an accepted write of %s to partition %d at epoch %d, which the service assigned to %q", w.member, w.partition, w.epoch, owner)
		}
	}
	t.Logf("%d status views, %d writes accepted, %d rejected as stale (%d by m2 after its resume)", owners.views, accepted, rejected, lateM2)
	if res := checkFencedRegisters(writes); res != porcupine.Ok {
		t.Errorf("porcupine: the store's history is not linearizable as one fenced register per partition (%v)", res)
	}
}

// checkFencedRegisters checks with porcupine that the writes are a history of one
// fenced register per partition: a write is accepted iff its epoch is not below the
// highest accepted before it.
func checkFencedRegisters(writes []groupWrite) porcupine.CheckResult {
	type in struct {
		partition int
		epoch     uint64
	}
	model := porcupine.Model{
		Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
			by := map[int][]porcupine.Operation{}
			for _, op := range history {
				p := op.Input.(in).partition
				by[p] = append(by[p], op)
			}
			var out [][]porcupine.Operation
			for _, ops := range by {
				out = append(out, ops)
			}
			return out
		},
		Init: func() any { return uint64(0) },
		Step: func(state, input, output any) (bool, any) {
			highest, w, ok := state.(uint64), input.(in), output.(bool)
			if ok {
				return w.epoch >= highest, max(highest, w.epoch)
			}
			return w.epoch < highest, highest
		},
		DescribeOperation: func(input, output any) string {
			return fmt.Sprintf("write(p%d, %d) → %v", input.(in).partition, input.(in).epoch, output)
		},
	}
	ops := make([]porcupine.Operation, 0, len(writes))
	for i, w := range writes {
		ops = append(ops, porcupine.Operation{ClientId: i, Input: in{w.partition, w.epoch}, Output: w.accepted,
			Call: w.call.UnixNano(), Return: w.ret.UnixNano()})
	}
	return porcupine.CheckOperationsTimeout(model, ops, 30*time.Second)
}

// TestCLIGroup runs 'leasehold group create|join|status' as the README shows them: a
// join prints each partition it is assigned with its epoch, a second member takes its
// share (the first prints the partitions it stops), status shows it (also as JSON),
// and SIGTERM makes a member leave (exit 0, its partitions move at once).
func TestCLIGroup(t *testing.T) {
	s := StartServer(t)
	r := RunCLI(t, 20*time.Second, "group", "create", "e2e/cli", "--partitions", "4", "--drain", "2s", "--addr", s.Addr)
	if r.Code != 0 || !strings.Contains(r.Stdout, "created group e2e/cli with 4 partitions") {
		t.Fatalf("create: %d %q %q", r.Code, r.Stdout, r.Stderr)
	}
	if r := RunCLI(t, 20*time.Second, "group", "create", "e2e/cli", "--partitions", "5", "--addr", s.Addr); r.Code != exitError {
		t.Fatalf("create with other settings: %d %q", r.Code, r.Stderr)
	}
	a := StartProc(t, leaseholdBin, "group", "join", "e2e/cli", "a", "--addr", s.Addr, "--ttl", "2s")
	for range 4 {
		a.Expect("assigned e2e/cli/", 15*time.Second)
	}
	b := StartProc(t, leaseholdBin, "group", "join", "e2e/cli", "b", "--addr", s.Addr, "--ttl", "2s", "--weight", "3")
	line := a.Expect("stopped e2e/cli/", 15*time.Second)
	if !strings.Contains(line.Text, "moving to another member") {
		t.Errorf("a stopped a partition with %q", line.Text)
	}
	b.Expect("assigned e2e/cli/", 15*time.Second)
	if !eventually(10*time.Second, func() bool {
		r := RunCLI(t, 20*time.Second, "group", "status", "e2e/cli", "--addr", s.Addr, "--output", "json")
		var st struct {
			Members []struct {
				Name string `json:"name"`
				Owns int    `json:"owns"`
			} `json:"members"`
			Partitions []struct {
				Owner    string `json:"owner"`
				Epoch    string `json:"epoch"` // protojson: a uint64 is a string
				Draining bool   `json:"draining"`
			} `json:"partitions"`
		}
		if r.Code != 0 || json.Unmarshal([]byte(r.Stdout), &st) != nil || len(st.Members) != 2 || len(st.Partitions) != 4 {
			return false
		}
		for _, p := range st.Partitions {
			if p.Draining || p.Epoch == "0" {
				return false
			}
		}
		return st.Members[0].Owns+st.Members[1].Owns == 4 && st.Members[1].Owns > 0 // b, weight 3
	}) {
		t.Fatal("status never showed every partition owned, b's share moved")
	}
	r = RunCLI(t, 20*time.Second, "group", "status", "e2e/cli", "--addr", s.Addr)
	if r.Code != 0 || !strings.Contains(r.Stdout, "MEMBER") || !strings.Contains(r.Stdout, "PARTITION") {
		t.Fatalf("status: %d %q %q", r.Code, r.Stdout, r.Stderr)
	}
	b.Signal(syscall.SIGTERM)
	if code := b.Wait(10 * time.Second); code != 0 {
		t.Fatalf("join exited %d after SIGTERM", code)
	}
	if !slices.ContainsFunc(b.Stdout(), func(l string) bool { return strings.HasPrefix(l, "left group e2e/cli") }) {
		t.Errorf("b did not say it left: %q", b.Stdout())
	}
	a.Expect("assigned e2e/cli/", 10*time.Second) // b's partitions come back to a
	if r := RunCLI(t, 20*time.Second, "group", "status", "e2e/nope", "--addr", s.Addr); r.Code != exitError || !strings.Contains(r.Stderr, "no such group") {
		t.Fatalf("status of an unknown group: %d %q", r.Code, r.Stderr)
	}
}

// TestGroupMemberServerPaused: while the server is stopped (SIGSTOP) nothing can
// confirm a member's ownership, so each partition's handler is stopped at the
// partition's own cautious deadline (ErrPartitionDeadline) — within the drain deadline
// of the last confirmation, before the service could have moved the partition — though
// the member's lease (TTL 5 s) is still alive; once the server runs again the member
// gives the partitions back and gets them again at new, larger epochs.
func TestGroupMemberServerPaused(t *testing.T) {
	s := StartServer(t)
	c := s.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const group, parts, drain = "e2e/paused-server", 4, time.Second
	if err := c.CreateGroup(ctx, group, parts, drain); err != nil {
		t.Fatal(err)
	}
	store := startFencedStore(t)
	m := StartProc(t, groupmemberBin, "--addr", s.Addr, "--group", group, "--member", "m", "--ttl", "5s", "--store", store.url)
	epochs := map[int]uint64{}
	for range parts {
		var p int
		var e uint64
		line := m.Expect("ASSIGNED ", 15*time.Second)
		if n, _ := fmt.Sscanf(line.Text, "ASSIGNED %d %d", &p, &e); n != 2 {
			t.Fatalf("%q", line.Text)
		}
		epochs[p] = e
	}
	time.Sleep(500 * time.Millisecond)
	stopped := time.Now()
	s.Signal(syscall.SIGSTOP)
	resumed := false
	defer func() {
		if !resumed {
			s.Signal(syscall.SIGCONT)
		}
	}()
	for range parts {
		line := m.Expect("STOPPED ", 5*time.Second)
		if !strings.Contains(line.Text, "ownership not confirmed") {
			t.Errorf("stopped with %q, want the partition's own deadline", line.Text)
		}
		if after := line.At.Sub(stopped); after >= drain {
			t.Errorf("%q came %v after the server stopped, not within the drain deadline %v", line.Text, after, drain)
		}
	}
	time.Sleep(time.Until(stopped.Add(2500 * time.Millisecond)))
	s.Signal(syscall.SIGCONT)
	resumed = true
	for range parts {
		var p int
		var e uint64
		line := m.Expect("ASSIGNED ", 15*time.Second)
		if n, _ := fmt.Sscanf(line.Text, "ASSIGNED %d %d", &p, &e); n != 2 || e <= epochs[p] {
			t.Errorf("after the pause: %q, the epoch before was %d", line.Text, epochs[p])
		}
	}
}
