package proc

import (
	"errors"
	"net"
)

// FreePorts returns n distinct loopback TCP ports that were free a moment ago. Another
// process may take one before the caller binds it: start through RetryPorts (Server
// does) to pick again when that happens.
func FreePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	lns := make([]net.Listener, 0, n)
	defer func() {
		for _, ln := range lns {
			_ = ln.Close()
		}
	}()
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0") // held until all are picked, so they differ
		if err != nil {
			return nil, err
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// freePorts is FreePorts; a test replaces it to lose the race on purpose.
var freePorts = FreePorts

// portAttempts bounds RetryPorts: five losses of the race in a row mean something else
// is wrong.
const portAttempts = 5

// RetryPorts calls start with n free loopback ports, and again with new ones, up to
// five times in all, while it fails with an error wrapping ErrAddrInUse: the race
// between picking a free port and binding it, lost to another process. start must clean
// up after a failed attempt (stop what it started).
func RetryPorts(n int, start func(ports []int) error) error {
	var err error
	for range portAttempts {
		var ports []int
		if ports, err = freePorts(n); err != nil {
			return err
		}
		if err = start(ports); !errors.Is(err, ErrAddrInUse) {
			return err
		}
	}
	return err
}
