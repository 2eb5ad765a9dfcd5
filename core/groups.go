package core

import (
	"fmt"
	"math/bits"
	"slices"
	"strings"
)

// Groups and partitions (DESIGN.md "Group and partitions", G2, G8).
//
// A group has a fixed number of partitions P. Members join it with a lease and a weight;
// the state machine assigns every partition to a live member by weighted rendezvous
// (highest random weight) hashing, computed with integers only, so every replica makes
// the same choice. Each assignment carries an epoch from the token sequence: successive
// epochs of one partition strictly increase, and every epoch is larger than every token
// issued before it (G8), so an owner fences its writes with it like a lock's token.
//
// A partition has at most one owner in the replicated state (G2), and it moves only in
// three steps: when the hash names another member (one joined, or changed its weight)
// the partition starts to drain — it stays its owner's, flagged draining, and the leader
// starts a drain timer; then the owner releases it (OpGroupRelease), or the owner's
// lease ends (expired, revoked, or the member left), or the drain deadline passes
// (OpGroupDrainEnd, proposed by the leader's timer: the state machine has no clock, so
// the deadline reaches it as a command); only then is it granted to the member the hash
// names at that moment, at a new epoch. A partition whose owner leaves or whose owner's
// lease ends is granted again at once: the owner's client stopped before its lease could
// end (G4b), and a member leaves only after stopping. A partition that is draining stays
// draining until one of the three steps ends it, even if the hash names its owner again
// meanwhile (it is then granted back to the same member at a new epoch): the owner was
// told to stop and may have.
//
// While a group has members, every partition has an owner (draining or not): a
// partition is left without one only while no member exists.
const (
	// OpGroupCreate creates group Name with Count partitions and a drain deadline of
	// DrainMillis. Creating a group that exists with the same partitions and drain
	// deadline changes nothing (a retried create); with others it fails with
	// ErrGroupExists.
	OpGroupCreate Op = 60
	// OpGroupJoin makes Lease member Member of group Name with Weight (0 means 1). A
	// member that exists under the same lease takes the new weight; under another lease
	// the join fails with ErrMemberExists until that lease ends or the member leaves.
	OpGroupJoin Op = 61
	// OpGroupLeave removes member Member (of Lease) from group Name and frees its
	// partitions at once: the member promises it stopped working on them.
	OpGroupLeave Op = 62
	// OpGroupRelease gives partition Partition of group Name, owned by Lease at epoch
	// Token, back. Releasing an epoch that already ended changes nothing.
	OpGroupRelease Op = 63
	// OpGroupDrainEnd says that the drain deadline of partition Partition of group Name
	// at epoch Token passed: if it still drains at that epoch, it is taken from its
	// owner. Otherwise (released, moved, or not draining) it changes nothing.
	OpGroupDrainEnd Op = 64
)

// Bounds of groups. They are part of the API contract.
const (
	// MaxPartitions bounds a group's partition count.
	MaxPartitions = 4096
	// MaxWeight bounds a member's weight.
	MaxWeight = 1000
	// MinDrainMillis and MaxDrainMillis bound a group's drain deadline (100 ms to one
	// hour). Below 100 ms a member could not confirm a partition (a read) within the
	// deadline, and would give it up as soon as it got it.
	MinDrainMillis = 100
	MaxDrainMillis = 3600_000
)

// Effects of group commands.
const (
	// EffectPartitionAssigned: partition Partition of group Name was granted to member
	// Note (of Lease) at epoch Token.
	EffectPartitionAssigned EffectKind = 60
	// EffectPartitionDraining: partition Partition of group Name, owned by member Note
	// (of Lease) at epoch Token, started to drain; the leader must propose
	// OpGroupDrainEnd when DelayMillis have passed.
	EffectPartitionDraining EffectKind = 61
	// EffectPartitionReleased: member Note (of Lease) no longer owns partition Partition
	// of group Name at epoch Token (it released it, left, its lease ended, or the drain
	// deadline passed).
	EffectPartitionReleased EffectKind = 62
)

var groupOpNames = map[Op]string{OpGroupCreate: "group-create", OpGroupJoin: "group-join", OpGroupLeave: "group-leave",
	OpGroupRelease: "group-release", OpGroupDrainEnd: "group-drain-end"}

// group is one group as the state keeps it.
type group struct {
	name        string
	drainMillis int64
	members     map[string]*groupMember
	parts       []partition
}

type groupMember struct {
	name   string
	lease  LeaseID
	weight uint32
	seed   uint64 // hash of (group, member), the base of its scores
}

// partition is one partition: its owner ("" when none) and epoch (the epoch of its last
// grant, kept after the owner is gone), and the member the hash names (want, with its
// score; derived from the members, not part of a snapshot).
type partition struct {
	owner    string
	epoch    uint64
	draining bool
	want     string
	score    hrwScore
}

// groupStore holds the groups of a State.
type groupStore struct {
	groups  map[string]*group
	byLease map[LeaseID]map[memberRef]struct{} // the memberships of each lease
}

type memberRef struct{ group, member string }

func newGroupStore() groupStore {
	return groupStore{groups: make(map[string]*group), byLease: make(map[LeaseID]map[memberRef]struct{})}
}

// PartitionView is one partition as Status and Assignments show it. It never shows the
// owner's lease.
type PartitionView struct {
	Partition int
	Owner     string // "" when no member exists
	Epoch     uint64 // the epoch of the owner's grant (of the last grant when unowned)
	Draining  bool
}

// GroupMemberView is one member as Status shows it.
type GroupMemberView struct {
	Name   string
	Weight uint32
	Owns   int // partitions it owns, draining or not
}

// GroupView is a group as Status shows it.
type GroupView struct {
	Name        string
	DrainMillis int64
	Members     []GroupMemberView // by name
	Partitions  []PartitionView   // by partition, all of them
}

// Group returns group name, or false when it does not exist.
func (s *State) Group(name string) (GroupView, bool) {
	g := s.groups.groups[name]
	if g == nil {
		return GroupView{}, false
	}
	v := GroupView{Name: g.name, DrainMillis: g.drainMillis, Partitions: make([]PartitionView, len(g.parts))}
	owns := make(map[string]int, len(g.members))
	for i, p := range g.parts {
		v.Partitions[i] = PartitionView{Partition: i, Owner: p.owner, Epoch: p.epoch, Draining: p.draining}
		owns[p.owner]++
	}
	for _, name := range g.memberNames() {
		m := g.members[name]
		v.Members = append(v.Members, GroupMemberView{Name: name, Weight: m.weight, Owns: owns[name]})
	}
	return v, true
}

// GroupAssignments returns the partitions member owns in group (draining or not), in
// partition order, and whether lease is that member's lease. ok is false when the
// group does not exist or member is not a member under lease.
func (s *State) GroupAssignments(groupName, member string, lease LeaseID) (parts []PartitionView, ok bool) {
	g := s.groups.groups[groupName]
	if g == nil {
		return nil, false
	}
	if m := g.members[member]; m == nil || m.lease != lease {
		return nil, false
	}
	for i, p := range g.parts {
		if p.owner == member {
			parts = append(parts, PartitionView{Partition: i, Owner: p.owner, Epoch: p.epoch, Draining: p.draining})
		}
	}
	return parts, true
}

// NumGroups returns the number of groups.
func (s *State) NumGroups() int { return len(s.groups.groups) }

// Draining calls fn for every draining partition, in group then partition order, with
// its group's drain deadline: a new leader restarts every drain timer at full length.
func (s *State) Draining(fn func(group string, partition int, epoch uint64, drainMillis int64)) {
	names := make([]string, 0, len(s.groups.groups))
	for name := range s.groups.groups {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		g := s.groups.groups[name]
		for i, p := range g.parts {
			if p.draining {
				fn(name, i, p.epoch, g.drainMillis)
			}
		}
	}
}

// applyGroup applies the group commands.
func (s *State) applyGroup(c Command) Result {
	gs := &s.groups
	g := gs.groups[c.Name]
	if c.Op == OpGroupCreate {
		if g != nil {
			if len(g.parts) != int(c.Count) || g.drainMillis != c.DrainMillis {
				return Result{Err: fmt.Errorf("%w: group %q has %d partitions and a drain deadline of %d ms", ErrGroupExists, c.Name, len(g.parts), g.drainMillis)}
			}
			return Result{}
		}
		if len(gs.groups) >= s.limits.MaxGroups {
			return Result{Err: fmt.Errorf("%w: the limit is %d", ErrTooManyGroups, s.limits.MaxGroups)}
		}
		gs.groups[c.Name] = &group{name: c.Name, drainMillis: c.DrainMillis, members: make(map[string]*groupMember), parts: make([]partition, c.Count)}
		return Result{}
	}
	if g == nil {
		return Result{Err: fmt.Errorf("%w: %q", ErrGroupNotFound, c.Name)}
	}
	var r Result
	switch c.Op {
	case OpGroupJoin:
		if !s.live(c.Lease) {
			return Result{Err: s.leaseGone(c.Lease)}
		}
		weight := max(c.Weight, 1)
		m := g.members[c.Member]
		switch {
		case m != nil && m.lease != c.Lease:
			return Result{Err: fmt.Errorf("%w: %q is a member of %q under another lease", ErrMemberExists, c.Member, c.Name)}
		case m != nil && m.weight == weight:
			return Result{} // a retried join
		case m != nil:
			m.weight = weight
			g.rescore()
		case len(g.members) >= s.limits.MaxGroupMembers:
			return Result{Err: fmt.Errorf("%w: group %q has %d members, the limit is %d", ErrTooManyMembers, c.Name, len(g.members), s.limits.MaxGroupMembers)}
		default:
			m = &groupMember{name: c.Member, lease: c.Lease, weight: weight, seed: memberSeed(c.Name, c.Member)}
			gs.add(g, m)
		}
	case OpGroupLeave:
		m := g.members[c.Member]
		if m == nil || m.lease != c.Lease {
			return Result{Err: fmt.Errorf("%w: %q is not a member of %q under this lease", ErrNotMember, c.Member, c.Name)}
		}
		gs.remove(g, m, &r)
	case OpGroupRelease:
		if int(c.Partition) >= len(g.parts) {
			return Result{Err: Invalid("partition", "is %d, group %q has %d partitions", c.Partition, c.Name, len(g.parts))}
		}
		p := &g.parts[c.Partition]
		switch {
		case c.Token < p.epoch || (c.Token == p.epoch && p.owner == ""):
			return Result{} // that epoch ended already: a retried release
		case c.Token != p.epoch || g.members[p.owner].lease != c.Lease:
			return Result{Err: fmt.Errorf("%w: partition %d of %q is not owned by this lease at epoch %d", ErrNotOwner, c.Partition, c.Name, c.Token)}
		}
		g.free(int(c.Partition), &r)
	case OpGroupDrainEnd:
		if int(c.Partition) >= len(g.parts) {
			return Result{Err: Invalid("partition", "is %d, group %q has %d partitions", c.Partition, c.Name, len(g.parts))}
		}
		if p := &g.parts[c.Partition]; !p.draining || p.epoch != c.Token {
			return Result{}
		}
		g.free(int(c.Partition), &r)
	default:
		return Result{Err: fmt.Errorf("%w: unknown op %d", ErrInvalid, c.Op)}
	}
	g.settle(s, &r)
	return r
}

// dropLease removes every membership of lease (the lease ended), in group then member
// order, freeing and granting again the partitions it owned.
func (s *State) dropGroupLease(lease LeaseID, r *Result) {
	gs := &s.groups
	refs := gs.byLease[lease]
	if len(refs) == 0 {
		return
	}
	sorted := make([]memberRef, 0, len(refs))
	for ref := range refs {
		sorted = append(sorted, ref)
	}
	slices.SortFunc(sorted, func(a, b memberRef) int {
		if c := strings.Compare(a.group, b.group); c != 0 {
			return c
		}
		return strings.Compare(a.member, b.member)
	})
	for _, ref := range sorted {
		g := gs.groups[ref.group]
		gs.remove(g, g.members[ref.member], r)
		g.settle(s, r)
	}
}

// add adds member m to g and to the lease index, and lets every partition's wanted
// member compete with it.
func (gs *groupStore) add(g *group, m *groupMember) {
	g.members[m.name] = m
	refs := gs.byLease[m.lease]
	if refs == nil {
		refs = make(map[memberRef]struct{})
		gs.byLease[m.lease] = refs
	}
	refs[memberRef{g.name, m.name}] = struct{}{}
	for i := range g.parts {
		p := &g.parts[i]
		if sc := m.score(i); p.want == "" || sc.beats(m.name, p.score, p.want) {
			p.want, p.score = m.name, sc
		}
	}
}

// remove takes member m out of g, frees its partitions, and finds a new wanted member
// for the partitions that wanted it.
func (gs *groupStore) remove(g *group, m *groupMember, r *Result) {
	for i := range g.parts {
		if g.parts[i].owner == m.name {
			g.free(i, r)
		}
	}
	delete(g.members, m.name)
	refs := gs.byLease[m.lease]
	delete(refs, memberRef{g.name, m.name})
	if len(refs) == 0 {
		delete(gs.byLease, m.lease)
	}
	for i := range g.parts {
		if g.parts[i].want == m.name {
			g.rescorePartition(i)
		}
	}
}

// free takes partition i from its owner, reporting it.
func (g *group) free(i int, r *Result) {
	p := &g.parts[i]
	m := g.members[p.owner]
	r.Effects = append(r.Effects, Effect{Kind: EffectPartitionReleased, Name: g.name, Partition: uint32(i), Note: p.owner, Lease: m.lease, Token: p.epoch})
	p.owner, p.draining = "", false
}

// settle moves every partition one step towards the member the hash names: a partition
// without an owner is granted to it at a new epoch, and one owned by another member
// starts to drain.
func (g *group) settle(seq Sequence, r *Result) {
	for i := range g.parts {
		p := &g.parts[i]
		switch {
		case p.want == "":
		case p.owner == "":
			p.owner, p.epoch = p.want, seq.Next()
			r.Effects = append(r.Effects, Effect{Kind: EffectPartitionAssigned, Name: g.name, Partition: uint32(i), Note: p.owner, Lease: g.members[p.owner].lease, Token: p.epoch})
		case p.owner != p.want && !p.draining:
			p.draining = true
			r.Effects = append(r.Effects, Effect{Kind: EffectPartitionDraining, Name: g.name, Partition: uint32(i), Note: p.owner, Lease: g.members[p.owner].lease, Token: p.epoch, DelayMillis: g.drainMillis})
		}
	}
}

// rescore finds every partition's wanted member again (a weight changed).
func (g *group) rescore() {
	for i := range g.parts {
		g.rescorePartition(i)
	}
}

func (g *group) rescorePartition(i int) {
	p := &g.parts[i]
	p.want, p.score = "", hrwScore{}
	for name, m := range g.members {
		if sc := m.score(i); p.want == "" || sc.beats(name, p.score, p.want) {
			p.want, p.score = name, sc
		}
	}
}

func (g *group) memberNames() []string {
	names := make([]string, 0, len(g.members))
	for name := range g.members {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// Weighted rendezvous hashing with integers only. A member's score for a partition is
// -ln(u)/w for a hash u uniform in (0,1) and its weight w; the smallest score wins, so a
// member wins each partition with probability w/Σw (the "logarithmic method" of
// Schindelhauer and Schomaker). -log2(u) is computed in fixed point with 32 fraction
// bits by repeated squaring (no floating point, whose results may differ between
// platforms), and scores are compared by cross-multiplying, which is exact: -log2(u) is
// below 2^39 and a weight at most MaxWeight < 2^10. Ties go to the larger hash, then to
// the smaller name, so the order is total. As -log2(u) never grows with u, two members
// of the same weight are ordered by their hashes alone: the logarithm is needed only
// between different weights, and a group whose members all weigh the same computes
// none.
type hrwScore struct {
	hash   uint64 // u = hash / 2^64
	weight uint32
}

// beats reports whether score a of member nameA beats score b of member nameB.
func (a hrwScore) beats(nameA string, b hrwScore, nameB string) bool {
	if a.weight != b.weight {
		l, r := negLog2(a.hash)*uint64(b.weight), negLog2(b.hash)*uint64(a.weight)
		if l != r {
			return l < r
		}
	}
	if a.hash != b.hash {
		return a.hash > b.hash
	}
	return nameA < nameB
}

func (m *groupMember) score(partition int) hrwScore {
	return hrwScore{hash: mix64(m.seed + uint64(partition+1)*0x9e3779b97f4a7c15), weight: m.weight}
}

// memberSeed hashes (group, member) with FNV-1a.
func memberSeed(group, member string) uint64 {
	h := uint64(14695981039346656037)
	add := func(s string) {
		for i := 0; i < len(s); i++ {
			h ^= uint64(s[i])
			h *= 1099511628211
		}
		h ^= 0xff // names never contain 0xff: a separator
		h *= 1099511628211
	}
	add(group)
	add(member)
	return h
}

// mix64 is splitmix64's finalizer.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// negLog2 returns -log2(h/2^64) in 32.32 fixed point (h = 0 counts as 1).
func negLog2(h uint64) uint64 {
	h = max(h, 1)
	e := bits.Len64(h) - 1 // h = 2^e · m, m in [1, 2)
	m := h << (63 - e)     // m in 1.63 fixed point
	var frac uint64
	for i := range 32 {
		hi, lo := bits.Mul64(m, m) // m² in 2.126 fixed point
		one := hi >> 63            // m² ≥ 2: the next fraction bit is 1, and m = m²/2
		frac |= one << (31 - i)
		keep := 1 - one // without branches: the bits are random, a branch mispredicts
		m = hi<<keep | (lo>>63)*keep
	}
	return 64<<32 - (uint64(e)<<32 | frac)
}

// ValidateGroupCommand checks a group command as the state machine will, naming the
// request field at fault (as in the protobuf API). The server calls it before
// proposing.
func ValidateGroupCommand(c Command) error { return c.validateGroupOp() }

// validateGroupOp checks the group commands.
func (c *Command) validateGroupOp() error {
	if err := ValidateName("group", c.Name); err != nil {
		return err
	}
	switch c.Op {
	case OpGroupCreate:
		if c.Count == 0 || c.Count > MaxPartitions {
			return Invalid("partitions", "must be 1 to %d", MaxPartitions)
		}
		if c.DrainMillis < MinDrainMillis || c.DrainMillis > MaxDrainMillis {
			return Invalid("drain_ms", "must be %d to %d", MinDrainMillis, MaxDrainMillis)
		}
		return nil
	case OpGroupJoin:
		if c.Weight > MaxWeight {
			return Invalid("weight", "is %d, the limit is %d", c.Weight, MaxWeight)
		}
		fallthrough
	case OpGroupLeave:
		if err := ValidateName("member", c.Member); err != nil {
			return err
		}
		if c.Lease.IsZero() {
			return Invalid("lease_id", "must be set")
		}
		return nil
	case OpGroupRelease:
		if c.Lease.IsZero() {
			return Invalid("lease_id", "must be set")
		}
		fallthrough
	case OpGroupDrainEnd:
		if c.Partition >= MaxPartitions {
			return Invalid("partition", "must be below %d", MaxPartitions)
		}
		if c.Token == 0 {
			return Invalid("epoch", "must be the epoch of the assignment (positive)")
		}
		return nil
	}
	return fmt.Errorf("%w: unknown op %d", ErrInvalid, c.Op)
}

// groupRecord is one group as a snapshot records it: members by name, and every
// partition that was ever granted, in partition order.
type groupRecord struct {
	Name        string              `json:"name"`
	Partitions  int                 `json:"partitions"`
	DrainMillis int64               `json:"drainMs"`
	Members     []groupMemberRecord `json:"members,omitempty"`
	Owners      []ownerRecord       `json:"owners,omitempty"`
}

type groupMemberRecord struct {
	Name   string  `json:"name"`
	Lease  LeaseID `json:"lease"`
	Weight uint32  `json:"weight"`
}

type ownerRecord struct {
	Partition int    `json:"p"`
	Member    string `json:"member,omitempty"`
	Epoch     uint64 `json:"epoch"`
	Draining  bool   `json:"draining,omitempty"`
}

// records copies the groups for a snapshot, in name order.
func (gs *groupStore) records() []groupRecord {
	out := make([]groupRecord, 0, len(gs.groups))
	for _, g := range gs.groups {
		rec := groupRecord{Name: g.name, Partitions: len(g.parts), DrainMillis: g.drainMillis}
		for _, name := range g.memberNames() {
			m := g.members[name]
			rec.Members = append(rec.Members, groupMemberRecord{Name: name, Lease: m.lease, Weight: m.weight})
		}
		for i, p := range g.parts {
			if p.epoch != 0 {
				rec.Owners = append(rec.Owners, ownerRecord{Partition: i, Member: p.owner, Epoch: p.epoch, Draining: p.draining})
			}
		}
		out = append(out, rec)
	}
	slices.SortFunc(out, func(a, b groupRecord) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// restoreGroup adds one group read from a snapshot, checking it against the leases and
// the sequence restored before it, and that its assignment is one the commands could
// have left (every partition owned when members exist; an owner the hash does not name
// is draining).
func (s *State) restoreGroup(rec *groupRecord) error {
	gs := &s.groups
	bad := func(why string) error { return fmt.Errorf("%w: group in snapshot: %s", ErrCorrupt, why) }
	switch {
	case rec == nil:
		return bad("null")
	case ValidateName("group", rec.Name) != nil || gs.groups[rec.Name] != nil:
		return bad("invalid or repeated name")
	case rec.Partitions < 1 || rec.Partitions > MaxPartitions || rec.DrainMillis < MinDrainMillis || rec.DrainMillis > MaxDrainMillis:
		return bad(rec.Name + " has an impossible partition count or drain deadline")
	}
	g := &group{name: rec.Name, drainMillis: rec.DrainMillis, members: make(map[string]*groupMember), parts: make([]partition, rec.Partitions)}
	for _, mr := range rec.Members {
		switch {
		case ValidateName("member", mr.Name) != nil || g.members[mr.Name] != nil:
			return bad(rec.Name + " has an invalid or repeated member")
		case !s.live(mr.Lease) || mr.Weight < 1 || mr.Weight > MaxWeight:
			return bad(rec.Name + " has a member with an unknown lease or an impossible weight")
		}
		gs.add(g, &groupMember{name: mr.Name, lease: mr.Lease, weight: mr.Weight, seed: memberSeed(rec.Name, mr.Name)})
	}
	last := -1
	for _, o := range rec.Owners {
		switch {
		case o.Partition <= last || o.Partition >= rec.Partitions:
			return bad(rec.Name + " has partitions out of order or out of range")
		case o.Epoch == 0 || o.Epoch > s.seq:
			return bad(rec.Name + " has an impossible epoch")
		case o.Member != "" && g.members[o.Member] == nil, o.Member == "" && o.Draining:
			return bad(rec.Name + " has a partition owned by no member, or draining without an owner")
		}
		last = o.Partition
		p := &g.parts[o.Partition]
		p.owner, p.epoch, p.draining = o.Member, o.Epoch, o.Draining
	}
	for i, p := range g.parts {
		if (p.owner == "") != (p.want == "") || (p.owner != p.want && !p.draining) {
			return bad(fmt.Sprintf("%s partition %d is not where the hash puts it", rec.Name, i))
		}
	}
	gs.groups[g.name] = g
	return nil
}
