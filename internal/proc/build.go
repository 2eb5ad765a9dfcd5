package proc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// ModuleRoot walks up from the working directory (a package's directory under `go
// test`) to the directory holding the go.mod of github.com/leasehold/leasehold.
func ModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.Contains(b, []byte("module github.com/leasehold/leasehold\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("proc: cannot find the go.mod of github.com/leasehold/leasehold above the working directory")
		}
		dir = parent
	}
}

// Build runs `go build flags... -o out pkg` in the module at root, as `make build` does
// (CGO_ENABLED=0; GOWORK=off, so that the module's own go.mod decides). pkg is relative
// to root ("./cmd/leasehold").
func Build(ctx context.Context, root, out, pkg string, flags ...string) error {
	gobin, err := exec.LookPath("go")
	if err != nil {
		return fmt.Errorf("proc: go build %s: the go command is not in PATH: %w", pkg, err)
	}
	args := append(append([]string{"build"}, flags...), "-o", out, pkg)
	cmd := exec.CommandContext(ctx, gobin, args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("proc: go %v in %s: %w\n%s", args, root, err, b)
	}
	return nil
}
