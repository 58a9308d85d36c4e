package harness

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/google/pprof/profile"

	"github.com/ztunnel-go/ztunnel/bench/load"
	"github.com/ztunnel-go/ztunnel/bench/report"
)

// LoadOptions shape the Load scenario (issue 36): many concurrent
// connections at a fixed aggregate rate, through the daemon pair and the
// HAProxy mTLS pair. Zero fields take the defaults (the quick run's when
// Options.Quick is set).
type LoadOptions struct {
	// Conns are the levels of concurrency (default 1,000, 5,000 and
	// 8,000; quick 200). 8,000 is about as far as one client pod goes on
	// this machine kind: the daemon's descriptor budget is RLIMIT_NOFILE
	// (20,000) less an eighth, and one peer may hold at most half of it
	// (8,750 connections, each one descriptor on either daemon).
	Conns []int
	// Rate is the aggregate requests/s (default 10,000; quick 2,000): at
	// 20,000 the load generator saturates this 2-vCPU machine kind (p50 of
	// 15 ms on both paths at 1,000 connections, the proxies at 0.3-0.45
	// cores).
	Rate int
	// Size is each request's and response's bytes (default 64).
	Size int
	// Warmup is from the schedule's start to the window's (default 3s;
	// quick 1s): the set-ups' burst (HAProxy's handshakes) is over by then.
	Warmup time.Duration
	// Window is the length of the CPU, GC and memory readings (default
	// 10s; quick 2s).
	Window time.Duration
	// Rounds is how many times each level runs on each path, the paths
	// taking turns (default 3; quick 1).
	Rounds int
	// ProfileConns is the level at which the daemons' CPU and heap are
	// profiled after the window (default 5,000; quick none).
	ProfileConns int
}

// loadTail is the schedule's time after the window (and the profile, if
// any): the readings never race the schedule's end.
const loadTail = time.Second

func (lo *LoadOptions) defaults(quick bool) {
	if len(lo.Conns) == 0 {
		lo.Conns = []int{1000, 5000, 8000}
		if quick {
			lo.Conns = []int{200}
		}
	}
	pick := func(full, q time.Duration) time.Duration {
		if quick {
			return q
		}
		return full
	}
	if lo.Rate <= 0 {
		lo.Rate = 10000
		if quick {
			lo.Rate = 2000
		}
	}
	if lo.Size <= 0 {
		lo.Size = 64
	}
	if lo.Warmup <= 0 {
		lo.Warmup = pick(3*time.Second, time.Second)
	}
	if lo.Window <= 0 {
		lo.Window = pick(10*time.Second, 2*time.Second)
	}
	if lo.Rounds <= 0 {
		lo.Rounds = 3
		if quick {
			lo.Rounds = 1
		}
	}
	if lo.ProfileConns == 0 && !quick {
		lo.ProfileConns = 5000
	}
}

// gcTraceEnv makes the daemons print a line per collection: the GC's CPU
// and pauses of a window are read from those lines.
const gcTraceEnv = "GODEBUG=gctrace=1"

// RunLoad builds the lab with the daemon pair (the first backend) and the
// HAProxy mTLS pair, loads each level through both and tears it down.
func RunLoad(ctx context.Context, o Options, lo LoadOptions) (*report.Load, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	lo.defaults(o.Quick)
	be := o.Backends[0]
	o.Backends = o.Backends[:1]
	ours := report.ConfigID(report.GroupHBONE2, report.DaemonKey(be))
	peer := report.ConfigID(report.GroupHBONE2, report.KeyHAProxyPair)
	o.Paths = regexp.MustCompile("^(" + regexp.QuoteMeta(ours) + "|" + regexp.QuoteMeta(peer) + ")$")
	// The daemons restart with the collector's trace on (a variant of the
	// backend restarts them in setup).
	v := o.Variants[be]
	v.Env = append(append([]string{}, v.Env...), gcTraceEnv)
	o.Variants = map[string]Variant{be: v}
	b := &bench{o: o, start: time.Now(), run: &report.Run{}}
	l := &report.Load{
		Machine: DescribeMachine(o.HAProxy), Quick: o.Quick, Rate: lo.Rate, Size: lo.Size,
		Duration: lo.Warmup + lo.Window + loadTail, Warmup: lo.Warmup, Window: lo.Window, Rounds: lo.Rounds,
	}
	err := b.setup(ctx)
	var targets []*target
	// The direct path (no proxy) runs too: its latency is the load
	// generator's and the machine's share of every path's.
	for _, t := range b.targets {
		targets = append(targets, t)
		l.Paths = append(l.Paths, t.cfg)
	}
	l.Skipped = append(l.Skipped, b.run.Skipped...)
	// A process keeps what a level's connections made it allocate (the Go
	// runtime returns spans to the OS only after minutes, HAProxy and
	// OpenSSL keep their pools), so memory per connection is read against
	// each process's RSS before its path's first level, not the level's.
	firstRSS := map[*proc]int64{}
	for _, n := range lo.Conns {
		for round := 1; round <= lo.Rounds; round++ {
			for _, t := range targets {
				if err != nil {
					break
				}
				if err = ctx.Err(); err != nil {
					break
				}
				if !t.cfg.Daemon && !t.cfg.Direct && n > haproxyMaxConn {
					if round == 1 {
						l.Skipped = append(l.Skipped, report.Skip{What: fmt.Sprintf("%s at %s connections", t.cfg.ID, commaInt(n)),
							Reason: fmt.Sprintf("each HAProxy half holds two descriptors per connection and runs with maxconn %s under "+
								"the hard RLIMIT_NOFILE (20,000)", commaInt(haproxyMaxConn))})
					}
					continue
				}
				// The profile (after the window) is taken in the last
				// round only.
				profile := t.cfg.Daemon && n == lo.ProfileConns && round == lo.Rounds
				b.loadRound(ctx, t, n, round, lo, profile, l, firstRSS)
			}
		}
	}
	err = errors.Join(err, b.teardown())
	l.Machine.LoadEnd = LoadAvg()
	if err == nil && o.Quick {
		err = checkQuickLoad(l, targets)
	}
	return l, err
}

// loadRound runs one round of a level on t and records it (or its failure).
func (b *bench) loadRound(ctx context.Context, t *target, n, round int, lo LoadOptions, profile bool, l *report.Load, firstRSS map[*proc]int64) {
	p, err := b.loadLevel(ctx, t, n, lo, profile, l, firstRSS)
	if err != nil {
		msg := fmt.Sprintf("%s at %d connections, round %d: %v", t.cfg.ID, n, round, err)
		l.Failures = append(l.Failures, msg)
		b.logf("FAILED %s", msg)
		return
	}
	p.Round = round
	l.Points = append(l.Points, p)
	b.logf("load %-26s %6d conns r%d %7.0f/s p50 %6.0f p99 %7.0f p99.9 %7.0f µs  %.2f cores  %.1f KiB/conn%s",
		t.cfg.ID, n, round, p.PerSecond, p.Latency.P50, p.Latency.P99, p.Latency.P999, p.Cores(), p.RSSPerConnKiB(), gcLine(p))
}

// commaInt writes n with thousands separators, as the report does.
func commaInt(n int) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

func gcLine(p report.LoadPoint) string {
	g := p.GC()
	if g == nil {
		return ""
	}
	return fmt.Sprintf("  GC %d cycles %.2f s CPU, pauses p99 %.0f µs", g.Cycles, g.CPUSeconds, g.PauseP99)
}

// checkQuickLoad is the CI assertion: both paths answered at the level.
func checkQuickLoad(l *report.Load, targets []*target) error {
	var missing []string
	for _, t := range targets {
		if t.cfg.Direct {
			continue
		}
		found := false
		for _, p := range l.Points {
			found = found || (p.Config == t.cfg.ID && p.Requests > 0 && p.Latency.P999 > 0)
		}
		if !found {
			missing = append(missing, t.cfg.ID)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("harness: the quick Load run produced no numbers for: %s", strings.Join(missing, ", "))
	}
	return nil
}

// loadReading is the path's processes at one moment.
type loadReading struct {
	ticks  []int64
	rssKiB []int64
	logLen []int // daemons' log lengths (others: 0)
}

func (b *bench) readLoad(t *target) (loadReading, error) {
	var r loadReading
	for _, p := range t.procs {
		ps, err := load.ReadProc(p.pid)
		if err != nil {
			return r, fmt.Errorf("%s: %w", p.name, err)
		}
		r.ticks = append(r.ticks, ps.CPUTicks)
		r.rssKiB = append(r.rssKiB, ps.RSSKiB)
		n := 0
		if d := b.cluster.Daemons[p.pod]; p.daemon && d != nil {
			n = len(d.Log())
		}
		r.logLen = append(r.logLen, n)
	}
	return r, nil
}

// loadLevel runs one level through t: zload dials n connections and sends
// the aggregate rate; the window opens Warmup after the schedule starts.
// firstRSS holds each process's RSS before its first level (set here on
// the first).
func (b *bench) loadLevel(ctx context.Context, t *target, n int, lo LoadOptions, prof bool, l *report.Load, firstRSS map[*proc]int64) (report.LoadPoint, error) {
	pt := report.LoadPoint{Config: t.cfg.ID, Conns: n}
	settle(ctx, t.procs)
	base, err := b.readLoad(t)
	if err != nil {
		return pt, err
	}
	for i, p := range t.procs {
		if _, ok := firstRSS[p]; !ok {
			firstRSS[p] = base.rssKiB[i]
		}
	}
	d := lo.Warmup + lo.Window + loadTail
	if prof {
		d += time.Duration(b.o.ProfileSeconds) * time.Second
	}
	// --prime: HAProxy's upstream handshakes run behind the accept; one
	// round trip a connection first keeps them out of the schedule.
	args := append([]string{"rr", "--prime", "--open-rate", fmt.Sprint(lo.Rate), "--concurrency", fmt.Sprint(n),
		"--duration", d.String(), "--req-size", fmt.Sprint(lo.Size), "--resp-size", fmt.Sprint(lo.Size)}, t.args...)
	started := make(chan struct{})
	var once sync.Once
	type result struct {
		res *load.Result
		err error
	}
	done := make(chan result, 1)
	go func() {
		// Dialing is serial: a few seconds per 10,000 connections.
		res, err := b.zload(ctx, t.ns, d+3*time.Minute, func(line string) {
			if strings.HasPrefix(line, "zload: schedule started") {
				once.Do(func() { close(started) })
			}
		}, args...)
		done <- result{res, err}
	}()
	var r0, r1 loadReading
	var rerr error
	select {
	case r := <-done:
		if r.err == nil {
			r.err = errors.New("zload ended before its schedule started")
		}
		return pt, r.err
	case <-started:
	}
	wait := func(dur time.Duration) bool {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(dur):
			return true
		}
	}
	if wait(lo.Warmup) {
		r0, rerr = b.readLoad(t)
		if rerr == nil && wait(lo.Window) {
			r1, rerr = b.readLoad(t)
		}
	}
	if rerr == nil && prof && ctx.Err() == nil {
		rerr = b.loadProfiles(ctx, t, n, l)
	}
	r := <-done
	if r.err != nil {
		return pt, r.err
	}
	if rerr != nil {
		return pt, rerr
	}
	if err := ctx.Err(); err != nil {
		return pt, err
	}
	rr := r.res.RR
	if rr == nil {
		return pt, errors.New("zload returned no rr result")
	}
	pt.Requests, pt.PerSecond, pt.Errors, pt.Missed, pt.Unanswered = rr.Requests, rr.PerSecond, rr.Errors, rr.Missed, rr.Unanswered
	pt.Latency = report.LatencyUS{P50: rr.Latency.P50, P99: rr.Latency.P99, P999: rr.Latency.P999, Max: rr.Latency.Max}
	for i, p := range t.procs {
		lp := report.LoadProc{Name: p.name, Cores: load.CPUSeconds(r1.ticks[i]-r0.ticks[i]) / lo.Window.Seconds(),
			RSSKiB: r1.rssKiB[i], BaseRSSKiB: firstRSS[p]}
		if dm := b.cluster.Daemons[p.pod]; p.daemon && dm != nil {
			log := dm.Log()
			if r1.logLen[i] <= len(log) && r0.logLen[i] <= r1.logLen[i] {
				lp.GC = summarizeGC(parseGCTrace(log[r0.logLen[i]:r1.logLen[i]]))
			}
		}
		pt.Procs = append(pt.Procs, lp)
	}
	return pt, nil
}

// loadProfiles takes the daemons' CPU profiles (ProfileSeconds) and then
// their heap profiles while the level runs.
func (b *bench) loadProfiles(ctx context.Context, t *target, n int, l *report.Load) error {
	daemons, data, err := b.fetchDaemons(ctx, t, "profile")
	if err != nil {
		return err
	}
	name := fmt.Sprintf("load%d", n)
	for i, p := range daemons {
		file, err := b.saveProfile(t, name, p, data[i])
		if err != nil {
			return err
		}
		prof, err := profile.ParseData(data[i])
		if err != nil {
			return fmt.Errorf("%s: %w", p.name, err)
		}
		sum, err := report.SummarizeProfile(prof, 15)
		if err != nil {
			return err
		}
		l.Profiles = append(l.Profiles, report.Profile{Config: t.cfg.ID, Metric: name, Proc: p.name, File: file, Summary: sum})
		hctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		hd, err := nsGet(hctx, p.ns, p.pprof+"/debug/pprof/heap", 64<<20)
		cancel()
		if err != nil {
			return err
		}
		hp, err := profile.ParseData(hd)
		if err != nil {
			return fmt.Errorf("%s heap: %w", p.name, err)
		}
		hsum, err := report.SummarizeHeap(hp, 10)
		if err != nil {
			return err
		}
		hfile, err := b.saveProfile(t, name+"-heap", p, hd)
		if err != nil {
			return err
		}
		l.Heaps = append(l.Heaps, report.HeapProfile{Proc: p.name, Conns: n, File: hfile, Summary: hsum})
	}
	l.ProfileConns = n
	return nil
}
