package e2e

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/leasehold/leasehold/client"
)

// TestElectLeadersKilledAndPaused (G8): three `leasehold elect` candidates (TTL 1 s)
// while, for about 12 s, the current leader's process is killed with SIGKILL (and a
// new candidate started) or paused with SIGSTOP for 2 s, at random. An Observe
// stream, on its own client, and Leader polls check the service's view: the epochs
// Observe shows strictly increase, each change once; every epoch a poll saw is one
// Observe showed; a leader shown is never followed by a lower epoch; and every
// candidate's CMD gets the epoch it was elected under.
func TestElectLeadersKilledAndPaused(t *testing.T) {
	s := StartServer(t)
	c := s.Client(t)
	const name = "e2e/elect/faults"
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()

	type change struct {
		epoch uint64
		ok    bool
	}
	var mu sync.Mutex
	var observed []change
	octx, ostop := context.WithCancel(ctx)
	odone := make(chan error, 1)
	go func() {
		odone <- c.Observe(octx, name, func(l client.ElectionLeader, ok bool) error {
			mu.Lock()
			observed = append(observed, change{l.Epoch, ok})
			mu.Unlock()
			return nil
		})
	}()

	byPid := map[int]*Proc{}
	var all []*Proc
	start := func() {
		p := electProc(t, s, name, "v", "--ttl", "1s")
		byPid[p.Pid()] = p
		all = append(all, p)
	}
	for range 3 {
		start()
	}
	polled := map[uint64]bool{}
	var rounds, kills, pauses int
	// About 12 s of faults, and at least four rounds: a pause round takes 3.5 s, so
	// four pauses in a row need more than 12 s once finding each new leader takes a
	// moment (a slow machine ran only three). Up to 10 s more for the fourth, which
	// leaves ctx time for the checks.
	end := time.Now().Add(12 * time.Second)
	for time.Now().Before(end) || (rounds < 4 && time.Now().Before(end.Add(10*time.Second))) {
		lctx, lcancel := context.WithTimeout(ctx, 2*time.Second)
		ld, ok, err := c.Leader(lctx, name)
		lcancel()
		if err != nil || !ok {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		polled[ld.Epoch] = true
		p := byPid[int(ld.Holder.PID)]
		if p == nil {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		rounds++
		if rand.IntN(2) == 0 {
			kills++
			p.Signal(syscall.SIGKILL)
		} else {
			pauses++
			p.Signal(syscall.SIGSTOP)
			time.Sleep(2 * time.Second)
			p.Signal(syscall.SIGCONT)
		}
		// Killed, or paused past its 1 s TTL (it has lost the leadership: `leasehold
		// elect` kills its CMD and exits), the candidate is replaced. Replacing only
		// the killed ones left no candidate at all after three pauses in a row, and
		// no more rounds (a CI run: "only 3 rounds of faults", 3 pauses).
		delete(byPid, p.Pid())
		start()
		time.Sleep(1500 * time.Millisecond)
	}
	time.Sleep(2 * time.Second)
	ostop()
	if err := <-odone; err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("Observe ended with %v", err)
	}
	t.Logf("%d rounds: %d kills, %d pauses; Observe saw %d changes; Leader polls saw %d epochs", rounds, kills, pauses, len(observed), len(polled))
	if rounds < 4 {
		t.Fatalf("only %d rounds of faults", rounds)
	}

	mu.Lock()
	defer mu.Unlock()
	shown := map[uint64]bool{}
	var last change
	for i, ch := range observed {
		switch {
		case i == 0:
		case ch.ok && ch.epoch <= last.epoch:
			t.Errorf("G8: Observe showed epoch %d after %d (change %d): %v", ch.epoch, last.epoch, i, observed)
		case !ch.ok && (!last.ok || ch.epoch != last.epoch):
			t.Errorf("Observe showed the end of epoch %d after %+v (change %d)", ch.epoch, last, i)
		}
		if ch.ok {
			shown[ch.epoch] = true
		}
		last = ch
	}
	for e := range polled {
		if !shown[e] {
			t.Errorf("Leader answered epoch %d, which Observe never showed: %v", e, observed)
		}
	}
	// Every CMD that ran was told the epoch it led under, and two CMDs never got one.
	got := map[uint64]int{}
	for _, p := range all {
		for _, line := range p.Stdout() {
			var e uint64
			var pid int
			if _, err := fmt.Sscanf(line, "lead %d %d", &e, &pid); err == nil {
				got[e]++
				t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) }) // a killed leasehold's CMD outlives it
			}
		}
	}
	for e, n := range got {
		if n > 1 {
			t.Errorf("epoch %d was handed to %d CMDs", e, n)
		}
		if !shown[e] {
			t.Errorf("a CMD ran under epoch %d, which Observe never showed", e)
		}
	}
}
