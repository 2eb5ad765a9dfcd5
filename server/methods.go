package server

import (
	"context"
	"net/http"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/api/leasehold/v1/leaseholdv1connect"
	"github.com/leasehold/leasehold/core"
	"github.com/leasehold/leasehold/fastlane"
	"github.com/leasehold/leasehold/internal/auth"
	"github.com/leasehold/leasehold/leader"
)

// methodTable is the one list of the RPCs this server serves: one entry per RPC with its
// handler and everything both transports need to know about it. Connect's routes, the
// fast lane's dispatch, forwarding to the leader, the metric labels and the permission an
// RPC needs all come from here, so a new RPC is one entry in this list (and its handler).
// Which RPCs the fast lane carries, and under which number, is the `fast_lane` option in
// the .proto file (see package fastlane); TestMethodTable checks that this table and the
// .proto file name the same RPCs.
func methodTable() []*method {
	return []*method{
		// LeaseService
		unary(leaseholdv1connect.LeaseServiceGrantProcedure, (*Server).Grant, needs(permLock)),
		unary(leaseholdv1connect.LeaseServiceKeepAliveProcedure, (*Server).KeepAlive, needs(permLock),
			readerProposesUncancelled((*Server).keepAliveThen)),
		unary(leaseholdv1connect.LeaseServiceRevokeProcedure, (*Server).Revoke, needs(permLock)),
		serverStream(leaseholdv1connect.LeaseServiceBindProcedure, (*Server).Bind, needs(permLock)),
		// LockService
		unary(leaseholdv1connect.LockServiceAcquireProcedure, (*Server).Acquire,
			needsOnEach(permLock, lockNames),
			readerServes((*Server).acquireAtOnce), readerGrants((*Server).acquireNow), readerProposes((*Server).acquireThen)),
		unary(leaseholdv1connect.LockServiceReleaseProcedure, (*Server).Release,
			needsOn(permLock, (*leaseholdv1.ReleaseRequest).GetName),
			readerServes((*Server).releaseAtOnce), readerProposesUncancelled((*Server).releaseThen)),
		unary(leaseholdv1connect.LockServiceDescribeProcedure, (*Server).Describe, needsOn(permRead, (*leaseholdv1.DescribeRequest).GetName)),
		unary(leaseholdv1connect.LockServiceListProcedure, (*Server).List, needsOn(permRead, (*leaseholdv1.ListRequest).GetPrefix)),
		unary(leaseholdv1connect.LockServiceForceReleaseProcedure, (*Server).ForceRelease, needs(permAdmin)),
		unary(leaseholdv1connect.LockServiceCheckTokenProcedure, (*Server).CheckToken, needsOn(permRead, (*leaseholdv1.CheckTokenRequest).GetName)),
		serverStream(leaseholdv1connect.LockServiceWatchProcedure, (*Server).Watch, needsOn(permRead, (*leaseholdv1.WatchRequest).GetPrefix)),
		unary(leaseholdv1connect.LockServiceHistoryProcedure, (*Server).History, needsOn(permRead, (*leaseholdv1.HistoryRequest).GetName)),
		// KVService
		unary(leaseholdv1connect.KVServiceGetProcedure, (*Server).Get,
			needsOn(permRead, (*leaseholdv1.GetRequest).GetKey), servedHereWhen((*leaseholdv1.GetRequest).GetStale)),
		unary(leaseholdv1connect.KVServicePutProcedure, (*Server).Put, needsOn(permKVWrite, (*leaseholdv1.PutRequest).GetKey)),
		unary(leaseholdv1connect.KVServiceDeleteProcedure, (*Server).Delete, needsOn(permKVWrite, (*leaseholdv1.DeleteRequest).GetKey)),
		unary(leaseholdv1connect.KVServiceListProcedure, (*Server).ListKV,
			needsOn(permRead, (*leaseholdv1.KVServiceListRequest).GetPrefix), servedHereWhen((*leaseholdv1.KVServiceListRequest).GetStale)),
		// IdempotencyService
		unary(leaseholdv1connect.IdempotencyServiceBeginProcedure, (*Server).Begin, needsOn(permLock, (*leaseholdv1.BeginRequest).GetKey)),
		unary(leaseholdv1connect.IdempotencyServiceCompleteProcedure, (*Server).Complete, needsOn(permLock, (*leaseholdv1.CompleteRequest).GetKey)),
		unary(leaseholdv1connect.IdempotencyServiceAbandonProcedure, (*Server).Abandon, needsOn(permLock, (*leaseholdv1.AbandonRequest).GetKey)),
		unary(leaseholdv1connect.IdempotencyServiceGetProcedure, (*Server).GetKey, needsOn(permRead, (*leaseholdv1.IdempotencyServiceGetRequest).GetKey)),
		// GroupService
		unary(leaseholdv1connect.GroupServiceCreateProcedure, (*Server).CreateGroup, needsOn(permLock, (*leaseholdv1.GroupServiceCreateRequest).GetGroup)),
		unary(leaseholdv1connect.GroupServiceJoinProcedure, (*Server).JoinGroup, needsOn(permLock, (*leaseholdv1.JoinRequest).GetGroup)),
		unary(leaseholdv1connect.GroupServiceLeaveProcedure, (*Server).LeaveGroup, needsOn(permLock, (*leaseholdv1.LeaveRequest).GetGroup)),
		unary(leaseholdv1connect.GroupServiceReleaseProcedure, (*Server).ReleasePartition, needsOn(permLock, (*leaseholdv1.GroupServiceReleaseRequest).GetGroup)),
		unary(leaseholdv1connect.GroupServiceStatusProcedure, (*Server).GroupStatus, needsOn(permRead, (*leaseholdv1.GroupServiceStatusRequest).GetGroup)),
		serverStream(leaseholdv1connect.GroupServiceAssignmentsProcedure, (*Server).Assignments, needsOn(permLock, (*leaseholdv1.AssignmentsRequest).GetGroup)),
		// ElectionService
		unary(leaseholdv1connect.ElectionServiceCampaignProcedure, (*Server).Campaign, needsOn(permLock, (*leaseholdv1.CampaignRequest).GetName)),
		unary(leaseholdv1connect.ElectionServiceProclaimProcedure, (*Server).Proclaim, needsOn(permLock, (*leaseholdv1.ProclaimRequest).GetName)),
		unary(leaseholdv1connect.ElectionServiceLeaderProcedure, (*Server).Leader, needsOn(permRead, (*leaseholdv1.LeaderRequest).GetName)),
		unary(leaseholdv1connect.ElectionServiceResignProcedure, (*Server).Resign, needsOn(permLock, (*leaseholdv1.ResignRequest).GetName)),
		serverStream(leaseholdv1connect.ElectionServiceObserveProcedure, (*Server).Observe, needsOn(permRead, (*leaseholdv1.ObserveRequest).GetName)),
		// ClusterService
		unary(leaseholdv1connect.ClusterServiceStatusProcedure, (*Server).Status, needs(permRead), anyNode()),
		unary(leaseholdv1connect.ClusterServiceMembersProcedure, (*Server).Members, needs(permRead), anyNode()),
		unary(leaseholdv1connect.ClusterServiceAddMemberProcedure, (*Server).AddMember, needs(permAdmin)),
		unary(leaseholdv1connect.ClusterServiceRemoveMemberProcedure, (*Server).RemoveMember, needs(permAdmin)),
	}
}

// permission is what a caller must be allowed to do to call an RPC (issue #17's rules:
// read, lock, kv-write, admin; package auth). With authentication enabled, the check is
// made on the request's name (lock name, key or prefix) for RPCs that have one (see
// authorize).
type permission = auth.Permission

const (
	permRead    = auth.Read    // Describe, List, Get, CheckToken, Status, Members
	permLock    = auth.Lock    // leases, Acquire, Release, idempotency keys
	permKVWrite = auth.KVWrite // Put, Delete
	permAdmin   = auth.Admin   // ForceRelease, membership, snapshots, profiling
)

// route says which node serves an RPC.
type route uint8

const (
	// onLeader: the leader serves it; any other node forwards it to the leader, once.
	onLeader route = iota
	// onAnyNode: the node that receives it answers from its own view.
	onAnyNode
)

// method is one RPC, as methodTable lists it. Only the constructors (unary,
// serverStream) and their options fill it in.
type method struct {
	procedure string // Connect procedure, e.g. "/leasehold.v1.LockService/Acquire"
	schema    protoreflect.MethodDescriptor
	fast      fastlane.Method // its number on the fast lane; 0 when Connect only
	perm      permission
	names     func(proto.Message) []string // the names the permission applies to, each; nil: none
	route     route
	// here, if set, says that an onLeader request is served by the receiving node anyway
	// (a read that asked to be served stale).
	here func(proto.Message) bool

	newRequest func() proto.Message
	// serve runs the handler on this node.
	serve func(*Server, context.Context, proto.Message) (proto.Message, error)
	// forward sends the request to the leader's node p, with the headers that
	// forwardHeaders sets.
	forward func(p *peer, ctx context.Context, req proto.Message, headers func(http.Header)) (proto.Message, error)
	// connectHandler serves the RPC over Connect (gRPC, gRPC-Web, Connect).
	connectHandler func(*Server, ...connect.HandlerOption) http.Handler

	// A server stream (serverStream) has these instead of serve and forward:
	// stream runs the handler on this node, sending each answer with send.
	stream func(s *Server, ctx context.Context, req proto.Message, send func(proto.Message) error) error
	// forwardStream opens the stream at the leader's node p and relays every message
	// it sends to send, until the stream ends.
	forwardStream func(p *peer, ctx context.Context, req proto.Message, headers func(http.Header), send func(proto.Message) error) error

	// The fast-lane reader's shortcuts (docs/ARCHITECTURE.md, "The fast lane's
	// threads"), each nil when the RPC has none:
	// atOnce reports that the reader may serve the request itself, in full, because it
	// never waits (an efficiency try-once acquire).
	atOnce func(*Server, proto.Message) bool
	// now answers the request from memory if it can without waiting, and reports false,
	// having changed nothing, otherwise.
	now func(*Server, proto.Message) (proto.Message, bool)
	// then starts the request without waiting for its commit and reports true; the
	// answer goes to done, on the goroutine that hands out commit results. It reports
	// false, having done nothing, when the request must take the full path.
	then func(s *Server, ctx context.Context, req proto.Message, done func(proto.Message, error)) bool
	// thenUncancelled is then for a request that nothing stops, once started, short of
	// its answer (a keepalive's leadership round, a release's commit): it takes no
	// context, and the reader gives the request none. At most one of then and
	// thenUncancelled is set.
	thenUncancelled func(s *Server, req proto.Message, done func(proto.Message, error)) bool

	series *procMetrics // this RPC's metric series on one Server
}

// methodOption sets one property of a method.
type methodOption func(*method)

// unary makes the table entry of a unary RPC served by handler.
func unary[Req, Res any, PReq interface {
	*Req
	proto.Message
}, PRes interface {
	*Res
	proto.Message
}](procedure string, handler func(*Server, context.Context, PReq) (PRes, error), opts ...methodOption) *method {
	m := &method{procedure: procedure, route: onLeader}
	m.fast, _ = fastlane.MethodOf(procedure)
	m.schema = methodDescriptor(procedure)
	m.newRequest = func() proto.Message { return PReq(new(Req)) }
	m.serve = func(s *Server, ctx context.Context, req proto.Message) (proto.Message, error) {
		resp, err := handler(s, ctx, req.(PReq))
		if err != nil {
			return nil, err // not a typed nil inside the interface
		}
		return resp, nil
	}
	m.forward = func(p *peer, ctx context.Context, req proto.Message, headers func(http.Header)) (proto.Message, error) {
		r := connect.NewRequest((*Req)(req.(PReq)))
		headers(r.Header())
		forwardCredentials(ctx, r.Header())
		resp, err := peerClient[Req, Res](p, procedure).CallUnary(ctx, r)
		if err != nil {
			return nil, err
		}
		return PRes(resp.Msg), nil
	}
	m.connectHandler = func(s *Server, opts ...connect.HandlerOption) http.Handler {
		return connect.NewUnaryHandler(procedure, func(ctx context.Context, r *connect.Request[Req]) (*connect.Response[Res], error) {
			settle, err := s.gate(principalOf(ctx), m, PReq(r.Msg))
			if err != nil {
				return nil, s.finish(m, time.Now(), err)
			}
			resp, err := s.call(ctx, m, PReq(r.Msg), callerOf(r.Header()))
			if settle != nil {
				settle(resp, err)
			}
			if err != nil {
				return nil, err
			}
			return connect.NewResponse((*Res)(resp.(PRes))), nil
		}, append(opts, connect.WithSchema(m.schema))...)
	}
	return m.with(opts)
}

// serverStream makes the table entry of a server-streaming RPC (one request, a stream of
// answers) served by handler, which sends each answer with send and returns when the
// stream ends; send fails once the caller has gone (its error is the stream's end, as
// it is). A stream goes through what a unary RPC does — the gate (permission, quotas),
// the cluster-ID check, the route (served here, or forwarded to the leader's node, which
// serves it and whose every message this node relays, with forwardHeaders and the
// caller's credentials), and, when it ends, the one error mapping and the metrics
// (finish: one request, its duration the stream's). Streams are served over Connect only:
// the fast lane carries none. A forwarded stream is not bounded by forwardContext; a
// silent leader ends it with the peer connection's failed ping.
func serverStream[Req, Res any, PReq interface {
	*Req
	proto.Message
}, PRes interface {
	*Res
	proto.Message
}](procedure string, handler func(s *Server, ctx context.Context, req PReq, send func(PRes) error) error, opts ...methodOption) *method {
	m := &method{procedure: procedure, route: onLeader}
	m.schema = methodDescriptor(procedure)
	if !m.schema.IsStreamingServer() || m.schema.IsStreamingClient() {
		panic("server: " + procedure + " is not a server-streaming RPC")
	}
	m.newRequest = func() proto.Message { return PReq(new(Req)) }
	m.stream = func(s *Server, ctx context.Context, req proto.Message, send func(proto.Message) error) error {
		return handler(s, ctx, req.(PReq), func(resp PRes) error { return send(resp) })
	}
	m.forwardStream = func(p *peer, ctx context.Context, req proto.Message, headers func(http.Header), send func(proto.Message) error) error {
		r := connect.NewRequest((*Req)(req.(PReq)))
		headers(r.Header())
		forwardCredentials(ctx, r.Header())
		st, err := peerClient[Req, Res](p, procedure).CallServerStream(ctx, r)
		if err != nil {
			return err
		}
		defer st.Close()
		for st.Receive() {
			if err := send(PRes(st.Msg())); err != nil {
				return err
			}
		}
		return st.Err()
	}
	m.connectHandler = func(s *Server, opts ...connect.HandlerOption) http.Handler {
		return connect.NewServerStreamHandler(procedure, func(ctx context.Context, r *connect.Request[Req], st *connect.ServerStream[Res]) error {
			c := principalOf(ctx)
			settle, err := s.gate(c, m, PReq(r.Msg))
			if err != nil {
				return s.finish(m, time.Now(), err)
			}
			err = s.callStream(ctx, m, PReq(r.Msg), callerOf(r.Header()), func(resp proto.Message) error {
				// Each message is for a caller the auth file, reloaded or not, allows.
				again, err := s.reauthorize(c, m, PReq(r.Msg))
				if err != nil {
					return err
				}
				c = again
				return st.Send((*Res)(resp.(PRes)))
			})
			if settle != nil {
				settle(nil, err)
			}
			return err
		}, append(opts, connect.WithSchema(m.schema))...)
	}
	return m.with(opts)
}

// with sets opts on m, which must name the permission it needs.
func (m *method) with(opts []methodOption) *method {
	for _, o := range opts {
		o(m)
	}
	if m.perm == 0 {
		panic("server: " + m.procedure + " has no permission in the method table")
	}
	return m
}

// needs sets the permission an RPC that names nothing requires.
func needs(p permission) methodOption { return func(m *method) { m.perm = p } }

// needsOn sets the permission an RPC requires on the name name returns.
func needsOn[PReq proto.Message](p permission, name func(PReq) string) methodOption {
	return func(m *method) {
		m.perm = p
		m.names = func(req proto.Message) []string { return []string{name(req.(PReq))} }
	}
}

// needsOnEach sets the permission an RPC requires on every name names returns.
func needsOnEach[PReq proto.Message](p permission, names func(PReq) []string) methodOption {
	return func(m *method) {
		m.perm = p
		m.names = func(req proto.Message) []string { return names(req.(PReq)) }
	}
}

// lockNames are the locks an Acquire asks for: its lock set, or its one name.
func lockNames(r *leaseholdv1.AcquireRequest) []string {
	if len(r.GetNames()) > 0 {
		return r.GetNames()
	}
	return []string{r.GetName()}
}

// anyNode makes the receiving node answer the RPC itself.
func anyNode() methodOption { return func(m *method) { m.route = onAnyNode } }

// servedHereWhen makes the receiving node serve a request for which here is true.
func servedHereWhen[PReq proto.Message](here func(PReq) bool) methodOption {
	return func(m *method) { m.here = func(req proto.Message) bool { return here(req.(PReq)) } }
}

// readerServes lets the fast-lane reader serve a request in full when ok says it never
// waits.
func readerServes[PReq proto.Message](ok func(*Server, PReq) bool) methodOption {
	return func(m *method) { m.atOnce = func(s *Server, req proto.Message) bool { return ok(s, req.(PReq)) } }
}

// readerGrants lets the fast-lane reader answer a request from memory when now can.
func readerGrants[PReq proto.Message, PRes proto.Message](now func(*Server, PReq) (PRes, bool)) methodOption {
	return func(m *method) {
		m.now = func(s *Server, req proto.Message) (proto.Message, bool) {
			resp, ok := now(s, req.(PReq))
			if !ok {
				return nil, false
			}
			return resp, true
		}
	}
}

// readerProposes lets the fast-lane reader start a request and leave its answer to the
// commit.
func readerProposes[PReq proto.Message](then func(*Server, context.Context, PReq, func(proto.Message, error)) bool) methodOption {
	return func(m *method) {
		m.then = func(s *Server, ctx context.Context, req proto.Message, done func(proto.Message, error)) bool {
			return then(s, ctx, req.(PReq), done)
		}
	}
}

// readerProposesUncancelled is readerProposes for a request that a cancel cannot stop once
// then has started it: then gets no context.
func readerProposesUncancelled[PReq proto.Message](then func(*Server, PReq, func(proto.Message, error)) bool) methodOption {
	return func(m *method) {
		m.thenUncancelled = func(s *Server, req proto.Message, done func(proto.Message, error)) bool {
			return then(s, req.(PReq), done)
		}
	}
}

// methodDescriptor finds procedure ("/pkg.Service/Method") in the .proto file's
// descriptors.
func methodDescriptor(procedure string) protoreflect.MethodDescriptor {
	services := leaseholdv1.File_leasehold_v1_leasehold_proto.Services()
	for i := range services.Len() {
		sd := services.Get(i)
		for j := range sd.Methods().Len() {
			if md := sd.Methods().Get(j); "/"+string(sd.FullName())+"/"+string(md.Name()) == procedure {
				return md
			}
		}
	}
	panic("server: " + procedure + " is not an RPC of leasehold.proto")
}

// methods indexes one Server's copy of the table.
type methods struct {
	list        []*method
	byProcedure map[string]*method
	byFast      [256]*method
}

func newMethods(s *Server) methods {
	ms := methods{list: methodTable(), byProcedure: make(map[string]*method)}
	for _, m := range ms.list {
		if ms.byProcedure[m.procedure] != nil {
			panic("server: " + m.procedure + " is twice in the method table")
		}
		ms.byProcedure[m.procedure] = m
		if m.fast != 0 {
			ms.byFast[m.fast] = m
		}
		m.series = s.metrics.series(m.procedure)
	}
	return ms
}

// caller is what the transport knows of who sent a request, for the checks call makes
// before serving it.
type caller struct {
	// forwarded: another node forwarded the request (it is never forwarded again).
	forwarded bool
	// clusterID is the cluster the caller expects to talk to; "" when it does not say
	// (the fast lane checks it in its handshake).
	clusterID string
	// fastLane: the request came on a fast-lane connection, which can hold the
	// binding of a release-on-disconnect lease (G7).
	fastLane bool
}

// callerOf reads a Connect request's headers.
func callerOf(h http.Header) caller {
	return caller{forwarded: h.Get(forwardedHeader) != "", clusterID: h.Get(ClusterIDHeader)}
}

// call serves one request — on this node, or forwarded to the leader — and finishes it
// (finish). Both transports serve every request through call or, for the fast lane's
// shortcuts, through finish. A request for another cluster is refused before anything
// else.
func (s *Server) call(ctx context.Context, m *method, req proto.Message, from caller) (proto.Message, error) {
	start := time.Now()
	if err := s.checkClusterID(from.clusterID); err != nil {
		return nil, s.finish(m, start, err)
	}
	if g, ok := req.(*leaseholdv1.GrantRequest); ok && g.GetReleaseOnDisconnect() && !from.fastLane && !from.forwarded {
		return nil, s.finish(m, start, core.Invalid("release_on_disconnect", "needs a fast-lane connection to bind the lease to"))
	}
	resp, err := s.serveOrForward(ctx, m, req, from.forwarded)
	return resp, s.finish(m, start, err)
}

// callStream serves one server stream as call serves a unary request: the cluster-ID
// check, then the stream served here or forwarded to the leader (one hop, every message
// relayed to send), finished when it ends.
func (s *Server) callStream(ctx context.Context, m *method, req proto.Message, from caller, send func(proto.Message) error) error {
	start := time.Now()
	if err := s.checkClusterID(from.clusterID); err != nil {
		return s.finish(m, start, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(s.streams, cancel)()
	err := s.serveStream(ctx, m, req, from, send)
	if s.streams.Err() != nil {
		// The node shuts down: whatever ended the stream first (EndStreams, or the
		// Demote right after it), the caller resumes at another node.
		err = ErrShuttingDown
	}
	return s.finish(m, start, err)
}

// EndStreams ends every server stream, now and from now on, with ErrShuttingDown
// (Unavailable, reason shutting_down), so that a node can shut down without waiting for
// its streams and their callers resume at another node. service.Node.Close calls it.
func (s *Server) EndStreams() { s.endStreams() }

// serveStream serves a stream here or forwards it to the leader (callStream).
func (s *Server) serveStream(ctx context.Context, m *method, req proto.Message, from caller, send func(proto.Message) error) error {
	addr, here, err := s.routeTo(m, req, from.forwarded)
	switch {
	case err != nil:
	case here:
		err = m.stream(s, ctx, req, send)
	default:
		if err = m.forwardStream(s.peers.get(addr), ctx, req, s.forwardHeaders, send); err != nil {
			err = forwardError(ctx, addr, err)
		}
	}
	return err
}

// forwardHeaders sets the headers of a request this node forwards to the leader.
func (s *Server) forwardHeaders(h http.Header) {
	h.Set(forwardedHeader, sanitizeHeader(s.cfg.NodeID))
	if id := s.ClusterID(); id != "" {
		h.Set(ClusterIDHeader, id) // a leader address reused by another cluster refuses it
	}
}

// finish maps a request's error to its code and details (the one table, errors.go) and
// records the request in the metrics, under the code the caller will see.
func (s *Server) finish(m *method, start time.Time, err error) error {
	err = ToConnect(err)
	s.metrics.observe(m.series, start, err)
	return err
}

// serveOrForward serves req here when this node may, or forwards it to the leader
// (routeTo), bounded by forwardContext; a forward that got no answer is
// errLeaderUnreachable (forwardError).
func (s *Server) serveOrForward(ctx context.Context, m *method, req proto.Message, forwarded bool) (proto.Message, error) {
	addr, here, err := s.routeTo(m, req, forwarded)
	switch {
	case err != nil:
		return nil, err
	case here:
		return m.serve(s, ctx, req)
	}
	bounded, cancel := forwardContext(ctx, req)
	defer cancel()
	resp, err := m.forward(s.peers.get(addr), bounded, req, s.forwardHeaders)
	if err != nil {
		return nil, forwardError(ctx, addr, err)
	}
	return resp, nil
}

// routeTo says where req is served: here (this node leads, or the method says it serves
// anywhere or this request here), or at the leader's API address, with one hop. It fails,
// Unavailable, with errLeaderUnknown when this node knows no leader's address, and with
// leader.ErrNotLeader — naming the leader when it can (leaderHint) — when the request was
// already forwarded once, or raft names this node leader before it serves.
func (s *Server) routeTo(m *method, req proto.Message, forwarded bool) (addr string, here bool, err error) {
	if m.route == onAnyNode || s.leader.Active() || (m.here != nil && m.here(req)) {
		return "", true, nil
	}
	addr = s.leaderAPIAddr()
	if forwarded {
		if addr == s.cfg.APIAddr {
			addr = ""
		}
		return "", false, &leaderHint{err: leader.ErrNotLeader, addr: addr}
	}
	switch addr {
	case "":
		return "", false, errLeaderUnknown
	case s.cfg.APIAddr:
		return "", false, leader.ErrNotLeader // elected, not serving yet: another node forwards here
	}
	return addr, false, nil
}
