package report

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
)

// Files of the Load scenario's report (issue 36), relative to its directory.
const (
	FileLoadReport  = "LOAD.md"
	FileLoadResults = "load.json"
	PlotLoadLatency = "load-latency.png"
	PlotLoadCPU     = "load-cpu.png"
)

// Load is one run of the Load scenario: many concurrent connections, each
// sending small requests, at a fixed aggregate rate (open loop), through
// the daemon pair and through the HAProxy mTLS pair, level by level.
type Load struct {
	Machine Machine `json:"machine"`
	// Quick marks the CI smoke run (a few hundred connections, seconds).
	Quick bool `json:"quick"`
	// Rate is the aggregate requests/s, Size each request's and
	// response's bytes.
	Rate int `json:"rate"`
	Size int `json:"size"`
	// Duration is each level's schedule; Warmup and Window place the
	// CPU, GC and memory readings inside it (from the schedule's start).
	Duration time.Duration `json:"duration_ns"`
	Warmup   time.Duration `json:"warmup_ns"`
	Window   time.Duration `json:"window_ns"`
	// Paths are the two paths compared (configs of the main report).
	Paths []Config `json:"paths"`
	// Rounds is how many times each level ran on each path, the paths
	// taking turns, so that the machine's noise falls on both alike.
	Rounds int         `json:"rounds"`
	Points []LoadPoint `json:"points"`
	// Profiles are the daemons' CPU profiles at ProfileConns, Heaps their
	// heap profiles then.
	ProfileConns int           `json:"profile_conns,omitempty"`
	Profiles     []Profile     `json:"profiles,omitempty"`
	Heaps        []HeapProfile `json:"heaps,omitempty"`
	Skipped      []Skip        `json:"skipped,omitempty"`
	Failures     []string      `json:"failures,omitempty"`
}

// LoadPoint is one path at one level of concurrency.
type LoadPoint struct {
	Config string `json:"config"`
	Conns  int    `json:"conns"`
	Round  int    `json:"round"`
	// Requests answered, Errors (connections that failed), Missed and
	// Unanswered requests, as zload counts them over the whole schedule.
	Requests   int64   `json:"requests"`
	PerSecond  float64 `json:"per_second"`
	Errors     int64   `json:"errors"`
	Missed     int64   `json:"missed"`
	Unanswered int64   `json:"unanswered"`
	// Latency is from each request's schedule (open loop), µs.
	Latency LatencyUS `json:"latency"`
	// Procs are the path's proxy processes over the window.
	Procs []LoadProc `json:"procs"`
}

// LatencyUS are the latency quantiles of a level, µs.
type LatencyUS struct {
	P50  float64 `json:"p50_us"`
	P99  float64 `json:"p99_us"`
	P999 float64 `json:"p99_9_us"`
	Max  float64 `json:"max_us"`
}

// LoadProc is one proxy process under the load.
type LoadProc struct {
	Name string `json:"name"`
	// Cores is its CPU (user + system) over the window per second.
	Cores float64 `json:"cores"`
	// RSSKiB is its resident memory at the window's end; BaseRSSKiB
	// before its path's first level (what a level made a process
	// allocate, it keeps: the next level's baseline would hide it).
	RSSKiB     int64 `json:"rss_kib"`
	BaseRSSKiB int64 `json:"base_rss_kib"`
	// GC is the Go runtime's collector over the window (daemons only).
	GC *GCStats `json:"gc,omitempty"`
}

// GCStats are the collections of a window, as GODEBUG=gctrace=1 reports
// them.
type GCStats struct {
	Cycles int `json:"cycles"`
	// CPUSeconds is the collector's CPU as the runtime counts it: both
	// stop-the-world phases (times the Ps stopped), assists, background and
	// idle marking.
	CPUSeconds float64 `json:"cpu_seconds"`
	// Pauses are the stop-the-world pauses (two a cycle), µs.
	PauseP50 float64 `json:"pause_p50_us"`
	PauseP99 float64 `json:"pause_p99_us"`
	PauseMax float64 `json:"pause_max_us"`
	// HeapGoalMB is the last cycle's heap goal.
	HeapGoalMB int `json:"heap_goal_mb"`
}

// Cores sums the processes' CPU.
func (p LoadPoint) Cores() float64 {
	var c float64
	for _, pr := range p.Procs {
		c += pr.Cores
	}
	return c
}

// RSSPerConnKiB is what one connection adds to the processes' resident
// memory (all of them), KiB.
func (p LoadPoint) RSSPerConnKiB() float64 {
	if p.Conns == 0 {
		return math.NaN()
	}
	var d int64
	for _, pr := range p.Procs {
		d += pr.RSSKiB - pr.BaseRSSKiB
	}
	return float64(d) / float64(p.Conns)
}

// GC sums the daemons' collections: cycles and CPU add up, the pause
// quantiles are the worst daemon's. Nil if no process reported any.
func (p LoadPoint) GC() *GCStats {
	var out *GCStats
	for _, pr := range p.Procs {
		if pr.GC == nil {
			continue
		}
		if out == nil {
			out = &GCStats{}
		}
		out.Cycles += pr.GC.Cycles
		out.CPUSeconds += pr.GC.CPUSeconds
		out.PauseP50 = max(out.PauseP50, pr.GC.PauseP50)
		out.PauseP99 = max(out.PauseP99, pr.GC.PauseP99)
		out.PauseMax = max(out.PauseMax, pr.GC.PauseMax)
		out.HeapGoalMB = max(out.HeapGoalMB, pr.GC.HeapGoalMB)
	}
	return out
}

// Point returns config's point at conns: each figure the median of its
// rounds (field by field, so the figures of one row may come from
// different rounds).
func (l *Load) Point(config string, conns int) (LoadPoint, bool) {
	var ps []LoadPoint
	for _, p := range l.Points {
		if p.Config == config && p.Conns == conns {
			ps = append(ps, p)
		}
	}
	if len(ps) == 0 {
		return LoadPoint{}, false
	}
	return medianPoint(ps), true
}

// medianPoint is the field-by-field median of rounds of one level.
func medianPoint(ps []LoadPoint) LoadPoint {
	if len(ps) == 1 {
		return ps[0]
	}
	med := func(f func(LoadPoint) float64) float64 {
		v := make([]float64, len(ps))
		for i, p := range ps {
			v[i] = f(p)
		}
		slices.Sort(v)
		if len(v)%2 == 1 {
			return v[len(v)/2]
		}
		return (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	medI := func(f func(LoadPoint) int64) int64 {
		return int64(math.Round(med(func(p LoadPoint) float64 { return float64(f(p)) })))
	}
	out := LoadPoint{Config: ps[0].Config, Conns: ps[0].Conns,
		Requests: medI(func(p LoadPoint) int64 { return p.Requests }), PerSecond: med(func(p LoadPoint) float64 { return p.PerSecond }),
		Errors: medI(func(p LoadPoint) int64 { return p.Errors }), Missed: medI(func(p LoadPoint) int64 { return p.Missed }),
		Unanswered: medI(func(p LoadPoint) int64 { return p.Unanswered }),
		Latency: LatencyUS{P50: med(func(p LoadPoint) float64 { return p.Latency.P50 }), P99: med(func(p LoadPoint) float64 { return p.Latency.P99 }),
			P999: med(func(p LoadPoint) float64 { return p.Latency.P999 }), Max: med(func(p LoadPoint) float64 { return p.Latency.Max })},
	}
	for i, pr := range ps[0].Procs {
		at := func(p LoadPoint) LoadProc {
			if i < len(p.Procs) {
				return p.Procs[i]
			}
			return LoadProc{}
		}
		lp := LoadProc{Name: pr.Name, Cores: med(func(p LoadPoint) float64 { return at(p).Cores }),
			RSSKiB: medI(func(p LoadPoint) int64 { return at(p).RSSKiB }), BaseRSSKiB: medI(func(p LoadPoint) int64 { return at(p).BaseRSSKiB })}
		if pr.GC != nil {
			gc := func(p LoadPoint) GCStats {
				if g := at(p).GC; g != nil {
					return *g
				}
				return GCStats{}
			}
			lp.GC = &GCStats{Cycles: int(medI(func(p LoadPoint) int64 { return int64(gc(p).Cycles) })),
				CPUSeconds: med(func(p LoadPoint) float64 { return gc(p).CPUSeconds }),
				PauseP50:   med(func(p LoadPoint) float64 { return gc(p).PauseP50 }),
				PauseP99:   med(func(p LoadPoint) float64 { return gc(p).PauseP99 }),
				PauseMax:   med(func(p LoadPoint) float64 { return gc(p).PauseMax }),
				HeapGoalMB: int(medI(func(p LoadPoint) int64 { return int64(gc(p).HeapGoalMB) }))}
		}
		out.Procs = append(out.Procs, lp)
	}
	return out
}

// p999Range is the lowest and highest p99.9 of config's rounds at conns.
func (l *Load) p999Range(config string, conns int) (lo, hi float64, n int) {
	lo = math.Inf(1)
	for _, p := range l.Points {
		if p.Config == config && p.Conns == conns {
			lo, hi, n = min(lo, p.Latency.P999), max(hi, p.Latency.P999), n+1
		}
	}
	return lo, hi, n
}

// Levels are the levels of concurrency measured, in order.
func (l *Load) Levels() []int {
	var out []int
	for _, p := range l.Points {
		if !slices.Contains(out, p.Conns) {
			out = append(out, p.Conns)
		}
	}
	slices.Sort(out)
	return out
}

// WriteLoad writes LOAD.md, load.json and the plots into dir.
func WriteLoad(dir string, l *Load) error {
	return writeScenario(dir, l, FileLoadResults, FileLoadReport,
		func() ([]string, error) { return writeLoadPlots(dir, l) },
		func(p []string) []byte { return LoadMarkdown(l, p) })
}

// loadPair returns the two paths' IDs: ours (a daemon path) and the peer.
func (l *Load) loadPair() (ours, peer string) {
	for _, c := range l.Paths {
		switch {
		case c.Daemon:
			ours = c.ID
		case !c.Direct:
			peer = c.ID
		}
	}
	return ours, peer
}

// LoadMarkdown renders the Load section.
func LoadMarkdown(l *Load, plots []string) []byte {
	var m md
	m.p("# Load: concurrent HBONE connections at a fixed rate (issue 36)")
	m.p("")
	mc := l.Machine
	m.p("Machine: %s, %s, %d cores, %s MiB, kernel %s, %s; load %.2f → %.2f.", mc.Host, mc.CPUModel, mc.Cores,
		commas(mc.MemTotalKiB/1024), mc.Kernel, mc.GoVersion, mc.LoadStart[0], mc.LoadEnd[0])
	if l.Quick {
		m.p("")
		m.p("Quick run (CI smoke): a few hundred connections for seconds; the figures only show the scenario still runs.")
	}
	m.p("")
	m.p("Each level: zload dials that many connections through the path, then sends %s requests/s in all "+
		"(open loop: each connection on a fixed schedule, whatever the responses do; latency counts from the schedule) "+
		"of %d B each way for %s. CPU, GC and memory are read over %s from %s into the schedule, after the burst of "+
		"set-ups. The direct path (no proxy) is the load generator's and the machine's own share of every path's latency. "+
		"CPU is each path's proxy processes' (user + system); memory per connection is their RSS growth over "+
		"their RSS before the path's first level, divided by the connections (levels ascend; a process keeps what a "+
		"level made it allocate). The GC columns are the daemons' (GODEBUG=gctrace=1): "+
		"the collector's CPU as the runtime counts it over the path's CPU, and its stop-the-world pauses. "+
		"%s",
		commas(int64(l.Rate)), l.Size, l.Duration, l.Window, l.Warmup, roundsNote(l.Rounds))
	m.p("")
	for _, c := range l.Paths {
		what := c.Proxy
		if c.Note != "" {
			what += ", " + c.Note
		}
		if len(c.Procs) > 0 {
			what += "; processes " + strings.Join(c.Procs, ", ")
		}
		m.p("- `%s`: %s.", c.ID, what)
	}
	m.p("")
	ours, peer := l.loadPair()
	var rows [][]string
	for _, n := range l.Levels() {
		for _, c := range l.Paths {
			p, ok := l.Point(c.ID, n)
			if !ok {
				continue
			}
			gcShare, pauses, cycles := "—", "—", "—"
			if g := p.GC(); g != nil {
				if cores := p.Cores(); cores > 0 && l.Window > 0 {
					gcShare = fmt.Sprintf("%.1f%%", 100*g.CPUSeconds/(cores*l.Window.Seconds()))
				}
				pauses = fmt.Sprintf("%s / %s / %s", num(g.PauseP50), num(g.PauseP99), num(g.PauseMax))
				if g.Cycles == 0 {
					pauses = "no cycle"
				}
				cycles = fmt.Sprintf("%.1f", float64(g.Cycles)/l.Window.Seconds())
			}
			var procCores []string
			for _, pr := range p.Procs {
				procCores = append(procCores, fmt.Sprintf("%.2f", pr.Cores))
			}
			cores, rss := fmt.Sprintf("%.2f (%s)", p.Cores(), strings.Join(procCores, " + ")), num(p.RSSPerConnKiB())
			if len(p.Procs) == 0 {
				cores, rss = "—", "—"
			}
			lost := p.Errors + p.Missed + p.Unanswered
			p999 := num(p.Latency.P999)
			if lo, hi, k := l.p999Range(c.ID, n); k > 1 {
				p999 += fmt.Sprintf(" (%s–%s)", num(lo), num(hi))
			}
			rows = append(rows, []string{
				commas(int64(n)), "`" + c.ID + "`", commas(int64(math.Round(p.PerSecond))), commas(lost),
				num(p.Latency.P50), num(p.Latency.P99), p999, num(p.Latency.Max),
				cores, rss, gcShare, cycles, pauses,
			})
		}
	}
	m.table(2, []string{"connections", "path", "requests/s", "errors + missed + unanswered", "p50 µs", "p99 µs",
		"p99.9 µs", "max µs", "cores (per process)", "RSS KiB/conn", "GC share of CPU", "GCs/s",
		"GC pause p50 / p99 / max µs"}, rows)
	if ours != "" && peer != "" {
		m.p("Against the HAProxy mTLS pair at the same level (issue 36's goal at 5,000 connections: p99.9 ≤ 1.0×, CPU ≤ 0.8×):")
		m.p("")
		var rows [][]string
		for _, n := range l.Levels() {
			a, okA := l.Point(ours, n)
			b, okB := l.Point(peer, n)
			if !okA || !okB {
				continue
			}
			rows = append(rows, []string{commas(int64(n)), ratio(a.Latency.P50, b.Latency.P50),
				ratio(a.Latency.P99, b.Latency.P99), ratio(a.Latency.P999, b.Latency.P999), ratio(a.Cores(), b.Cores()),
				ratio(a.RSSPerConnKiB(), b.RSSPerConnKiB()),
				l.roundRatios(ours, peer, n, func(p LoadPoint) float64 { return p.Latency.P999 }),
				l.roundRatios(ours, peer, n, LoadPoint.Cores)})
		}
		m.table(1, []string{"connections", "p50", "p99", "p99.9", "CPU", "RSS per connection",
			"p99.9, round by round", "CPU, round by round"}, rows)
		m.p("The first five columns are ratios of the medians; the last two the median (and range) of the ratios of " +
			"rounds run back to back, which the machine's drifting load touches less.")
		m.p("")
	}
	for _, f := range plots {
		m.p("![%s](%s)", f, f)
		m.p("")
	}
	if len(l.Profiles) > 0 {
		m.p("## The daemons at %s connections", commas(int64(l.ProfileConns)))
		m.p("")
		for _, p := range l.Profiles {
			m.p("CPU profile of %s (`%s`, %.2f s of CPU in %.1f s), top functions by self time:", p.Proc, p.File,
				p.Summary.CPUSeconds, p.Summary.Seconds)
			m.p("")
			var rows [][]string
			for _, f := range p.Summary.Flat {
				rows = append(rows, []string{"`" + shortFunc(f.Name) + "`", fmt.Sprintf("%.1f%%", 100*f.Share)})
			}
			m.table(1, []string{"function", "share"}, rows)
			var cats []string
			for _, c := range p.Summary.Categories {
				cats = append(cats, fmt.Sprintf("%s %.0f%%", c.Name, 100*c.Share))
			}
			m.p("By category: %s.", strings.Join(cats, ", "))
			m.p("")
		}
		for _, h := range l.Heaps {
			m.p("Heap profile of %s (`%s`, %s KiB live), top sites by live bytes:", h.Proc, h.File, num(h.Summary.InuseKiB))
			m.p("")
			var rows [][]string
			for _, f := range h.Summary.Flat {
				rows = append(rows, []string{"`" + shortFunc(f.Name) + "`", num(f.KiB), fmt.Sprintf("%.1f%%", 100*f.Share)})
			}
			m.table(1, []string{"allocated in", "KiB", "share"}, rows)
		}
	}
	for _, s := range l.Skipped {
		m.p("Skipped: %s: %s.", s.What, s.Reason)
		m.p("")
	}
	for _, f := range l.Failures {
		m.p("Failed: %s.", f)
		m.p("")
	}
	return m.Bytes()
}

// roundRatios is the median and range of a's figure over b's, round by
// round (each round's two runs are back to back), or a dash.
func (l *Load) roundRatios(a, b string, conns int, f func(LoadPoint) float64) string {
	var rs []float64
	for _, pa := range l.Points {
		if pa.Config != a || pa.Conns != conns {
			continue
		}
		for _, pb := range l.Points {
			if pb.Config == b && pb.Conns == conns && pb.Round == pa.Round && f(pb) > 0 {
				rs = append(rs, f(pa)/f(pb))
			}
		}
	}
	if len(rs) == 0 {
		return "—"
	}
	slices.Sort(rs)
	med := rs[len(rs)/2]
	if len(rs)%2 == 0 {
		med = (rs[len(rs)/2-1] + rs[len(rs)/2]) / 2
	}
	if len(rs) == 1 {
		return fmt.Sprintf("%.2f×", med)
	}
	return fmt.Sprintf("%.2f× (%.2f–%.2f)", med, rs[0], rs[len(rs)-1])
}

// ratio is a/b as "0.85×" (or "<0.01×"), or a dash.
func ratio(a, b float64) string {
	if !(b > 0) || math.IsNaN(a) {
		return "—"
	}
	if a/b < 0.01 {
		return "<0.01×"
	}
	return fmt.Sprintf("%.2f×", a/b)
}

// roundsNote says how the rows come from the rounds.
func roundsNote(rounds int) string {
	if rounds <= 1 {
		return "Each level ran once on each path."
	}
	return fmt.Sprintf("Each level ran %d times on each path, the paths taking turns; a row is the median of its "+
		"rounds, figure by figure (p99.9 with its range).", rounds)
}

func writeLoadPlots(dir string, l *Load) ([]string, error) {
	if len(l.Points) == 0 {
		return nil, nil
	}
	lp := plot.New()
	lp.Title.Text = fmt.Sprintf("Latency against concurrency at %s requests/s in all (median of rounds)", commas(int64(l.Rate)))
	lp.X.Label.Text = "concurrent connections"
	lp.Y.Label.Text = "µs (log)"
	lp.Y.Scale = plot.LogScale{}
	lp.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	cp := plot.New()
	cp.Title.Text = "Proxy CPU against concurrency (all processes of a path)"
	cp.X.Label.Text = "concurrent connections"
	cp.Y.Label.Text = "cores"
	quantiles := []struct {
		name string
		v    func(LatencyUS) float64
	}{
		{"p50", func(q LatencyUS) float64 { return q.P50 }},
		{"p99", func(q LatencyUS) float64 { return q.P99 }},
		{"p99.9", func(q LatencyUS) float64 { return q.P999 }},
	}
	maxY := 0.0
	for ci, c := range l.Paths {
		var cpu plotter.XYs
		for qi, q := range quantiles {
			var pts plotter.XYs
			for _, n := range l.Levels() {
				if p, ok := l.Point(c.ID, n); ok && q.v(p.Latency) > 0 {
					pts = append(pts, plotter.XY{X: float64(n), Y: q.v(p.Latency)})
				}
			}
			if len(pts) == 0 {
				continue
			}
			// A path's colour, a quantile's dashes and marks.
			ln, sc, err := plotter.NewLinePoints(pts)
			if err != nil {
				return nil, err
			}
			ln.Color, sc.Color = plotutil.Color(ci), plotutil.Color(ci)
			ln.Dashes, sc.Shape = plotutil.Dashes(qi), plotutil.Shape(qi)
			lp.Add(ln, sc)
			lp.Legend.Add(c.ID+" "+q.name, ln, sc)
			for _, pt := range pts {
				maxY = max(maxY, pt.Y)
			}
		}
		for _, n := range l.Levels() {
			if p, ok := l.Point(c.ID, n); ok {
				cpu = append(cpu, plotter.XY{X: float64(n), Y: p.Cores()})
			}
		}
		if len(cpu) > 0 && !c.Direct {
			if err := addLine(cp, cpu, ci, c.ID); err != nil {
				return nil, err
			}
		}
	}
	// Headroom above the lines for the legend (log scale).
	lp.Y.Max = maxY * 1000
	if err := saveLines(lp, dir, PlotLoadLatency, true); err != nil {
		return nil, err
	}
	cp.Y.Min = 0
	if err := saveLines(cp, dir, PlotLoadCPU, true); err != nil {
		return nil, err
	}
	return []string{PlotLoadLatency, PlotLoadCPU}, nil
}
