package harness

import (
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/ztunnel-go/ztunnel/bench/report"
)

// gcCycle is one line of GODEBUG=gctrace=1:
//
//	gc 12 @3.104s 2%: 0.015+1.2+0.003 ms clock, 0.030+0.5/1.1/0.2+0.006 ms cpu, 4->4->2 MB, 5 MB goal, 0 MB stacks, 0 MB globals, 2 P
//
// The clock triple is sweep termination (stop-the-world), concurrent mark,
// mark termination (stop-the-world); the CPU fields are the two
// stop-the-world phases times the Ps stopped, and between them assist,
// background and idle marking.
type gcCycle struct {
	pausesMS [2]float64 // the two stop-the-world phases' wall time
	cpuMS    float64    // every CPU field summed
	goalMB   int
}

// parseGCTrace reads the gctrace lines of a process's output (other lines
// are skipped).
func parseGCTrace(out string) []gcCycle {
	var cycles []gcCycle
	for _, line := range strings.Split(out, "\n") {
		if c, ok := parseGCLine(line); ok {
			cycles = append(cycles, c)
		}
	}
	return cycles
}

func parseGCLine(line string) (gcCycle, bool) {
	var c gcCycle
	if !strings.HasPrefix(line, "gc ") {
		return c, false
	}
	_, rest, ok := strings.Cut(line, ": ")
	if !ok {
		return c, false
	}
	clock, rest, ok := strings.Cut(rest, " ms clock, ")
	if !ok {
		return c, false
	}
	cpu, rest, ok := strings.Cut(rest, " ms cpu, ")
	if !ok {
		return c, false
	}
	phases, ok := floats(clock, "+")
	if !ok || len(phases) != 3 {
		return c, false
	}
	c.pausesMS = [2]float64{phases[0], phases[2]}
	parts, ok := floats(strings.ReplaceAll(cpu, "/", "+"), "+")
	if !ok || len(parts) != 5 {
		return c, false
	}
	for _, v := range parts {
		c.cpuMS += v
	}
	for _, f := range strings.Split(rest, ", ") {
		if g, ok := strings.CutSuffix(f, " MB goal"); ok {
			c.goalMB, _ = strconv.Atoi(g)
		}
	}
	return c, true
}

func floats(s, sep string) ([]float64, bool) {
	var out []float64
	for _, f := range strings.Split(s, sep) {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil {
			return nil, false
		}
		out = append(out, v)
	}
	return out, true
}

// summarizeGC sums a window's cycles (a window may hold none).
func summarizeGC(cycles []gcCycle) *report.GCStats {
	if len(cycles) == 0 {
		return &report.GCStats{}
	}
	s := &report.GCStats{Cycles: len(cycles)}
	var pauses []float64
	for _, c := range cycles {
		s.CPUSeconds += c.cpuMS / 1000
		pauses = append(pauses, c.pausesMS[0]*1000, c.pausesMS[1]*1000)
		s.HeapGoalMB = c.goalMB
	}
	slices.Sort(pauses)
	rank := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(pauses)))) - 1
		return pauses[max(0, min(i, len(pauses)-1))]
	}
	s.PauseP50, s.PauseP99, s.PauseMax = rank(0.50), rank(0.99), pauses[len(pauses)-1]
	return s
}
