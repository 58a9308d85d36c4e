package report

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// Files of the mesh-scale report (issue 36), relative to its directory.
const (
	FileScaleReport  = "SCALE.md"
	FileScaleResults = "scale.json"
	PlotScaleMemory  = "scale-memory.png"
	PlotScaleTime    = "scale-time.png"
)

// Scale is one run of the mesh-scale scenario: a dedicated daemon fed a mesh
// of growing size over delta xDS, measured at each size.
type Scale struct {
	Machine Machine `json:"machine"`
	// Quick marks the CI smoke run (small sizes, few probes).
	Quick bool `json:"quick"`
	// ChurnPerSecond is the rate of unrelated Address changes pushed while
	// the change latencies are measured.
	ChurnPerSecond int `json:"churn_per_second"`
	// Baseline is the daemon with only the lab's own workloads: the
	// per-workload figures are the growth above it.
	Baseline ScalePoint   `json:"baseline"`
	Points   []ScalePoint `json:"points"`
	// HeapProfiles are the daemon's heap profiles (gc=1) at each size,
	// summarized; the files sit next to the report.
	HeapProfiles []ScaleHeap `json:"heap_profiles,omitempty"`
}

// ScaleHeap is the daemon's heap profile at one size.
type ScaleHeap struct {
	Workloads int `json:"workloads"`
	// File is the raw profile (gzipped protobuf), relative to the report.
	File    string      `json:"file"`
	Summary HeapSummary `json:"summary"`
}

// ScalePoint is the mesh at one size and what the daemon paid for it.
type ScalePoint struct {
	Workloads int `json:"workloads"`
	Services  int `json:"services"`
	Policies  int `json:"policies"`
	// RSSKiB and HeapInuseKiB are the daemon's resident memory and Go heap
	// in use (after a collection) once synced and quiet: after its memory
	// releaser has handed back what the push freed (Released), or after a
	// bounded wait for it. SyncedRSSKiB is the resident memory right at
	// synced, with the push's garbage.
	RSSKiB       int64 `json:"rss_kib"`
	HeapInuseKiB int64 `json:"heap_inuse_kib"`
	// HeapLiveKiB is the bytes of the heap's objects at that reading: what
	// the mesh keeps. HeapInuseKiB less it is free space inside the spans
	// the live objects hold (the push's garbage was interleaved with them).
	HeapLiveKiB  int64 `json:"heap_live_kib"`
	SyncedRSSKiB int64 `json:"synced_rss_kib"`
	Released     bool  `json:"released"`
	// Sync is from the control plane's first byte (its answer to the
	// daemon's first request) to the daemon's last ACK of the initial push.
	Sync time.Duration `json:"sync_ns"`
	// CPU is the daemon's CPU (user + system) from its start to synced.
	CPU time.Duration `json:"cpu_ns"`
	// Setup is the connection set-up latency through a service VIP
	// (connect and a 1-byte round trip through both daemons).
	Setup Percentiles `json:"setup"`
	// AddressChange and AuthzChange are from pushing one change to the
	// first connection that shows it (the client daemon routing around an
	// endpoint that became unhealthy, or back; the server daemon denying a
	// connection under a new policy, or allowing it again), under churn.
	AddressChange Percentiles `json:"address_change"`
	AuthzChange   Percentiles `json:"authz_change"`
}

// Percentiles summarize latency samples.
type Percentiles struct {
	N   int           `json:"n"`
	P50 time.Duration `json:"p50_ns"`
	P99 time.Duration `json:"p99_ns"`
	Max time.Duration `json:"max_ns"`
}

// PercentilesOf summarizes samples (nearest rank).
func PercentilesOf(samples []time.Duration) Percentiles {
	if len(samples) == 0 {
		return Percentiles{}
	}
	v := make([]float64, len(samples))
	for i, s := range samples {
		v[i] = float64(s)
	}
	slices.Sort(v)
	rank := func(p float64) time.Duration {
		i := int(math.Ceil(p*float64(len(v)))) - 1
		return time.Duration(v[max(0, min(i, len(v)-1))])
	}
	return Percentiles{N: len(v), P50: rank(0.50), P99: rank(0.99), Max: time.Duration(v[len(v)-1])}
}

// PerWorkload is what one workload (with its share of services and
// policies) adds to the daemon above the baseline, in bytes: RSS and Go
// heap.
func (s *Scale) PerWorkload(p ScalePoint) (rss, heap float64) {
	if p.Workloads == 0 {
		return math.NaN(), math.NaN()
	}
	n := float64(p.Workloads)
	return float64(p.RSSKiB-s.Baseline.RSSKiB) * 1024 / n, float64(p.HeapInuseKiB-s.Baseline.HeapInuseKiB) * 1024 / n
}

// LivePerWorkload is the growth of the heap's live bytes per workload
// above the baseline (NaN when not measured).
func (s *Scale) LivePerWorkload(p ScalePoint) float64 {
	if p.Workloads == 0 || p.HeapLiveKiB == 0 {
		return math.NaN()
	}
	return float64(p.HeapLiveKiB-s.Baseline.HeapLiveKiB) * 1024 / float64(p.Workloads)
}

// writeScenario writes a scenario's results as JSON (results), its plots
// and its markdown report (report, which names the plots) into dir: the
// one shape of WriteScale, WriteNode and WriteLoad.
func writeScenario(dir string, v any, results, report string, plots func() ([]string, error), md func([]string) []byte) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	js, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("report: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, results), append(js, '\n'), 0o644); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	names, err := plots()
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, report), md(names), 0o644); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	return nil
}

// WriteScale writes SCALE.md, scale.json and the plots into dir.
func WriteScale(dir string, s *Scale) error {
	return writeScenario(dir, s, FileScaleResults, FileScaleReport,
		func() ([]string, error) { return writeScalePlots(dir, s) },
		func(p []string) []byte { return ScaleMarkdown(s, p) })
}

func ms(d time.Duration) string {
	if d == 0 {
		return "—"
	}
	return num(float64(d) / 1e6)
}

func pcts(p Percentiles) string {
	if p.N == 0 {
		return "—"
	}
	return fmt.Sprintf("%s / %s (n=%d)", ms(p.P50), ms(p.P99), p.N)
}

// ScaleMarkdown renders the mesh-scale section.
func ScaleMarkdown(s *Scale, plots []string) []byte {
	var m md
	m.p("# Mesh at scale (issue 36)")
	m.p("")
	mc := s.Machine
	m.p("Machine: %s, %s, %d cores, %s MiB, kernel %s, %s; load %.2f → %.2f.", mc.Host, mc.CPUModel, mc.Cores,
		commas(mc.MemTotalKiB/1024), mc.Kernel, mc.GoVersion, mc.LoadStart[0], mc.LoadEnd[0])
	if s.Quick {
		m.p("")
		m.p("Quick run (CI smoke): small sizes and few probes; the figures only show the scenario still runs.")
	}
	m.p("")
	m.p("A dedicated daemon (the client's; the server's daemon holds the same mesh) is fed the whole mesh over delta xDS "+
		"from xdstest's server. Per-workload figures are the growth above the baseline daemon (lab workloads only: "+
		"RSS %s KiB, heap %s KiB), with each size's services and policies included, read once the daemon is quiet (its "+
		"memory releaser has returned what the push freed). Change latencies are measured while "+
		"%d unrelated Address changes a second are pushed; each sample is from the push to the end of the first "+
		"connection that shows the change (an upper bound, within one connection set-up). The heap is the Go heap in use "+
		"(whole spans); the live heap the bytes of its objects: the gap is free space in spans that live objects hold.",
		commas(s.Baseline.RSSKiB), commas(s.Baseline.HeapInuseKiB), s.ChurnPerSecond)
	m.p("")
	rows := [][]string{}
	for _, p := range s.Points {
		rss, heap := s.PerWorkload(p)
		quiet := num(float64(p.RSSKiB) / 1024)
		if !p.Released && !s.Quick {
			quiet += " (nothing released)"
		}
		rows = append(rows, []string{
			commas(int64(p.Workloads)), commas(int64(p.Services)), commas(int64(p.Policies)),
			num(float64(p.SyncedRSSKiB) / 1024), quiet, num(rss), num(heap), num(s.LivePerWorkload(p)),
			ms(p.Sync), ms(p.CPU),
			pcts(p.Setup), pcts(p.AddressChange), pcts(p.AuthzChange),
		})
	}
	m.table(0, []string{"workloads", "services", "policies", "RSS at synced MiB", "RSS quiet MiB", "RSS B/workload", "heap B/workload", "live heap B/workload",
		"first byte → synced ms", "CPU to synced ms", "VIP set-up p50/p99 ms", "Address change p50/p99 ms",
		"Authorization change p50/p99 ms"}, rows)
	if len(s.Points) > 1 {
		first, last := s.Points[0], s.Points[len(s.Points)-1]
		if first.Setup.N > 0 && last.Setup.N > 0 {
			m.p("VIP set-up p50 at %s workloads against %s: %.2f×.", commas(int64(last.Workloads)),
				commas(int64(first.Workloads)), float64(last.Setup.P50)/float64(first.Setup.P50))
			m.p("")
		}
	}
	for _, f := range plots {
		m.p("![%s](%s)", f, f)
		m.p("")
	}
	for _, h := range s.HeapProfiles {
		m.p("Heap profile at %s workloads (`%s`, %s KiB live), top sites by live bytes:", commas(int64(h.Workloads)),
			h.File, num(h.Summary.InuseKiB))
		m.p("")
		var rows [][]string
		for _, f := range h.Summary.Flat {
			rows = append(rows, []string{"`" + shortFunc(f.Name) + "`", num(f.KiB), fmt.Sprintf("%.1f%%", 100*f.Share)})
		}
		m.table(1, []string{"allocated in", "KiB", "share"}, rows)
	}
	return m.Bytes()
}

func writeScalePlots(dir string, s *Scale) ([]string, error) {
	if len(s.Points) == 0 {
		return nil, nil
	}
	var files []string
	mem := plot.New()
	mem.Title.Text = "Daemon memory per workload (services and policies included)"
	mem.X.Label.Text = "workloads"
	mem.X.Scale = plot.LogScale{}
	mem.X.Tick.Marker = plot.LogTicks{Prec: -1}
	mem.Y.Label.Text = "bytes per workload above baseline"
	var rss, heap plotter.XYs
	for _, p := range s.Points {
		r, h := s.PerWorkload(p)
		rss = append(rss, plotter.XY{X: float64(p.Workloads), Y: r})
		heap = append(heap, plotter.XY{X: float64(p.Workloads), Y: h})
	}
	if err := addLine(mem, rss, 0, "RSS"); err != nil {
		return nil, err
	}
	if err := addLine(mem, heap, 1, "Go heap in use"); err != nil {
		return nil, err
	}
	// Issue 36's goal: at most 1 KiB of RSS per workload at 100,000.
	goal := plotter.NewFunction(func(float64) float64 { return 1024 })
	goal.Dashes = []vg.Length{vg.Points(4), vg.Points(4)}
	mem.Add(goal)
	mem.Legend.Add("goal (RSS, 100k)", goal)
	mem.Y.Min = 0
	mem.Add(plotter.NewGrid())
	if err := mem.Save(8*vg.Inch, 5*vg.Inch, filepath.Join(dir, PlotScaleMemory)); err != nil {
		return nil, fmt.Errorf("report: %s: %w", PlotScaleMemory, err)
	}
	files = append(files, PlotScaleMemory)

	tp := plot.New()
	tp.Title.Text = "Initial push and changes against mesh size"
	tp.X.Label.Text = "workloads"
	tp.X.Scale = plot.LogScale{}
	tp.X.Tick.Marker = plot.LogTicks{Prec: -1}
	tp.Y.Label.Text = "ms"
	err := addDurationLines(tp, s.Points, func(p ScalePoint) float64 { return float64(p.Workloads) }, []durationSeries[ScalePoint]{
		{"first byte → synced", func(p ScalePoint) time.Duration { return p.Sync }},
		{"CPU to synced", func(p ScalePoint) time.Duration { return p.CPU }},
		{"Address change p99", func(p ScalePoint) time.Duration { return p.AddressChange.P99 }},
		{"Authorization change p99", func(p ScalePoint) time.Duration { return p.AuthzChange.P99 }},
		{"VIP set-up p99", func(p ScalePoint) time.Duration { return p.Setup.P99 }},
	})
	if err != nil {
		return nil, err
	}
	tp.Y.Min = 0
	if err := saveLines(tp, dir, PlotScaleTime, true); err != nil {
		return nil, err
	}
	return append(files, PlotScaleTime), nil
}
