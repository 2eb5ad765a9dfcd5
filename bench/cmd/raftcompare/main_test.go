package main

import (
	"slices"
	"testing"
	"time"
)

// TestRotated: each round starts each size's engines one further along, and keeps the
// sizes in order.
func TestRotated(t *testing.T) {
	setups := []setup{{name: "a", nodes: 1}, {name: "b", nodes: 1}, {name: "c", nodes: 1}, {name: "a", nodes: 3}, {name: "b", nodes: 3}}
	names := func(ss []setup) (out []string) {
		for _, s := range ss {
			out = append(out, s.name)
		}
		return out
	}
	for r, want := range map[int][]string{1: {"a", "b", "c", "a", "b"}, 2: {"b", "c", "a", "b", "a"}, 3: {"c", "a", "b", "a", "b"}} {
		if got := names(rotated(setups, r)); !slices.Equal(got, want) {
			t.Errorf("round %d: %v, want %v", r, got, want)
		}
	}
}

// TestRunSmoke runs one short round of both engines on one node.
func TestRunSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts raft clusters")
	}
	if err := run(1, 200*time.Millisecond, 50*time.Millisecond, 4, t.TempDir(), []string{"hashicorp", "etcd"}, []string{"1"}, ""); err != nil {
		t.Fatal(err)
	}
}

// TestRunRefusesUnknownEngine: a misspelt -engines runs nothing and says so.
func TestRunRefusesUnknownEngine(t *testing.T) {
	if err := run(1, time.Millisecond, 0, 1, t.TempDir(), []string{"etdc"}, []string{"1"}, ""); err == nil {
		t.Fatal("no error for an unknown engine")
	}
}
