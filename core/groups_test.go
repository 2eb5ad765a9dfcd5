package core

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

func createGroup(name string, partitions uint64) Command {
	return Command{Op: OpGroupCreate, Name: name, Count: partitions, DrainMillis: 5000}
}

func join(group, member string, lease LeaseID) Command {
	return Command{Op: OpGroupJoin, Name: group, Member: member, Lease: lease}
}

func owners(s *State, group string) []string {
	v, _ := s.Group(group)
	out := make([]string, len(v.Partitions))
	for i, p := range v.Partitions {
		out[i] = p.Owner
		if p.Draining {
			out[i] += "*"
		}
	}
	return out
}

// TestGroupMove walks a partition through a move: the first member owns all, a second
// one's join starts drains (the partitions stay the first's), a release grants the
// partition to the second at a new epoch, a drain deadline does the same for the rest,
// and the first member's lease ending hands everything to the second at once.
func TestGroupMove(t *testing.T) {
	h := newHarness(t, Limits{}, leaseA, leaseB)
	h.ok(createGroup("g", 8))
	h.unchanged(createGroup("g", 8)) // a retried create
	h.fails(Command{Op: OpGroupCreate, Name: "g", Count: 9, DrainMillis: 5000}, ErrGroupExists)
	if got := owners(h.s, "g"); !slices.Equal(got, make([]string, 8)) {
		t.Fatalf("owners without members: %q", got)
	}
	r := h.ok(join("g", "a", leaseA))
	if len(r.Effects) != 8 {
		t.Fatalf("join of the only member: %+v", r.Effects)
	}
	first := h.s.LastToken()
	for i, e := range r.Effects {
		if e.Kind != EffectPartitionAssigned || e.Partition != uint32(i) || e.Note != "a" || e.Lease != leaseA || e.Token != first-7+uint64(i) {
			t.Fatalf("effect %d: %+v", i, e)
		}
	}
	h.unchanged(join("g", "a", leaseA)) // a retried join
	h.fails(join("g", "a", leaseB), ErrMemberExists)

	r = h.ok(join("g", "b", leaseB))
	var draining []uint32
	for _, e := range r.Effects {
		if e.Kind != EffectPartitionDraining || e.Note != "a" || e.DelayMillis != 5000 {
			t.Fatalf("join of a second member: %+v", r.Effects)
		}
		draining = append(draining, e.Partition)
	}
	if len(draining) == 0 || len(draining) == 8 {
		t.Fatalf("b would take %d of 8 partitions", len(draining))
	}
	for _, p := range owners(h.s, "g") {
		if p != "a" && p != "a*" {
			t.Fatalf("a partition moved before its owner released it: %q", owners(h.s, "g"))
		}
	}
	v, _ := h.s.Group("g")
	p0 := v.Partitions[draining[0]]
	h.fails(Command{Op: OpGroupRelease, Name: "g", Partition: draining[0], Token: p0.Epoch, Lease: leaseB}, ErrNotOwner)
	h.fails(Command{Op: OpGroupRelease, Name: "g", Partition: draining[0], Token: p0.Epoch + 100, Lease: leaseA}, ErrNotOwner)
	h.fails(Command{Op: OpGroupRelease, Name: "g", Partition: 8, Token: p0.Epoch, Lease: leaseA}, ErrInvalid)
	r = h.ok(Command{Op: OpGroupRelease, Name: "g", Partition: draining[0], Token: p0.Epoch, Lease: leaseA})
	wantEffects(t, r.Effects,
		Effect{Kind: EffectPartitionReleased, Name: "g", Partition: draining[0], Note: "a", Lease: leaseA, Token: p0.Epoch},
		Effect{Kind: EffectPartitionAssigned, Name: "g", Partition: draining[0], Note: "b", Lease: leaseB, Token: h.s.LastToken()})
	h.unchanged(Command{Op: OpGroupRelease, Name: "g", Partition: draining[0], Token: p0.Epoch, Lease: leaseA}) // retried
	h.unchanged(Command{Op: OpGroupDrainEnd, Name: "g", Partition: draining[0], Token: p0.Epoch})               // late deadline

	for _, p := range draining[1:] {
		v, _ := h.s.Group("g")
		r = h.ok(Command{Op: OpGroupDrainEnd, Name: "g", Partition: p, Token: v.Partitions[p].Epoch})
		if len(r.Effects) != 2 || r.Effects[1].Note != "b" {
			t.Fatalf("drain deadline of %d: %+v", p, r.Effects)
		}
	}
	if parts, ok := h.s.GroupAssignments("g", "b", leaseB); !ok || len(parts) != len(draining) {
		t.Fatalf("b's assignments: %+v %v", parts, ok)
	}
	if _, ok := h.s.GroupAssignments("g", "b", leaseA); ok {
		t.Fatal("assignments of b under a's lease")
	}

	before := h.s.LastToken()
	r = h.ok(Command{Op: OpExpire, Lease: leaseA})
	if got := owners(h.s, "g"); !slices.Equal(got, slices.Repeat([]string{"b"}, 8)) {
		t.Fatalf("after a's lease ended: %q (%+v)", got, r.Effects)
	}
	v, _ = h.s.Group("g")
	for _, p := range v.Partitions {
		if !slices.Contains(draining, uint32(p.Partition)) && p.Epoch <= before {
			t.Fatalf("partition %d kept an old epoch %d", p.Partition, p.Epoch)
		}
	}
	if len(v.Members) != 1 || v.Members[0] != (GroupMemberView{Name: "b", Weight: 1, Owns: 8}) {
		t.Fatalf("members: %+v", v.Members)
	}
	h.fails(Command{Op: OpGroupLeave, Name: "g", Member: "b", Lease: leaseA}, ErrNotMember)
	h.ok(Command{Op: OpGroupLeave, Name: "g", Member: "b", Lease: leaseB})
	if got := owners(h.s, "g"); !slices.Equal(got, make([]string, 8)) {
		t.Fatalf("after the last member left: %q", got)
	}
	h.fails(join("nope", "a", leaseB), ErrGroupNotFound)
	h.fails(join("g", "a", leaseA), ErrLeaseNotFound)
}

// TestGroupValidation: every field of every group command is checked, naming it.
func TestGroupValidation(t *testing.T) {
	h := newHarness(t, Limits{}, leaseA)
	for _, tc := range []struct {
		c     Command
		field string
	}{
		{Command{Op: OpGroupCreate, Name: "a b", Count: 1, DrainMillis: 1}, "group"},
		{Command{Op: OpGroupCreate, Name: "g", DrainMillis: 1}, "partitions"},
		{Command{Op: OpGroupCreate, Name: "g", Count: MaxPartitions + 1, DrainMillis: 1}, "partitions"},
		{Command{Op: OpGroupCreate, Name: "g", Count: 1}, "drain_ms"},
		{Command{Op: OpGroupCreate, Name: "g", Count: 1, DrainMillis: MaxDrainMillis + 1}, "drain_ms"},
		{Command{Op: OpGroupCreate, Name: "g", Count: 1, DrainMillis: MinDrainMillis - 1}, "drain_ms"},
		{Command{Op: OpGroupJoin, Name: "g", Lease: leaseA}, "member"},
		{Command{Op: OpGroupJoin, Name: "g", Member: "m"}, "lease_id"},
		{Command{Op: OpGroupJoin, Name: "g", Member: "m", Lease: leaseA, Weight: MaxWeight + 1}, "weight"},
		{Command{Op: OpGroupLeave, Name: "g", Member: "m"}, "lease_id"},
		{Command{Op: OpGroupRelease, Name: "g", Token: 1}, "lease_id"},
		{Command{Op: OpGroupRelease, Name: "g", Lease: leaseA}, "epoch"},
		{Command{Op: OpGroupDrainEnd, Name: "g", Partition: MaxPartitions, Token: 1}, "partition"},
	} {
		r := h.fails(tc.c, ErrInvalid)
		var fe *FieldError
		if !errors.As(r.Err, &fe) || fe.Field != tc.field {
			t.Errorf("%v %+v: %v, want field %s", tc.c.Op, tc.c, r.Err, tc.field)
		}
	}
}

// TestGroupLimits: the group and member limits answer ResourceExhausted's sentinels and
// change nothing.
func TestGroupLimits(t *testing.T) {
	h := newHarness(t, Limits{MaxGroups: 2, MaxGroupMembers: 2}, leaseA, leaseB, leaseC)
	h.ok(createGroup("g1", 4))
	h.ok(createGroup("g2", 4))
	h.fails(createGroup("g3", 4), ErrTooManyGroups)
	h.ok(join("g1", "a", leaseA))
	h.ok(join("g1", "b", leaseB))
	h.fails(join("g1", "c", leaseC), ErrTooManyMembers)
	h.ok(join("g2", "c", leaseC))
}

// TestGroupWeights: partitions spread in proportion to the weights, and the hash is
// the same for the same names (replicas agree; a restart does not reshuffle).
func TestGroupWeights(t *testing.T) {
	h := newHarness(t, Limits{}, leaseA, leaseB, leaseC)
	h.ok(createGroup("w", 3000))
	h.ok(Command{Op: OpGroupJoin, Name: "w", Member: "heavy", Lease: leaseA, Weight: 4})
	h.ok(join("w", "one", leaseB))
	h.ok(Command{Op: OpGroupJoin, Name: "w", Member: "three", Lease: leaseC, Weight: 3})
	wants := map[string]int{}
	g := h.s.groups.groups["w"]
	for _, p := range g.parts {
		wants[p.want]++
	}
	for name, w := range map[string]int{"heavy": 4, "one": 1, "three": 3} {
		exp := 3000 * w / 8
		if got := wants[name]; got < exp*85/100 || got > exp*115/100 {
			t.Errorf("%s (weight %d) is wanted by %d of 3000 partitions, expected about %d", name, w, got, exp)
		}
	}
	// A weight change moves partitions towards the new weights.
	h.ok(Command{Op: OpGroupJoin, Name: "w", Member: "one", Lease: leaseB, Weight: 4})
	n := 0
	for _, p := range g.parts {
		if p.want == "one" {
			n++
		}
	}
	if n < 1000 {
		t.Errorf("one, now weight 4 of 11, is wanted by %d of 3000", n)
	}
	if negLog2(1<<63) != 1<<32 || negLog2(1) != 64<<32 || negLog2(0) != 64<<32 {
		t.Errorf("negLog2: %d %d", negLog2(1<<63), negLog2(1))
	}
	for _, h := range []uint64{3 << 62, 12345, 1<<64 - 1, 0x9e3779b97f4a7c15} {
		want := -math.Log2(float64(h) / (1 << 64))
		if got := float64(negLog2(h)) / (1 << 32); math.Abs(got-want) > 1e-8 {
			t.Errorf("negLog2(%#x) = %v, want %v", h, got, want)
		}
	}
}

// TestGroupCommandsRoundTrip: every group command survives the binary format.
func TestGroupCommandsRoundTrip(t *testing.T) {
	for _, c := range []Command{
		createGroup("g", 4096),
		{Op: OpGroupJoin, Name: "g", Member: "m-1", Lease: leaseA, Weight: 1000},
		{Op: OpGroupLeave, Name: "g", Member: "m-1", Lease: leaseA},
		{Op: OpGroupRelease, Name: "g", Partition: 4095, Token: 1 << 60, Lease: leaseA},
		{Op: OpGroupDrainEnd, Name: "g", Token: 7},
	} {
		b, err := EncodeCommand(c)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) > commandSize(c) {
			t.Fatalf("%v: %d bytes, commandSize %d", c.Op, len(b), commandSize(c))
		}
		got, err := DecodeCommand(b)
		if err != nil || fmt.Sprint(got) != fmt.Sprint(c) {
			t.Fatalf("%v: round trip gave %+v, %v", c.Op, got, err)
		}
	}
	if OpGroupCreate.String() != "group-create" || OpGroupDrainEnd.String() != "group-drain-end" {
		t.Fatal("names of the group ops")
	}
}

// TestGroupSnapshot: groups survive a snapshot, a restored state goes on exactly as the
// original, and snapshots written before groups still restore.
func TestGroupSnapshot(t *testing.T) {
	h := newHarness(t, Limits{}, leaseA, leaseB)
	h.ok(createGroup("g", 16))
	h.ok(createGroup("empty", 2))
	h.ok(join("g", "a", leaseA))
	h.ok(Command{Op: OpGroupJoin, Name: "g", Member: "b", Lease: leaseB, Weight: 3}) // some partitions drain
	b := mustSnapshot(t, h.s)
	if !bytes.Contains(b, []byte(`"groups":[{"name":"empty"`)) || !bytes.Contains(b, []byte(`"draining":true`)) {
		t.Fatalf("snapshot: %s", b)
	}
	s2, err := RestoreState(b, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if b2 := mustSnapshot(t, s2); !bytes.Equal(b, b2) {
		t.Fatalf("restored state encodes differently:\n%s\n%s", b, b2)
	}
	for _, s := range []*State{h.s, s2} {
		s.Apply(Command{Op: OpExpire, Lease: leaseA})
	}
	if !bytes.Equal(mustSnapshot(t, h.s), mustSnapshot(t, s2)) {
		t.Fatal("restored state diverged")
	}
	if s, err := RestoreState(snapJSONVersion(snapshotV2, `{"seq":3,"leases":[],"locks":[],"tombstones":null}`), Limits{}); err != nil || s.NumGroups() != 0 {
		t.Fatalf("a snapshot without groups: %v", err)
	}
}

func TestGroupSnapshotRejects(t *testing.T) {
	lease := leaseA.String()
	pre := `{"seq":9,"leases":[{"id":"` + lease + `","ttl":1000}],"locks":[],"tombstones":null,"groups":[`
	member := `"members":[{"name":"a","lease":"` + lease + `","weight":1}]`
	for name, body := range map[string]string{
		"null":            `null]`,
		"bad name":        `{"name":"a b","partitions":1,"drainMs":1000}]`,
		"no partitions":   `{"name":"g","partitions":0,"drainMs":1000}]`,
		"no drain":        `{"name":"g","partitions":1}]`,
		"short drain":     `{"name":"g","partitions":1,"drainMs":99}]`,
		"twice":           `{"name":"g","partitions":1,"drainMs":1000},{"name":"g","partitions":1,"drainMs":1000}]`,
		"unknown lease":   `{"name":"g","partitions":1,"drainMs":1000,"members":[{"name":"a","lease":"` + leaseB.String() + `","weight":1}]}]`,
		"zero weight":     `{"name":"g","partitions":1,"drainMs":1000,"members":[{"name":"a","lease":"` + lease + `","weight":0}]}]`,
		"unowned":         `{"name":"g","partitions":1,"drainMs":1000,` + member + `}]`,
		"future epoch":    `{"name":"g","partitions":1,"drainMs":1000,` + member + `,"owners":[{"p":0,"member":"a","epoch":10}]}]`,
		"stranger owns":   `{"name":"g","partitions":1,"drainMs":1000,` + member + `,"owners":[{"p":0,"member":"z","epoch":1}]}]`,
		"out of range":    `{"name":"g","partitions":1,"drainMs":1000,` + member + `,"owners":[{"p":0,"member":"a","epoch":1},{"p":1,"member":"a","epoch":2}]}]`,
		"drain no owner":  `{"name":"g","partitions":1,"drainMs":1000,"owners":[{"p":0,"epoch":1,"draining":true}]}]`,
		"unknown field":   `{"name":"g","partitions":1,"drainMs":1000,"x":1}]`,
		"owned, no lease": `{"name":"g","partitions":1,"drainMs":1000,"owners":[{"p":0,"member":"a","epoch":1}]}]`,
	} {
		if _, err := RestoreState(snapJSONVersion(snapshotV2, pre+body+`}`), Limits{}); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", name, err)
		}
	}
	ok := `{"name":"g","partitions":1,"drainMs":1000,` + member + `,"owners":[{"p":0,"member":"a","epoch":1}]}]`
	if _, err := RestoreState(snapJSONVersion(snapshotV2, pre+ok+`}`), Limits{}); err != nil {
		t.Fatalf("a valid group: %v", err)
	}
}

// TestPropertyGroups runs random sequences of joins (with weights), leaves, lease
// grants and expiries, releases (right, stale and wrong) and drain deadlines against
// two groups, and after every command checks G2 and G8 as the service shows them
// (Status views and effects): a partition never has two owners — an assignment is
// reported only for a partition whose previous owner was reported released —, each
// partition's epochs strictly increase and every new epoch is larger than any token
// before it, every partition has an owner while its group has members, an owner is a
// live member, an owner the hash does not name is draining, a failing command changes
// no byte of the snapshot, the snapshot restores to the same bytes and behaves the same,
// and a twin fed the same commands stays byte-identical.
func TestPropertyGroups(t *testing.T) {
	seeds := 40
	if testing.Short() || raceEnabled {
		seeds = 10
	}
	for seed := range uint64(seeds) {
		if _, err := runGroupSequence(newRandChooser(seed), seed, 400); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
	}
}

// runGroupSequence runs steps random group commands chosen by ch (seed names the leases
// and sizes one group) and returns the final state.
func runGroupSequence(ch chooser, seed uint64, steps int) (*State, error) {
	limits := Limits{MaxGroupMembers: 4}
	s, twin := NewState(limits), NewState(limits)
	apply := func(c Command) Result {
		r := s.Apply(c)
		if r2 := twin.Apply(c); fmt.Sprint(r2) != fmt.Sprint(r) {
			panic(fmt.Sprintf("twin answered %+v, state %+v", r2, r))
		}
		return r
	}
	groups := []string{"g1", "g2"}
	parts := map[string]int{"g1": 1 + int(seed%7), "g2": 16}
	for _, g := range groups {
		if r := apply(Command{Op: OpGroupCreate, Name: g, Count: uint64(parts[g]), DrainMillis: 1000}); r.Err != nil {
			return nil, r.Err
		}
	}
	leases := make([]LeaseID, 5)
	nextID := uint16(1)
	grant := func(i int) {
		leases[i] = lid(uint32(seed)<<16 | uint32(nextID))
		nextID++
		apply(Command{Op: OpGrant, Lease: leases[i], TTLMillis: 1000})
	}
	for i := range leases {
		grant(i)
	}
	members := []string{"m0", "m1", "m2", "m3", "m4", "m5"}
	type seen struct {
		owner string
		epoch uint64
	}
	view := map[string][]seen{} // what the effects said, per partition
	for _, g := range groups {
		view[g] = make([]seen, parts[g])
	}
	for step := range steps {
		g := groups[ch.intn(2)]
		li := ch.intn(len(leases))
		var c Command
		switch k := ch.intn(100); {
		case k < 30:
			c = Command{Op: OpGroupJoin, Name: g, Member: members[ch.intn(len(members))], Lease: leases[li], Weight: uint32(ch.intn(4))}
		case k < 40:
			c = Command{Op: OpGroupLeave, Name: g, Member: members[ch.intn(len(members))], Lease: leases[li]}
		case k < 50:
			c = Command{Op: OpExpire, Lease: leases[li]}
		case k < 55:
			grant(li)
			continue
		case k < 80, k < 90:
			v, _ := s.Group(g)
			p := v.Partitions[ch.intn(len(v.Partitions))]
			op, epoch := OpGroupRelease, p.Epoch
			if k >= 80 {
				op = OpGroupDrainEnd
			}
			if ch.intn(4) == 0 {
				epoch = max(1, epoch+uint64(ch.intn(3))-1) // stale or future
			}
			c = Command{Op: op, Name: g, Partition: uint32(p.Partition), Token: epoch, Lease: leases[li]}
			if ch.intn(3) > 0 && p.Owner != "" {
				c.Lease = s.groups.groups[g].members[p.Owner].lease // mostly the owner's own release
			}
		default:
			c = Command{Op: OpGroupRelease, Name: g, Partition: uint32(ch.intn(parts[g] + 1)), Token: uint64(ch.intn(50) + 1), Lease: leases[li]}
		}
		before := mustSnapshotErr(s)
		lastBefore := s.LastToken()
		r := apply(c)
		if r.Err != nil {
			if !bytes.Equal(before, mustSnapshotErr(s)) || len(r.Effects) > 0 {
				return nil, fmt.Errorf("step %d: %v failed with %w but changed the state", step, c.Op, r.Err)
			}
			continue
		}
		for _, e := range r.Effects {
			switch e.Kind {
			case EffectPartitionReleased:
				cur := &view[e.Name][e.Partition]
				if cur.owner != e.Note || cur.epoch != e.Token {
					return nil, fmt.Errorf("step %d: %s/%d released by %s at %d, but the owner was %s at %d", step, e.Name, e.Partition, e.Note, e.Token, cur.owner, cur.epoch)
				}
				cur.owner = ""
			case EffectPartitionAssigned:
				cur := &view[e.Name][e.Partition]
				switch {
				case cur.owner != "":
					return nil, fmt.Errorf("step %d: %s/%d assigned to %s while %s owns it: two owners", step, e.Name, e.Partition, e.Note, cur.owner)
				case e.Token <= cur.epoch || e.Token <= lastBefore:
					return nil, fmt.Errorf("step %d: %s/%d epoch %d after %d (last token before %d)", step, e.Name, e.Partition, e.Token, cur.epoch, lastBefore)
				}
				*cur = seen{e.Note, e.Token}
			}
		}
		for _, gname := range groups {
			if err := checkGroup(s, gname); err != nil {
				return nil, fmt.Errorf("step %d (%v): %w", step, c.Op, err)
			}
			v, _ := s.Group(gname)
			for i, p := range v.Partitions {
				if w := view[gname][i]; p.Owner != w.owner || (p.Owner != "" && p.Epoch != w.epoch) {
					return nil, fmt.Errorf("step %d: %s/%d is %s at %d, the effects said %s at %d", step, gname, i, p.Owner, p.Epoch, w.owner, w.epoch)
				}
			}
		}
		if step%50 == 49 {
			b := mustSnapshotErr(s)
			restored, err := RestoreState(b, limits)
			if err != nil {
				return nil, fmt.Errorf("step %d: restore: %w", step, err)
			}
			if !bytes.Equal(b, mustSnapshotErr(restored)) {
				return nil, fmt.Errorf("step %d: restored snapshot differs", step)
			}
			twin = restored // from now on the restored state must behave as the original
		}
	}
	if !bytes.Equal(mustSnapshotErr(s), mustSnapshotErr(twin)) {
		return nil, errors.New("twin diverged")
	}
	return s, nil
}

// checkGroup checks a group's invariants directly on the state.
func checkGroup(s *State, name string) error {
	g := s.groups.groups[name]
	for mname, m := range g.members {
		if !s.live(m.lease) {
			return fmt.Errorf("%s: member %s has an ended lease", name, mname)
		}
		if _, ok := s.groups.byLease[m.lease][memberRef{name, mname}]; !ok {
			return fmt.Errorf("%s: member %s missing from the lease index", name, mname)
		}
	}
	for i, p := range g.parts {
		want := ""
		var best hrwScore
		for _, mn := range g.memberNames() {
			if sc := g.members[mn].score(i); want == "" || sc.beats(mn, best, want) {
				want, best = mn, sc
			}
		}
		switch {
		case p.want != want:
			return fmt.Errorf("%s/%d: cached want %q, the hash names %q", name, i, p.want, want)
		case len(g.members) > 0 && p.owner == "":
			return fmt.Errorf("%s/%d: no owner while %d members exist", name, i, len(g.members))
		case p.owner != "" && g.members[p.owner] == nil:
			return fmt.Errorf("%s/%d: owned by %q, not a member", name, i, p.owner)
		case p.owner != want && p.owner != "" && !p.draining:
			return fmt.Errorf("%s/%d: owned by %q, the hash names %q, and it is not draining", name, i, p.owner, want)
		case p.epoch > s.seq:
			return fmt.Errorf("%s/%d: epoch %d from the future", name, i, p.epoch)
		}
	}
	return nil
}

// FuzzGroupSequence runs the group property test's command sequence with choices read
// from the input, one byte each.
func FuzzGroupSequence(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 20, 30, 40, 50, 60, 70, 80, 90, 99})
	for seed := range uint64(4) {
		r := rand.New(rand.NewPCG(seed, 78))
		b := make([]byte, 400)
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) == 0 {
			return
		}
		if _, err := runGroupSequence(&byteChooser{b: slices.Clone(b[1:])}, uint64(b[0]), 300); err != nil {
			t.Fatal(err)
		}
	})
}

// BenchmarkGroupJoinLeave is the state machine's cost of churn in the largest group: one
// op is a Leave and a Join of one of 1,000 members of a 4,096-partition group (the
// partitions it owned granted to the others, then the partitions it is to own set
// draining), with no release; with every member of weight 1, and with weights 1 to 3.
func BenchmarkGroupJoinLeave(b *testing.B) {
	for _, mixed := range []bool{false, true} {
		name := "equal-weights"
		if mixed {
			name = "mixed-weights"
		}
		b.Run(name, func(b *testing.B) {
			s := NewState(Limits{})
			if r := s.Apply(Command{Op: OpGroupCreate, Name: "big", Count: MaxPartitions, DrainMillis: 1000}); r.Err != nil {
				b.Fatal(r.Err)
			}
			const members = 1000
			leases := make([]LeaseID, members)
			weight := func(i int) uint32 {
				if mixed {
					return uint32(1 + i%3)
				}
				return 1
			}
			for i := range leases {
				leases[i] = lid(uint32(i + 1))
				s.Apply(Command{Op: OpGrant, Lease: leases[i], TTLMillis: 10_000})
				if r := s.Apply(Command{Op: OpGroupJoin, Name: "big", Member: fmt.Sprintf("m%d", i), Lease: leases[i], Weight: weight(i)}); r.Err != nil {
					b.Fatal(r.Err)
				}
			}
			i := 0
			for b.Loop() {
				m := i % members
				i++
				name := fmt.Sprintf("m%d", m)
				if r := s.Apply(Command{Op: OpGroupLeave, Name: "big", Member: name, Lease: leases[m]}); r.Err != nil {
					b.Fatal(r.Err)
				}
				if r := s.Apply(Command{Op: OpGroupJoin, Name: "big", Member: name, Lease: leases[m], Weight: weight(m)}); r.Err != nil {
					b.Fatal(r.Err)
				}
			}
		})
	}
}

// TestScoreOrderIsTotal: the order of rendezvous scores is a strict total order —
// asymmetric, and transitive — over scores with many ties of the logarithm, so that
// the member a partition wants does not depend on the order members are looked at in.
func TestScoreOrderIsTotal(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	type named struct {
		s    hrwScore
		name string
	}
	pick := func() named {
		h := r.Uint64() >> (r.IntN(64)) // small hashes too, where the fixed point ties
		if r.IntN(4) == 0 {
			h = 1 << 63 >> r.IntN(63) // powers of two: exact logarithms, exact cross ties
		}
		return named{hrwScore{hash: h, weight: uint32(1 + r.IntN(4))}, string(rune('a' + r.IntN(3)))}
	}
	for range 200_000 {
		a, b, c := pick(), pick(), pick()
		if a == b {
			continue
		}
		ab, ba := a.s.beats(a.name, b.s, b.name), b.s.beats(b.name, a.s, a.name)
		if ab == ba {
			t.Fatalf("%+v and %+v: beats both ways or neither", a, b)
		}
		if ab && b.s.beats(b.name, c.s, c.name) && !a.s.beats(a.name, c.s, c.name) && a != c {
			t.Fatalf("not transitive: %+v > %+v > %+v, but not %+v > %+v", a, b, c, a, c)
		}
	}
}
