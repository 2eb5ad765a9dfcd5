package fence_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestFencingDoc checks that every Go snippet in docs/FENCING.md appears, line by line,
// in a compiled example (this package's or the client's), so the documentation cannot
// drift into code that does not build.
func TestFencingDoc(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "docs", "FENCING.md"))
	if err != nil {
		t.Fatal(err)
	}
	var examples strings.Builder
	for _, f := range []string{"example_test.go", filepath.Join("..", "client", "example_test.go")} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		examples.Write(b)
	}
	code := normalize(examples.String())
	snippets := goBlocks(string(doc))
	if len(snippets) < 5 {
		t.Fatalf("found %d Go snippets in FENCING.md; expected at least 5", len(snippets))
	}
	for i, s := range snippets {
		if !strings.Contains(code, normalize(s)) {
			t.Errorf("snippet %d of docs/FENCING.md is not in a compiled example:\n%s", i+1, s)
		}
	}
}

func goBlocks(doc string) []string {
	var out []string
	for {
		i := strings.Index(doc, "```go\n")
		if i < 0 {
			return out
		}
		doc = doc[i+len("```go\n"):]
		j := strings.Index(doc, "```")
		if j < 0 {
			return out
		}
		out = append(out, doc[:j])
		doc = doc[j+3:]
	}
}

// normalize trims each line and drops blank ones, so indentation does not matter.
func normalize(s string) string {
	var b strings.Builder
	for _, line := range strings.Split(s, "\n") {
		if line = strings.TrimSpace(line); line != "" {
			b.WriteString(line)
			b.WriteByte('\n')
		}
	}
	return b.String()
}
