package run

import "testing"

func TestParseScenario(t *testing.T) {
	for name, want := range map[string]Scenario{
		"uncontended-64":   {Name: "uncontended-64", Workers: 64},
		"contended-16":     {Name: "contended-16", Workers: 16, Shared: true},
		"semaphore-64-8":   {Name: "semaphore-64-8", Workers: 64, Shared: true, Semaphore: 8},
		"lockset-1-16":     {Name: "lockset-1-16", Workers: 1, SetSize: 16},
		"lockset-64-1":     {Name: "lockset-64-1", Workers: 64, SetSize: 1},
		"semaphore-1-1":    {Name: "semaphore-1-1", Workers: 1, Shared: true, Semaphore: 1},
		"uncontended-1024": {Name: "uncontended-1024", Workers: 1024},
	} {
		if got, err := ParseScenario(name); err != nil || got != want {
			t.Errorf("%s: %+v, %v; want %+v", name, got, err, want)
		}
	}
	for _, bad := range []string{"", "uncontended", "uncontended-0", "uncontended-1025", "contended-x", "semaphore-8",
		"semaphore-8-0", "semaphore-8-10001", "lockset-8-65", "lockset-8", "uncontended-8-2", "other-8", "lockset--4"} {
		if sc, err := ParseScenario(bad); err == nil {
			t.Errorf("%q parsed as %+v", bad, sc)
		}
	}
}
