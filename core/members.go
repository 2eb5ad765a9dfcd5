package core

import (
	"net"
	"slices"
	"strconv"
)

// Member is a node of the cluster as the replicated state records it: its raft server id
// and the address its API listens on, so that any node can forward a request to the
// leader. Raft's own configuration holds the raft addresses.
type Member struct {
	ID      string `json:"id"`
	APIAddr string `json:"apiAddr"`
}

// Member returns the API address recorded for node id ("" when unknown).
func (s *State) Member(id string) string { return s.members[id] }

// Members returns every recorded member in id order.
func (s *State) Members() []Member {
	out := make([]Member, 0, len(s.members))
	for id, addr := range s.members {
		out = append(out, Member{ID: id, APIAddr: addr})
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
