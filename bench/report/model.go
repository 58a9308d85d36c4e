// Package report turns the measurements of a benchmark run into
// bench/results/<date>-<host>/: REPORT.md (tables of medians with every
// figure as a ratio to direct, the goals of the engine and HBONE issues,
// CPU profile summaries), results.json (everything measured, every round)
// and PNG plots drawn with gonum.org/v1/plot; and, for the mesh-scale run
// (issue 36, e2e.TestMeshScale), SCALE.md, scale.json and its plots of cost
// against mesh size (WriteScale); for the node-scale run (e2e.TestNodeScale),
// NODE.md, node.json and its plots of cost against pod count (WriteNode).
//
// It knows nothing of labs or processes: the harness fills a Run and calls
// Write. Imports (of ours): bench/load (for the result types). Imported by:
// bench/cmd/zbench, bench/harness and tests (which write reports from
// synthetic runs).
package report

import (
	"fmt"
	"sort"
	"time"

	"github.com/ztunnel-go/ztunnel/bench/load"
)

// Groups of configurations, in report order.
const (
	// GroupTCP is one plain TCP proxy hop between two pods.
	GroupTCP = "tcp"
	// GroupHBONE1 is one HBONE hop: an mTLS client straight to the proxy,
	// which forwards plain TCP to the app.
	GroupHBONE1 = "hbone1"
	// GroupHBONE2 is two hops: pod → proxy → (mTLS tunnel) → proxy → pod.
	GroupHBONE2 = "hbone2"
)

// GroupTitle names a group in the report.
func GroupTitle(g string) string {
	switch g {
	case GroupTCP:
		return "TCP, one proxy hop (client pod → proxy → server pod)"
	case GroupHBONE1:
		return "HBONE one hop (mTLS client → proxy → app)"
	case GroupHBONE2:
		return "Two hops (pod → proxy → tunnel → proxy → pod)"
	}
	return g
}

// Metric names. RR metrics are named by RRMetric.
const (
	// MetricTput1 is throughput over one stream.
	MetricTput1 = "tput1"
	// MetricTputN is throughput over Settings.Streams streams.
	MetricTputN = "tputN"
	// MetricCPS is the connection rate.
	MetricCPS = "cps"
	// MetricFixedRate is request/response open loop at Settings.FixedRate:
	// what it measures is the proxies' CPU at a load every path can carry.
	MetricFixedRate = "fixed"
)

// RRMetric names the request/response metric for the given sizes.
func RRMetric(s RRSize) string { return fmt.Sprintf("rr-%dx%d", s.Req, s.Resp) }

// RRSize is a request/response size pair in bytes.
type RRSize struct {
	Req  int `json:"req"`
	Resp int `json:"resp"`
}

// Run is everything one benchmark run measured.
type Run struct {
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished"`
	Quick    bool      `json:"quick"`
	Machine  Machine   `json:"machine"`
	Settings Settings  `json:"settings"`
	// Configs are the scenario × proxy combinations, in report order. The
	// one with Direct set is the baseline of every ratio.
	Configs  []Config  `json:"configs"`
	Samples  []Sample  `json:"samples"`
	Idle     []Idle    `json:"idle"`
	Profiles []Profile `json:"profiles"`
	// Skipped lists configurations (or whole peers) that did not run, and why.
	Skipped []Skip `json:"skipped,omitempty"`
	// Failures lists measurements that failed; the run went on without them.
	Failures []string `json:"failures,omitempty"`
}

// Machine describes where the run happened.
type Machine struct {
	Host        string `json:"host"`
	CPUModel    string `json:"cpu_model"`
	Cores       int    `json:"cores"`
	MemTotalKiB int64  `json:"mem_total_kib"`
	Kernel      string `json:"kernel"`
	GoVersion   string `json:"go_version"`
	HAProxy     string `json:"haproxy,omitempty"`
	Commit      string `json:"commit,omitempty"`
	// LoadStart and LoadEnd are /proc/loadavg's 1, 5 and 15 minute load
	// averages when the run started and ended: other work on the machine
	// makes the figures noisier.
	LoadStart [3]float64 `json:"load_start"`
	LoadEnd   [3]float64 `json:"load_end"`
}

// Settings are the run's parameters.
type Settings struct {
	Rounds         int           `json:"rounds"`
	Duration       time.Duration `json:"duration_ns"`
	Streams        int           `json:"streams"`
	RRSizes        []RRSize      `json:"rr_sizes"`
	CPSConcurrency int           `json:"cps_concurrency"`
	IdleConns      int           `json:"idle_conns"`
	IdleSteps      int           `json:"idle_steps"`
	// IdleSettle is how long after the idle ramp's last step its final
	// reading was taken; zero in runs that predate it (300 ms then).
	IdleSettle     time.Duration `json:"idle_settle_ns,omitempty"`
	ProfileSeconds int           `json:"profile_seconds"`
	Backends       []string      `json:"backends"`
	DaemonLogLevel string        `json:"daemon_log_level"`
	// FixedRate is the load of MetricFixedRate; zero when not measured.
	FixedRate FixedRate `json:"fixed_rate,omitzero"`
}

// FixedRate is an open-loop request/response load (zload rr --open-rate):
// Rate requests per second in total, of Size bytes each way, over Conns
// connections.
type FixedRate struct {
	Rate  int `json:"rate"`
	Conns int `json:"conns"`
	Size  int `json:"size"`
}

// Config is one scenario run through one proxy.
type Config struct {
	// ID is unique: "<group>/<proxy>".
	ID    string `json:"id"`
	Group string `json:"group"`
	// Proxy names what carries the traffic ("direct", "ztunnel-go (std)",
	// "HAProxy splice", ...).
	Proxy string `json:"proxy"`
	// Backend is the daemon's engine backend; empty for peers.
	Backend string `json:"backend,omitempty"`
	// Daemon marks our daemon (profiled, checked against the goals).
	Daemon bool `json:"daemon,omitempty"`
	// Direct marks the no-proxy baseline.
	Direct bool `json:"direct,omitempty"`
	// Procs names the measured processes.
	Procs []string `json:"procs,omitempty"`
	// Note explains the path in one line.
	Note string `json:"note,omitempty"`
}

// Sample is one measurement of one metric of one config in one round.
type Sample struct {
	Config string `json:"config"`
	Metric string `json:"metric"`
	Round  int    `json:"round"`
	// Gbps is set for throughput metrics.
	Gbps float64 `json:"gbps,omitempty"`
	// PerSecond is transactions (rr) or connections (cps) per second.
	PerSecond float64 `json:"per_second,omitempty"`
	// Latency is set for rr and cps.
	Latency *load.Latency `json:"latency,omitempty"`
	// Cores is the CPU of the proxy processes during the measurement.
	Cores float64 `json:"cores"`
	// Errors counts failed transactions (cps).
	Errors int64 `json:"errors,omitempty"`
	// Seconds is the measured window.
	Seconds float64 `json:"seconds"`
	// AckWait is, for throughput, how long the path took to drain after
	// the client stopped writing (a stall shows here).
	AckWait float64 `json:"ack_wait_seconds,omitempty"`
}

// Idle is the idle-connection cost of one config.
type Idle struct {
	Config string `json:"config"`
	// Heaps are the daemons' heap profiles taken while the connections were
	// held.
	Heaps []HeapProfile `json:"heaps,omitempty"`
	// Points are the samples from 0 connections up, RSS and fds summed over
	// the config's processes.
	Points []IdlePoint `json:"points"`
	// PerProc is the per-connection cost in each process.
	PerProc []IdleProc `json:"per_proc"`
}

// IdlePoint is one sample of an idle ramp.
type IdlePoint struct {
	Conns  int   `json:"conns"`
	RSSKiB int64 `json:"rss_kib"`
	FDs    int   `json:"fds"`
}

// IdleProc is one process's cost per idle connection. Goroutines and heap
// are negative when the process has no pprof endpoint. The heap figures are
// taken after a GC: HeapInuse (live spans) and committed heap (HeapSys
// minus HeapReleased).
type IdleProc struct {
	Proc             string  `json:"proc"`
	RSSKiB           float64 `json:"rss_kib"`
	FDs              float64 `json:"fds"`
	Goroutines       float64 `json:"goroutines"`
	HeapInuseKiB     float64 `json:"heap_inuse_kib"`
	HeapCommittedKiB float64 `json:"heap_committed_kib"`
	BaselineRSSKB    int64   `json:"baseline_rss_kib"`
}

// PerConn sums the per-connection cost over the config's processes.
func (i Idle) PerConn() IdleProc {
	var s IdleProc
	s.Proc = "total"
	goroutines, heap := true, true
	for _, p := range i.PerProc {
		s.RSSKiB += p.RSSKiB
		s.FDs += p.FDs
		s.BaselineRSSKB += p.BaselineRSSKB
		if p.Goroutines < 0 {
			goroutines = false
		}
		if p.HeapInuseKiB < 0 {
			heap = false
		}
		s.Goroutines += p.Goroutines
		s.HeapInuseKiB += p.HeapInuseKiB
		s.HeapCommittedKiB += p.HeapCommittedKiB
	}
	if !goroutines || len(i.PerProc) == 0 {
		s.Goroutines = -1
	}
	if !heap || len(i.PerProc) == 0 {
		s.HeapInuseKiB, s.HeapCommittedKiB = -1, -1
	}
	return s
}

// MaxPerProc returns the costliest process's figures (for "per daemon"
// goals).
func (i Idle) MaxPerProc() IdleProc {
	var m IdleProc
	for n, p := range i.PerProc {
		if n == 0 || p.RSSKiB > m.RSSKiB {
			m = p
		}
	}
	return m
}

// HeapProfile is one heap profile taken from a daemon holding idle
// connections.
type HeapProfile struct {
	Proc  string `json:"proc"`
	Conns int    `json:"conns"`
	// File is the raw profile (gzipped protobuf), relative to the report.
	File    string      `json:"file"`
	Summary HeapSummary `json:"summary"`
}

// Profile is one CPU profile taken from a daemon under load.
type Profile struct {
	Config string `json:"config"`
	Metric string `json:"metric"`
	Proc   string `json:"proc"`
	// File is the raw profile (gzipped protobuf), relative to the report.
	File    string         `json:"file"`
	Summary ProfileSummary `json:"summary"`
}

// Skip records something that did not run.
type Skip struct {
	What   string `json:"what"`
	Reason string `json:"reason"`
}

// Stat is the median of a metric over rounds, with its spread.
type Stat struct {
	N              int
	Median, Lo, Hi float64
}

// Stats aggregates a run's samples.
type Stats struct {
	run *Run
	by  map[[2]string][]Sample
}

// NewStats indexes a run's samples by config and metric.
func NewStats(r *Run) *Stats {
	s := &Stats{run: r, by: map[[2]string][]Sample{}}
	for _, x := range r.Samples {
		k := [2]string{x.Config, x.Metric}
		s.by[k] = append(s.by[k], x)
	}
	return s
}

// Get returns the median over rounds of field(sample).
func (s *Stats) Get(config, metric string, field func(Sample) float64) Stat {
	var v []float64
	for _, x := range s.by[[2]string{config, metric}] {
		v = append(v, field(x))
	}
	return statOf(v)
}

// Direct returns the ID of the baseline config, or "".
func (s *Stats) Direct() string {
	for _, c := range s.run.Configs {
		if c.Direct {
			return c.ID
		}
	}
	return ""
}

func statOf(v []float64) Stat {
	if len(v) == 0 {
		return Stat{}
	}
	v = append([]float64(nil), v...)
	sort.Float64s(v)
	m := v[len(v)/2]
	if len(v)%2 == 0 {
		m = (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	return Stat{N: len(v), Median: m, Lo: v[0], Hi: v[len(v)-1]}
}

// Field selectors for Stats.Get.
var (
	FieldGbps      = func(s Sample) float64 { return s.Gbps }
	FieldPerSecond = func(s Sample) float64 { return s.PerSecond }
	FieldCores     = func(s Sample) float64 { return s.Cores }
	FieldP50       = func(s Sample) float64 { return latency(s).P50 }
	FieldP90       = func(s Sample) float64 { return latency(s).P90 }
	FieldP99       = func(s Sample) float64 { return latency(s).P99 }
	FieldP999      = func(s Sample) float64 { return latency(s).P999 }
	FieldMax       = func(s Sample) float64 { return latency(s).Max }
	// FieldCoresPerGbps is the proxy CPU per Gbit/s of a throughput sample.
	FieldCoresPerGbps = func(s Sample) float64 {
		if s.Gbps <= 0 {
			return 0
		}
		return s.Cores / s.Gbps
	}
)

func latency(s Sample) load.Latency {
	if s.Latency == nil {
		return load.Latency{}
	}
	return *s.Latency
}
