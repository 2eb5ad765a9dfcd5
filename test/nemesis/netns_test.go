package nemesis

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// netLab is a small private network of network namespaces, one per node, so that a test
// can cut a node off the way a real network failure does (packets silently dropped,
// connections hanging) without touching anything outside it:
//
//	root ns (the test process)           hub ns                    node ns i
//	  <id>h  10.A.B.1/24  ───veth───  <id>hb ─┐
//	                                          br0 ── <id>n<i>b ───veth─── <id>n<i>  10.A.B.(10+i)/24
//
// The bridge lives in its own "hub" namespace, not in the root namespace: on a host with
// Docker, bridged traffic in the root namespace goes through the host's FORWARD chain
// (br_netfilter), whose policy is DROP. In the hub namespace no rule applies, and the
// host firewall is never changed. The test process reaches every node through its
// root-side veth, which is plain local traffic.
//
// Two ways to isolate node i:
//   - full: its bridge port goes down; nobody (peers, clients) reaches it;
//   - peers: nftables rules inside its namespace drop packets to and from the other
//     nodes only; clients still reach it — the harsher case, where a deposed leader keeps
//     hearing from clients.
//
// Every namespace name starts with labPrefix and carries the creating process's pid, so
// a later run removes what a crashed run left behind (see sweepStaleLabs).
type netLab struct {
	id     string // 6 hex digits, unique per lab
	prefix string // "10.A.B"
	hub    string // hub namespace
	nodes  []string
	hostIf string
	nft    bool // nft works inside the namespaces (peer partitions)
}

const labPrefix = "lhnem-"

// run executes a command with a timeout and returns its combined output in the error.
func run(timeout time.Duration, name string, args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func runInput(timeout time.Duration, input string, name string, args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdin = strings.NewReader(input)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// netnsUnavailable returns why network namespaces cannot be used here, or "".
func netnsUnavailable() string {
	if os.Geteuid() != 0 {
		return "not running as root (network namespaces need CAP_NET_ADMIN)"
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return "the ip command (iproute2) is not installed"
	}
	if _, err := os.Stat("/proc/self/ns/net"); err != nil {
		return "the kernel has no network namespaces: " + err.Error()
	}
	return ""
}

// newNetLab builds a lab for n nodes. On error, whatever was created is removed.
func newNetLab(n int) (*netLab, error) {
	if why := netnsUnavailable(); why != "" {
		return nil, errors.New(why)
	}
	sweepStaleLabs()
	var b [3]byte
	_, _ = crand.Read(b[:])
	l := &netLab{id: hex.EncodeToString(b[:])}
	pfx, err := freeSubnet()
	if err != nil {
		return nil, err
	}
	l.prefix = pfx
	base := fmt.Sprintf("%s%d-%s", labPrefix, os.Getpid(), l.id)
	l.hub = base + "-hub"
	l.hostIf = "lh" + l.id + "h"
	ok := false
	defer func() {
		if !ok {
			l.Close()
		}
	}()
	const t = 10 * time.Second
	steps := [][]string{
		{"ip", "netns", "add", l.hub},
		{"ip", "-n", l.hub, "link", "set", "lo", "up"},
		{"ip", "-n", l.hub, "link", "add", "br0", "type", "bridge"},
		{"ip", "-n", l.hub, "link", "set", "br0", "up"},
		{"ip", "link", "add", l.hostIf, "type", "veth", "peer", "name", l.hostIf + "b", "netns", l.hub},
		{"ip", "-n", l.hub, "link", "set", l.hostIf + "b", "master", "br0"},
		{"ip", "-n", l.hub, "link", "set", l.hostIf + "b", "up"},
		{"ip", "addr", "add", l.prefix + ".1/24", "dev", l.hostIf},
		{"ip", "link", "set", l.hostIf, "up"},
	}
	for i := range n {
		ns := fmt.Sprintf("%s-n%d", base, i+1)
		l.nodes = append(l.nodes, ns)
		nodeIf, hubIf := l.nodeIf(i), l.nodeIf(i)+"b"
		steps = append(steps,
			[]string{"ip", "netns", "add", ns},
			[]string{"ip", "-n", ns, "link", "set", "lo", "up"},
			[]string{"ip", "-n", l.hub, "link", "add", hubIf, "type", "veth", "peer", "name", nodeIf, "netns", ns},
			[]string{"ip", "-n", l.hub, "link", "set", hubIf, "master", "br0"},
			[]string{"ip", "-n", l.hub, "link", "set", hubIf, "up"},
			[]string{"ip", "-n", ns, "addr", "add", l.NodeIP(i) + "/24", "dev", nodeIf},
			[]string{"ip", "-n", ns, "link", "set", nodeIf, "up"},
		)
	}
	for _, s := range steps {
		if err := run(t, s[0], s[1:]...); err != nil {
			return nil, fmt.Errorf("building the network lab: %w", err)
		}
	}
	// Peer partitions need nftables inside a node namespace; check once.
	if _, err := exec.LookPath("nft"); err == nil {
		if err := run(t, "ip", "netns", "exec", l.nodes[0], "nft", "list", "ruleset"); err == nil {
			l.nft = true
		}
	}
	ok = true
	return l, nil
}

func (l *netLab) nodeIf(i int) string { return fmt.Sprintf("lh%sn%d", l.id, i+1) }

// NodeIP returns node i's address (i from 0).
func (l *netLab) NodeIP(i int) string { return fmt.Sprintf("%s.%d", l.prefix, 11+i) }

// Exec returns the argv prefix that runs a command inside node i's namespace.
func (l *netLab) Exec(i int) []string { return []string{"ip", "netns", "exec", l.nodes[i]} }

// IsolateFull cuts node i off from everyone: its port on the bridge goes down.
func (l *netLab) IsolateFull(i int) error {
	return run(10*time.Second, "ip", "-n", l.hub, "link", "set", l.nodeIf(i)+"b", "down")
}

// IsolatePeers drops every packet between node i and the other nodes, in both
// directions; the test process (the clients) still reaches it.
func (l *netLab) IsolatePeers(i int, n int) error {
	if !l.nft {
		return errors.New("nftables is not usable inside the namespaces")
	}
	var others []string
	for j := range n {
		if j != i {
			others = append(others, l.NodeIP(j))
		}
	}
	set := strings.Join(others, ", ")
	rules := fmt.Sprintf(`table inet lhpart {
	chain in { type filter hook input priority 0; policy accept; ip saddr { %s } drop; }
	chain out { type filter hook output priority 0; policy accept; ip daddr { %s } drop; }
}
`, set, set)
	return runInput(10*time.Second, rules, "ip", "netns", "exec", l.nodes[i], "nft", "-f", "-")
}

// IsolateClients drops every packet between node i and the test process (the clients,
// at the host's address of the lab); its peers still reach it.
func (l *netLab) IsolateClients(i int) error {
	if !l.nft {
		return errors.New("nftables is not usable inside the namespaces")
	}
	host := l.prefix + ".1"
	rules := fmt.Sprintf(`table inet lhpart {
	chain in { type filter hook input priority 0; policy accept; ip saddr %s drop; }
	chain out { type filter hook output priority 0; policy accept; ip daddr %s drop; }
}
`, host, host)
	return runInput(10*time.Second, rules, "ip", "netns", "exec", l.nodes[i], "nft", "-f", "-")
}

// Heal undoes every kind of isolation of node i (it is fine to call it when node i is
// not isolated).
func (l *netLab) Heal(i int) error {
	var errs []error
	if err := run(10*time.Second, "ip", "-n", l.hub, "link", "set", l.nodeIf(i)+"b", "up"); err != nil {
		errs = append(errs, err)
	}
	if l.nft {
		// Deleting a table that does not exist fails; that is the common case.
		_ = run(10*time.Second, "ip", "netns", "exec", l.nodes[i], "nft", "delete", "table", "inet", "lhpart")
	}
	return errors.Join(errs...)
}

// Close removes every namespace of the lab (which removes the veths inside them and
// their root-side peers) and kills any process still running in them.
func (l *netLab) Close() {
	for _, ns := range append(append([]string(nil), l.nodes...), l.hub) {
		removeNetns(ns)
	}
	_ = run(10*time.Second, "ip", "link", "del", l.hostIf) // gone with the hub already, normally
}

func removeNetns(ns string) {
	if out, err := exec.Command("ip", "netns", "pids", ns).Output(); err == nil {
		for _, f := range strings.Fields(string(out)) {
			if pid, err := strconv.Atoi(f); err == nil && pid > 1 {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	_ = run(10*time.Second, "ip", "netns", "del", ns)
}

// sweepStaleLabs removes the namespaces of labs whose creating process is gone (a run
// killed before its cleanup ran).
func sweepStaleLabs() {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || !strings.HasPrefix(f[0], labPrefix) {
			continue
		}
		rest := strings.TrimPrefix(f[0], labPrefix)
		pidStr, _, _ := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidStr)
		if err != nil || pid == os.Getpid() {
			continue
		}
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
			continue // its creator still runs
		}
		removeNetns(f[0])
	}
}

// freeSubnet picks a 10.A.B.0/24 that overlaps no route of the root namespace.
func freeSubnet() (string, error) {
	out, err := exec.Command("ip", "-4", "-o", "route", "show", "table", "all").Output()
	if err != nil {
		return "", fmt.Errorf("ip route: %w", err)
	}
	var used []*net.IPNet
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		for _, w := range f {
			if !strings.Contains(w, ".") {
				continue
			}
			if !strings.Contains(w, "/") {
				w += "/32"
			}
			if _, n, err := net.ParseCIDR(w); err == nil {
				used = append(used, n)
			}
		}
	}
	for range 64 {
		a, b := 100+rand.IntN(150), 1+rand.IntN(250)
		_, cand, _ := net.ParseCIDR(fmt.Sprintf("10.%d.%d.0/24", a, b))
		clash := false
		for _, u := range used {
			if u.Contains(cand.IP) || cand.Contains(u.IP) {
				clash = true
				break
			}
		}
		if !clash {
			return fmt.Sprintf("10.%d.%d", a, b), nil
		}
	}
	return "", errors.New("no free 10.x.y.0/24 subnet for the network lab")
}
