package app

import (
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"testing"
)

// TestTuneGC: the daemon's GC settings apply only where the operator set
// none, and the memory limit follows the cgroup's.
func TestTuneGC(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	const gib = 1 << 30
	for _, tc := range []struct {
		name  string
		env   map[string]string
		files map[string]string // under the fake root
		want  GCSettings
	}{
		{"nothing set, no cgroup", nil, nil, GCSettings{GCPercent: DefaultGCPercent}},
		{"operator's GOGC wins", map[string]string{"GOGC": "200"}, nil, GCSettings{}},
		{"operator's GOGC=off wins", map[string]string{"GOGC": "off"}, nil, GCSettings{}},
		{"cgroup v2 limit of the process's cgroup", nil, map[string]string{
			"proc/self/cgroup": "0::/kubepods/pod1/ztunnel\n",
			"sys/fs/cgroup/kubepods/pod1/ztunnel/memory.max": "1073741824\n",
		}, GCSettings{GCPercent: DefaultGCPercent, MemoryLimit: gib * 9 / 10}},
		{"cgroup v2 limit at the namespace root (a container)", nil, map[string]string{
			"proc/self/cgroup":         "0::/\n",
			"sys/fs/cgroup/memory.max": "2147483648\n",
		}, GCSettings{GCPercent: DefaultGCPercent, MemoryLimit: 2 * gib * 9 / 10}},
		{"cgroup v2 without a limit", nil, map[string]string{
			"proc/self/cgroup":         "0::/\n",
			"sys/fs/cgroup/memory.max": "max\n",
		}, GCSettings{GCPercent: DefaultGCPercent}},
		{"cgroup v1 limit", nil, map[string]string{
			"proc/self/cgroup":                           "4:memory:/docker/abc\n",
			"sys/fs/cgroup/memory/memory.limit_in_bytes": "1073741824\n",
		}, GCSettings{GCPercent: DefaultGCPercent, MemoryLimit: gib * 9 / 10}},
		{"cgroup v1 unlimited", nil, map[string]string{
			"sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n",
		}, GCSettings{GCPercent: DefaultGCPercent}},
		{"garbage in memory.max", nil, map[string]string{
			"sys/fs/cgroup/memory.max": "lots\n",
		}, GCSettings{GCPercent: DefaultGCPercent}},
		{"operator's GOMEMLIMIT wins", map[string]string{"GOMEMLIMIT": "300MiB"}, map[string]string{
			"sys/fs/cgroup/memory.max": "1073741824\n",
		}, GCSettings{GCPercent: DefaultGCPercent}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			for name, content := range tc.files {
				p := filepath.Join(root, name)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			debug.SetGCPercent(100)
			debug.SetMemoryLimit(math.MaxInt64)
			lookup := func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }
			got := TuneGC(lookup, root)
			if got != tc.want {
				t.Fatalf("TuneGC = %+v, want %+v", got, tc.want)
			}
			wantPercent := 100
			if tc.want.GCPercent != 0 {
				wantPercent = tc.want.GCPercent
			}
			if p := debug.SetGCPercent(100); p != wantPercent {
				t.Fatalf("GC percent %d, want %d", p, wantPercent)
			}
			wantLimit := int64(math.MaxInt64)
			if tc.want.MemoryLimit != 0 {
				wantLimit = tc.want.MemoryLimit
			}
			if l := debug.SetMemoryLimit(-1); l != wantLimit {
				t.Fatalf("memory limit %d, want %d", l, wantLimit)
			}
		})
	}
}
