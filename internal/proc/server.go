package proc

import (
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Server is a `leasehold server` process with its own data directory, on fixed
// addresses or on free loopback ports. Every incarnation appends its output to Log.
// Start starts it again after it exited, on the same addresses and data directory.
//
// Fill the fields, then call Start. Fields are read-only once Start has been called.
type Server struct {
	// Bin is the leasehold binary (see Build). Required.
	Bin string
	// Name names the server in errors and in the log. Default: ID, or "leasehold".
	Name string
	// ID is --node-id (default: the server's own default).
	ID string
	// Dir is the data directory (--data-dir). Required.
	Dir string
	// Log receives every incarnation's output. Required.
	Log string
	// API, Raft and Fast are the API, raft and fast-lane addresses (host:port). Those
	// left empty get free loopback ports on the first Start, picked again if another
	// process takes one first. Fast stays empty, and --fast-lane-addr is not passed,
	// when Bin has no such flag (an older build, for the benchmarks).
	API, Raft, Fast string
	// Advertise passes API as --advertise-addr too.
	Advertise bool
	// Join is --join: the API address of a member this node asks to add it.
	Join string
	// Args are more flags for `leasehold server`.
	Args []string
	// Prefix runs the server under another command (`ip netns exec NS`, say).
	Prefix []string
	// Env is added to the server's environment.
	Env []string
	// Group starts each incarnation in a process group of its own (see Options.Group).
	Group bool

	mu      sync.Mutex
	p       *Process // the latest incarnation
	started bool     // the addresses are settled
}

// flagsOf caches which optional flags a binary's `server` command takes.
var flagsOf sync.Map // binary path → *serverFlags

type serverFlags struct {
	once     sync.Once
	fastLane bool
}

// HasFastLane reports whether the binary's `server` command takes --fast-lane-addr (it
// asks `BIN server -h` once per binary).
func HasFastLane(bin string) bool {
	v, _ := flagsOf.LoadOrStore(bin, &serverFlags{})
	f := v.(*serverFlags)
	f.once.Do(func() {
		help, _ := exec.Command(bin, "server", "-h").CombinedOutput()
		f.fastLane = strings.Contains(string(help), "fast-lane-addr")
	})
	return f.fastLane
}

// upWait bounds how long Start waits for the server's listeners.
const upWait = time.Minute

// Start starts the server and waits, up to ctx or a minute, until it answers HTTP on
// its API address: every listener is then open (the API serves only after the raft and
// fast-lane ports were bound), though the node may not lead or have joined yet (see
// WaitHealthy). On the first Start, a server that exits because a port picked for it
// was taken meanwhile is started again on new ports (RetryPorts). It fails if the
// server runs already, or exits before it answers (ErrExited).
func (s *Server) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.p != nil {
		if ok, _ := s.p.Exited(); !ok {
			return fmt.Errorf("proc: %s is already running (pid %d)", s.name(), s.p.PID())
		}
	}
	ctx, cancel := context.WithTimeout(ctx, upWait)
	defer cancel()
	if s.started {
		return s.startLocked(ctx)
	}
	if !HasFastLane(s.Bin) {
		s.Fast = ""
	}
	var pick []*string // the addresses to choose
	for _, a := range []*string{&s.API, &s.Raft, &s.Fast} {
		if *a == "" && (a != &s.Fast || HasFastLane(s.Bin)) {
			pick = append(pick, a)
		}
	}
	start := func(ports []int) error {
		for i, a := range pick {
			*a = "127.0.0.1:" + strconv.Itoa(ports[i])
		}
		return s.startLocked(ctx)
	}
	var err error
	if len(pick) == 0 {
		err = s.startLocked(ctx)
	} else {
		err = RetryPorts(len(pick), start)
	}
	if err != nil {
		for _, a := range pick {
			*a = "" // a later Start picks again
		}
		return err
	}
	s.started = true
	return nil
}

func (s *Server) name() string {
	switch {
	case s.Name != "":
		return s.Name
	case s.ID != "":
		return s.ID
	}
	return "leasehold"
}

// startLocked starts one incarnation and waits until it answers HTTP; an incarnation
// that does not is killed.
func (s *Server) startLocked(ctx context.Context) error {
	args := append([]string(nil), s.Prefix...)
	args = append(args, s.Bin, "server", "--addr", s.API, "--raft-addr", s.Raft, "--data-dir", s.Dir)
	if s.ID != "" {
		args = append(args, "--node-id", s.ID)
	}
	if s.Advertise {
		args = append(args, "--advertise-addr", s.API)
	}
	if s.Fast != "" {
		args = append(args, "--fast-lane-addr", s.Fast)
	}
	if s.Join != "" {
		args = append(args, "--join", s.Join)
	}
	args = append(args, s.Args...)
	p, err := Start(Options{Name: s.name(), Argv: args, Env: s.Env, Log: s.Log, Group: s.Group})
	if err != nil {
		return err
	}
	s.p = p
	hc := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	err = p.waitUntil(ctx, "serving HTTP on "+s.API, func() error {
		resp, err := hc.Get("http://" + s.API + "/healthz")
		if err == nil {
			_ = resp.Body.Close()
		}
		return err
	})
	if err != nil {
		_ = p.Kill()
	}
	return err
}

// Process returns the latest incarnation (nil before the first Start).
func (s *Server) Process() *Process {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.p
}

// Running reports whether an incarnation runs.
func (s *Server) Running() bool {
	p := s.Process()
	if p == nil {
		return false
	}
	ok, _ := p.Exited()
	return !ok
}

// PID returns the latest incarnation's pid (0 before the first Start).
func (s *Server) PID() int {
	if p := s.Process(); p != nil {
		return p.PID()
	}
	return 0
}

// Signal sends sig to the running incarnation.
func (s *Server) Signal(sig syscall.Signal) error {
	p := s.Process()
	if p == nil {
		return fmt.Errorf("proc: %s was never started", s.name())
	}
	return p.Signal(sig)
}

// Kill kills the running incarnation with SIGKILL and waits until it is gone. It does
// nothing when none runs.
func (s *Server) Kill() error {
	if p := s.Process(); p != nil {
		return p.Kill()
	}
	return nil
}

// Stop ends the running incarnation (Process.Stop). It does nothing when none runs.
func (s *Server) Stop(grace time.Duration) error {
	if p := s.Process(); p != nil {
		return p.Stop(grace)
	}
	return nil
}

// Healthy reports whether the server answers /readyz with 200: it is ready to serve (a
// single node once it leads; in a cluster, the leader or a follower that has caught up).
func (s *Server) Healthy() bool {
	hc := &http.Client{Timeout: time.Second}
	resp, err := hc.Get("http://" + s.API + "/readyz")
	if err != nil {
		return false
	}
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// WaitHealthy waits until the server is ready to serve (Healthy), it exits
// (ErrExited), or ctx ends.
func (s *Server) WaitHealthy(ctx context.Context) error {
	p := s.Process()
	if p == nil {
		return fmt.Errorf("proc: %s was never started", s.name())
	}
	return p.waitUntil(ctx, "healthy at "+s.API, func() error {
		if !s.Healthy() {
			return fmt.Errorf("GET http://%s/readyz is not 200", s.API)
		}
		return nil
	})
}
