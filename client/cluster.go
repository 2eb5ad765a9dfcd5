package client

import (
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"

	"connectrpc.com/connect"

	"github.com/leasehold/leasehold/fastlane"
)

// clusterIDHeader is the header that carries cluster IDs over Connect (the server's
// ClusterIDHeader): the server's on every response, the one the client expects on every
// request.
const clusterIDHeader = "Leasehold-Cluster-Id"

// WithClusterID makes the client talk only to nodes of the cluster with this ID (32 hex
// characters, as `leasehold status` shows it). Without it the client learns the ID from
// the first node that names one (the node Dial reaches) and holds every node to it from
// then on. Either way a node of another cluster is refused with ErrWrongCluster, and
// nothing is written there: the client sends the ID it expects with every request, and
// the node refuses to serve a request for another cluster.
func WithClusterID(id string) Option { return func(o *options) { o.clusterID = id } }

// ClusterID returns the ID of the cluster the client talks to: the one given with
// WithClusterID, or the one learnt from the first node that named one ("" until then,
// or when the servers predate cluster IDs).
func (c *Client) ClusterID() string { return c.id.get() }

// clusterID is the cluster a Client talks to, given or learnt, and the check every
// answer goes through.
type clusterID struct {
	mu sync.Mutex
	id string
}

// newClusterID returns the cluster check of a client given id ("" to learn it).
func newClusterID(id string) (*clusterID, error) {
	if id != "" {
		if _, err := hex.DecodeString(id); err != nil || len(id) != 32 || strings.ToLower(id) != id {
			return nil, fmt.Errorf("client: WithClusterID(%q): a cluster ID is 32 lowercase hex characters", id)
		}
	}
	return &clusterID{id: id}, nil
}

func (c *clusterID) get() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.id
}

// check accepts an answer from node, whose cluster ID is got ("" when it has none): it
// learns got if no ID is known yet, and refuses any other ID than the known one.
func (c *clusterID) check(got, node string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.id == "":
		c.id = got
		return nil
	case got == c.id:
		return nil
	case got == "":
		return fmt.Errorf("%w: node %s names no cluster; this client talks to cluster %s", ErrWrongCluster, node, c.id)
	default:
		return fmt.Errorf("%w: node %s is of cluster %s; this client talks to cluster %s", ErrWrongCluster, node, got, c.id)
	}
}

// clusterChecked is the HTTP client under failover: it sends the expected cluster ID
// with every request (the server refuses to serve another cluster's) and refuses every
// answer from a node of another cluster, as a FailedPrecondition wrapping
// ErrWrongCluster — or an Unavailable one from a node that names no cluster (yet).
type clusterChecked struct {
	base connect.HTTPClient
	id   *clusterID
}

func (c clusterChecked) Do(req *http.Request) (*http.Response, error) {
	if want := c.id.get(); want != "" {
		req.Header.Set(clusterIDHeader, want) // req is failover's own clone
	}
	resp, err := c.base.Do(req)
	if err != nil {
		return nil, err
	}
	got := resp.Header.Get(clusterIDHeader)
	if err := c.id.check(got, req.URL.Host); err != nil {
		_ = resp.Body.Close()
		code := connect.CodeFailedPrecondition
		if got == "" {
			code = connect.CodeUnavailable // a node that has just joined, say: try another
		}
		return nil, connect.NewError(code, err)
	}
	return resp, nil
}

// fastLaneHello makes the fast-lane handshake on a new connection to addr: the server
// must be of the client's cluster (or name the first one the client learns).
func (c *clusterID) fastLaneHello(conn net.Conn, addr string) error {
	got, err := fastlane.ClientHello(conn, c.get())
	if errors.Is(err, fastlane.ErrWrongCluster) {
		return fmt.Errorf("%w: fast lane %s: %w", ErrWrongCluster, addr, err)
	}
	if err != nil {
		return err
	}
	return c.check(got, "with fast lane "+addr)
}
