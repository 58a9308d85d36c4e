package harness

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ztunnel-go/ztunnel/bench/load"
	"github.com/ztunnel-go/ztunnel/bench/report"
)

// The round-trip census (issue 23: "publish the round-trip syscall count
// and wake-ups per round trip"): counted 1-byte round trips through each
// path. Untraced, for each proxy process's syscalls by kind (perf's
// tracepoint counters, which do not slow the run), context switches (every
// thread's, from /proc) and CPU; sampled by perf record over as many more,
// for the CPU's split into kernel and user functions (censusperf.go); under `strace -c -f` for its failed calls
// (ptrace slows the run, not the count of the calls each message makes);
// and, for the daemons, a CPU profile under load and a Go execution trace
// around a counted run (saved; its goroutine unblocks say which goroutine
// wakes which). Counts are per round trip, so two paths are compared as
// ratios in one run.

// CensusFile and CensusReport are the census's outputs in the report
// directory.
const (
	CensusFile   = "census.json"
	CensusReport = "CENSUS.md"
)

// Census is one path's counts.
type Census struct {
	Config     string           `json:"config"`
	RoundTrips int64            `json:"round_trips"`
	P50us      float64          `json:"p50_us"`      // untraced run
	P99us      float64          `json:"p99_us"`      // untraced run
	PerSecond  float64          `json:"per_second"`  // untraced run
	TracedRate float64          `json:"traced_rate"` // round trips/s under strace
	Procs      []CensusProc     `json:"procs"`
	Profiles   []report.Profile `json:"profiles,omitempty"`
	Traces     []string         `json:"traces,omitempty"` // Go execution traces, relative to the report
	// TraceRoundTrips is the round trips inside each trace: a counted
	// zload run that starts after the traces and ends before them.
	TraceRoundTrips float64 `json:"trace_round_trips,omitempty"`
	// Wakeups are each daemon's goroutine wake-ups per round trip, from
	// its trace (needs the go command).
	Wakeups []DaemonWakes `json:"wakeups,omitempty"`
}

// DaemonWakes is one daemon's wake-ups per round trip, by kind, and the
// syscalls its goroutines entered (the trace's count: raw syscalls and the
// runtime's own are not in it).
type DaemonWakes struct {
	Proc     string  `json:"proc"`
	Total    float64 `json:"total"`
	Syscalls float64 `json:"go_syscalls"`
	Wakes    []Wake  `json:"wakes"`
}

// CensusProc is one proxy process's counts per round trip.
type CensusProc struct {
	Proc string `json:"proc"`
	// Syscalls by name per round trip, counted by perf's syscall
	// tracepoints in the untraced run ("other": the rest of
	// raw_syscalls:sys_enter); nil without perf.
	Syscalls map[string]float64 `json:"syscalls,omitempty"`
	// Straced and Errors (failed calls: EAGAIN reads, say) by name per
	// round trip, counted by strace. Its ptrace stops slow the run some
	// fourfold, so the calls made per unit of time (sysmon's nanosleep, an
	// idle thread's spin) are overcounted per round trip; the calls made per
	// message are not.
	Straced map[string]float64 `json:"straced"`
	Errors  map[string]float64 `json:"errors,omitempty"`
	// Voluntary (blocked: a sleep in epoll_wait or futex) and Involuntary
	// (preempted) context switches over all threads, per round trip.
	Voluntary   float64 `json:"voluntary_cs"`
	Involuntary float64 `json:"involuntary_cs"`
	CPUus       float64 `json:"cpu_us"` // CPU µs per round trip (10 ms ticks: long runs only)
	// Sampled is perf record's split of the CPU per round trip into
	// kernel and user time, by function (censusperf.go); nil without perf.
	Sampled *SampledCPU `json:"sampled,omitempty"`
}

// TotalSyscalls is the sum over kinds (perf's count, else strace's).
func (p CensusProc) TotalSyscalls() float64 {
	m := p.Syscalls
	if m == nil {
		m = p.Straced
	}
	var n float64
	for _, v := range m {
		n += v
	}
	return n
}

// RunCensus builds the lab like Run, then takes the census of every path
// (o.Paths filters them) with n round trips each, instead of the
// measurements.
func RunCensus(ctx context.Context, o Options, n int64) ([]Census, error) {
	if n <= 0 || n > load.MaxCount {
		return nil, fmt.Errorf("harness: census of %d round trips", n)
	}
	if _, err := exec.LookPath("strace"); err != nil {
		return nil, errors.New("harness: the census counts syscalls with strace (apt-get install strace)")
	}
	if err := o.defaults(); err != nil {
		return nil, err
	}
	b := &bench{o: o, start: time.Now(), run: &report.Run{}}
	var out []Census
	err := b.setup(ctx)
	for _, t := range b.targets {
		if err != nil {
			break
		}
		var c Census
		if c, err = b.census(ctx, t, n); err == nil {
			out = append(out, c)
			b.logf("census %-28s %s", t.cfg.ID, c.summary())
		}
	}
	return out, errors.Join(err, b.teardown())
}

func (c Census) summary() string {
	s := fmt.Sprintf("p50 %.0f µs", c.P50us)
	for _, p := range c.Procs {
		s += fmt.Sprintf(" | %s: %.1f syscalls, %.1f+%.1f cs", p.Proc, p.TotalSyscalls(), p.Voluntary, p.Involuntary)
	}
	return s
}

// rrArgs are zload's flags for n 1-byte round trips (or, n == 0, for d).
func rrArgs(n int64, d time.Duration) []string {
	a := []string{"rr", "--req-size", "1", "--resp-size", "1", "--concurrency", "1"}
	if n > 0 {
		return append(a, "--count", fmt.Sprint(n))
	}
	return append(a, "--duration", d.String())
}

func (b *bench) census(ctx context.Context, t *target, n int64) (Census, error) {
	c := Census{Config: t.cfg.ID, RoundTrips: n}
	timeout := 10 * time.Minute
	settle(ctx, t.procs)
	stopPerf, err := perfStat(ctx, b.dir, t.procs)
	if err != nil {
		return c, err
	}
	before, err := readCounters(t.procs)
	if err != nil {
		stopPerf()
		return c, err
	}
	res, err := b.zload(ctx, t.ns, timeout, nil, append(rrArgs(n, 0), t.args...)...)
	if err != nil {
		stopPerf()
		return c, err
	}
	after, err := readCounters(t.procs)
	perfCounts := stopPerf()
	if err != nil {
		return c, err
	}
	if res.RR == nil || res.RR.Requests != n {
		return c, fmt.Errorf("zload: %v round trips, want %d", res.RR, n)
	}
	c.P50us, c.P99us, c.PerSecond = res.RR.Latency.P50, res.RR.Latency.P99, res.RR.PerSecond
	per := func(v int64) float64 { return float64(v) / float64(n) }
	for i, p := range t.procs {
		d := after[i].minus(before[i])
		cp := CensusProc{Proc: p.name, Voluntary: per(d.voluntary), Involuntary: per(d.involuntary),
			CPUus: per(d.ticks) * 1e6 / load.ClockTicks}
		if perfCounts != nil && perfCounts[i] != nil {
			cp.Syscalls = map[string]float64{}
			for k, v := range perfCounts[i] {
				cp.Syscalls[k] = per(v)
			}
		}
		c.Procs = append(c.Procs, cp)
	}
	if len(t.procs) == 0 {
		return c, nil
	}
	if err := b.perfSamples(ctx, t, n, &c); err != nil {
		return c, err
	}
	if err := b.straceCensus(ctx, t, n, &c); err != nil {
		return c, err
	}
	if !t.cfg.Daemon {
		return c, nil
	}
	m := metric{report.RRMetric(report.RRSize{Req: 1, Resp: 1}), rrArgs(0, time.Second)}
	if c.Profiles, err = b.profile(ctx, t, m); err != nil {
		return c, err
	}
	var traced int64
	if c.Traces, traced, err = b.traces(ctx, t, c.PerSecond); err != nil {
		return c, err
	}
	c.TraceRoundTrips = float64(traced)
	if _, err := exec.LookPath("go"); err != nil {
		return c, nil // the traces are saved; go tool trace reads them later
	}
	var daemons []*proc
	for _, p := range t.procs {
		if p.daemon {
			daemons = append(daemons, p)
		}
	}
	for i, f := range c.Traces {
		wakes, syscalls, err := traceWakeups(ctx, filepath.Join(b.o.OutDir, f))
		if err != nil {
			return c, err
		}
		dw := DaemonWakes{Proc: daemons[i].name, Syscalls: float64(syscalls) / c.TraceRoundTrips}
		for _, w := range wakes {
			w.Count /= c.TraceRoundTrips
			dw.Total += w.Count
			dw.Wakes = append(dw.Wakes, w)
		}
		c.Wakeups = append(c.Wakeups, dw)
	}
	return c, nil
}

// straceCensus counts t's processes' syscalls over n round trips.
func (b *bench) straceCensus(ctx context.Context, t *target, n int64, c *Census) error {
	dir, err := os.MkdirTemp(b.dir, "strace-")
	if err != nil {
		return err
	}
	var tracers []*exec.Cmd
	stop := func() {
		for _, s := range tracers {
			_ = s.Process.Signal(syscall.SIGINT) // strace detaches and writes its summary
		}
		for _, s := range tracers {
			_ = s.Wait()
		}
		tracers = nil
	}
	defer stop()
	for i, p := range t.procs {
		s := exec.CommandContext(ctx, "strace", "-c", "-f", "-qq", "-o", filepath.Join(dir, fmt.Sprint(i)), "-p", fmt.Sprint(p.pid))
		s.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := s.Start(); err != nil {
			return fmt.Errorf("strace: %w", err)
		}
		tracers = append(tracers, s)
	}
	// strace attaches to every thread before it returns to them; a second is
	// ample on an idle process.
	time.Sleep(time.Second)
	res, err := b.zload(ctx, t.ns, 30*time.Minute, nil, append(rrArgs(n, 0), t.args...)...)
	if err != nil {
		return err
	}
	stop()
	if res.RR != nil {
		c.TracedRate = res.RR.PerSecond
	}
	for i := range t.procs {
		out, err := os.ReadFile(filepath.Join(dir, fmt.Sprint(i)))
		if err != nil {
			return err
		}
		calls, errs, err := parseStraceSummary(out)
		if err != nil {
			return fmt.Errorf("%s: %w", t.procs[i].name, err)
		}
		c.Procs[i].Straced, c.Procs[i].Errors = map[string]float64{}, map[string]float64{}
		for k, v := range calls {
			c.Procs[i].Straced[k] = float64(v) / float64(n)
		}
		for k, v := range errs {
			c.Procs[i].Errors[k] = float64(v) / float64(n)
		}
	}
	return nil
}

// perfSyscalls are the syscalls perf counts by name; the rest of
// raw_syscalls:sys_enter is "other". A list, not syscalls:sys_enter_*: perf
// opens every event on every thread.
var perfSyscalls = []string{"read", "write", "readv", "writev", "recvfrom", "sendto", "recvmsg", "sendmsg",
	"splice", "epoll_wait", "epoll_pwait", "epoll_ctl", "io_uring_enter", "futex", "nanosleep", "clock_nanosleep",
	"sched_yield", "clock_gettime", "getpid", "gettid", "tgkill", "rt_sigprocmask", "rt_sigreturn", "madvise",
	"mmap", "munmap", "setsockopt", "getsockopt", "accept4", "close"}

// perfStat counts each process's syscalls with `perf stat` (tracepoints:
// no stop per call, so the run keeps its pace) until the returned stop,
// which gives the counts by name per process (nil if perf is missing).
func perfStat(ctx context.Context, scratch string, procs []*proc) (stop func() []map[string]int64, err error) {
	if _, err := exec.LookPath("perf"); err != nil || len(procs) == 0 {
		return func() []map[string]int64 { return nil }, nil
	}
	dir, err := os.MkdirTemp(scratch, "perf-")
	if err != nil {
		return nil, err
	}
	events := []string{"raw_syscalls:sys_enter"}
	for _, s := range perfSyscalls {
		events = append(events, "syscalls:sys_enter_"+s)
	}
	var cmds []*exec.Cmd
	stop = func() []map[string]int64 {
		for _, c := range cmds {
			_ = c.Process.Signal(syscall.SIGINT) // perf writes its counts
		}
		for _, c := range cmds {
			_ = c.Wait()
		}
		var out []map[string]int64
		for i := range cmds {
			b, err := os.ReadFile(filepath.Join(dir, fmt.Sprint(i)))
			var m map[string]int64
			if err == nil {
				m = parsePerfStat(b)
			}
			out = append(out, m)
		}
		cmds = nil
		return out
	}
	for i, p := range procs {
		c := exec.CommandContext(ctx, "perf", "stat", "-x", ",", "-o", filepath.Join(dir, fmt.Sprint(i)),
			"-e", strings.Join(events, ","), "-p", fmt.Sprint(p.pid))
		c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := c.Start(); err != nil {
			stop()
			return nil, fmt.Errorf("perf: %w", err)
		}
		cmds = append(cmds, c)
	}
	time.Sleep(500 * time.Millisecond) // perf opens its events
	return stop, nil
}

// parsePerfStat reads `perf stat -x,` output: the count of every
// syscalls:sys_enter_NAME as NAME, and raw_syscalls:sys_enter less their sum
// as "other". Nil if raw_syscalls was not counted.
func parsePerfStat(b []byte) map[string]int64 {
	m := map[string]int64{}
	total := int64(-1)
	var named int64
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Split(sc.Text(), ",")
		if len(f) < 3 || strings.HasPrefix(f[0], "#") {
			continue
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			continue // <not counted>, <not supported>
		}
		switch name, ok := strings.CutPrefix(f[2], "syscalls:sys_enter_"); {
		case f[2] == "raw_syscalls:sys_enter":
			total = n
		case ok && n > 0:
			m[name] = n
			named += n
		}
	}
	if total < 0 {
		return nil
	}
	if total > named {
		m["other"] = total - named
	}
	return m
}

// traces saves a Go execution trace of each of t's daemons that holds a
// counted number of round trips: the traces start first, then zload runs
// about half of ProfileSeconds' worth (at the untraced rate) and must end
// inside them. It returns the files and the count.
func (b *bench) traces(ctx context.Context, t *target, untracedRate float64) ([]string, int64, error) {
	secs := float64(b.o.ProfileSeconds)
	n := max(int64(untracedRate*secs/2), 100)
	type fetched struct {
		daemons []*proc
		data    [][]byte
		err     error
	}
	done := make(chan fetched, 1)
	go func() {
		var f fetched
		f.daemons, f.data, f.err = b.fetchDaemons(ctx, t, "trace")
		done <- f
	}()
	time.Sleep(300 * time.Millisecond) // the traces start (a stop-the-world each)
	res, err := b.zload(ctx, t.ns, 10*time.Minute, nil, append(rrArgs(n, 0), t.args...)...)
	f := <-done
	if err != nil {
		return nil, 0, err
	}
	if f.err != nil {
		return nil, 0, f.err
	}
	if res.RR == nil || res.RR.Requests != n || res.RR.Seconds+0.3 >= secs {
		return nil, 0, fmt.Errorf("the traced %d round trips did not fit in the %gs trace (%+v)", n, secs, res.RR)
	}
	var files []string
	for i, p := range f.daemons {
		file, err := b.saveProfile(t, "rr-1x1-trace", p, f.data[i])
		if err != nil {
			return files, 0, err
		}
		files = append(files, file)
	}
	return files, n, nil
}

// counters are one process's /proc counters: context switches summed over
// its threads, CPU ticks.
type counters struct{ voluntary, involuntary, ticks int64 }

func (a counters) minus(b counters) counters {
	return counters{a.voluntary - b.voluntary, a.involuntary - b.involuntary, a.ticks - b.ticks}
}

func readCounters(procs []*proc) ([]counters, error) {
	var out []counters
	for _, p := range procs {
		var c counters
		tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", p.pid))
		if err != nil || len(tasks) == 0 {
			return nil, fmt.Errorf("%s: no threads in /proc", p.name)
		}
		for _, f := range tasks {
			b, err := os.ReadFile(f)
			if err != nil {
				continue // the thread exited
			}
			v, iv := parseCtxtSwitches(b)
			c.voluntary += v
			c.involuntary += iv
		}
		ps, err := load.ReadProc(p.pid)
		if err != nil {
			return nil, err
		}
		c.ticks = ps.CPUTicks
		out = append(out, c)
	}
	return out, nil
}

// parseCtxtSwitches reads voluntary_ctxt_switches and
// nonvoluntary_ctxt_switches from a /proc status file.
func parseCtxtSwitches(b []byte) (voluntary, involuntary int64) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		switch k {
		case "voluntary_ctxt_switches":
			voluntary = n
		case "nonvoluntary_ctxt_switches":
			involuntary = n
		}
	}
	return voluntary, involuntary
}

// parseStraceSummary reads the table `strace -c` writes: calls and errors
// by syscall name (the total row left out).
func parseStraceSummary(b []byte) (calls, errs map[string]int64, err error) {
	calls, errs = map[string]int64{}, map[string]int64{}
	rules := 0
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "------") {
			rules++
			continue
		}
		if rules != 1 {
			continue
		}
		// % time, seconds, usecs/call, calls, [errors,] syscall
		f := strings.Fields(line)
		if len(f) != 5 && len(f) != 6 {
			return nil, nil, fmt.Errorf("strace summary: bad row %q", line)
		}
		name := f[len(f)-1]
		if calls[name], err = strconv.ParseInt(f[3], 10, 64); err != nil {
			return nil, nil, fmt.Errorf("strace summary: row %q: %w", line, err)
		}
		if len(f) == 6 {
			if errs[name], err = strconv.ParseInt(f[4], 10, 64); err != nil {
				return nil, nil, fmt.Errorf("strace summary: row %q: %w", line, err)
			}
		}
	}
	if rules < 2 {
		return nil, nil, fmt.Errorf("strace summary: no table in %q", b)
	}
	return calls, errs, nil
}
