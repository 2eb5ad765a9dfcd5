package server_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/api/leasehold/v1/leaseholdv1connect"
	"github.com/leasehold/leasehold/internal/clustertest"
	"github.com/leasehold/leasehold/internal/reason"
	"github.com/leasehold/leasehold/internal/testnode"
)

// wantCode checks that err is a *connect.Error with code and reason (and field when
// not "").
func wantCode(t *testing.T, err error, code connect.Code, why, field string) {
	t.Helper()
	var ce *connect.Error
	if !errors.As(err, &ce) || ce.Code() != code {
		t.Fatalf("got %v, want %v", err, code)
	}
	if d := detailOf(t, err); d.GetReason() != why || d.GetField() != field {
		t.Fatalf("%v: detail %+v, want reason %q field %q", err, d, why, field)
	}
}

// TestGroupService drives GroupService over Connect: create (and its retry), two
// members, a drain, a release that hands the partition over at a larger epoch, Status,
// Leave, and the errors every RPC answers with, each with its reason or field.
func TestGroupService(t *testing.T) {
	n := testnode.Start(t)
	url := "http://" + n.Addr()
	groups := leaseholdv1connect.NewGroupServiceClient(http.DefaultClient, url)
	leases := leaseholdv1connect.NewLeaseServiceClient(http.DefaultClient, url)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	grantLease := func() string {
		r, err := leases.Grant(ctx, &leaseholdv1.GrantRequest{TtlMs: 60_000})
		if err != nil {
			t.Fatal(err)
		}
		return r.GetLeaseId()
	}
	a, b := grantLease(), grantLease()

	create := &leaseholdv1.GroupServiceCreateRequest{Group: "orders", Partitions: 8, DrainMs: 60_000}
	for range 2 { // the second is a retry
		if _, err := groups.Create(ctx, create); err != nil {
			t.Fatal(err)
		}
	}
	_, err := groups.Create(ctx, &leaseholdv1.GroupServiceCreateRequest{Group: "orders", Partitions: 9})
	wantCode(t, err, connect.CodeAlreadyExists, reason.GroupExists, "")
	_, err = groups.Create(ctx, &leaseholdv1.GroupServiceCreateRequest{Group: "x", Partitions: 5000})
	wantCode(t, err, connect.CodeInvalidArgument, reason.InvalidArgument, "partitions")

	ja, err := groups.Join(ctx, &leaseholdv1.JoinRequest{Group: "orders", Member: "a", LeaseId: a})
	if err != nil || len(ja.GetAssignments()) != 8 {
		t.Fatalf("join of the first member: %v %v", ja, err)
	}
	_, err = groups.Join(ctx, &leaseholdv1.JoinRequest{Group: "orders", Member: "a", LeaseId: b})
	wantCode(t, err, connect.CodeAlreadyExists, reason.MemberExists, "")
	_, err = groups.Join(ctx, &leaseholdv1.JoinRequest{Group: "nope", Member: "a", LeaseId: b})
	wantCode(t, err, connect.CodeNotFound, reason.GroupUnknown, "")
	_, err = groups.Join(ctx, &leaseholdv1.JoinRequest{Group: "orders", Member: "b", LeaseId: b, Weight: 1001})
	wantCode(t, err, connect.CodeInvalidArgument, reason.InvalidArgument, "weight")
	_, err = groups.Join(ctx, &leaseholdv1.JoinRequest{Group: "orders", Member: "b"})
	wantCode(t, err, connect.CodeInvalidArgument, reason.InvalidArgument, "lease_id")

	jb, err := groups.Join(ctx, &leaseholdv1.JoinRequest{Group: "orders", Member: "b", LeaseId: b})
	if err != nil || len(jb.GetAssignments()) != 0 {
		t.Fatalf("b owns partitions before a released any: %v %v", jb, err)
	}
	st, err := groups.Status(ctx, &leaseholdv1.GroupServiceStatusRequest{Group: "orders"})
	if err != nil {
		t.Fatal(err)
	}
	var moving *leaseholdv1.PartitionOwner
	for _, p := range st.GetPartitions() {
		if p.GetOwner() != "a" {
			t.Fatalf("partition %d is %q's before a released it", p.GetPartition(), p.GetOwner())
		}
		if p.GetDraining() && moving == nil {
			moving = p
		}
	}
	if moving == nil || len(st.GetMembers()) != 2 || st.GetDrainMs() != 60_000 {
		t.Fatalf("status: %v", st)
	}
	rel := &leaseholdv1.GroupServiceReleaseRequest{Group: "orders", Partition: moving.GetPartition(), Epoch: moving.GetEpoch(), LeaseId: b}
	_, err = groups.Release(ctx, rel)
	wantCode(t, err, connect.CodeFailedPrecondition, reason.NotOwner, "")
	rel.Epoch = 0
	_, err = groups.Release(ctx, rel)
	wantCode(t, err, connect.CodeInvalidArgument, reason.InvalidArgument, "epoch")
	rel.Epoch, rel.LeaseId = moving.GetEpoch(), a
	for range 2 { // the second is a retry
		if _, err := groups.Release(ctx, rel); err != nil {
			t.Fatal(err)
		}
	}
	st, err = groups.Status(ctx, &leaseholdv1.GroupServiceStatusRequest{Group: "orders"})
	if err != nil {
		t.Fatal(err)
	}
	if p := st.GetPartitions()[moving.GetPartition()]; p.GetOwner() != "b" || p.GetEpoch() <= moving.GetEpoch() || p.GetDraining() {
		t.Fatalf("after the release: %v (was %v)", p, moving)
	}

	_, err = groups.Leave(ctx, &leaseholdv1.LeaveRequest{Group: "orders", Member: "a", LeaseId: b})
	wantCode(t, err, connect.CodeFailedPrecondition, reason.NotMember, "")
	if _, err := groups.Leave(ctx, &leaseholdv1.LeaveRequest{Group: "orders", Member: "a", LeaseId: a}); err != nil {
		t.Fatal(err)
	}
	st, err = groups.Status(ctx, &leaseholdv1.GroupServiceStatusRequest{Group: "orders"})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range st.GetPartitions() {
		if p.GetOwner() != "b" || p.GetDraining() {
			t.Fatalf("after a left: %v", st)
		}
	}
	_, err = groups.Status(ctx, &leaseholdv1.GroupServiceStatusRequest{Group: "nope"})
	wantCode(t, err, connect.CodeNotFound, reason.GroupUnknown, "")
}

// BenchmarkGroupChurn measures assignments per second under churn, over Connect on one
// durable node: each iteration, one of 8 members of a 256-partition group leaves (its
// partitions are granted to the others at once) and joins again (the partitions it is
// to own drain), and the owners release every draining partition (each is granted to
// it). The assignments are the epochs the group consumed (nothing else takes tokens).
func BenchmarkGroupChurn(b *testing.B) {
	n := testnode.Start(b)
	url := "http://" + n.Addr()
	groups := leaseholdv1connect.NewGroupServiceClient(http.DefaultClient, url)
	leases := leaseholdv1connect.NewLeaseServiceClient(http.DefaultClient, url)
	ctx := context.Background()
	const members, parts = 8, 256
	if _, err := groups.Create(ctx, &leaseholdv1.GroupServiceCreateRequest{Group: "churn", Partitions: parts, DrainMs: 60_000}); err != nil {
		b.Fatal(err)
	}
	ids := make(map[string]string)
	for i := range members {
		r, err := leases.Grant(ctx, &leaseholdv1.GrantRequest{TtlMs: 600_000})
		if err != nil {
			b.Fatal(err)
		}
		name := fmt.Sprintf("m%d", i)
		ids[name] = r.GetLeaseId()
		if _, err := groups.Join(ctx, &leaseholdv1.JoinRequest{Group: "churn", Member: name, LeaseId: ids[name]}); err != nil {
			b.Fatal(err)
		}
	}
	maxEpoch := func() (uint64, []*leaseholdv1.PartitionOwner) {
		st, err := groups.Status(ctx, &leaseholdv1.GroupServiceStatusRequest{Group: "churn"})
		if err != nil {
			b.Fatal(err)
		}
		var m uint64
		for _, p := range st.GetPartitions() {
			m = max(m, p.GetEpoch())
		}
		return m, st.GetPartitions()
	}
	releaseDraining := func(parts []*leaseholdv1.PartitionOwner) {
		for _, p := range parts {
			if p.GetDraining() {
				req := &leaseholdv1.GroupServiceReleaseRequest{Group: "churn", Partition: p.GetPartition(), Epoch: p.GetEpoch(), LeaseId: ids[p.GetOwner()]}
				if _, err := groups.Release(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	_, ps := maxEpoch()
	releaseDraining(ps)
	first, _ := maxEpoch()
	start := time.Now()
	i := 0
	for b.Loop() {
		name := fmt.Sprintf("m%d", i%members)
		i++
		if _, err := groups.Leave(ctx, &leaseholdv1.LeaveRequest{Group: "churn", Member: name, LeaseId: ids[name]}); err != nil {
			b.Fatal(err)
		}
		if _, err := groups.Join(ctx, &leaseholdv1.JoinRequest{Group: "churn", Member: name, LeaseId: ids[name]}); err != nil {
			b.Fatal(err)
		}
		_, ps := maxEpoch()
		releaseDraining(ps)
	}
	elapsed := time.Since(start)
	last, _ := maxEpoch()
	b.ReportMetric(float64(last-first)/elapsed.Seconds(), "assignments/s")
	b.ReportMetric(float64(last-first)/float64(b.N), "assignments/op")
}

// TestAssignmentsStream: a member's stream answers its partitions at once, then again
// when they change (a partition released to it arrives at its new epoch), and ends
// with not_member once the member has left.
func TestAssignmentsStream(t *testing.T) {
	n := testnode.Start(t)
	url := "http://" + n.Addr()
	groups := leaseholdv1connect.NewGroupServiceClient(http.DefaultClient, url)
	leases := leaseholdv1connect.NewLeaseServiceClient(http.DefaultClient, url)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var ids []string
	for range 2 {
		r, err := leases.Grant(ctx, &leaseholdv1.GrantRequest{TtlMs: 60_000})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, r.GetLeaseId())
	}
	if _, err := groups.Create(ctx, &leaseholdv1.GroupServiceCreateRequest{Group: "s", Partitions: 4, DrainMs: 60_000}); err != nil {
		t.Fatal(err)
	}
	if _, err := groups.Join(ctx, &leaseholdv1.JoinRequest{Group: "s", Member: "a", LeaseId: ids[0]}); err != nil {
		t.Fatal(err)
	}
	if _, err := groups.Join(ctx, &leaseholdv1.JoinRequest{Group: "s", Member: "b", LeaseId: ids[1]}); err != nil {
		t.Fatal(err)
	}
	st, err := groups.Assignments(ctx, &leaseholdv1.AssignmentsRequest{Group: "s", Member: "b", LeaseId: ids[1]})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if !st.Receive() || len(st.Msg().GetAssignments()) != 0 || st.Msg().GetDrainMs() != 60_000 {
		t.Fatalf("first message: %v %v", st.Msg(), st.Err())
	}
	status, err := groups.Status(ctx, &leaseholdv1.GroupServiceStatusRequest{Group: "s"})
	if err != nil {
		t.Fatal(err)
	}
	moving := draining(status.GetPartitions())
	if moving == nil {
		t.Fatal("nothing drains towards b")
	}
	if _, err := groups.Release(ctx, &leaseholdv1.GroupServiceReleaseRequest{Group: "s", Partition: moving.GetPartition(), Epoch: moving.GetEpoch(), LeaseId: ids[0]}); err != nil {
		t.Fatal(err)
	}
	if !st.Receive() {
		t.Fatal(st.Err())
	}
	got := st.Msg().GetAssignments()
	if len(got) != 1 || got[0].GetPartition() != moving.GetPartition() || got[0].GetEpoch() <= moving.GetEpoch() || got[0].GetDraining() {
		t.Fatalf("after the release: %v", got)
	}
	if _, err := groups.Leave(ctx, &leaseholdv1.LeaveRequest{Group: "s", Member: "b", LeaseId: ids[1]}); err != nil {
		t.Fatal(err)
	}
	for st.Receive() {
	}
	wantCode(t, st.Err(), connect.CodeFailedPrecondition, reason.NotMember, "")
}

// TestGroupsSurviveLeaderChange: a group's members, owners and epochs are the same on a
// new leader; a drain that began on the old leader ends on the new one, after the
// group's full drain deadline counted from the new leader's start (never sooner), at a
// larger epoch; the cut-off leader can release nothing.
func TestGroupsSurviveLeaderChange(t *testing.T) {
	c := clustertest.MakeCluster(t, 3, clustertest.Options{})
	L := c.Leader()
	a, b := at(t, L).grant(30*time.Second), at(t, L).grant(30*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const drain = 1500 * time.Millisecond
	if _, err := L.Server().CreateGroup(ctx, &leaseholdv1.GroupServiceCreateRequest{Group: "lc", Partitions: 8, DrainMs: drain.Milliseconds()}); err != nil {
		t.Fatal(err)
	}
	for m, id := range map[string]string{"a": a, "b": b} {
		if _, err := L.Server().JoinGroup(ctx, &leaseholdv1.JoinRequest{Group: "lc", Member: m, LeaseId: id}); err != nil {
			t.Fatal(err)
		}
	}
	before, err := L.Server().GroupStatus(ctx, &leaseholdv1.GroupServiceStatusRequest{Group: "lc"})
	if err != nil {
		t.Fatal(err)
	}
	moving := draining(before.GetPartitions())
	if moving == nil {
		t.Fatal("the second join started no drain")
	}

	// The drain has run for a second on L when L is cut off: a new leader that went on
	// with what was left would end it about half a second later.
	time.Sleep(time.Second)
	cut := time.Now()
	c.Partition(L)
	N := c.Leader(c.Others(L)...)
	lease := a
	if moving.GetOwner() == "b" {
		lease = b
	}
	short, cancelShort := context.WithTimeout(ctx, 500*time.Millisecond)
	if _, err := L.Server().ReleasePartition(short, &leaseholdv1.GroupServiceReleaseRequest{Group: "lc", Partition: moving.GetPartition(), Epoch: moving.GetEpoch(), LeaseId: lease}); err == nil {
		t.Fatal("the cut-off leader released a partition")
	}
	cancelShort()
	status := func() *leaseholdv1.GroupServiceStatusResponse {
		t.Helper()
		st, err := N.Server().GroupStatus(ctx, &leaseholdv1.GroupServiceStatusRequest{Group: "lc"})
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	st := status()
	for i, p := range st.GetPartitions() {
		q := before.GetPartitions()[i]
		if p.GetOwner() != q.GetOwner() || p.GetEpoch() != q.GetEpoch() || p.GetDraining() != q.GetDraining() {
			t.Fatalf("partition %d on the new leader: %v, before: %v", i, p, q)
		}
	}
	for {
		p := status().GetPartitions()[moving.GetPartition()]
		if !p.GetDraining() {
			if waited := time.Since(cut); waited < drain {
				t.Fatalf("the drain ended %v after the old leader was cut off, before the deadline %v", waited, drain)
			}
			if p.GetEpoch() <= moving.GetEpoch() || p.GetOwner() == moving.GetOwner() {
				t.Fatalf("after the drain deadline: %v (was %v)", p, moving)
			}
			break
		}
		if time.Since(cut) > 10*time.Second {
			t.Fatal("the drain never ended on the new leader")
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.Heal()
}

// draining returns the last draining partition of parts, or nil.
func draining(parts []*leaseholdv1.PartitionOwner) *leaseholdv1.PartitionOwner {
	var d *leaseholdv1.PartitionOwner
	for _, p := range parts {
		if p.GetDraining() {
			d = p
		}
	}
	return d
}
