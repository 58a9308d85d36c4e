package harness

import (
	"cmp"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// WriteCensus writes census.json and CENSUS.md (a table per path) to dir.
func WriteCensus(dir string, cs []Census) error {
	return writeResults(dir, CensusFile, cs, CensusReport, CensusMarkdown(cs))
}

// writeResults writes v as indented JSON to dir/jsonName and md to
// dir/mdName: a run's numbers beside its report.
func writeResults(dir, jsonName string, v any, mdName, md string) error {
	j, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, jsonName), append(j, '\n'), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, mdName), []byte(md), 0o644)
}

// CensusMarkdown renders the census: per path its latency, then per process
// the syscalls by kind (the commonest first), context switches and CPU per
// round trip.
func CensusMarkdown(cs []Census) string {
	var b strings.Builder
	b.WriteString("# Round-trip census (1-byte request, 1-byte response, one connection)\n\n")
	for _, c := range cs {
		fmt.Fprintf(&b, "## %s\n\n%d round trips; untraced p50 %.0f µs, p99 %.0f µs, %.0f/s", c.Config, c.RoundTrips, c.P50us, c.P99us, c.PerSecond)
		if len(c.Procs) == 0 {
			b.WriteString("\n\n")
			continue
		}
		fmt.Fprintf(&b, "; under strace %.0f/s\n\n", c.TracedRate)
		b.WriteString("| per round trip | syscalls | by kind | under strace | failed (strace) | voluntary cs | involuntary cs | CPU µs |\n|---|---|---|---|---|---|---|---|\n")
		for _, p := range c.Procs {
			var st float64
			for _, v := range p.Straced {
				st += v
			}
			fmt.Fprintf(&b, "| %s | %.2f | %s | %.2f | %s | %.2f | %.2f | %.1f |\n", p.Proc, p.TotalSyscalls(), byKind(p.Syscalls),
				st, byKind(p.Errors), p.Voluntary, p.Involuntary, p.CPUus)
		}
		b.WriteString("\n")
		for _, p := range c.Procs {
			b.WriteString(sampledMarkdown(p.Proc, p.Sampled))
		}
		for _, p := range c.Profiles {
			fmt.Fprintf(&b, "CPU profile, %s (`%s`): %s\n\n", p.Proc, p.File, p.Summary)
		}
		for _, f := range c.Traces {
			fmt.Fprintf(&b, "Go execution trace (%.0f round trips): `%s`\n\n", c.TraceRoundTrips, f)
		}
		for _, d := range c.Wakeups {
			fmt.Fprintf(&b, "Goroutine wake-ups per round trip, %s: %.2f (goroutines entered %.2f syscalls)\n\n"+
				"| waker | by | wakee | per round trip |\n|---|---|---|---|\n", d.Proc, d.Total, d.Syscalls)
			for _, w := range d.Wakes {
				if w.Count >= 0.02 {
					fmt.Fprintf(&b, "| %s | %s | %s | %.2f |\n", w.Waker, w.Via, w.Wakee, w.Count)
				}
			}
			b.WriteString("\n")
		}
	}
	return b.String()
}

// byKind lists m's entries of at least 0.01, the largest first.
func byKind(m map[string]float64) string {
	names := make([]string, 0, len(m))
	for k, v := range m {
		if v >= 0.01 {
			names = append(names, k)
		}
	}
	slices.SortFunc(names, func(x, y string) int {
		if c := cmp.Compare(m[y], m[x]); c != 0 {
			return c
		}
		return strings.Compare(x, y)
	})
	kinds := make([]string, len(names))
	for i, k := range names {
		kinds[i] = fmt.Sprintf("%s %.2f", k, m[k])
	}
	return strings.Join(kinds, ", ")
}
