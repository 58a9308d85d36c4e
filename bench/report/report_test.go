package report_test

import (
	"bytes"
	"encoding/json"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"
	"go.uber.org/goleak"

	"github.com/ztunnel-go/ztunnel/bench/load"
	"github.com/ztunnel-go/ztunnel/bench/report"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// synthetic is a run whose every figure is chosen so that its ratios and
// goals are known.
func synthetic() *report.Run {
	r := &report.Run{
		Started:  time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
		Finished: time.Date(2026, 1, 2, 3, 14, 5, 0, time.UTC),
		Machine:  report.Machine{Host: "testhost", CPUModel: "Test CPU", Cores: 2, Kernel: "6.1", GoVersion: "go1.26"},
		Settings: report.Settings{Rounds: 3, Duration: 2 * time.Second, Streams: 8,
			RRSizes: []report.RRSize{{Req: 1, Resp: 1}, {Req: 1024, Resp: 16384}}, CPSConcurrency: 4,
			IdleConns: 2000, IdleSteps: 4, IdleSettle: 30 * time.Second, ProfileSeconds: 3, Backends: []string{"std"}, DaemonLogLevel: "warn"},
		Skipped: []report.Skip{{What: "HAProxy TCP, no splice", Reason: "not installed"}},
	}
	d := report.DaemonKey("std")
	type fig struct {
		id             string
		group          string
		daemon, direct bool
		gbps, cores    float64
		p50, p99, cps  float64
	}
	figs := []fig{
		{id: report.DirectID, group: report.GroupTCP, direct: true, gbps: 20, p50: 100, p99: 200, cps: 10000},
		{id: report.ConfigID(report.GroupTCP, d), group: report.GroupTCP, daemon: true, gbps: 10, cores: 1, p50: 150, p99: 300, cps: 5000},
		{id: report.ConfigID(report.GroupTCP, report.KeyCopy), group: report.GroupTCP, gbps: 16, cores: 0.8, p50: 200, p99: 400, cps: 4000},
		{id: report.ConfigID(report.GroupTCP, report.KeyHAProxySplice), group: report.GroupTCP, gbps: 10, cores: 0.8, p50: 200, p99: 600, cps: 5000},
		{id: report.ConfigID(report.GroupHBONE1, d), group: report.GroupHBONE1, daemon: true, gbps: 5, cores: 1, p50: 150, p99: 300, cps: 3000},
		{id: report.ConfigID(report.GroupHBONE1, report.KeyTLS), group: report.GroupHBONE1, gbps: 5, cores: 1, p50: 150, p99: 300, cps: 1000},
		{id: report.ConfigID(report.GroupHBONE2, d), group: report.GroupHBONE2, daemon: true, gbps: 2, cores: 1.5, p50: 300, p99: 600, cps: 2000},
		{id: report.ConfigID(report.GroupHBONE2, report.KeyH2), group: report.GroupHBONE2, gbps: 2, cores: 1.5, p50: 600, p99: 1200, cps: 2000},
		{id: report.ConfigID(report.GroupHBONE2, report.KeyCopyPair), group: report.GroupHBONE2, gbps: 10, cores: 1, p50: 200, p99: 400, cps: 3000},
		{id: report.ConfigID(report.GroupHBONE1, report.KeyHAProxyTLS), group: report.GroupHBONE1, gbps: 4, cores: 0.5, p50: 100, p99: 300, cps: 1500},
		{id: report.ConfigID(report.GroupHBONE2, report.KeyHAProxyPair), group: report.GroupHBONE2, gbps: 1, cores: 1, p50: 250, p99: 900, cps: 500},
		{id: report.ConfigID(report.GroupHBONE2, report.KeyHAProxyPairCaptured), group: report.GroupHBONE2, gbps: 0.8, cores: 1, p50: 400, p99: 900, cps: 400},
		{id: report.ConfigID(report.GroupHBONE1, report.KeyHAProxyTLSCaptured), group: report.GroupHBONE1, gbps: 2.5, cores: 0.5, p50: 120, p99: 300, cps: 1500},
	}
	for _, f := range figs {
		r.Configs = append(r.Configs, report.Config{ID: f.id, Group: f.group, Proxy: f.id, Daemon: f.daemon, Direct: f.direct, Backend: map[bool]string{true: "std"}[f.daemon]})
		for round := 1; round <= 3; round++ {
			// Rounds spread around the figure; the median is the figure.
			k := []float64{0.9, 1, 1.2}[round-1]
			lat := &load.Latency{P50: f.p50 * k, P90: f.p50 * 1.5 * k, P99: f.p99 * k, P999: f.p99 * 2 * k, Max: f.p99 * 5 * k}
			r.Samples = append(r.Samples,
				report.Sample{Config: f.id, Metric: report.MetricTput1, Round: round, Gbps: f.gbps * k, Cores: f.cores * k},
				report.Sample{Config: f.id, Metric: report.MetricTputN, Round: round, Gbps: 1.5 * f.gbps * k, Cores: f.cores * k},
				report.Sample{Config: f.id, Metric: report.RRMetric(r.Settings.RRSizes[0]), Round: round, PerSecond: 1e6 / f.p50, Latency: lat},
				report.Sample{Config: f.id, Metric: report.RRMetric(r.Settings.RRSizes[1]), Round: round, PerSecond: 1e6 / f.p50 / 2, Latency: lat},
				report.Sample{Config: f.id, Metric: report.MetricCPS, Round: round, PerSecond: f.cps * k, Latency: lat},
			)
		}
		if !f.direct {
			perProc := []report.IdleProc{{Proc: "p1", RSSKiB: 8, FDs: 2, Goroutines: 0, HeapInuseKiB: 1, HeapCommittedKiB: 2, BaselineRSSKB: 10000}}
			if f.group == report.GroupHBONE2 {
				perProc = append(perProc, report.IdleProc{Proc: "p2", RSSKiB: 4, FDs: 1, Goroutines: 1, HeapInuseKiB: 1, HeapCommittedKiB: 1, BaselineRSSKB: 10000})
			}
			r.Idle = append(r.Idle, report.Idle{Config: f.id, PerProc: perProc, Points: []report.IdlePoint{
				{Conns: 0, RSSKiB: 20000, FDs: 10}, {Conns: 1000, RSSKiB: 26000, FDs: 2010}, {Conns: 2000, RSSKiB: 32000, FDs: 4010},
			}})
		}
	}
	return r
}

func TestStats(t *testing.T) {
	r := synthetic()
	st := report.NewStats(r)
	if got := st.Direct(); got != report.DirectID {
		t.Fatalf("Direct() = %q", got)
	}
	s := st.Get(report.ConfigID(report.GroupTCP, "ztunnel-std"), report.MetricTput1, report.FieldGbps)
	if s.N != 3 || s.Median != 10 || s.Lo != 9 || math.Abs(s.Hi-12) > 1e-9 {
		t.Fatalf("tput1 stat = %+v", s)
	}
	// Even count: the mean of the middle two.
	r.Samples = append(r.Samples, report.Sample{Config: report.DirectID, Metric: report.MetricTput1, Round: 4, Gbps: 100})
	if s := report.NewStats(r).Get(report.DirectID, report.MetricTput1, report.FieldGbps); s.Median != 22 {
		t.Fatalf("median of 18, 20, 24, 100 = %v, want 22", s.Median)
	}
	if s := st.Get("nope", report.MetricTput1, report.FieldGbps); s.N != 0 || s.Median != 0 {
		t.Fatalf("missing config: %+v", s)
	}
}

func TestGoals(t *testing.T) {
	r := synthetic()
	goals := report.EvaluateGoals(r, report.NewStats(r), "std")
	byText := map[string]report.Goal{}
	for _, g := range goals {
		byText[g.Text] = g
	}
	want := map[string]float64{
		"TCP passthrough throughput, 1 stream, vs direct":              (10.0 / 20) / 0.9,
		"TCP passthrough throughput, 1 stream, vs HAProxy splice":      1 / 1.3,
		"TCP passthrough CPU per Gbit/s vs the Go io.Copy proxy":       0.7 / ((1.0 / 10) / (0.8 / 16)),
		"TCP passthrough RR p99 vs HAProxy splice":                     1 / (300.0 / 600),
		"two hops throughput, 1 stream, vs direct":                     (2.0 / 20) / 0.35,
		"one hop throughput, 1 stream, vs raw Go TLS 1.3":              1 / 0.9,
		"two hops RR p50 vs naive Go HBONE":                            1,
		"two hops added RR p50 vs two plain hops' added p50":           1.2 / (200.0 / 100),
		"idle passthrough connection: daemon RSS":                      2.0 / 8,
		"two hops connection rate (pooled tunnels) vs direct":          (2000.0 / 10000) / 0.4,
		"idle HBONE-carried connection: RSS per daemon (costlier one)": 4.0 / 8,
		// Issue 23, against HAProxy.
		"two hops RR p50 vs HAProxy mTLS pair":                                  250.0 / 300,
		"two hops RR p99 vs HAProxy mTLS pair":                                  900.0 / 600,
		"one hop RR p50 vs HAProxy mTLS terminator":                             100.0 / 150,
		"two hops throughput, 1 stream, vs HAProxy mTLS pair":                   2.0 / 1 / 1.3,
		"two hops CPU per Gbit/s vs HAProxy mTLS pair":                          0.75 / ((1.5 / 2) / (1.0 / 1)),
		"two hops connection rate vs HAProxy mTLS pair":                         2000.0 / 500 / 2,
		"idle HBONE-carried connection, tighter: RSS per daemon (costlier one)": 3.0 / 8,
	}
	for text, score := range want {
		g, ok := byText[text]
		if !ok {
			t.Errorf("goal %q missing", text)
			continue
		}
		if math.Abs(g.Score-score) > 1e-9 {
			t.Errorf("%s: score %v, want %v (measured %s)", text, g.Score, score, g.Measured)
		}
	}
	if g := byText["idle HBONE-carried connection holds no goroutine of its own (both daemons; tunnels' shared)"]; !g.Binary || g.Met() {
		t.Errorf("a goroutine per connection passes as none: %+v", g)
	}
	ranked := report.RankGoals(goals)
	if ranked[0].Text != "idle passthrough connection: daemon RSS" {
		t.Errorf("largest gap = %q, want the idle RSS", ranked[0].Text)
	}
	// A skipped peer makes its goals unmeasurable, ranked last.
	r.Samples = r.Samples[:0:0]
	for _, g := range report.RankGoals(report.EvaluateGoals(r, report.NewStats(r), "std")) {
		if strings.Contains(g.Text, "throughput") && g.Measurable() {
			t.Errorf("%q measurable without samples", g.Text)
		}
	}
}

// TestStanding: the report opens with "Where we stand": the shipped
// daemon against HAProxy and the Go baseline of each path, as ratios,
// bold where ahead, with the pooled-TLS caveat next to the connection rate
// and idle memory.
func TestStanding(t *testing.T) {
	r := synthetic()
	md := string(writeReport(t, t.TempDir(), r))
	i := strings.Index(md, "## Where we stand")
	if i < 0 || i > strings.Index(md, "## Machine") {
		t.Fatalf("no \"Where we stand\" before the machine section:\n%s", md)
	}
	for _, want := range []string{
		// tcp: 10 vs HAProxy 10 Gbit/s; p50 150 vs 200 (ahead); cps 5000 vs 5000.
		"| tcp (std) | tcp/haproxy-splice | 1.00× | 1.25× | **0.75×** | **0.50×** | 1.00× |",
		// tcp against the Go io.Copy proxy: 10 vs 16 Gbit/s.
		"| tcp (std) | tcp/copy | 0.62× |",
		// hbone2 against the HAProxy pair: 2 vs 1 Gbit/s, cps 2000 vs 500.
		"| hbone2 (std) | hbone2/haproxy-mtls-pair | **2.00×** |",
		// and against the same pair behind the capture rules, a row of
		// its own after it: 2 vs 0.8 Gbit/s, p50 300 vs 400.
		"| hbone2 (std) | hbone2/haproxy-mtls-pair-captured | **2.50×** |",
		// hbone1: 5 vs 2.5 Gbit/s, cores per Gbit/s 0.2 vs 0.2.
		"| hbone1 (std) | hbone1/haproxy-tls-captured | **2.00×** | 1.00× |",
		"¹ HBONE paths: ztunnel-go carries each new connection as a stream on a pooled mTLS connection",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("REPORT.md lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("REPORT.md:\n%s", md)
	}
}

func TestWrite(t *testing.T) {
	r := synthetic()
	sum, err := report.SummarizeProfile(syntheticProfile(), 10)
	if err != nil {
		t.Fatal(err)
	}
	r.Profiles = []report.Profile{{Config: report.ConfigID(report.GroupTCP, "ztunnel-std"), Metric: report.MetricTput1, Proc: "ztunnel in mcli-std", File: "profiles/x.pb.gz", Summary: sum}}
	heap, err := report.SummarizeHeap(heapProfile(), 5)
	if err != nil {
		t.Fatal(err)
	}
	r.Idle[0].Heaps = []report.HeapProfile{{Proc: "ztunnel in mcli-std", Conns: 2000, File: "profiles/h.pb.gz", Summary: heap}}
	dir := t.TempDir()
	md := writeReport(t, dir, r)
	for _, want := range []string{
		"# Benchmark report: testhost",
		"median of 3 round(s)",
		"## Summary",
		"| tcp | **tcp/ztunnel-std** | 10.0 (0.50×) | 15.0 (0.50×) |", // daemon row: 1 stream and 8 streams vs direct
		"150 / 300 (1.50× / 1.50×)",                                   // RR p50/p99 vs direct
		"5,000 (0.50×)",                                               // cps
		"(largest gap)",
		"## Throughput", "## Request/response latency", "### 1024 B request, 16384 B response",
		"## Connection rate", "## Idle connections", "## CPU profiles of the daemon",
		"between 0 and the last step (read 30 s after the last step)", // issue 23's idle goal reads 30 s after
		"`internal/runtime/syscall.Syscall6` | 50.0%",
		"### Live heap of ztunnel in mcli-std holding 2000 idle connections",
		"| `hbone.newStream` | 1.54 |", // 3 MiB over 2000 connections
		"skipped **HAProxy TCP, no splice**: not installed",
		"![throughput](throughput.png)", "![latency](latency.png)", "![idle RSS](idle-rss.png)", "![connection rate](cps.png)",
	} {
		if !bytes.Contains(md, []byte(want)) {
			t.Errorf("REPORT.md lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("REPORT.md:\n%s", md)
	}
	for _, f := range []string{report.PlotThroughput, report.PlotLatency, report.PlotCPS, report.PlotIdle} {
		fh, err := os.Open(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		img, err := png.Decode(fh)
		fh.Close()
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if b := img.Bounds(); b.Dx() < 300 || b.Dy() < 200 {
			t.Errorf("%s is %v", f, b)
		}
	}
	js, err := os.ReadFile(filepath.Join(dir, report.FileResults))
	if err != nil {
		t.Fatal(err)
	}
	var back report.Run
	if err := json.Unmarshal(js, &back); err != nil {
		t.Fatal(err)
	}
	if len(back.Samples) != len(r.Samples) || len(back.Configs) != len(r.Configs) || back.Profiles[0].Summary.CPUSeconds != sum.CPUSeconds {
		t.Fatal("results.json does not round-trip the run")
	}
}

// syntheticProfile is a CPU profile with one stack per category, each
// worth a known amount of CPU.
func syntheticProfile() *profile.Profile {
	p := &profile.Profile{
		SampleType:    []*profile.ValueType{{Type: "samples", Unit: "count"}, {Type: "cpu", Unit: "nanoseconds"}},
		DurationNanos: 2e9,
		PeriodType:    &profile.ValueType{Type: "cpu", Unit: "nanoseconds"},
		Period:        1e7,
	}
	fns := map[string]*profile.Function{}
	loc := func(name string) *profile.Location {
		f, ok := fns[name]
		if !ok {
			f = &profile.Function{ID: uint64(len(fns) + 1), Name: name}
			fns[name] = f
			p.Function = append(p.Function, f)
		}
		l := &profile.Location{ID: uint64(len(p.Location) + 1), Line: []profile.Line{{Function: f}}}
		p.Location = append(p.Location, l)
		return l
	}
	add := func(ms int64, stack ...string) {
		s := &profile.Sample{Value: []int64{ms / 10, ms * 1e6}}
		for _, fn := range stack { // leaf first
			s.Location = append(s.Location, loc(fn))
		}
		p.Sample = append(p.Sample, s)
	}
	add(500, "internal/runtime/syscall.Syscall6", "syscall.Syscall", "syscall.write", "internal/poll.(*FD).Write", "github.com/ztunnel-go/ztunnel/engine.Relay")
	add(200, "crypto/internal/fips140/aes/gcm.gcmAesEnc", "crypto/tls.(*Conn).Write", "github.com/ztunnel-go/ztunnel/hbone.(*conn).writeLoop")
	add(100, "runtime.futex", "runtime.futexsleep", "runtime.findRunnable", "runtime.schedule")
	add(100, "runtime.scanobject", "runtime.gcDrain", "runtime.gcBgMarkWorker")
	add(50, "runtime.memmove", "io.copyBuffer")
	add(50, "github.com/ztunnel-go/ztunnel/hbone.(*conn).writeLoop")
	return p
}

func heapProfile() *profile.Profile {
	p := &profile.Profile{SampleType: []*profile.ValueType{
		{Type: "alloc_objects", Unit: "count"}, {Type: "alloc_space", Unit: "bytes"},
		{Type: "inuse_objects", Unit: "count"}, {Type: "inuse_space", Unit: "bytes"},
	}}
	fn := func(id uint64, name string) *profile.Location {
		f := &profile.Function{ID: id, Name: name}
		p.Function = append(p.Function, f)
		l := &profile.Location{ID: id, Line: []profile.Line{{Function: f}}}
		p.Location = append(p.Location, l)
		return l
	}
	newStream, serve, bufio := fn(1, "hbone.newStream"), fn(2, "hbone.(*Server).ServeConn"), fn(3, "bufio.NewReaderSize")
	p.Sample = []*profile.Sample{
		{Location: []*profile.Location{newStream, serve}, Value: []int64{0, 0, 10, 3 << 20}},
		{Location: []*profile.Location{bufio, serve}, Value: []int64{0, 0, 10, 1 << 20}},
	}
	return p
}

func TestSummarizeHeap(t *testing.T) {
	sum, err := report.SummarizeHeap(heapProfile(), 5)
	if err != nil {
		t.Fatal(err)
	}
	if sum.InuseKiB != 4096 || sum.Flat[0].Name != "hbone.newStream" || sum.Flat[0].KiB != 3072 || sum.Flat[0].Share != 0.75 {
		t.Fatalf("heap summary: %+v", sum)
	}
	if sum.Cum[0].Name != "hbone.(*Server).ServeConn" || sum.Cum[0].KiB != 4096 {
		t.Fatalf("cumulative: %+v", sum.Cum)
	}
	if _, err := report.SummarizeHeap(syntheticProfile(), 5); err == nil {
		t.Fatal("a CPU profile was summarised as heap")
	}
}

func TestSummarizeProfile(t *testing.T) {
	sum, err := report.SummarizeProfile(syntheticProfile(), 3)
	if err != nil {
		t.Fatal(err)
	}
	if sum.CPUSeconds != 1 || sum.Seconds != 2 || sum.Cores() != 0.5 {
		t.Fatalf("totals: %+v", sum)
	}
	want := map[string]float64{
		report.CatSyscall: 0.5, report.CatCrypto: 0.2, report.CatScheduling: 0.1, report.CatGC: 0.1,
		report.CatMemory: 0.05, report.CatOther: 0.05,
	}
	for name, share := range want {
		if got := sum.CategoryShare(name); math.Abs(got-share) > 1e-9 {
			t.Errorf("%s share %v, want %v", name, got, share)
		}
	}
	if len(sum.Flat) != 3 || sum.Flat[0].Name != "internal/runtime/syscall.Syscall6" || sum.Flat[0].Share != 0.5 {
		t.Errorf("flat = %+v", sum.Flat)
	}
	// writeLoop is in two stacks: 200 + 50 ms cumulative.
	found := false
	for _, c := range sum.Cum {
		if c.Name == "github.com/ztunnel-go/ztunnel/hbone.(*conn).writeLoop" {
			found = true
		}
	}
	if found {
		t.Errorf("writeLoop (25%%) in the top 3 cumulative (the 50%% syscall stack has 5 frames): %+v", sum.Cum)
	}
	if len(sum.Syscalls) != 1 || sum.Syscalls[0].Name != "syscall.write" || sum.Syscalls[0].Share != 0.5 {
		t.Errorf("syscalls by caller = %+v, want syscall.write 50%%", sum.Syscalls)
	}
	if _, err := report.SummarizeProfile(&profile.Profile{SampleType: []*profile.ValueType{{Type: "alloc_space", Unit: "bytes"}}}, 3); err == nil {
		t.Error("a heap profile was summarised as CPU")
	}
}

// The fixed-rate CPU section: the proxies' CPU per request at the same
// open-loop load on every path; absent when the run did not measure it.
func TestWriteFixedRate(t *testing.T) {
	r := synthetic()
	dir := t.TempDir()
	md := writeReport(t, dir, r)
	if bytes.Contains(md, []byte("## CPU at a fixed rate")) {
		t.Fatal("a run without the fixed-rate measurement has its section")
	}
	r.Settings.FixedRate = report.FixedRate{Rate: 1000, Conns: 10, Size: 1024}
	daemon := report.ConfigID(report.GroupTCP, "ztunnel-std")
	for round := 1; round <= 3; round++ {
		r.Samples = append(r.Samples,
			report.Sample{Config: report.DirectID, Metric: report.MetricFixedRate, Round: round, PerSecond: 1000, Latency: &load.Latency{P50: 80, P99: 150}},
			report.Sample{Config: daemon, Metric: report.MetricFixedRate, Round: round, PerSecond: 1000, Cores: 0.05, Latency: &load.Latency{P50: 120, P99: 250}})
	}
	md = writeReport(t, dir, r)
	for _, want := range []string{
		"- Fixed rate: open loop, 1000 requests/s of 1024 B each way over 10 connections",
		"## CPU at a fixed rate",
		"| `tcp/ztunnel-std` | 1,000 | 120 | 250 | 0.05 | 50.0 |", // 0.05 cores at 1,000/s: 50 µs per request
		"| `direct` | 1,000 | 80.0 | 150 | — | — |",
	} {
		if !bytes.Contains(md, []byte(want)) {
			t.Errorf("REPORT.md lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("REPORT.md:\n%s", md)
	}
}

// writeReport writes r's report into dir and returns its REPORT.md.
func writeReport(t *testing.T, dir string, r *report.Run) []byte {
	t.Helper()
	if err := report.Write(dir, r); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(dir, report.FileReport))
	if err != nil {
		t.Fatal(err)
	}
	return md
}

// TestResultsIndex: bench/results/README.md lists every run kept there, so
// the index stays the one way in.
func TestResultsIndex(t *testing.T) {
	dir := filepath.Join("..", "results")
	index, err := os.ReadFile(filepath.Join(dir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		name := strings.TrimSuffix(e.Name(), ".md")
		if name == "README" {
			continue
		}
		if !strings.Contains(string(index), "["+name+"]") {
			t.Errorf("bench/results/README.md does not list %s", e.Name())
		}
	}
}
