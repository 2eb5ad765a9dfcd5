package report

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/leasehold/leasehold/bench/internal/run"
)

// Machine describes where the benchmark ran.
type Machine struct {
	NProc     int    // CPUs this process may use (runtime.NumCPU, like nproc)
	CPUModel  string // "model name" from /proc/cpuinfo
	Kernel    string // /proc/sys/kernel/osrelease
	Memory    string // MemTotal from /proc/meminfo
	GoVersion string
	Debian    string // /etc/debian_version
	// LoadBefore and LoadAfter are the 1-minute load averages at the start and end: a
	// load well above 0 before the run means other work shared the CPUs.
	LoadBefore, LoadAfter string
}

// DescribeMachine reads the machine description from /proc.
func DescribeMachine() Machine {
	m := Machine{NProc: runtime.NumCPU(), GoVersion: runtime.Version(), LoadBefore: loadAvg()}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
		_ = f.Close()
	}
	m.Kernel = readTrim("/proc/sys/kernel/osrelease")
	m.Debian = readTrim("/etc/debian_version")
	if f, err := os.Open("/proc/meminfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
				var kb int64
				if _, err := fmt.Sscan(strings.TrimSpace(v), &kb); err == nil {
					m.Memory = fmt.Sprintf("%.1f GiB", float64(kb)/(1<<20))
				}
				break
			}
		}
		_ = f.Close()
	}
	return m
}

// Finish records the load average at the end of the run.
func (m *Machine) Finish() { m.LoadAfter = loadAvg() }

func loadAvg() string {
	f := strings.Fields(readTrim("/proc/loadavg"))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func readTrim(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(b))
}

// Fsync is the measured latency of one 4 KiB write followed by fdatasync.
type Fsync struct {
	Dir      string
	FSType   string
	Samples  int
	P50, P99 time.Duration
	Err      string
}

// MeasureFsync writes 4 KiB and calls fdatasync, n times or until max passes, in a file
// under dir (the directory the servers keep their data in).
func MeasureFsync(dir string, n int, maxDur time.Duration) Fsync {
	res := Fsync{Dir: dir, FSType: fsType(dir)}
	f, err := os.Create(filepath.Join(dir, "fsync-probe"))
	if err != nil {
		res.Err = err.Error()
		return res
	}
	defer os.Remove(f.Name())
	defer f.Close()
	buf := make([]byte, 4096)
	for i := range buf {
		buf[i] = byte(i)
	}
	lat := make([]time.Duration, 0, n)
	deadline := time.Now().Add(maxDur)
	for i := 0; i < n && time.Now().Before(deadline); i++ {
		t0 := time.Now()
		if _, err := f.WriteAt(buf, int64(i%256)*4096); err != nil {
			res.Err = err.Error()
			return res
		}
		if err := syscall.Fdatasync(int(f.Fd())); err != nil {
			res.Err = err.Error()
			return res
		}
		lat = append(lat, time.Since(t0))
	}
	res.Samples = len(lat)
	res.P50, res.P99 = run.Percentile(lat, 0.50), run.Percentile(lat, 0.99)
	return res
}

// fsType names the filesystem holding dir, from /proc/self/mountinfo (longest
// matching mount point).
func fsType(dir string) string {
	abs, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return "?"
	}
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "?"
	}
	best, typ := "", "?"
	for _, line := range strings.Split(string(b), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		f, g := strings.Fields(pre), strings.Fields(post)
		if len(f) < 5 || len(g) < 2 {
			continue
		}
		mp := f[4]
		if (abs == mp || strings.HasPrefix(abs, strings.TrimSuffix(mp, "/")+"/")) && len(mp) >= len(best) {
			best, typ = mp, g[0]+" on "+g[1]
		}
	}
	return typ
}
