package main

import "testing"

func TestParseMemoryLimit(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
	}{
		{"240MiB", 240 << 20}, {"1GiB", 1 << 30}, {"16777216", 16 << 20}, {"20000KiB", 20000 << 10}, {"17000000B", 17000000}, {"1TiB", 1 << 40},
	} {
		if got, err := parseMemoryLimit(c.in); err != nil || got != c.want {
			t.Errorf("parseMemoryLimit(%q) = %d, %v; want %d", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{"", "MiB", "-1GiB", "0", "1MiB", "1.5GiB", "240MB", "240 MiB", "9999999999TiB"} {
		if got, err := parseMemoryLimit(bad); err == nil {
			t.Errorf("parseMemoryLimit(%q) = %d, want an error", bad, got)
		}
	}
}
