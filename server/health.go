package server

import (
	"context"
	"fmt"
	"net/http"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"
	"connectrpc.com/grpcreflect"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
)

// readyLag is how far a follower's applied index may trail its commit index while it
// counts as ready: under load a healthy follower trails by a few batches; one that is
// replaying its log after a restart trails by far more.
const readyLag = 1000

// Ready reports whether this node can serve requests now — it knows its cluster's ID
// (a client checks it on every answer), and it leads with its leader runtime active, or
// it follows a leader whose API address it knows (so it can forward) and has applied
// its log to within readyLag entries of the commit index — and, when it cannot, why. It
// is what /readyz and grpc.health.v1 answer.
func (s *Server) Ready() (bool, string) {
	if s.ClusterID() == "" {
		return false, "the cluster has no ID yet (its first leader names it)"
	}
	if s.leader.Active() {
		return true, "leader"
	}
	rs := s.raft.Status()
	switch rs.LeaderID {
	case "":
		return false, "no leader known"
	case rs.NodeID:
		return false, "elected leader, not serving yet"
	}
	addr := s.leaderAPIAddr()
	if addr == "" || addr == s.cfg.APIAddr {
		return false, fmt.Sprintf("leader %s known, but not its API address yet", rs.LeaderID)
	}
	if rs.AppliedIndex+readyLag < rs.CommitIndex {
		return false, fmt.Sprintf("catching up: applied %d of %d", rs.AppliedIndex, rs.CommitIndex)
	}
	return true, "follower of " + rs.LeaderID
}

// serveHealthz answers /healthz: the process is alive and serving HTTP (200 always).
// Load balancers and orchestrators that want to know whether to send requests here
// ask /readyz.
func (s *Server) serveHealthz(w http.ResponseWriter, _ *http.Request) {
	_, _ = w.Write([]byte("ok\n"))
}

// serveReadyz answers /readyz: 200 when the node is Ready, 503 with the reason when not.
func (s *Server) serveReadyz(w http.ResponseWriter, _ *http.Request) {
	ok, why := s.Ready()
	if !ok {
		http.Error(w, "not ready: "+why, http.StatusServiceUnavailable)
		return
	}
	_, _ = w.Write([]byte("ready: " + why + "\n"))
}

// mountGRPCServices mounts gRPC's health service (grpc.health.v1) and server reflection
// (v1 and v1alpha, for tools such as grpcurl) on mux. Reflection lists every service of
// leasehold.proto and these two.
func (s *Server) mountGRPCServices(mux *http.ServeMux, opts ...connect.HandlerOption) {
	mux.Handle(grpchealth.NewHandler(healthChecker{s}, opts...))
	reflector := grpcreflect.NewStaticReflector(reflectedServices()...)
	mux.Handle(grpcreflect.NewHandlerV1(reflector, opts...))
	mux.Handle(grpcreflect.NewHandlerV1Alpha(reflector, opts...))
}

// reflectedServices names the services gRPC reflection lists: leasehold.proto's, health
// and reflection.
func reflectedServices() []string {
	names := leaseholdServices()
	return append(names, grpchealth.HealthV1ServiceName, grpcreflect.ReflectV1ServiceName, grpcreflect.ReflectV1AlphaServiceName)
}

// grpcServiceRoutes are the RPCs of health and reflection, for the guard. (Their
// descriptors are not in the protobuf registry under these names: the libraries
// register them under a package prefix of their own.)
var grpcServiceRoutes = map[string]routeKind{
	"/" + grpchealth.HealthV1ServiceName + "/Check":                       unaryRoute,
	"/" + grpchealth.HealthV1ServiceName + "/Watch":                       streamRoute,
	"/" + grpcreflect.ReflectV1ServiceName + "/ServerReflectionInfo":      duplexRoute,
	"/" + grpcreflect.ReflectV1AlphaServiceName + "/ServerReflectionInfo": duplexRoute,
}

// leaseholdServices names the services of leasehold.proto.
func leaseholdServices() []string {
	services := leaseholdv1.File_leasehold_v1_leasehold_proto.Services()
	names := make([]string, 0, services.Len())
	for i := range services.Len() {
		names = append(names, string(services.Get(i).FullName()))
	}
	return names
}

// healthChecker answers grpc.health.v1 Check: SERVING when the node is Ready, for the
// server as a whole ("") and for each service of leasehold.proto (they are served, or
// not, together); NOT_SERVING otherwise; NotFound for any other service. Watch is not
// offered (Unimplemented): poll Check.
type healthChecker struct{ s *Server }

func (h healthChecker) Check(_ context.Context, req *grpchealth.CheckRequest) (*grpchealth.CheckResponse, error) {
	known := req.Service == ""
	for _, name := range leaseholdServices() {
		known = known || name == req.Service
	}
	if !known {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("server: no service %q here", req.Service))
	}
	if ok, _ := h.s.Ready(); !ok {
		return &grpchealth.CheckResponse{Status: grpchealth.StatusNotServing}, nil
	}
	return &grpchealth.CheckResponse{Status: grpchealth.StatusServing}, nil
}
