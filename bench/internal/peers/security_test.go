package peers

import "testing"

// TestSecuredNames checks the +tls and +auth suffixes of leasehold system names.
func TestSecuredNames(t *testing.T) {
	for _, name := range []string{"leasehold-efficiency+tls", "leasehold-correctness+auth", "leasehold-correctness-3+tls+auth"} {
		s, err := New(name, Options{})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if s.Name() != name {
			t.Errorf("New(%q).Name() = %q", name, s.Name())
		}
	}
	for _, name := range []string{"leasehold-efficiency+ssl", "redis-mem+tls", "leasehold-nothing+tls"} {
		if _, err := New(name, Options{}); err == nil {
			t.Errorf("New(%q) accepted it", name)
		}
	}
}
