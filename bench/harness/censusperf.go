package harness

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The census's CPU samples, kernel included: the Go profile says how much
// of a daemon's time is "in syscalls" but not what the kernel does there,
// and HAProxy has no Go profile at all. perf record's cpu-clock samples of
// every proxy process over one more untraced run of counted round trips
// split each process's CPU per round trip into kernel and user time and
// name the kernel functions it goes to, the same way for both, so a gap in
// CPU per round trip between two proxies can be traced to the kernel work
// (socket writes, wake-ups, scheduling) or to the process's own code.

// perfSampleHz is the sampling rate: ~5 samples per 1-byte round trip of
// 100-200 µs CPU at a few thousand round trips a second.
const perfSampleHz = 4999

// SampledCPU is one process's CPU per round trip from perf's samples.
type SampledCPU struct {
	// KernelUS and UserUS are µs per round trip (samples / rate / round
	// trips).
	KernelUS float64 `json:"kernel_us"`
	UserUS   float64 `json:"user_us"`
	// TopKernel are the kernel functions with the most samples (self
	// time), µs per round trip, the costliest first.
	TopKernel []SymbolCost `json:"top_kernel,omitempty"`
	// TopUser are the same for the process's own code and libraries.
	TopUser []SymbolCost `json:"top_user,omitempty"`
}

// SymbolCost is a function's self time per round trip.
type SymbolCost struct {
	Symbol string  `json:"symbol"`
	US     float64 `json:"us"`
}

// topSymbols is how many functions of each side SampledCPU keeps.
const topSymbols = 8

// perfSamples runs n more 1-byte round trips through t while perf samples
// each of its processes, and sets Procs[i].Sampled. Without perf it does
// nothing (the census's other counts stand alone).
func (b *bench) perfSamples(ctx context.Context, t *target, n int64, c *Census) error {
	if _, err := exec.LookPath("perf"); err != nil || len(t.procs) == 0 {
		return nil
	}
	dir, err := os.MkdirTemp(b.dir, "perfrec-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	var recs []*exec.Cmd
	stop := func() {
		for _, r := range recs {
			_ = r.Process.Signal(syscall.SIGINT) // perf writes its data file
		}
		for _, r := range recs {
			_ = r.Wait()
		}
		recs = nil
	}
	defer stop()
	for i, p := range t.procs {
		r := exec.CommandContext(ctx, "perf", "record", "-q", "-e", "cpu-clock", "-F", fmt.Sprint(perfSampleHz),
			"-o", filepath.Join(dir, fmt.Sprint(i)), "-p", fmt.Sprint(p.pid))
		r.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := r.Start(); err != nil {
			return fmt.Errorf("perf record: %w", err)
		}
		recs = append(recs, r)
	}
	time.Sleep(500 * time.Millisecond) // perf opens its events
	if _, err := b.zload(ctx, t.ns, 10*time.Minute, nil, append(rrArgs(n, 0), t.args...)...); err != nil {
		return err
	}
	stop()
	for i := range t.procs {
		out, err := exec.CommandContext(ctx, "perf", "report", "-i", filepath.Join(dir, fmt.Sprint(i)), "--stdio", "-q",
			"--no-children", "-n", "--sort", "sym", "-g", "none", "--percent-limit", "0").Output()
		if err != nil {
			return fmt.Errorf("perf report of %s: %w", t.procs[i].name, err)
		}
		s := parsePerfReport(out, float64(perfSampleHz)*float64(n)/1e6)
		c.Procs[i].Sampled = &s
	}
	return nil
}

// parsePerfReport reads `perf report --stdio -q -n --sort sym` lines
// ("  12.34%   567  [k] tcp_sendmsg_locked") into CPU per round trip;
// samplesPerUS converts a function's samples to µs per round trip (the
// rate times the round trips, per µs).
func parsePerfReport(out []byte, samplesPerUS float64) SampledCPU {
	var s SampledCPU
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasSuffix(f[0], "%") {
			continue
		}
		n, err := strconv.ParseFloat(f[1], 64)
		if err != nil || samplesPerUS <= 0 {
			continue
		}
		us, sym := n/samplesPerUS, strings.Join(f[3:], " ")
		switch f[2] {
		case "[k]":
			s.KernelUS += us
			s.TopKernel = append(s.TopKernel, SymbolCost{sym, us})
		case "[.]":
			s.UserUS += us
			s.TopUser = append(s.TopUser, SymbolCost{sym, us})
		}
	}
	top := func(l []SymbolCost) []SymbolCost {
		slices.SortStableFunc(l, func(a, b SymbolCost) int { return cmp.Compare(b.US, a.US) })
		return l[:min(len(l), topSymbols)]
	}
	s.TopKernel, s.TopUser = top(s.TopKernel), top(s.TopUser)
	return s
}

// sampledMarkdown is the census table's perf line for p, "" without it.
func sampledMarkdown(proc string, s *SampledCPU) string {
	if s == nil {
		return ""
	}
	list := func(l []SymbolCost) string {
		parts := make([]string, len(l))
		for i, c := range l {
			parts[i] = fmt.Sprintf("%s %.1f", c.Symbol, c.US)
		}
		return strings.Join(parts, ", ")
	}
	return fmt.Sprintf("perf samples, %s: kernel %.1f µs + user %.1f µs per round trip; kernel: %s; user: %s\n\n",
		proc, s.KernelUS, s.UserUS, list(s.TopKernel), list(s.TopUser))
}
