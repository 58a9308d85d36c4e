package report

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Files written by Write besides the plots.
const (
	FileReport  = "REPORT.md"
	FileResults = "results.json"
)

// Write writes REPORT.md, results.json and the plots into dir (created if
// needed). Profiles are expected in dir already (their File fields).
func Write(dir string, r *Run) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("report: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, FileResults), append(js, '\n'), 0o644); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	st := NewStats(r)
	plots, err := writePlots(dir, r, st)
	if err != nil {
		return err
	}
	md := Markdown(r, st, plots)
	if err := os.WriteFile(filepath.Join(dir, FileReport), md, 0o644); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	return nil
}

type md struct{ bytes.Buffer }

func (m *md) p(format string, args ...any) { fmt.Fprintf(&m.Buffer, format+"\n", args...) }

// table writes a table whose first left columns are text (left-aligned)
// and the rest numbers (right-aligned).
func (m *md) table(left int, header []string, rows [][]string) {
	m.p("| %s |", strings.Join(header, " | "))
	seps := make([]string, len(header))
	for i := range seps {
		seps[i] = "---"
		if i >= left {
			seps[i] = "---:"
		}
	}
	m.p("| %s |", strings.Join(seps, " | "))
	for _, r := range rows {
		m.p("| %s |", strings.Join(r, " | "))
	}
	m.p("")
}

// num formats a value with a precision suited to its size; "—" when absent.
func num(v float64) string {
	switch {
	case math.IsNaN(v) || math.IsInf(v, 0) || v == 0:
		return "—"
	case math.Abs(v) >= 1000:
		return commas(int64(math.Round(v)))
	case math.Abs(v) >= 100:
		return fmt.Sprintf("%.0f", v)
	case math.Abs(v) >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

func commas(n int64) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// withRatio is "v (r×)" where r = v/base.
func withRatio(v, base float64, direct bool) string {
	if v == 0 || math.IsNaN(v) {
		return "—"
	}
	if direct || base == 0 || math.IsNaN(base) {
		return num(v)
	}
	return fmt.Sprintf("%s (%.2f×)", num(v), v/base)
}

// Markdown renders the report.
func Markdown(r *Run, st *Stats, plots []string) []byte {
	var m md
	date := r.Started.Format("2006-01-02 15:04 MST")
	m.p("# Benchmark report: %s, %s", r.Machine.Host, date)
	m.p("")
	if r.Quick {
		m.p("> **Quick run** (CI smoke test): one short round per measurement. The figures only show that every path works; do not compare them.")
		m.p("")
	}
	m.p("Written by `bench/cmd/zbench` (`make bench`). Every figure is the **median of %d round(s)**; `(0.86×)` is the ratio to the **direct** path (no proxy) measured in the same run. Proxy CPU is read from `/proc/<pid>/stat` of the proxy processes (all of them for two hops) during each measurement, in cores. Run time %s.",
		r.Settings.Rounds, r.Finished.Sub(r.Started).Round(time.Second))
	m.p("")
	hasPlot := map[string]bool{}
	for _, p := range plots {
		hasPlot[p] = true
	}

	writeStanding(&m, r, st) // standing.go: the first table

	m.p("## Machine")
	m.p("")
	mem := "—"
	if r.Machine.MemTotalKiB > 0 {
		mem = fmt.Sprintf("%.1f GiB", float64(r.Machine.MemTotalKiB)/(1<<20))
	}
	m.table(2, []string{"", ""}, [][]string{
		{"Host", r.Machine.Host},
		{"CPU", r.Machine.CPUModel},
		{"Cores", fmt.Sprint(r.Machine.Cores)},
		{"Memory", mem},
		{"Kernel", r.Machine.Kernel},
		{"Go", r.Machine.GoVersion},
		{"HAProxy", orDash(r.Machine.HAProxy)},
		{"Commit", orDash(r.Machine.Commit)},
		{"Load average (1/5/15 min) at start, at end", fmt.Sprintf("%.2f %.2f %.2f, %.2f %.2f %.2f",
			r.Machine.LoadStart[0], r.Machine.LoadStart[1], r.Machine.LoadStart[2], r.Machine.LoadEnd[0], r.Machine.LoadEnd[1], r.Machine.LoadEnd[2])},
	})
	if busy := r.Machine.LoadStart[0]; r.Machine.Cores > 0 && busy > 0.5*float64(r.Machine.Cores) {
		m.p("> Other work kept the machine busy when the run started (load average %.2f on %d cores): the figures are noisier than on an idle machine; the ratios, measured side by side in interleaved rounds, suffer least.", busy, r.Machine.Cores)
		m.p("")
	}

	s := r.Settings
	m.p("## Settings")
	m.p("")
	var sizes []string
	for _, z := range s.RRSizes {
		sizes = append(sizes, fmt.Sprintf("%d B → %d B", z.Req, z.Resp))
	}
	m.p("- %d round(s), %v per measurement; rounds interleave every path so drift hits all alike.", s.Rounds, s.Duration)
	m.p("- Throughput: 1 stream and %d streams, client → server (128 KiB writes), counted by the server.", s.Streams)
	m.p("- Request/response: closed loop, one connection: %s.", strings.Join(sizes, ", "))
	m.p("- Connection rate: %d workers, each connection carries one 1-byte request and response and is closed by the server.", s.CPSConcurrency)
	if f := s.FixedRate; f.Rate > 0 {
		m.p("- Fixed rate: open loop, %d requests/s of %d B each way over %d connections (sent on schedule whatever the responses do; latency from the actual send of a request that left on time, from its scheduled time otherwise).", f.Rate, f.Size, f.Conns)
	}
	m.p("- Idle: %d connections opened in %d step(s), each after one 1-byte exchange; measured before any traffic and %s.", s.IdleConns, s.IdleSteps, idleReadAt(s))
	m.p("- Daemon engine backends: %s (selected with `ZTUNNEL_ENGINE`); daemon log level `%s` (no per-connection access log, as the peers).", strings.Join(s.Backends, ", "), s.DaemonLogLevel)
	m.p("- Profiles: %d s of CPU profile from each daemon's `/debug/pprof/profile` under load.", s.ProfileSeconds)
	m.p("")

	writeSummary(&m, r, st)
	writeGoals(&m, r, st)
	writeThroughput(&m, r, st, hasPlot[PlotThroughput])
	writeLatency(&m, r, st, hasPlot[PlotLatency])
	writeCPS(&m, r, st, hasPlot[PlotCPS])
	writeFixedRate(&m, r, st)
	writeIdle(&m, r, hasPlot[PlotIdle])
	writeProfiles(&m, r)

	if len(r.Skipped) > 0 || len(r.Failures) > 0 {
		m.p("## Skipped and failed")
		m.p("")
		for _, sk := range r.Skipped {
			m.p("- skipped **%s**: %s", sk.What, sk.Reason)
		}
		for _, f := range r.Failures {
			m.p("- failed: %s", f)
		}
		m.p("")
	}

	m.p("## Paths")
	m.p("")
	var rows [][]string
	for _, c := range r.Configs {
		rows = append(rows, []string{"`" + c.ID + "`", c.Proxy, c.Note, strings.Join(c.Procs, ", ")})
	}
	m.table(4, []string{"ID", "Proxy", "Path", "Measured processes"}, rows)

	m.p("## Reproduce")
	m.p("")
	m.p("```sh")
	m.p("make bench        # this report (root; installs haproxy with apt if missing)")
	m.p("make bench-quick  # the CI smoke run")
	m.p("go tool pprof -top <report dir>/profiles/<file>.pb.gz   # a raw profile")
	m.p("```")
	m.p("")
	m.p("See PROFILING.md for how to read the profiles and how to profile the daemon live.")
	return m.Bytes()
}

func orDash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}

func idleOf(r *Run, id string) (Idle, bool) {
	for _, i := range r.Idle {
		if i.Config == id {
			return i, true
		}
	}
	return Idle{}, false
}

func writeSummary(m *md, r *Run, st *Stats) {
	d := st.Direct()
	m.p("## Summary")
	m.p("")
	rr1 := ""
	rrHead := "RR p50 / p99 µs"
	if len(r.Settings.RRSizes) > 0 {
		rr1 = RRMetric(r.Settings.RRSizes[0])
		rrHead = fmt.Sprintf("RR %d B p50 / p99 µs", r.Settings.RRSizes[0].Req)
	}
	head := []string{"Path", "Proxy", "Gbit/s 1 stream", fmt.Sprintf("Gbit/s %d streams", r.Settings.Streams),
		"proxy cores (1 stream)", "cores per Gbit/s", rrHead, "new conns/s", "idle KiB / fds / goroutines per conn"}
	var rows [][]string
	for _, c := range r.Configs {
		t1 := st.Get(c.ID, MetricTput1, FieldGbps).Median
		tn := st.Get(c.ID, MetricTputN, FieldGbps).Median
		cores := st.Get(c.ID, MetricTput1, FieldCores).Median
		cpg := st.Get(c.ID, MetricTput1, FieldCoresPerGbps).Median
		p50 := st.Get(c.ID, rr1, FieldP50).Median
		p99 := st.Get(c.ID, rr1, FieldP99).Median
		cps := st.Get(c.ID, MetricCPS, FieldPerSecond).Median
		lat := "—"
		if p50 > 0 {
			lat = fmt.Sprintf("%s / %s", num(p50), num(p99))
			if !c.Direct {
				lat += fmt.Sprintf(" (%.2f× / %.2f×)", p50/st.Get(d, rr1, FieldP50).Median, p99/st.Get(d, rr1, FieldP99).Median)
			}
		}
		idle := "—"
		if i, ok := idleOf(r, c.ID); ok {
			pc := i.PerConn()
			g := "—"
			if pc.Goroutines >= 0 {
				g = fmt.Sprintf("%.2f", pc.Goroutines)
			}
			idle = fmt.Sprintf("%.1f / %.2f / %s", pc.RSSKiB, pc.FDs, g)
		}
		coresS, cpgS := "—", "—"
		if !c.Direct {
			coresS, cpgS = num(cores), num(cpg)
		}
		group := c.Group
		if c.Direct {
			group = "—"
		}
		rows = append(rows, []string{group, proxyName(c),
			withRatio(t1, st.Get(d, MetricTput1, FieldGbps).Median, c.Direct),
			withRatio(tn, st.Get(d, MetricTputN, FieldGbps).Median, c.Direct),
			coresS, cpgS, lat,
			withRatio(cps, st.Get(d, MetricCPS, FieldPerSecond).Median, c.Direct),
			idle})
	}
	m.table(2, head, rows)
	m.p("Paths: `tcp` = %s; `hbone1` = %s; `hbone2` = %s. Idle figures are summed over the path's proxy processes.",
		GroupTitle(GroupTCP), GroupTitle(GroupHBONE1), GroupTitle(GroupHBONE2))
	m.p("")
}

func proxyName(c Config) string {
	if c.Daemon {
		return "**" + c.Proxy + "**"
	}
	return c.Proxy
}

func writeGoals(m *md, r *Run, st *Stats) {
	var backends []string
	for _, c := range r.Configs {
		if c.Daemon && c.Group == GroupTCP {
			backends = append(backends, c.Backend)
		}
	}
	if len(backends) == 0 {
		return
	}
	m.p("## Goals of the engine (#4) and HBONE (#5) issues")
	m.p("")
	m.p("Score = how far the goal is met (≥ 1 met; 0.5 = half way). Sorted worst first; the first row is the largest gap.")
	m.p("")
	for _, b := range backends {
		goals := RankGoals(EvaluateGoals(r, st, b))
		m.p("### Backend `%s`", b)
		m.p("")
		var rows [][]string
		for i, g := range goals {
			status := "n/a"
			score := "—"
			if g.Measurable() {
				status = "gap"
				if g.Met() {
					status = "met"
				}
				if !g.Binary {
					score = fmt.Sprintf("%.2f", g.Score)
				}
			}
			text := g.Text
			if i == 0 && g.Measurable() && !g.Met() && !g.Binary {
				text = "**" + text + "** (largest gap)"
			}
			rows = append(rows, []string{g.Issue, text, g.Target, g.Measured, score, status, "`" + g.Config + "`"})
		}
		m.table(2, []string{"Issue", "Goal", "Target", "Measured", "Score", "", "Path"}, rows)
	}
	m.p("Not measured here: allocations per DATA frame and write syscalls per 64 KiB: `go test -run '^$' -bench StreamThroughput ./hbone` reports both (allocs/op and writes/64KiB).")
	m.p("")
}

func writeThroughput(m *md, r *Run, st *Stats, plot bool) {
	d := st.Direct()
	m.p("## Throughput")
	m.p("")
	var rows [][]string
	for _, c := range r.Configs {
		row := []string{"`" + c.ID + "`"}
		for _, metric := range []string{MetricTput1, MetricTputN} {
			s := st.Get(c.ID, metric, FieldGbps)
			row = append(row, withRatio(s.Median, st.Get(d, metric, FieldGbps).Median, c.Direct), spread(s))
			row = append(row, coresCell(st, c, metric))
		}
		rows = append(rows, row)
	}
	n := fmt.Sprint(r.Settings.Streams)
	m.table(1, []string{"Path", "1 stream Gbit/s", "range", "cores", n + " streams Gbit/s", "range", "cores"}, rows)
	if plot {
		m.p("![throughput](%s)", PlotThroughput)
		m.p("")
	}
}

// coresCell is the proxy CPU cell of c's metric: none for the direct path,
// which has no proxy.
func coresCell(st *Stats, c Config, metric string) string {
	if c.Direct {
		return "—"
	}
	return num(st.Get(c.ID, metric, FieldCores).Median)
}

func spread(s Stat) string {
	if s.N <= 1 {
		return "—"
	}
	return fmt.Sprintf("%s–%s", num(s.Lo), num(s.Hi))
}

func writeLatency(m *md, r *Run, st *Stats, plot bool) {
	d := st.Direct()
	m.p("## Request/response latency")
	m.p("")
	for _, size := range r.Settings.RRSizes {
		metric := RRMetric(size)
		m.p("### %d B request, %d B response", size.Req, size.Resp)
		m.p("")
		var rows [][]string
		for _, c := range r.Configs {
			row := []string{"`" + c.ID + "`"}
			for _, f := range []func(Sample) float64{FieldP50, FieldP90, FieldP99, FieldP999, FieldMax} {
				row = append(row, num(st.Get(c.ID, metric, f).Median))
			}
			added := "—"
			if !c.Direct {
				a50 := st.Get(c.ID, metric, FieldP50).Median - st.Get(d, metric, FieldP50).Median
				a99 := st.Get(c.ID, metric, FieldP99).Median - st.Get(d, metric, FieldP99).Median
				added = fmt.Sprintf("%+.0f / %+.0f", a50, a99)
			}
			row = append(row, added, withRatio(st.Get(c.ID, metric, FieldPerSecond).Median, st.Get(d, metric, FieldPerSecond).Median, c.Direct))
			row = append(row, coresCell(st, c, metric))
			rows = append(rows, row)
		}
		m.table(1, []string{"Path", "p50 µs", "p90", "p99", "p99.9", "max", "added p50 / p99 µs", "transactions/s", "cores"}, rows)
	}
	if plot {
		m.p("![latency](%s)", PlotLatency)
		m.p("")
	}
}

// writeFixedRate is the CPU each path's proxies spend carrying the same
// fixed load, the figure of issue 23.
func writeFixedRate(m *md, r *Run, st *Stats) {
	f := r.Settings.FixedRate
	if f.Rate <= 0 {
		return
	}
	m.p("## CPU at a fixed rate")
	m.p("")
	var rows [][]string
	for _, c := range r.Configs {
		rate := st.Get(c.ID, MetricFixedRate, FieldPerSecond).Median
		perReq := "—"
		if cores := st.Get(c.ID, MetricFixedRate, FieldCores).Median; !c.Direct && rate > 0 {
			perReq = num(cores * 1e6 / rate)
		}
		rows = append(rows, []string{"`" + c.ID + "`", num(rate),
			num(st.Get(c.ID, MetricFixedRate, FieldP50).Median), num(st.Get(c.ID, MetricFixedRate, FieldP99).Median),
			coresCell(st, c, MetricFixedRate), perReq})
	}
	m.table(1, []string{"Path", "achieved requests/s", "p50 µs", "p99 µs", "cores", "CPU µs per request"}, rows)
	m.p("%d requests/s of %d B each way over %d connections, open loop: the proxies' CPU (all processes of a path) at a load every path carries.", f.Rate, f.Size, f.Conns)
	m.p("")
}

func writeCPS(m *md, r *Run, st *Stats, plot bool) {
	d := st.Direct()
	m.p("## Connection rate")
	m.p("")
	var rows [][]string
	for _, c := range r.Configs {
		s := st.Get(c.ID, MetricCPS, FieldPerSecond)
		cores := coresCell(st, c, MetricCPS)
		errs := st.Get(c.ID, MetricCPS, func(s Sample) float64 { return float64(s.Errors) })
		rows = append(rows, []string{"`" + c.ID + "`",
			withRatio(s.Median, st.Get(d, MetricCPS, FieldPerSecond).Median, c.Direct), spread(s),
			num(st.Get(c.ID, MetricCPS, FieldP50).Median), num(st.Get(c.ID, MetricCPS, FieldP99).Median),
			cores, fmt.Sprint(int64(errs.Median))})
	}
	m.table(1, []string{"Path", "connections/s", "range", "p50 µs", "p99 µs", "cores", "errors"}, rows)
	m.p("HBONE paths open a new CONNECT stream per connection on pooled mTLS connections (as the daemon does); `hbone1/tls` does a full mTLS handshake per connection.")
	m.p("")
	if plot {
		m.p("![connection rate](%s)", PlotCPS)
		m.p("")
	}
}

// idleReadAt says when the idle ramp's final reading was taken: issue 23's
// idle goal is read 30 s after the connections opened, and a reading taken
// sooner includes what the burst of set-ups freed but the daemon has not yet
// handed back. Runs that predate the setting read after zload's 300 ms.
func idleReadAt(s Settings) string {
	d := s.IdleSettle
	if d <= 0 {
		d = 300 * time.Millisecond
	}
	return fmt.Sprintf("read %s s after the last step", strconv.FormatFloat(d.Seconds(), 'f', -1, 64))
}

func writeIdle(m *md, r *Run, plot bool) {
	if len(r.Idle) == 0 {
		return
	}
	m.p("## Idle connections")
	m.p("")
	m.p("Growth of each proxy process between 0 and the last step (%s), divided by the connections held. Goroutines and heap (after a forced GC: live = HeapInuse, committed = HeapSys − HeapReleased) come from the process's pprof endpoint (Go processes only); a daemon shared by two paths is restarted before its second ramp, so every ramp starts from a fresh process. The committed heap moves with the scavenger and can come out slightly negative.", idleReadAt(r.Settings))
	m.p("")
	var rows [][]string
	for _, i := range r.Idle {
		conns := 0
		if len(i.Points) > 0 {
			conns = i.Points[len(i.Points)-1].Conns
		}
		for _, p := range append(i.PerProc, i.PerConn()) {
			if p.Proc == "total" && len(i.PerProc) < 2 {
				continue
			}
			g, h, hc := "—", "—", "—"
			if p.Goroutines >= 0 {
				g = fmt.Sprintf("%.2f", p.Goroutines)
			}
			if p.HeapInuseKiB >= 0 {
				h = fmt.Sprintf("%.1f", p.HeapInuseKiB)
				hc = fmt.Sprintf("%.1f", p.HeapCommittedKiB)
			}
			rows = append(rows, []string{"`" + i.Config + "`", p.Proc, fmt.Sprint(conns),
				fmt.Sprint(p.BaselineRSSKB), fmt.Sprintf("%.2f", p.RSSKiB), fmt.Sprintf("%.2f", p.FDs), g, h, hc})
		}
	}
	m.table(2, []string{"Path", "Process", "connections", "baseline RSS KiB", "RSS KiB/conn", "fds/conn", "goroutines/conn", "live heap KiB/conn", "committed heap KiB/conn"}, rows)
	if plot {
		m.p("![idle RSS](%s)", PlotIdle)
		m.p("")
	}
	for _, i := range r.Idle {
		for _, h := range i.Heaps {
			if h.Conns <= 0 {
				continue
			}
			m.p("### Live heap of %s holding %d idle connections (`%s`)", h.Proc, h.Conns, i.Config)
			m.p("")
			m.p("%.0f KiB live in all; per connection, by allocation site; raw profile: [%s](%s) (`go tool pprof -sample_index=inuse_space`).", h.Summary.InuseKiB, h.File, h.File)
			m.p("")
			n := min(max(len(h.Summary.Flat), len(h.Summary.Cum)), 8)
			var rows [][]string
			per := func(s SiteShare) string { return fmt.Sprintf("%.2f", s.KiB/float64(h.Conns)) }
			for k := range n {
				row := make([]string, 4)
				if k < len(h.Summary.Flat) {
					row[0], row[1] = "`"+shortFunc(h.Summary.Flat[k].Name)+"`", per(h.Summary.Flat[k])
				}
				if k < len(h.Summary.Cum) {
					row[2], row[3] = "`"+shortFunc(h.Summary.Cum[k].Name)+"`", per(h.Summary.Cum[k])
				}
				rows = append(rows, row)
			}
			m.table(4, []string{"allocated by", "KiB/conn", "under (cumulative)", "KiB/conn"}, rows)
		}
	}
}

func writeProfiles(m *md, r *Run) {
	if len(r.Profiles) == 0 {
		return
	}
	m.p("## CPU profiles of the daemon")
	m.p("")
	m.p("Taken from `/debug/pprof/profile` of each daemon while the path was loaded. Categories: a sample counts for the first of GC, runtime scheduling (scheduler, netpoll, wake-ups), syscalls, crypto, memmove/alloc that appears anywhere in its stack; the rest is proxy code (HBONE framing, relays, policy).")
	m.p("")
	var rows [][]string
	for _, p := range r.Profiles {
		row := []string{"`" + p.Config + "`", p.Metric, p.Proc, fmt.Sprintf("%.2f", p.Summary.Cores())}
		for _, c := range p.Summary.Categories {
			row = append(row, fmt.Sprintf("%.0f%%", 100*c.Share))
		}
		rows = append(rows, row)
	}
	head := []string{"Path", "load", "process", "cores"}
	if len(r.Profiles) > 0 {
		for _, c := range r.Profiles[0].Summary.Categories {
			head = append(head, c.Name)
		}
	}
	m.table(3, head, rows)
	for _, p := range r.Profiles {
		m.p("### `%s`, %s, %s", p.Config, p.Metric, p.Proc)
		m.p("")
		m.p("%.1f s profiled, %.2f cores; raw profile: [%s](%s).", p.Summary.Seconds, p.Summary.Cores(), p.File, p.File)
		m.p("")
		n := max(len(p.Summary.Flat), len(p.Summary.Cum))
		n = min(n, 12)
		var rows [][]string
		for i := range n {
			row := make([]string, 4)
			if i < len(p.Summary.Flat) {
				f := p.Summary.Flat[i]
				row[0], row[1] = "`"+shortFunc(f.Name)+"`", fmt.Sprintf("%.1f%%", 100*f.Share)
			}
			if i < len(p.Summary.Cum) {
				c := p.Summary.Cum[i]
				row[2], row[3] = "`"+shortFunc(c.Name)+"`", fmt.Sprintf("%.1f%%", 100*c.Share)
			}
			rows = append(rows, row)
		}
		m.table(4, []string{"top flat", "flat", "top cumulative", "cum"}, rows)
		if len(p.Summary.Syscalls) > 0 {
			var parts []string
			for _, c := range p.Summary.Syscalls[:min(6, len(p.Summary.Syscalls))] {
				parts = append(parts, fmt.Sprintf("`%s` %.0f%%", shortFunc(c.Name), 100*c.Share))
			}
			m.p("Syscalls by caller: %s.", strings.Join(parts, ", "))
			m.p("")
		}
	}
}

// shortFunc drops the module path of our own functions.
func shortFunc(name string) string {
	return strings.TrimPrefix(name, "github.com/ztunnel-go/ztunnel/")
}
