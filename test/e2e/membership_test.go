package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/client"
)

// members runs `leasehold members list` against addr and returns its rows (header
// skipped).
func members(t *testing.T, addr string) []string {
	t.Helper()
	r := RunCLI(t, 10*time.Second, "members", "list", "--addr", addr)
	if r.Code != 0 {
		t.Fatalf("members list: exit %d, stderr %q", r.Code, r.Stderr)
	}
	lines := strings.Split(strings.TrimSpace(r.Stdout), "\n")
	return lines[1:]
}

// TestMemberTypoLeavesClusterServing is the brick: one `members add` for a node
// that does not exist used to leave a one-node cluster without quorum for good (after a
// restart it stayed candidate). Now the add is refused, the configuration is what it
// was, and after a restart the node leads and serves its data again.
func TestMemberTypoLeavesClusterServing(t *testing.T) {
	if testing.Short() {
		t.Skip("restarts a server")
	}
	s := StartServer(t, "--node-id", "n1")
	c := s.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := c.Put(ctx, "typo/key", []byte("v")); err != nil {
		t.Fatal(err)
	}
	ports := []int{freePort(t), freePort(t)}
	typo := []string{"members", "add", "n2", fmt.Sprintf("127.0.0.1:%d", ports[0]), fmt.Sprintf("127.0.0.1:%d", ports[1]), "--addr", s.Addr}
	r := RunCLI(t, 30*time.Second, typo...)
	if r.Code == 0 || !strings.Contains(r.Stderr, "no leasehold node answers") {
		t.Fatalf("members add of a node that does not exist: exit %d, stderr %q", r.Code, r.Stderr)
	}
	if rows := members(t, s.Addr); len(rows) != 1 || !strings.HasPrefix(rows[0], "n1 ") {
		t.Fatalf("the configuration changed: %q", rows)
	}
	if _, err := c.Put(ctx, "typo/key", []byte("w")); err != nil {
		t.Fatalf("the cluster no longer commits after the refused add: %v", err)
	}
	if code, _ := s.Stop(20 * time.Second); code != 0 {
		t.Fatalf("server exit code %d", code)
	}
	s.Restart() // fails the test unless the node leads again within 30 s
	c2 := s.Client(t)
	if v, err := c2.Get(ctx, "typo/key"); err != nil || string(v.Data) != "w" {
		t.Fatalf("after the restart: %q %v", v.Data, err)
	}
}

// TestRemoveLastVoterChangesNothing: `members remove` of the only voter used to answer
// internal and still forget the node's API address. Now it is refused, and the node
// keeps its address, leads and serves.
func TestRemoveLastVoterChangesNothing(t *testing.T) {
	s := StartServer(t, "--node-id", "n1")
	r := RunCLI(t, 30*time.Second, "members", "remove", "n1", "--addr", s.Addr)
	if r.Code == 0 || !strings.Contains(r.Stderr, "last voter") {
		t.Fatalf("members remove of the last voter: exit %d, stderr %q", r.Code, r.Stderr)
	}
	rows := members(t, s.Addr)
	if len(rows) != 1 || !regexp.MustCompile(`^n1\s+\S+\s+`+regexp.QuoteMeta(s.Addr)+`\s+\S+\s+voter\s+\*$`).MatchString(rows[0]) {
		t.Fatalf("members after the refused remove: %q", rows)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := s.Client(t).Lock(ctx, "last-voter", client.Correctness)
	if err != nil {
		t.Fatal(err)
	}
	_ = l.Unlock(ctx)
}

// defaultPortsFree reports whether 127.0.0.1:7740–7742 can be bound now.
func defaultPortsFree() error {
	for port := 7740; port <= 7742; port++ {
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			return err
		}
		ln.Close()
	}
	return nil
}

// TestTwoClustersOnOneHost is the data-safety bug: a client of one cluster took
// its lock and wrote its value in another leasehold on the same host (the compose nodes
// advertised 127.0.0.1:7742, which on the host is the quick-start server's fast lane).
// Here a quick-start server runs on the default ports, another cluster on free ports,
// and a third advertises the quick-start server's fast lane as its own; a client of
// each locks (both classes) and writes through the fast lane and Connect, and nothing
// ever lands in another cluster.
func TestTwoClustersOnOneHost(t *testing.T) {
	if err := defaultPortsFree(); err != nil {
		t.Skipf("the default ports 7740-7742 are taken, and the point is a cluster on them: %v", err)
	}
	quick := StartProc(t, leaseholdBin, "server", "--data-dir", filepath.Join(t.TempDir(), "quick"))
	hc := &http.Client{Timeout: time.Second}
	if !eventually(30*time.Second, func() bool {
		resp, err := hc.Get("http://127.0.0.1:7740/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}) {
		t.Fatalf("the quick-start server did not serve on 127.0.0.1:7740; stderr:\n%s", quick.Stderr())
	}
	other := StartServer(t)
	liar := StartServer(t, "--fast-lane-advertise", "127.0.0.1:7742")

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dial := func(addr string, opts ...client.Option) *client.Client {
		c, err := client.Dial(ctx, addr, opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close(context.Background()) })
		return c
	}
	clients := map[string]*client.Client{
		"quick":         dial("127.0.0.1:7740"),
		"other":         dial(other.Addr),
		"liar":          dial(liar.Addr),
		"quick-connect": dial("127.0.0.1:7740", client.WithoutFastLane()),
		"other-connect": dial(other.Addr, client.WithoutFastLane()),
	}
	owner := map[string]string{"quick": "quick", "quick-connect": "quick", "other": "other", "other-connect": "other", "liar": "liar"}
	ids := map[string]string{}
	for name, c := range clients {
		if c.ClusterID() == "" {
			t.Fatalf("client %s learnt no cluster ID", name)
		}
		if prev, ok := ids[owner[name]]; ok && prev != c.ClusterID() {
			t.Fatalf("two clients of %s learnt different IDs", owner[name])
		}
		ids[owner[name]] = c.ClusterID()
	}
	if ids["quick"] == ids["other"] || ids["quick"] == ids["liar"] || ids["other"] == ids["liar"] {
		t.Fatalf("clusters share an ID: %v", ids)
	}
	if st, err := clients["liar"].Status(ctx); err != nil || st.GetFastLaneAddr() != "127.0.0.1:7742" {
		t.Fatalf("the third cluster advertises %q (%v)", st.GetFastLaneAddr(), err)
	}

	for round := range 10 {
		for name, c := range clients {
			for _, class := range []client.LockOption{client.Correctness, client.Efficiency} {
				l, err := c.Lock(ctx, name+"/lock", class)
				if err != nil {
					t.Fatalf("%s: lock: %v", name, err)
				}
				if _, err := c.Put(ctx, name+"/key", []byte{byte(round)}); err != nil {
					t.Fatalf("%s: put: %v", name, err)
				}
				if err := l.Unlock(ctx); err != nil {
					t.Fatalf("%s: unlock: %v", name, err)
				}
			}
		}
	}
	// Every value is in its own cluster and in no other; no lock is held anywhere.
	for name := range clients {
		for _, reader := range []string{"quick", "other", "liar"} {
			v, err := clients[reader].Get(ctx, name+"/key")
			if err != nil {
				t.Fatal(err)
			}
			if want := owner[name] == reader; v.Found != want {
				t.Errorf("%s/key in cluster %s: found %v, want %v", name, reader, v.Found, want)
			}
		}
	}
	for _, reader := range []string{"quick", "other", "liar"} {
		if l, err := clients[reader].List(ctx, "", 0); err != nil || len(l.GetLocks()) != 0 {
			t.Errorf("cluster %s lists locks %v (%v)", reader, l.GetLocks(), err)
		}
	}

	// A client that expects one cluster is refused by another before anything is sent.
	if _, err := client.Dial(ctx, "127.0.0.1:7740", client.WithClusterID(ids["other"])); !errors.Is(err, client.ErrWrongCluster) {
		t.Fatalf("Dial(quick, WithClusterID(other)) = %v, want ErrWrongCluster", err)
	}
	r := RunCLI(t, 10*time.Second, "status", "--addr", "127.0.0.1:7740")
	if !strings.Contains(r.Stdout, ids["quick"]) {
		t.Errorf("leasehold status does not show the cluster ID %s:\n%s", ids["quick"], r.Stdout)
	}
}
