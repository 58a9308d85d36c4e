package harness

import (
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
)

// gcHelperEnv makes the test binary, run again by TestGCTraceFromRuntime
// under GODEBUG=gctrace=1, collect six times and exit, so that the
// runtime itself prints the lines the Load scenario reads. Six, for five
// whole lines: runtime.GC can return before the runtime has printed the end
// of the cycle's line (" (forced)"), and the exit may cut the last one.
const gcHelperEnv = "ZBENCH_GCTRACE_HELPER"

// runGCHelper is the helper's body (TestMain runs it in the child).
func runGCHelper() {
	var keep [][]byte
	for range 6 {
		for range 1000 {
			keep = append(keep, make([]byte, 1024))
		}
		runtime.GC()
	}
	runtime.KeepAlive(keep)
}

// The lines of the Go release that builds the daemon parse: five forced
// collections give at least five cycles, each with two pauses and CPU.
func TestGCTraceFromRuntime(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), gcHelperEnv+"=1", gcTraceEnv)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	forced := strings.Count(string(out), "(forced)")
	cycles := parseGCTrace(string(out))
	if forced < 5 || len(cycles) < forced {
		t.Fatalf("%d cycles parsed, %d forced, from:\n%s", len(cycles), forced, out)
	}
	s := summarizeGC(cycles)
	if s.Cycles != len(cycles) || s.CPUSeconds <= 0 || s.PauseMax <= 0 || s.PauseP50 > s.PauseP99 || s.PauseP99 > s.PauseMax {
		t.Fatalf("summary %+v of %d cycles", s, len(cycles))
	}
}

func TestParseGCLine(t *testing.T) {
	for _, c := range []struct {
		name, line string
		ok         bool
		want       gcCycle
	}{
		{"go1.26", "gc 12 @3.104s 2%: 0.015+1.2+0.003 ms clock, 0.030+0.5/1.1/0.2+0.006 ms cpu, 4->4->2 MB, 5 MB goal, 0 MB stacks, 0 MB globals, 2 P",
			true, gcCycle{pausesMS: [2]float64{0.015, 0.003}, cpuMS: 0.030 + 0.5 + 1.1 + 0.2 + 0.006, goalMB: 5}},
		{"forced", "gc 3 @0.010s 1%: 0.010+0.20+0.002 ms clock, 0.020+0/0.1/0+0.004 ms cpu, 1->1->0 MB, 4 MB goal, 0 MB stacks, 0 MB globals, 2 P (forced)",
			true, gcCycle{pausesMS: [2]float64{0.010, 0.002}, cpuMS: 0.020 + 0.1 + 0.004, goalMB: 4}},
		{"leak check", "gc 4 @1.5s 3% (checking for goroutine leaks): 0.1+2+0.2 ms clock, 0.2+1/2/3+0.4 ms cpu, 8->9->4 MB, 10 MB goal, 0 MB stacks, 0 MB globals, 2 P",
			true, gcCycle{pausesMS: [2]float64{0.1, 0.2}, cpuMS: 0.2 + 1 + 2 + 3 + 0.4, goalMB: 10}},
		{"a log line", `2026-12-06T05:00:00Z warn proxy: gc of pool`, false, gcCycle{}},
		{"scavenger", "scav 1 KiB work (bg), 0 KiB work (eager), 1 KiB total", false, gcCycle{}},
		{"cut short", "gc 5 @1s 1%: 0.1+2 ms clock, 0.2+1/2/3+0.4 ms cpu", false, gcCycle{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, ok := parseGCLine(c.line)
			if ok != c.ok {
				t.Fatalf("ok = %v, want %v", ok, c.ok)
			}
			const eps = 1e-9
			if ok && (got.pausesMS != c.want.pausesMS || got.goalMB != c.want.goalMB || got.cpuMS-c.want.cpuMS > eps || c.want.cpuMS-got.cpuMS > eps) {
				t.Fatalf("got %+v, want %+v", got, c.want)
			}
		})
	}
}
