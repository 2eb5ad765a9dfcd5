package core

import (
	"net"
	"slices"
	"strconv"
)

// Member is a node of the cluster as the replicated state records it: its raft server id,
// the address its API listens on (so that any node can forward a request to the leader)
// and the address of its fast lane ("" when it has none), both as the node advertises
// them. Raft's own configuration holds the raft addresses.
type Member struct {
	ID           string `json:"id"`
	APIAddr      string `json:"apiAddr"`
	FastLaneAddr string `json:"fastLaneAddr,omitempty"`
}

// memberAddrs is what the state records for one member.
type memberAddrs struct {
	api, fastLane string
}

// Member returns the API address recorded for node id ("" when unknown).
func (s *State) Member(id string) string { return s.members[id].api }

// ClusterID returns the cluster's ID, "" until OpSetClusterID has named it.
func (s *State) ClusterID() string { return s.clusterID }

// Members returns every recorded member in id order.
func (s *State) Members() []Member {
	out := make([]Member, 0, len(s.members))
	for id, a := range s.members {
		out = append(out, Member{ID: id, APIAddr: a.api, FastLaneAddr: a.fastLane})
	}
	slices.SortFunc(out, func(a, b Member) int {
		switch {
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	})
	return out
}

// ValidateNodeID checks a node id: 1 to 64 ASCII letters, digits, '.', '_' or '-'.
func ValidateNodeID(field, id string) error {
	if id == "" || len(id) > 64 {
		return Invalid(field, "must be 1 to 64 characters")
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
		if !ok {
			return Invalid(field, "has character %q; allowed are letters, digits, '.', '_' and '-'", rune(c))
		}
	}
	return nil
}

// ClusterIDLen is the length of a cluster ID: 128 bits in lowercase hex.
const ClusterIDLen = 32

// ValidateClusterID checks a cluster ID: 32 lowercase hex characters, not all zero.
func ValidateClusterID(field, id string) error {
	if len(id) != ClusterIDLen {
		return Invalid(field, "must be %d hex characters, got %d", ClusterIDLen, len(id))
	}
	zero := true
	for i := 0; i < len(id); i++ {
		c := id[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return Invalid(field, "must be lowercase hex, has %q", rune(c))
		}
		zero = zero && c == '0'
	}
	if zero {
		return Invalid(field, "must not be all zero")
	}
	return nil
}

// ValidateAddr checks a host:port address.
func ValidateAddr(field, addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" || len(addr) > 255 {
		return Invalid(field, "must be host:port, got %q", addr)
	}
	if p, err := strconv.Atoi(port); err != nil || p <= 0 || p > 65535 {
		return Invalid(field, "port must be 1 to 65535, got %q", port)
	}
	return nil
}
