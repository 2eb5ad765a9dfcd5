package proc

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// RSS returns the resident set size of pid in bytes (VmRSS in /proc/PID/status).
func RSS(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			fields := strings.Fields(rest)
			if len(fields) < 1 {
				break
			}
			kb, err := strconv.ParseInt(fields[0], 10, 64)
			if err != nil {
				return 0, err
			}
			return kb * 1024, nil
		}
	}
	return 0, errors.New("proc: no VmRSS line")
}

// clockTick is USER_HZ, the unit of utime and stime in /proc/PID/stat. It is 100 on
// every Linux architecture Go supports.
const clockTick = 100

// CPU returns the user plus system CPU time pid has used so far (10 ms resolution).
func CPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may contain spaces; fields after its ')' are plain.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("proc: malformed stat")
	}
	f := strings.Fields(string(b[i+1:]))
	// After ')': state is field 3, so utime (14) and stime (15) are f[11] and f[12].
	if len(f) < 13 {
		return 0, errors.New("proc: short stat")
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return time.Duration(ut+st) * time.Second / clockTick, nil
}

// SumRSS and SumCPU add up several processes (a three-node cluster is one system).
func SumRSS(pids []int) (int64, error) {
	var total int64
	for _, pid := range pids {
		v, err := RSS(pid)
		if err != nil {
			return 0, err
		}
		total += v
	}
	return total, nil
}

// SumCPU adds the CPU time of pids.
func SumCPU(pids []int) (time.Duration, error) {
	var total time.Duration
	for _, pid := range pids {
		v, err := CPU(pid)
		if err != nil {
			return 0, err
		}
		total += v
	}
	return total, nil
}
