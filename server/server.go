package server

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"connectrpc.com/connect"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/core"
	"github.com/leasehold/leasehold/leader"
	"github.com/leasehold/leasehold/replication"
	"github.com/leasehold/leasehold/ui"
)

// Raft is what the server needs from the replication layer (replication.Node).
type Raft interface {
	Status() replication.Status
	Apply(ctx context.Context, cmd core.Command) (core.Result, error)
	Read(fn func(*core.State))
	ReadIndex(ctx context.Context) error
	Configuration() ([]replication.Server, error)
	AddVoter(ctx context.Context, id, raftAddr string) error
	AddNonvoter(ctx context.Context, id, raftAddr string) error
	RemoveServer(ctx context.Context, id string) error
	SnapshotState() ([]byte, error)
	// HoldProposals makes commands proposed from now on wait for unhold, then go to
	// the log together (replication.Node.HoldProposals).
	HoldProposals() (unhold func())
}

// Server serves leasehold's RPCs. Its exported methods named like RPCs (Grant,
// Acquire, Get, …) are the handlers: each serves its request on this node, validating
// every field, and returns errors from core, leader and replication unmapped. Callers
// that want what a client gets — forwarding to the leader, error codes, metrics — go
// through Handler (Connect) or ServeFastLane, both of which serve every RPC through the
// method table (methods.go).
type Server struct {
	cfg     Config
	leader  *leader.Leader
	raft    Raft
	peers   *peers
	metrics *metrics
	methods methods
	started time.Time
	// clusterID caches ClusterID once the state has one.
	clusterID atomic.Pointer[string]
	log       *slog.Logger
	quotas    quotas
	lanes     lanes // the open fast-lane connections, for DrainFastLane
	// streams ends (EndStreams) when the node shuts down; every server stream ends
	// with it.
	streams    context.Context
	endStreams context.CancelFunc
}

// New returns a Server with cfg, whose zero fields take their defaults. An invalid cfg
// is refused (Config.Validate).
func New(cfg Config, l *leader.Leader, r Raft) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	s := &Server{cfg: cfg, leader: l, raft: r, peers: newPeers(cfg.TLS), started: time.Now(), log: cfg.Logger}
	s.streams, s.endStreams = context.WithCancel(context.Background())
	s.metrics = newMetrics(s)
	s.methods = newMethods(s)
	return s, nil
}

// Handler returns the HTTP handler serving every RPC of the method table with Connect
// (gRPC, gRPC-Web and Connect's JSON/binary protocol), gRPC health (grpc.health.v1) and
// server reflection, plus /metrics, /healthz (alive), /readyz (ready to serve),
// /admin/snapshot and the dashboard at /ui (with Config.Auth: admin for /admin/snapshot,
// read for /metrics, the health checks and the dashboard's assets open to all — the
// page reads its data with the caller's token, through the RPCs). Every request passes the guard (guard.go): deadlines for slow
// clients, checked gRPC envelopes, bounded bodies.
func (s *Server) Handler() http.Handler {
	opts := []connect.HandlerOption{
		connect.WithReadMaxBytes(s.cfg.MaxRequestBytes),
		// Small messages are not worth compressing: gzip would be a third of the CPU.
		connect.WithCompressMinBytes(4 << 10),
	}
	for _, c := range codecs {
		opts = append(opts, connect.WithCodec(c)) // decode errors name the field (G6)
	}
	mux := http.NewServeMux()
	for _, m := range s.methods.list {
		mux.Handle(m.procedure, m.connectHandler(s, opts...))
	}
	s.mountGRPCServices(mux, opts...)
	mux.Handle("GET /admin/snapshot", s.requireHTTP(permAdmin, http.HandlerFunc(s.serveSnapshot)))
	mux.Handle("GET /metrics", s.requireHTTP(permRead, s.metrics.handler()))
	mux.HandleFunc("GET /healthz", s.serveHealthz)
	mux.HandleFunc("GET /readyz", s.serveReadyz)
	dashboard := s.dashboard()
	mux.Handle("GET /ui", dashboard)
	mux.Handle("GET /ui/", dashboard)
	return s.withClusterID(newGuard(s.identified(mux), s.cfg, routesOf(leaseholdv1.File_leasehold_v1_leasehold_proto, maps.Clone(grpcServiceRoutes))))
}

// dashboard returns the handler of /ui (package ui), told whether auth is on and
// which RPCs this server serves.
func (s *Server) dashboard() http.Handler {
	procs := make([]string, 0, len(s.methods.list))
	for _, m := range s.methods.list {
		procs = append(procs, m.procedure)
	}
	return ui.Handler(ui.Config{Auth: s.authOn(), Procedures: procs})
}

// serveSnapshot writes the whole state (leases, locks, token sequence, KV, members) as
// of a linearizable point, for `leasehold snapshot save`. A follower redirects to the
// leader.
func (s *Server) serveSnapshot(w http.ResponseWriter, r *http.Request) {
	if !s.leader.Active() {
		addr := s.leaderAPIAddr()
		if addr == "" || addr == s.cfg.APIAddr {
			http.Error(w, "no leader known; retry", http.StatusServiceUnavailable)
			return
		}
		http.Redirect(w, r, s.peers.scheme+"://"+addr+"/admin/snapshot", http.StatusTemporaryRedirect)
		return
	}
	if err := s.raft.ReadIndex(r.Context()); err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	b, err := s.raft.SnapshotState()
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	_, _ = w.Write(b)
}

// ---- LeaseService ---------------------------------------------------------------------

// Grant serves LeaseService.Grant: it creates a lease, durable when Grant returns.
func (s *Server) Grant(ctx context.Context, req *leaseholdv1.GrantRequest) (*leaseholdv1.GrantResponse, error) {
	ttl, err := s.ttl(req.GetTtlMs())
	if err != nil {
		return nil, err
	}
	id, err := s.leader.Grant(ctx, ttl)
	if err != nil {
		return nil, err
	}
	return &leaseholdv1.GrantResponse{LeaseId: id.String(), TtlMs: ttl.Milliseconds()}, nil
}

// KeepAlive serves LeaseService.KeepAlive: it restarts a lease's countdown, and
// acknowledges only once a quorum has confirmed that this node still leads (G4).
func (s *Server) KeepAlive(ctx context.Context, req *leaseholdv1.KeepAliveRequest) (*leaseholdv1.KeepAliveResponse, error) {
	id, err := leaseID(req.GetLeaseId())
	if err != nil {
		return nil, err
	}
	// leader.KeepAlive answers only once a quorum confirmed this node still leads (G4).
	ka, err := s.leader.KeepAlive(ctx, id)
	if err != nil {
		return nil, err
	}
	return keepAliveResponse(ka), nil
}

func keepAliveResponse(ka leader.KeepAliveResult) *leaseholdv1.KeepAliveResponse {
	resp := &leaseholdv1.KeepAliveResponse{TtlMs: ka.TTL.Milliseconds(), Epoch: ka.Epoch}
	for _, l := range ka.Lost {
		resp.Lost = append(resp.Lost, &leaseholdv1.LostLock{Name: l.Name, Token: l.Token, Reason: l.Reason})
	}
	return resp
}

// Revoke serves LeaseService.Revoke: it ends a lease and releases its locks.
func (s *Server) Revoke(ctx context.Context, req *leaseholdv1.RevokeRequest) (*leaseholdv1.RevokeResponse, error) {
	id, err := leaseID(req.GetLeaseId())
	if err != nil {
		return nil, err
	}
	end := s.leader.Revoke
	if req.GetDisconnected() {
		end = s.leader.Disconnect
	}
	if err := end(ctx, id); err != nil {
		return nil, err
	}
	return &leaseholdv1.RevokeResponse{}, nil
}

// ---- LockService ----------------------------------------------------------------------

// Acquire serves LockService.Acquire: it takes the lock or waits in its queue.
func (s *Server) Acquire(ctx context.Context, req *leaseholdv1.AcquireRequest) (*leaseholdv1.AcquireResponse, error) {
	a, err := s.acquireArgs(req)
	if err != nil {
		return nil, err
	}
	g, err := s.leader.Acquire(ctx, a)
	if err != nil {
		return nil, err
	}
	return acquireResponse(g), nil
}

func acquireResponse(g leader.Grant) *leaseholdv1.AcquireResponse {
	return &leaseholdv1.AcquireResponse{Token: g.Token, Class: leaseholdv1.LockClass(g.Class), Epoch: g.Epoch}
}

func (s *Server) acquireArgs(req *leaseholdv1.AcquireRequest) (leader.AcquireArgs, error) {
	var a leader.AcquireArgs
	name, names, err := acquireNames(req)
	if err != nil {
		return a, err
	}
	mode, limit, err := acquireMode(req)
	if err != nil {
		return a, err
	}
	switch req.GetClass() {
	case leaseholdv1.LockClass_LOCK_CLASS_EFFICIENCY:
		a.Class = core.Efficiency
	case leaseholdv1.LockClass_LOCK_CLASS_CORRECTNESS:
		a.Class = core.Correctness
	default:
		return a, core.Invalid("class", "must be LOCK_CLASS_EFFICIENCY or LOCK_CLASS_CORRECTNESS, got %v", req.GetClass())
	}
	id, err := leaseID(req.GetLeaseId())
	if err != nil {
		return a, err
	}
	h := holderFromProto(req.GetHolder())
	if err := core.ValidateHolder("holder", h); err != nil {
		return a, err
	}
	switch w := req.GetWaitMs(); {
	case w == -1:
		a.Forever = true
	case w < -1:
		return a, core.Invalid("wait_ms", "must be -1 (forever), 0 (try once) or a positive number of milliseconds, got %d", w)
	case time.Duration(w) > s.cfg.MaxWait/time.Millisecond:
		return a, core.Invalid("wait_ms", "is %d, the maximum is %d", w, s.cfg.MaxWait.Milliseconds())
	default:
		a.WaitFor = time.Duration(w) * time.Millisecond
	}
	if d := req.GetLockDelayMs(); d < 0 || time.Duration(d) > s.cfg.MaxLockDelay/time.Millisecond {
		return a, core.Invalid("lock_delay_ms", "must be 0 to %d, got %d", s.cfg.MaxLockDelay.Milliseconds(), d)
	}
	a.AcquireArgs = core.AcquireArgs{Lease: id, Name: name, Names: names, Class: a.Class, Mode: mode, Limit: limit,
		Holder: h, DelayMillis: req.GetLockDelayMs()}
	return a, nil
}

// acquireNames checks an acquire's name, or its lock set's names, and returns them as
// the core takes them: one name, or two or more names sorted. A set of one name is that
// name.
func acquireNames(req *leaseholdv1.AcquireRequest) (string, []string, error) {
	given := req.GetNames()
	switch {
	case len(given) == 0:
		return req.GetName(), nil, core.ValidateName("name", req.GetName())
	case req.GetName() != "":
		return "", nil, core.Invalid("names", "set either name or names, not both")
	case len(given) > core.MaxSetNames:
		return "", nil, core.Invalid("names", "has %d names, the limit is %d", len(given), core.MaxSetNames)
	}
	for i, n := range given {
		if fe := new(core.FieldError); errors.As(core.ValidateName("names", n), &fe) {
			return "", nil, core.Invalid("names", "name %d: %s", i, fe.Reason)
		}
	}
	names := slices.Clone(given)
	slices.Sort(names)
	for i := 1; i < len(names); i++ {
		if names[i] == names[i-1] {
			return "", nil, core.Invalid("names", "has %q twice", names[i])
		}
	}
	if len(names) == 1 {
		return names[0], nil, nil
	}
	return "", names, nil
}

// acquireMode checks an acquire's mode and limit.
func acquireMode(req *leaseholdv1.AcquireRequest) (core.Mode, uint32, error) {
	var mode core.Mode
	switch req.GetMode() {
	case leaseholdv1.LockMode_LOCK_MODE_UNSPECIFIED, leaseholdv1.LockMode_LOCK_MODE_EXCLUSIVE:
		mode = core.Exclusive
	case leaseholdv1.LockMode_LOCK_MODE_SHARED:
		mode = core.Shared
	case leaseholdv1.LockMode_LOCK_MODE_SEMAPHORE:
		mode = core.Semaphore
	default:
		return 0, 0, core.Invalid("mode", "must be LOCK_MODE_EXCLUSIVE, LOCK_MODE_SHARED or LOCK_MODE_SEMAPHORE, got %v", req.GetMode())
	}
	limit := req.GetLimit()
	switch {
	case mode == core.Semaphore && (limit < 1 || limit > core.MaxSemaphoreLimit):
		return 0, 0, core.Invalid("limit", "must be 1 to %d for LOCK_MODE_SEMAPHORE, got %d", core.MaxSemaphoreLimit, limit)
	case mode != core.Semaphore && limit != 0:
		return 0, 0, core.Invalid("limit", "is only for LOCK_MODE_SEMAPHORE; leave it 0 for %v", req.GetMode())
	}
	return mode, limit, nil
}

// Release serves LockService.Release: it gives up a lock held by the lease.
func (s *Server) Release(ctx context.Context, req *leaseholdv1.ReleaseRequest) (*leaseholdv1.ReleaseResponse, error) {
	id, err := s.releaseArgs(req)
	if err != nil {
		return nil, err
	}
	if err := s.leader.Release(ctx, id, req.GetName(), req.GetToken()); err != nil {
		return nil, err
	}
	return &leaseholdv1.ReleaseResponse{}, nil
}

// releaseArgs validates a release and returns its lease.
func (s *Server) releaseArgs(req *leaseholdv1.ReleaseRequest) (core.LeaseID, error) {
	if err := core.ValidateName("name", req.GetName()); err != nil {
		return core.LeaseID{}, err
	}
	id, err := leaseID(req.GetLeaseId())
	if err != nil {
		return core.LeaseID{}, err
	}
	if req.GetToken() == 0 {
		return core.LeaseID{}, core.Invalid("token", "must be the grant's token (tokens start at 1)")
	}
	return id, nil
}

// Describe serves LockService.Describe.
func (s *Server) Describe(_ context.Context, req *leaseholdv1.DescribeRequest) (*leaseholdv1.DescribeResponse, error) {
	if err := core.ValidateName("name", req.GetName()); err != nil {
		return nil, err
	}
	v, err := s.leader.Describe(req.GetName())
	if err != nil {
		return nil, err
	}
	return &leaseholdv1.DescribeResponse{Lock: lockInfo(v)}, nil
}

// List serves LockService.List: locks under a prefix, in name order.
func (s *Server) List(_ context.Context, req *leaseholdv1.ListRequest) (*leaseholdv1.ListResponse, error) {
	limit, err := listBounds(req.GetPrefix(), req.GetLimit())
	if err != nil {
		return nil, err
	}
	views, truncated, err := s.leader.List(req.GetPrefix(), limit)
	if err != nil {
		return nil, err
	}
	resp := &leaseholdv1.ListResponse{Truncated: truncated, Locks: make([]*leaseholdv1.LockInfo, len(views))}
	for i, v := range views {
		resp.Locks[i] = lockInfo(v)
	}
	return resp, nil
}

// ForceRelease serves LockService.ForceRelease: an operator's release of a lock,
// whoever holds it, that consumes a fence token. The reason is recorded (ledger, Watch,
// the holder's lost lock) with the identity that asked, when auth is on.
func (s *Server) ForceRelease(ctx context.Context, req *leaseholdv1.ForceReleaseRequest) (*leaseholdv1.ForceReleaseResponse, error) {
	if err := core.ValidateName("name", req.GetName()); err != nil {
		return nil, err
	}
	if r := req.GetReason(); len(r) > core.MaxReasonLen || !utf8.ValidString(r) {
		return nil, core.Invalid("reason", "must be valid UTF-8 of at most %d bytes", core.MaxReasonLen)
	}
	released, fence, err := s.leader.ForceRelease(ctx, req.GetName(), recordedReason(principalOf(ctx), req.GetReason()))
	if err != nil {
		return nil, err
	}
	return &leaseholdv1.ForceReleaseResponse{ReleasedToken: released, FenceToken: fence}, nil
}

// recordedReason is a force release's reason as the ledger, the Watch event and the
// holder's lost lock record it: with the identity that asked, when auth knows it
// ("by admin alice: stuck job"), cut to MaxReasonLen.
func recordedReason(c *principal, reason string) string {
	if c == nil || c.who == nil {
		return reason
	}
	r := "by " + c.who.String() + ": " + reason
	for len(r) > core.MaxReasonLen {
		_, size := utf8.DecodeLastRuneInString(r)
		r = r[:len(r)-size]
	}
	return r
}

// CheckToken serves LockService.CheckToken: whether a token is the current holder's,
// vouched for only after a quorum confirmed that this node still leads.
func (s *Server) CheckToken(ctx context.Context, req *leaseholdv1.CheckTokenRequest) (*leaseholdv1.CheckTokenResponse, error) {
	if err := core.ValidateName("name", req.GetName()); err != nil {
		return nil, err
	}
	if req.GetToken() == 0 {
		return nil, core.Invalid("token", "must be positive")
	}
	current, holder, err := s.leader.CheckToken(ctx, req.GetName(), req.GetToken()) // confirms leadership first
	if err != nil {
		return nil, err
	}
	return &leaseholdv1.CheckTokenResponse{Current: current, HolderToken: holder}, nil
}

// ---- ClusterService -------------------------------------------------------------------

// Status serves ClusterService.Status: this node's own view, on any node.
func (s *Server) Status(context.Context, *leaseholdv1.StatusRequest) (*leaseholdv1.StatusResponse, error) {
	rs := s.raft.Status()
	st := s.leader.Stats()
	resp := &leaseholdv1.StatusResponse{
		NodeId:       rs.NodeID,
		Role:         rs.Role,
		Leader:       rs.LeaderID,
		Term:         rs.Term,
		CommitIndex:  rs.CommitIndex,
		AppliedIndex: rs.AppliedIndex,
		Leases:       uint32(st.Leases),
		Locks:        uint32(st.Locks),
		Version:      s.cfg.Version,
		UptimeMs:     time.Since(s.started).Milliseconds(),
		Epoch:        st.Epoch,
		LastToken:    st.LastToken,
		ApiAddr:      s.cfg.APIAddr,
		FastLaneAddr: s.cfg.FastLaneAddr,
		ClusterId:    s.ClusterID(),
		RaftAddr:     rs.RaftAddr,
	}
	resp.LeaderApiAddr = s.leaderAPIAddr()
	return resp, nil
}

// listBounds checks a List request's prefix and limit (0 means 1000, at most 10 000).
func listBounds(prefix string, limit uint32) (int, error) {
	switch {
	case limit == 0:
		limit = 1000
	case limit > 10000:
		return 0, core.Invalid("limit", "is %d, the maximum is 10000", limit)
	}
	if len(prefix) > core.MaxNameLen || !utf8.ValidString(prefix) {
		return 0, core.Invalid("prefix", "must be valid UTF-8 of at most %d bytes", core.MaxNameLen)
	}
	return int(limit), nil
}

// ---- conversions ----------------------------------------------------------------------

func (s *Server) ttl(ms int64) (time.Duration, error) {
	if ms == 0 {
		return s.cfg.DefaultTTL, nil
	}
	if ms < s.cfg.MinTTL.Milliseconds() || ms > s.cfg.MaxTTL.Milliseconds() {
		return 0, core.Invalid("ttl_ms", "is %d, it must be 0 (default) or %d to %d", ms, s.cfg.MinTTL.Milliseconds(), s.cfg.MaxTTL.Milliseconds())
	}
	return time.Duration(ms) * time.Millisecond, nil
}

func leaseID(s string) (core.LeaseID, error) {
	if s == "" {
		return core.LeaseID{}, core.Invalid("lease_id", "is required (from LeaseService.Grant)")
	}
	id, err := core.ParseLeaseID(s)
	if err != nil {
		return id, core.Invalid("lease_id", "must be 32 hex characters from LeaseService.Grant")
	}
	return id, nil
}

func holderFromProto(h *leaseholdv1.Holder) core.Holder {
	return core.Holder{Host: h.GetHost(), PID: h.GetPid(), Note: h.GetNote()}
}

func holderToProto(h core.Holder) *leaseholdv1.Holder {
	if h == (core.Holder{}) {
		return nil
	}
	return &leaseholdv1.Holder{Host: h.Host, Pid: h.PID, Note: h.Note}
}

func lockInfo(v leader.LockView) *leaseholdv1.LockInfo {
	info := &leaseholdv1.LockInfo{
		Name:             v.Name,
		Class:            leaseholdv1.LockClass(v.Class),
		Held:             v.Held,
		Token:            v.Token,
		Holder:           holderToProto(v.Holder),
		TtlRemainingMs:   ttlMillis(v.TTLRemaining),
		Waiters:          uint32(v.Waiters),
		DelayRemainingMs: v.DelayRemaining.Milliseconds(),
		LockDelayMs:      v.DelayMillis,
		Mode:             modeToProto(v.Mode),
		Limit:            v.Limit,
	}
	for _, h := range v.Holders {
		info.Holders = append(info.Holders, &leaseholdv1.LockHolder{
			Token: h.Token, Holder: holderToProto(h.Holder), TtlRemainingMs: ttlMillis(h.TTLRemaining), LockDelayMs: h.DelayMillis,
		})
	}
	return info
}

// ttlMillis is a TTL left in milliseconds, -1 when unknown (negative).
func ttlMillis(d time.Duration) int64 {
	if d < 0 {
		return -1
	}
	return d.Milliseconds()
}

func modeToProto(m core.Mode) leaseholdv1.LockMode {
	switch m {
	case core.Shared:
		return leaseholdv1.LockMode_LOCK_MODE_SHARED
	case core.Semaphore:
		return leaseholdv1.LockMode_LOCK_MODE_SEMAPHORE
	}
	return leaseholdv1.LockMode_LOCK_MODE_EXCLUSIVE
}
