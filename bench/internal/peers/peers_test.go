package peers

import (
	"strings"
	"testing"
)

// TestNamesAndClients: every known system, and every leasehold one ending in PerWorker
// and secured, is named as it was asked for (the report matches results to systems by
// name), and says the kind of client its workers use — what the report's like-for-like
// comparisons rely on.
func TestNamesAndClients(t *testing.T) {
	shared := map[string]bool{
		"leasehold-efficiency": true, "leasehold-efficiency-per-worker": false,
		"leasehold-correctness": true, "leasehold-correctness-per-worker": false,
		"leasehold-correctness-3": true, "leasehold-correctness-3-per-worker": false,
		"redis-mem": false, "redis-mem-rueidis": true, "redis-aof": false, "redis-aof-rueidis": true,
		"etcd": true, "etcd-3": true, "zookeeper": false,
		"leasehold-correctness-per-worker+tls+auth": false,
	}
	for _, name := range Names {
		if _, ok := shared[name]; !ok {
			t.Errorf("%s: not covered by this test", name)
		}
	}
	for name, want := range shared {
		s, err := New(name, Options{})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if s.Name() != name {
			t.Errorf("New(%q).Name() = %q", name, s.Name())
		}
		if s.SharedClient() != want {
			t.Errorf("%s: SharedClient() = %v, want %v", name, s.SharedClient(), want)
		}
		if d := s.Describe(); strings.Contains(name, "rueidis") != strings.Contains(d, "rueidis") {
			t.Errorf("%s: Describe() = %q", name, d)
		}
	}
	for _, bad := range []string{"redis-mem-per-worker", "etcd-per-worker", "leasehold-per-worker"} {
		if _, err := New(bad, Options{}); err == nil {
			t.Errorf("New(%q) accepted it", bad)
		}
	}
}
