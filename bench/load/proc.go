package load

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
)

// ClockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat.
// It is 100 on every Linux architecture Go supports.
const ClockTicks = 100

// ReadProc reads a process's RSS, fd count, threads and CPU time from /proc.
func ReadProc(pid int) (ProcStat, error) {
	ps := ProcStat{Pid: pid}
	dir := fmt.Sprintf("/proc/%d", pid)
	status, err := os.ReadFile(dir + "/status")
	if err != nil {
		return ps, fmt.Errorf("load: %w", err)
	}
	if ps.RSSKiB, ps.Threads, err = ParseStatus(status); err != nil {
		return ps, fmt.Errorf("load: pid %d: %w", pid, err)
	}
	stat, err := os.ReadFile(dir + "/stat")
	if err != nil {
		return ps, fmt.Errorf("load: %w", err)
	}
	if ps.CPUTicks, err = ParseStatCPU(stat); err != nil {
		return ps, fmt.Errorf("load: pid %d: %w", pid, err)
	}
	fds, err := os.ReadDir(dir + "/fd")
	if err != nil {
		return ps, fmt.Errorf("load: %w", err)
	}
	ps.FDs = len(fds)
	return ps, nil
}

// ParseStatus extracts VmRSS (KiB) and Threads from /proc/<pid>/status.
func ParseStatus(b []byte) (rssKiB int64, threads int, err error) {
	found := 0
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		fields := strings.Fields(v)
		if len(fields) == 0 {
			continue
		}
		switch k {
		case "VmRSS":
			if rssKiB, err = strconv.ParseInt(fields[0], 10, 64); err != nil {
				return 0, 0, fmt.Errorf("VmRSS: %w", err)
			}
			found++
		case "Threads":
			if threads, err = strconv.Atoi(fields[0]); err != nil {
				return 0, 0, fmt.Errorf("threads: %w", err)
			}
			found++
		}
	}
	if found != 2 {
		return 0, 0, errors.New("no VmRSS or Threads in status (a zombie?)")
	}
	return rssKiB, threads, nil
}

// ParseStatCPU returns utime+stime (clock ticks) from /proc/<pid>/stat. The
// command name (field 2) may hold spaces and parentheses, so fields are
// counted from the last ')'.
func ParseStatCPU(b []byte) (int64, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("malformed stat")
	}
	// After ") ": field 3 (state) onwards; utime and stime are fields 14, 15.
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, errors.New("short stat")
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	s, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("stat cpu: %w", err)
	}
	return u + s, nil
}

// CPUSeconds converts ticks to seconds.
func CPUSeconds(ticks int64) float64 { return float64(ticks) / ClockTicks }

// ParseGoroutineCount reads the total from a goroutine profile in text form
// (/debug/pprof/goroutine?debug=1: "goroutine profile: total N").
func ParseGoroutineCount(b []byte) (int, error) {
	line, _, _ := bytes.Cut(b, []byte("\n"))
	const prefix = "goroutine profile: total "
	s, ok := strings.CutPrefix(strings.TrimSpace(string(line)), prefix)
	if !ok {
		return 0, errors.New("load: not a goroutine profile (debug=1)")
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("load: goroutine total %q", s)
	}
	return n, nil
}

// FetchGoroutines GETs a goroutine profile URL and returns its total. client
// nil means http.DefaultClient (the caller's network namespace).
func FetchGoroutines(ctx context.Context, client *http.Client, url string) (int, error) {
	if client == nil {
		client = http.DefaultClient
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("load: %s: %s", url, resp.Status)
	}
	// The first line is all we need; the rest can be megabytes.
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if err != nil {
		return 0, err
	}
	return ParseGoroutineCount(b)
}
