package app

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
)

// DefaultGCPercent is the daemon's GC target when GOGC is not set: the heap
// may grow to 1.5x the live heap between collections rather than Go's 2x.
// A node proxy's live heap is mostly idle connections' records and its
// data path allocates little per byte, so the tighter target costs little
// CPU and cuts the resident memory each idle connection costs (~15-20% of
// RSS per connection in zbench, throughput within noise).
const DefaultGCPercent = 50

// memoryLimitShare is the part of the container's memory limit
// (cgroup memory.max) the daemon's soft memory limit takes when GOMEMLIMIT
// is not set: the runtime collects harder as the heap nears it, instead of
// the kernel killing the daemon, and the rest is left for what Go does not
// count (kernel socket buffers are charged to the cgroup too).
const memoryLimitShare = 0.9

// GCSettings is what TuneGC set; zero fields were left to the runtime (the
// operator's GOGC or GOMEMLIMIT, or no container limit).
type GCSettings struct {
	GCPercent   int   // set by us; 0: GOGC rules
	MemoryLimit int64 // bytes, set by us; 0: GOMEMLIMIT or no limit
}

// TuneGC sets the Go runtime's GC target and soft memory limit for the
// daemon where the operator did not: GOGC unset gives DefaultGCPercent;
// GOMEMLIMIT unset, in a cgroup with a memory limit, gives 90% of that
// limit. lookup reads the environment; root is "/" outside tests.
func TuneGC(lookup func(string) (string, bool), root string) GCSettings {
	var s GCSettings
	if _, ok := lookup("GOGC"); !ok {
		debug.SetGCPercent(DefaultGCPercent)
		s.GCPercent = DefaultGCPercent
	}
	if _, ok := lookup("GOMEMLIMIT"); !ok {
		if max, ok := cgroupMemoryMax(root); ok {
			s.MemoryLimit = int64(float64(max) * memoryLimitShare)
			debug.SetMemoryLimit(s.MemoryLimit)
		}
	}
	return s
}

// cgroupMemoryMax returns the memory limit of the cgroup this process is in,
// read under root: cgroup v2 (memory.max of the path /proc/self/cgroup
// names, or of the cgroup namespace's root, as in a container), else
// cgroup v1 (memory.limit_in_bytes). false means no limit or none found.
func cgroupMemoryMax(root string) (int64, bool) {
	var dirs []string
	if b, err := os.ReadFile(filepath.Join(root, "proc/self/cgroup")); err == nil {
		if p, ok := cgroupV2Path(b); ok {
			dirs = append(dirs, filepath.Join(root, "sys/fs/cgroup", p))
		}
	}
	dirs = append(dirs, filepath.Join(root, "sys/fs/cgroup"))
	for _, d := range dirs {
		if b, err := os.ReadFile(filepath.Join(d, "memory.max")); err == nil {
			return parseMemoryLimit(b)
		}
	}
	if b, err := os.ReadFile(filepath.Join(root, "sys/fs/cgroup/memory/memory.limit_in_bytes")); err == nil {
		return parseMemoryLimit(b)
	}
	return 0, false
}

// cgroupV2Path finds the unified hierarchy's line ("0::/path") in the
// contents of /proc/self/cgroup.
func cgroupV2Path(b []byte) (string, bool) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if p, ok := strings.CutPrefix(sc.Text(), "0::"); ok && strings.HasPrefix(p, "/") {
			return p, true
		}
	}
	return "", false
}

// noLimitAbove is where a cgroup v1 limit means "none" (the kernel shows
// unlimited as the largest page-aligned int64).
const noLimitAbove = 1 << 62

// parseMemoryLimit reads a memory.max or memory.limit_in_bytes file: a
// byte count, or "max" for none.
func parseMemoryLimit(b []byte) (int64, bool) {
	v := strings.TrimSpace(string(b))
	if v == "max" {
		return 0, false
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n <= 0 || n >= noLimitAbove {
		return 0, false
	}
	return n, true
}
