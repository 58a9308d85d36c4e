package report

import (
	"fmt"
	"math"
	"path/filepath"
	"strconv"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// Plot files written by Write, relative to the report directory.
const (
	PlotThroughput = "throughput.png"
	PlotLatency    = "latency.png"
	PlotCPS        = "cps.png"
	PlotIdle       = "idle-rss.png"
)

// colorIndex gives every config the same color on every plot.
func colorIndex(r *Run, id string) int {
	for i, c := range r.Configs {
		if c.ID == id {
			return i
		}
	}
	return len(r.Configs)
}

// numberTicks labels an axis at round steps (1, 2 or 5 times a power of
// ten), five to ten of them between lo and hi, so every plot can be read off its axes
// (gonum's default labels only two or three).
type numberTicks struct{}

// Ticks returns the major ticks, labelled, between lo and hi.
func (numberTicks) Ticks(lo, hi float64) []plot.Tick {
	if !(hi > lo) {
		return plot.DefaultTicks{}.Ticks(lo, hi)
	}
	raw := (hi - lo) / 6
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag
	for _, f := range []float64{1, 2, 5, 10} {
		if f*mag >= raw {
			step = f * mag
			break
		}
	}
	prec := max(0, -int(math.Floor(math.Log10(step))))
	var ticks []plot.Tick
	for v := math.Ceil(lo/step) * step; v <= hi+step/1e6; v += step {
		ticks = append(ticks, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'f', prec, 64)})
	}
	return ticks
}

// headlineConfigs are the configs the line plots draw, a handful: the
// direct path (with direct), and per path the shipped daemon and the
// HAProxy peer of "Where we stand" (the Go baselines are in its table and
// the bar charts).
func headlineConfigs(r *Run, direct bool) map[string]bool {
	keep := map[string]bool{}
	for _, c := range r.Configs {
		if c.Direct && direct {
			keep[c.ID] = true
		}
	}
	for _, g := range []string{GroupTCP, GroupHBONE1, GroupHBONE2} {
		if c, ok := shippedDaemon(r, g); ok {
			keep[c.ID] = true
		}
		if c, ok := peerConfig(r, g, standingPeers[g].haproxy); ok {
			keep[c.ID] = true
		}
	}
	return keep
}

// label is a config's name on a plot axis.
func label(c Config) string {
	if c.Direct {
		return "direct"
	}
	return c.Group + ": " + c.Proxy
}

// writePlots draws every plot the run has data for and returns the files
// written.
func writePlots(dir string, r *Run, st *Stats) ([]string, error) {
	var files []string
	type plotFn func() (*plot.Plot, vg.Length, vg.Length, error)
	for _, p := range []struct {
		file string
		fn   plotFn
	}{
		{PlotThroughput, func() (*plot.Plot, vg.Length, vg.Length, error) { return throughputPlot(r, st) }},
		{PlotLatency, func() (*plot.Plot, vg.Length, vg.Length, error) { return latencyPlot(r, st) }},
		{PlotCPS, func() (*plot.Plot, vg.Length, vg.Length, error) { return cpsPlot(r, st) }},
		{PlotIdle, func() (*plot.Plot, vg.Length, vg.Length, error) { return idlePlot(r) }},
	} {
		pl, w, h, err := p.fn()
		if err != nil {
			return files, fmt.Errorf("report: %s: %w", p.file, err)
		}
		if pl == nil {
			continue
		}
		if err := pl.Save(w, h, filepath.Join(dir, p.file)); err != nil {
			return files, fmt.Errorf("report: %s: %w", p.file, err)
		}
		files = append(files, p.file)
	}
	return files, nil
}

// horizontalBars draws one horizontal bar per config for each series.
func horizontalBars(title, xlabel string, configs []Config, series []string, value func(c Config, series int) float64) (*plot.Plot, vg.Length, vg.Length, error) {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = xlabel
	n := len(configs)
	// Top to bottom in report order: the Y axis grows upwards.
	names := make([]string, n)
	for i, c := range configs {
		names[n-1-i] = label(c)
	}
	barW := vg.Points(14)
	any := false
	for s, name := range series {
		vals := make(plotter.Values, n)
		for i, c := range configs {
			v := value(c, s)
			vals[n-1-i] = v
			any = any || v > 0
		}
		bc, err := plotter.NewBarChart(vals, barW)
		if err != nil {
			return nil, 0, 0, err
		}
		bc.Horizontal = true
		bc.Color = plotutil.Color(s)
		bc.LineStyle.Width = 0
		bc.Offset = barW * vg.Length(float64(s)-float64(len(series)-1)/2)
		p.Add(bc)
		if len(series) > 1 {
			p.Legend.Add(name, bc)
		}
	}
	if !any {
		return nil, 0, 0, nil
	}
	// Bottom right: the slowest paths are listed last, so that corner is
	// free.
	p.Legend.Top = false
	p.X.Max *= 1.05
	p.X.Tick.Marker = numberTicks{}
	p.NominalY(names...)
	p.Add(plotter.NewGrid())
	h := vg.Points(float64(60 + n*int(len(series))*16 + n*6))
	return p, 9 * vg.Inch, h, nil
}

func throughputPlot(r *Run, st *Stats) (*plot.Plot, vg.Length, vg.Length, error) {
	series := []string{"1 stream", fmt.Sprintf("%d streams", r.Settings.Streams)}
	return horizontalBars("Throughput (median of rounds)", "Gbit/s", r.Configs, series, func(c Config, s int) float64 {
		m := MetricTput1
		if s == 1 {
			m = MetricTputN
		}
		return st.Get(c.ID, m, FieldGbps).Median
	})
}

func cpsPlot(r *Run, st *Stats) (*plot.Plot, vg.Length, vg.Length, error) {
	return horizontalBars("New connections per second (median of rounds)", "connections/s", r.Configs, []string{"cps"}, func(c Config, _ int) float64 {
		return st.Get(c.ID, MetricCPS, FieldPerSecond).Median
	})
}

func latencyPlot(r *Run, st *Stats) (*plot.Plot, vg.Length, vg.Length, error) {
	if len(r.Settings.RRSizes) == 0 {
		return nil, 0, 0, nil
	}
	size := r.Settings.RRSizes[0]
	metric := RRMetric(size)
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Request/response latency, %d B / %d B, closed loop (median of rounds; the shipped daemon and HAProxy)", size.Req, size.Resp)
	p.Y.Label.Text = "µs (log scale)"
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	pcts := []struct {
		name  string
		field func(Sample) float64
	}{{"p50", FieldP50}, {"p90", FieldP90}, {"p99", FieldP99}, {"p99.9", FieldP999}, {"max", FieldMax}}
	names := make([]string, len(pcts))
	for i, pc := range pcts {
		names[i] = pc.name
	}
	any := false
	maxY := 0.0
	keep := headlineConfigs(r, true)
	for i, c := range r.Configs {
		if !keep[c.ID] {
			continue
		}
		pts := plotter.XYs{}
		for x, pc := range pcts {
			v := st.Get(c.ID, metric, pc.field).Median
			if v > 0 {
				pts = append(pts, plotter.XY{X: float64(x), Y: v})
				maxY = max(maxY, v)
			}
		}
		if len(pts) == 0 {
			continue
		}
		any = true
		if err := addLine(p, pts, i, label(c)); err != nil {
			return nil, 0, 0, err
		}
	}
	if !any {
		return nil, 0, 0, nil
	}
	p.NominalX(names...)
	p.Legend.Top = true
	p.Legend.Left = true
	// Headroom above the lines for the legend (log scale).
	p.Y.Max = maxY * 40
	p.Add(plotter.NewGrid())
	return p, 9 * vg.Inch, 7 * vg.Inch, nil
}

// addLine draws pts as the line of the i-th config (its colour, dashes and
// point shape, the same in every plot) and adds it to the legend.
func addLine(p *plot.Plot, pts plotter.XYs, i int, name string) error {
	l, s, err := plotter.NewLinePoints(pts)
	if err != nil {
		return err
	}
	l.Color = plotutil.Color(i)
	l.Dashes = plotutil.Dashes(i / 7)
	s.Color = plotutil.Color(i)
	s.Shape = plotutil.Shape(i)
	p.Add(l, s)
	p.Legend.Add(name, l, s)
	return nil
}

func idlePlot(r *Run) (*plot.Plot, vg.Length, vg.Length, error) {
	if len(r.Idle) == 0 {
		return nil, 0, 0, nil
	}
	p := plot.New()
	p.Title.Text = "Proxy RSS growth with idle connections (all proxy processes of a path; the shipped daemon and HAProxy)"
	p.X.Label.Text = "idle connections"
	p.Y.Label.Text = "RSS above baseline, MiB"
	byID := map[string]Config{}
	for _, c := range r.Configs {
		byID[c.ID] = c
	}
	maxY := 0.0
	keep := headlineConfigs(r, false)
	for _, id := range r.Idle {
		if len(id.Points) == 0 || !keep[id.Config] {
			continue
		}
		i := colorIndex(r, id.Config)
		base := id.Points[0].RSSKiB
		pts := make(plotter.XYs, len(id.Points))
		for j, pt := range id.Points {
			pts[j] = plotter.XY{X: float64(pt.Conns), Y: float64(pt.RSSKiB-base) / 1024}
			maxY = max(maxY, pts[j].Y)
		}
		if err := addLine(p, pts, i, label(byID[id.Config])); err != nil {
			return nil, 0, 0, err
		}
	}
	p.Legend.Top = true
	p.Legend.Left = true
	// Headroom above the lines for the legend.
	p.Y.Max = maxY / 0.55
	p.X.Tick.Marker = numberTicks{}
	p.Y.Tick.Marker = numberTicks{}
	p.Add(plotter.NewGrid())
	return p, 9 * vg.Inch, 7 * vg.Inch, nil
}

// durationSeries is one line of a plot against size: its name and the
// duration it reads off a point.
type durationSeries[P any] struct {
	name string
	v    func(P) time.Duration
}

// addDurationLines adds one line per series to p: each point's duration in
// milliseconds against x(point).
func addDurationLines[P any](p *plot.Plot, points []P, x func(P) float64, series []durationSeries[P]) error {
	for i, se := range series {
		var pts plotter.XYs
		for _, pt := range points {
			pts = append(pts, plotter.XY{X: x(pt), Y: float64(se.v(pt)) / 1e6})
		}
		if err := addLine(p, pts, i, se.name); err != nil {
			return err
		}
	}
	return nil
}

// saveLines finishes a line plot of the scenario reports (the legend at the
// top, left if asked, a grid) and saves it as file in dir, 8x5 inches.
func saveLines(p *plot.Plot, dir, file string, left bool) error {
	p.Legend.Top = true
	p.Legend.Left = left
	p.Add(plotter.NewGrid())
	if err := p.Save(8*vg.Inch, 5*vg.Inch, filepath.Join(dir, file)); err != nil {
		return fmt.Errorf("report: %s: %w", file, err)
	}
	return nil
}
