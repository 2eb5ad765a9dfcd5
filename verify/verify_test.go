package verify_test

import (
	"bytes"
	"context"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/testnode"
	"github.com/leasehold/leasehold/verify"
)

// TestMain lets this test binary serve as the writers Run starts.
func TestMain(m *testing.M) {
	if verify.IsWriter() {
		os.Exit(verify.WriterMain())
	}
	os.Exit(m.Run())
}

// TestVerifyDemoResources runs the kit against both demo resources on a real leasehold
// node with real writer processes that are SIGSTOPped past their TTL: the unfenced one
// must fail (a stale write accepted), the fenced one must pass.
func TestVerifyDemoResources(t *testing.T) {
	if testing.Short() {
		t.Skip("runs writer processes for several seconds")
	}
	n := testnode.Start(t)
	for _, c := range []struct {
		fenced bool
		want   verify.Verdict
	}{{false, verify.Fail}, {true, verify.Pass}} {
		name := map[bool]string{false: "unfenced", true: "fenced"}[c.fenced]
		t.Run(name, func(t *testing.T) {
			res := httptest.NewServer(verify.DemoResource(c.fenced))
			defer res.Close()
			var log bytes.Buffer
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			r, err := verify.Run(ctx, verify.Config{
				Addr: n.Addr(), URL: res.URL + "/write", Writers: 3,
				Duration: 8 * time.Second, TTL: 300 * time.Millisecond, PauseChance: 0.3,
				Seed: 42, WriterCommand: []string{os.Args[0]}, Log: &log,
			})
			if err != nil {
				t.Fatal(err)
			}
			var out strings.Builder
			r.Print(&out)
			t.Logf("%s\n%s", out.String(), log.String())
			if r.Verdict != c.want {
				t.Fatalf("verdict %s, want %s", r.Verdict, c.want)
			}
			if c.want == verify.Fail && len(r.Violations) == 0 {
				t.Errorf("a failed run should show the offending writes")
			}
			if r.Pauses == 0 || r.StaleAttempts == 0 {
				t.Errorf("pauses %d, stale attempts %d: the run did not exercise fencing", r.Pauses, r.StaleAttempts)
			}
		})
	}
}
