package harness

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/pprof/profile"

	"github.com/ztunnel-go/ztunnel/bench/load"
	"github.com/ztunnel-go/ztunnel/bench/report"
	"github.com/ztunnel-go/ztunnel/internal/netnslab"
)

// metric is one measurement kind: its name and zload's mode flags.
type metric struct {
	name string
	args []string
}

func (b *bench) metrics() []metric {
	d := b.o.Duration.String()
	ms := []metric{
		{report.MetricTput1, []string{"throughput", "--duration", d, "--concurrency", "1"}},
		{report.MetricTputN, []string{"throughput", "--duration", d, "--concurrency", fmt.Sprint(b.o.Streams)}},
	}
	for _, s := range b.o.RRSizes {
		ms = append(ms, metric{report.RRMetric(s), []string{"rr", "--duration", d,
			"--req-size", fmt.Sprint(s.Req), "--resp-size", fmt.Sprint(s.Resp)}})
	}
	f := b.o.FixedRate
	ms = append(ms, metric{report.MetricFixedRate, []string{"rr", "--duration", d, "--open-rate", fmt.Sprint(f.Rate),
		"--concurrency", fmt.Sprint(f.Conns), "--req-size", fmt.Sprint(f.Size), "--resp-size", fmt.Sprint(f.Size)}})
	// The connection rate stays last: measureAll profiles it.
	ms = append(ms, metric{report.MetricCPS, []string{"cps", "--duration", d, "--concurrency", fmt.Sprint(b.o.CPSConcurrency)}})
	return ms
}

func (b *bench) measureAll(ctx context.Context) error {
	// Idle first: the processes have not handled traffic yet, so their heap
	// has no free spans that would hide the cost of new connections. A
	// daemon that two paths share is restarted before the second.
	used := map[*proc]bool{}
	for _, t := range b.targets {
		if len(t.procs) == 0 {
			continue
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		for _, p := range t.procs {
			if used[p] && p.daemon {
				if err := b.startDaemon(ctx, p.pod); err != nil {
					return err
				}
			}
			used[p] = true
		}
		id, err := b.idle(ctx, t)
		if err != nil {
			b.fail("%s idle: %v", t.cfg.ID, err)
			continue
		}
		b.run.Idle = append(b.run.Idle, id)
		pc := id.PerConn()
		b.logf("idle %-28s %6.2f KiB/conn %5.2f fds/conn %5.2f goroutines/conn", t.cfg.ID, pc.RSSKiB, pc.FDs, pc.Goroutines)
	}
	ms := b.metrics()
	for round := 1; round <= b.o.Rounds; round++ {
		for _, m := range ms {
			for _, t := range b.targets {
				if err := ctx.Err(); err != nil {
					return err
				}
				s, err := b.measure(ctx, t, m, round)
				if err != nil {
					b.fail("%s %s round %d: %v", t.cfg.ID, m.name, round, err)
					continue
				}
				b.run.Samples = append(b.run.Samples, s)
				b.logf("round %d/%d %-6s %-28s %s", round, b.o.Rounds, m.name, t.cfg.ID, describe(s))
			}
		}
	}
	for _, t := range b.targets {
		if !t.cfg.Daemon {
			continue
		}
		// One stream, the headline RR and the connection rate: the three
		// kinds of cost (per byte, per round trip, per connection).
		profiled := []metric{ms[0], ms[2], ms[len(ms)-1]}
		if b.o.Quick {
			profiled = profiled[:1]
		}
		for _, m := range profiled {
			if err := ctx.Err(); err != nil {
				return err
			}
			ps, err := b.profile(ctx, t, m)
			if err != nil {
				b.fail("%s %s profile: %v", t.cfg.ID, m.name, err)
				continue
			}
			for _, p := range ps {
				b.logf("profile %-28s %-6s %s: %s", t.cfg.ID, m.name, p.Proc, p.Summary)
			}
			b.run.Profiles = append(b.run.Profiles, ps...)
		}
	}
	return nil
}

func (b *bench) fail(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	b.run.Failures = append(b.run.Failures, msg)
	b.logf("FAILED %s", msg)
}

func describe(s report.Sample) string {
	switch {
	case s.Gbps > 0:
		return fmt.Sprintf("%7.2f Gbit/s  %.2f cores  (%.2fs, drained in %.0f ms)", s.Gbps, s.Cores, s.Seconds, 1000*s.AckWait)
	case s.Latency != nil:
		return fmt.Sprintf("%9.0f/s  p50 %.0f µs  p99 %.0f µs  %.2f cores", s.PerSecond, s.Latency.P50, s.Latency.P99, s.Cores)
	}
	return ""
}

// zload runs zload inside ns with --json and decodes its result. If
// onStderr is set it receives zload's stderr line by line.
func (b *bench) zload(ctx context.Context, ns netnslab.NS, timeout time.Duration, onStderr func(line string), args ...string) (*load.Result, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := ns.Command(ctx, b.o.Zload, append(args, "--json")...)
	var stdout bytes.Buffer
	stderr := &tailBuffer{max: 16 << 10}
	cmd.Stdout = &stdout
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var wg sync.WaitGroup
	if onStderr != nil {
		pipe, err := cmd.StderrPipe()
		if err != nil {
			return nil, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sc := bufio.NewScanner(pipe)
			for sc.Scan() {
				stderr.Write(append(sc.Bytes(), '\n'))
				onStderr(sc.Text())
			}
		}()
	} else {
		cmd.Stderr = stderr
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	wg.Wait() // the pipe ends when zload exits
	if err := cmd.Wait(); err != nil {
		return nil, fmt.Errorf("zload %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	var res load.Result
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		return nil, fmt.Errorf("zload output: %w", err)
	}
	return &res, nil
}

func cpuTicks(procs []*proc) (int64, error) {
	each, err := cpuTicksEach(procs)
	var sum int64
	for _, t := range each {
		sum += t
	}
	return sum, err
}

// cpuTicksEach is each process's CPU ticks (user and system), in procs'
// order.
func cpuTicksEach(procs []*proc) ([]int64, error) {
	each := make([]int64, len(procs))
	for i, p := range procs {
		ps, err := load.ReadProc(p.pid)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p.name, err)
		}
		each[i] = ps.CPUTicks
	}
	return each, nil
}

// measure runs one metric on one target and reads the proxies' CPU around
// it.
func (b *bench) measure(ctx context.Context, t *target, m metric, round int) (report.Sample, error) {
	s := report.Sample{Config: t.cfg.ID, Metric: m.name, Round: round}
	if m.name == report.MetricCPS {
		b.clearTimeWait(ctx, t.ns)
	}
	before, err := cpuTicks(t.procs)
	if err != nil {
		return s, err
	}
	res, err := b.zload(ctx, t.ns, b.o.Duration+90*time.Second, nil, append(append([]string{}, m.args...), t.args...)...)
	if err != nil {
		return s, err
	}
	after, err := cpuTicks(t.procs)
	if err != nil {
		return s, err
	}
	var secs float64
	switch {
	case res.Throughput != nil:
		s.Gbps, secs, s.AckWait = res.Throughput.Gbps, res.Throughput.Seconds, res.Throughput.AckWait
	case res.RR != nil:
		s.PerSecond, secs, s.Latency = res.RR.PerSecond, res.RR.Seconds, &res.RR.Latency
	case res.CPS != nil:
		s.PerSecond, secs, s.Latency, s.Errors = res.CPS.PerSecond, res.CPS.Seconds, &res.CPS.Latency, res.CPS.Errors
	default:
		return s, errors.New("zload returned no result")
	}
	s.Seconds = secs
	if secs > 0 {
		// The proxies idle outside zload's measured window, so their CPU
		// over the whole invocation is the CPU of the window.
		s.Cores = load.CPUSeconds(after-before) / secs
	}
	return s, nil
}

// clearTimeWait destroys the TIME_WAIT sockets in ns (ss -K, SOCK_DESTROY)
// before a connection-rate measurement, so that each path's rate is its
// own. In a captured pod the capture rules redirect every outbound
// connection to 127.0.0.1:15001, whatever its destination, so the daemon's
// side of each connection it closed first stays in TIME_WAIT as
// (127.0.0.1:15001, pod:port) for 60 s. The pod's kernel picks ports per
// destination and reuses such a port for another destination; the new
// SYN meets the old TIME_WAIT and, with timestamps offset per destination,
// is refused by PAWS half the time, to be retried after a retransmission
// timeout. The tcp path's connection burst thus took 10% of the hbone2
// path's connections through a SYN retransmission when the two ran in turn
// from one pod (p99 13 ms instead of 2.5, 20% fewer connections per
// second; bench/results/2026-12-06-timewait.md). A failure is logged, not
// fatal: the measurement stands, with its neighbour's leftovers.
func (b *bench) clearTimeWait(ctx context.Context, ns netnslab.NS) {
	if out, err := ns.Command(ctx, "ss", "-K", "-t", "-n", "state", "time-wait").CombinedOutput(); err != nil {
		b.logf("clearing TIME_WAIT sockets in %s: %v: %s", ns.NetNS, err, bytes.TrimSpace(out))
	}
}

// memCounts is what a Go process's pprof endpoint says about it; -1 when
// it has none or a fetch failed.
type memCounts struct {
	goroutines          int
	heapKiB, heapSysKiB int64
}

// pprofCounts reads a process's goroutines and heap. The heap profile's
// gc=1 runs a GC first, twice: sync.Pool keeps objects over one GC, and Go's
// splice pipes, pooled that way, hold two fds each until released, which
// would blur the fd count of the next idle ramp.
func pprofCounts(ctx context.Context, p *proc) memCounts {
	mc := memCounts{-1, -1, -1}
	if p.pprof == "" {
		return mc
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for range 2 {
		body, err := nsGet(ctx, p.ns, p.pprof+"/debug/pprof/heap?gc=1&debug=1", 64<<20)
		if err != nil {
			mc.heapKiB, mc.heapSysKiB = -1, -1
			break
		}
		if inuse, committed, err := heapStats(body); err == nil {
			mc.heapKiB, mc.heapSysKiB = inuse/1024, committed/1024
		}
	}
	if body, err := nsGet(ctx, p.ns, p.pprof+"/debug/pprof/goroutine?debug=1", 4096); err == nil {
		if n, err := load.ParseGoroutineCount(body); err == nil {
			mc.goroutines = n
		}
	}
	return mc
}

// idle opens the idle ramp through t and reads each proxy's growth.
func (b *bench) idle(ctx context.Context, t *target) (report.Idle, error) {
	id := report.Idle{Config: t.cfg.ID}
	base := make([]memCounts, len(t.procs))
	held := make([]memCounts, len(t.procs))
	// A previous path's connections may still be closing in a shared
	// process: start from a quiet baseline.
	settle(ctx, t.procs)
	for i, p := range t.procs {
		base[i] = pprofCounts(ctx, p)
	}
	settle(ctx, t.procs)
	// Long enough for the pprof fetches (three forced GCs) under it.
	hold := "3s"
	if b.o.Quick {
		hold = "1s"
	}
	args := []string{"idle", "--count", fmt.Sprint(b.o.IdleConns), "--steps", fmt.Sprint(b.o.IdleSteps),
		"--final-settle", b.o.IdleSettle.String(), "--hold", hold}
	for _, p := range t.procs {
		args = append(args, "--pid", fmt.Sprint(p.pid))
	}
	args = append(args, t.args...)
	var once sync.Once
	var heapErr error
	res, err := b.zload(ctx, t.ns, 3*time.Minute+b.o.IdleSettle, func(line string) {
		if strings.HasPrefix(line, "zload: holding") {
			once.Do(func() {
				for i, p := range t.procs {
					held[i] = pprofCounts(ctx, p)
				}
				for _, p := range t.procs {
					if !p.daemon {
						continue
					}
					h, err := b.heapProfile(ctx, t, p)
					if err != nil {
						heapErr = errors.Join(heapErr, err)
						continue
					}
					id.Heaps = append(id.Heaps, h)
				}
			})
		}
	}, args...)
	if heapErr != nil {
		b.fail("%s idle heap profile: %v", t.cfg.ID, heapErr)
	}
	if err != nil {
		return id, err
	}
	if res.Idle == nil || len(res.Idle.Samples) < 2 {
		return id, errors.New("zload idle returned no samples")
	}
	n := float64(res.Idle.Connections)
	for _, s := range res.Idle.Samples {
		pt := report.IdlePoint{Conns: s.Conns}
		for _, ps := range s.Procs {
			pt.RSSKiB += ps.RSSKiB
			pt.FDs += ps.FDs
		}
		id.Points = append(id.Points, pt)
	}
	for i, p := range t.procs {
		ip := report.IdleProc{Proc: p.name, Goroutines: -1, HeapInuseKiB: -1, HeapCommittedKiB: -1,
			BaselineRSSKB: res.Idle.Samples[0].Procs[i].RSSKiB}
		if i < len(res.Idle.PerConn) {
			ip.RSSKiB, ip.FDs = res.Idle.PerConn[i].RSSKiB, res.Idle.PerConn[i].FDs
		}
		if base[i].goroutines >= 0 && held[i].goroutines >= 0 {
			ip.Goroutines = float64(held[i].goroutines-base[i].goroutines) / n
		}
		if base[i].heapKiB >= 0 && held[i].heapKiB >= 0 {
			ip.HeapInuseKiB = float64(held[i].heapKiB-base[i].heapKiB) / n
			ip.HeapCommittedKiB = float64(held[i].heapSysKiB-base[i].heapSysKiB) / n
		}
		id.PerProc = append(id.PerProc, ip)
	}
	return id, nil
}

// heapProfile saves and summarises a daemon's heap (after a GC) while it
// holds the idle connections.
func (b *bench) heapProfile(ctx context.Context, t *target, p *proc) (report.HeapProfile, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	data, err := nsGet(ctx, p.ns, p.pprof+"/debug/pprof/heap?gc=1", 64<<20)
	if err != nil {
		return report.HeapProfile{}, err
	}
	prof, err := profile.ParseData(data)
	if err != nil {
		return report.HeapProfile{}, err
	}
	sum, err := report.SummarizeHeap(prof, 10)
	if err != nil {
		return report.HeapProfile{}, err
	}
	name, err := b.saveProfile(t, "idle-heap", p, data)
	if err != nil {
		return report.HeapProfile{}, err
	}
	return report.HeapProfile{Proc: p.name, Conns: b.o.IdleConns, File: name, Summary: sum}, nil
}

// saveProfile writes a raw profile (or, what ending in "-trace", an
// execution trace) under OutDir/profiles and returns its
// path relative to OutDir.
func (b *bench) saveProfile(t *target, what string, p *proc, data []byte) (string, error) {
	ext := ".pb.gz"
	if strings.HasSuffix(what, "-trace") {
		ext = ".trace" // an execution trace: go tool trace reads it
	}
	dir := filepath.Join(b.o.OutDir, "profiles")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	name := strings.NewReplacer("/", "_", " ", "_").Replace(fmt.Sprintf("%s-%s-%s%s", t.cfg.ID, what, strings.TrimPrefix(p.name, "ztunnel in "), ext))
	if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
		return "", err
	}
	return "profiles/" + name, nil
}

// settle waits (up to 5s) until the processes' fd counts stop changing.
func settle(ctx context.Context, procs []*proc) {
	last := -1
	for range 25 {
		n := 0
		for _, p := range procs {
			if ps, err := load.ReadProc(p.pid); err == nil {
				n += ps.FDs
			}
		}
		if n == last {
			return
		}
		last = n
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// profile loads t with m while taking a CPU profile from each of its
// daemons.
func (b *bench) profile(ctx context.Context, t *target, m metric) ([]report.Profile, error) {
	daemons, data, err := b.underLoad(ctx, t, m, "profile")
	if err != nil {
		return nil, err
	}
	var out []report.Profile
	for i, p := range daemons {
		file, err := b.saveProfile(t, m.name, p, data[i])
		if err != nil {
			return out, err
		}
		prof, err := profile.ParseData(data[i])
		if err != nil {
			return out, fmt.Errorf("%s: %w", p.name, err)
		}
		sum, err := report.SummarizeProfile(prof, 15)
		if err != nil {
			return out, err
		}
		out = append(out, report.Profile{Config: t.cfg.ID, Metric: m.name, Proc: p.name, File: file, Summary: sum})
	}
	return out, nil
}

// underLoad loads t with m (its duration stretched around the fetch) and
// fetches /debug/pprof/<kind>?seconds=ProfileSeconds from each of t's
// daemons while it runs (fetchDaemons).
func (b *bench) underLoad(ctx context.Context, t *target, m metric, kind string) ([]*proc, [][]byte, error) {
	secs := b.o.ProfileSeconds
	args := append([]string{}, m.args...)
	for i, a := range args {
		if a == "--duration" {
			args[i+1] = (time.Duration(secs)*time.Second + 1500*time.Millisecond).String()
		}
	}
	args = append(args, t.args...)
	loadDone := make(chan error, 1)
	go func() {
		_, err := b.zload(ctx, t.ns, time.Duration(secs)*time.Second+90*time.Second, nil, args...)
		loadDone <- err
	}()
	// Let the load start (process, certificates, connections) first.
	select {
	case <-ctx.Done():
		<-loadDone
		return nil, nil, ctx.Err()
	case <-time.After(500 * time.Millisecond):
	}
	daemons, data, err := b.fetchDaemons(ctx, t, kind)
	if lerr := <-loadDone; lerr != nil {
		return nil, nil, fmt.Errorf("load during %s: %w", kind, lerr)
	}
	return daemons, data, err
}

// fetchDaemons fetches /debug/pprof/<kind>?seconds=ProfileSeconds (a CPU
// profile, an execution trace) from each of t's daemons at once, and
// returns the daemons and what each gave.
func (b *bench) fetchDaemons(ctx context.Context, t *target, kind string) ([]*proc, [][]byte, error) {
	secs := b.o.ProfileSeconds
	var daemons []*proc
	for _, p := range t.procs {
		if p.daemon {
			daemons = append(daemons, p)
		}
	}
	data := make([][]byte, len(daemons))
	errs := make([]error, len(daemons))
	var wg sync.WaitGroup
	for i, p := range daemons {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pctx, cancel := context.WithTimeout(ctx, time.Duration(secs)*time.Second+30*time.Second)
			defer cancel()
			data[i], errs[i] = nsGet(pctx, p.ns, fmt.Sprintf("%s/debug/pprof/%s?seconds=%d", p.pprof, kind, secs), 256<<20)
		}()
	}
	wg.Wait()
	for i, p := range daemons {
		if errs[i] != nil {
			return nil, nil, fmt.Errorf("%s: %w", p.name, errs[i])
		}
	}
	return daemons, data, nil
}
