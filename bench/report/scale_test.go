package report_test

import (
	"encoding/json"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/bench/report"
)

// TestWriteScale writes the mesh-scale section of a synthetic run whose
// per-workload figures are known, and reads back the files it promises.
func TestWriteScale(t *testing.T) {
	pt := func(n int, rssKiB, heapKiB int64) report.ScalePoint {
		return report.ScalePoint{
			Workloads: n, Services: n / 5, Policies: n / 50, RSSKiB: rssKiB, HeapInuseKiB: heapKiB, SyncedRSSKiB: rssKiB + 1024,
			HeapLiveKiB: 4000 + (heapKiB-5000)/3*2, // two thirds of the growth live
			Released:    true, Sync: 150 * time.Millisecond, CPU: 120 * time.Millisecond,
			Setup:         report.PercentilesOf([]time.Duration{time.Millisecond, 2 * time.Millisecond}),
			AddressChange: report.PercentilesOf([]time.Duration{3 * time.Millisecond}),
			AuthzChange:   report.PercentilesOf([]time.Duration{4 * time.Millisecond}),
		}
	}
	s := &report.Scale{
		Machine:        report.Machine{Host: "testhost", CPUModel: "Test CPU", Cores: 2, Kernel: "6.1", GoVersion: "go1.26"},
		ChurnPerSecond: 100,
		Baseline:       report.ScalePoint{RSSKiB: 20000, HeapInuseKiB: 5000, HeapLiveKiB: 4000},
		// 1,000 workloads at 2 KiB RSS and 1.5 KiB heap each; 10,000 at 1 KiB and 0.75 KiB.
		Points: []report.ScalePoint{pt(1000, 20000+2000, 5000+1500), pt(10000, 20000+10000, 5000+7500)},
	}
	if rss, heap := s.PerWorkload(s.Points[1]); rss != 1024 || heap != 768 {
		t.Errorf("PerWorkload = %v, %v B; want 1024, 768", rss, heap)
	}
	dir := t.TempDir()
	if err := report.WriteScale(dir, s); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(dir, report.FileScaleReport))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"| 1,000 | 200 | 20 | 22.5 | 21.5 | 2,048 | 1,536 | 1,024 | 150 | 120 | 1.00 / 2.00 (n=2) | 3.00 / 3.00 (n=1) | 4.00 / 4.00 (n=1) |",
		"| 10,000 | 2,000 | 200 | 30.3 | 29.3 | 1,024 | 768 | 512 |",
		"VIP set-up p50 at 10,000 workloads against 1,000: 1.00×.",
		"](" + report.PlotScaleMemory + ")", "](" + report.PlotScaleTime + ")",
	} {
		if !strings.Contains(string(md), want) {
			t.Errorf("%s lacks %q:\n%s", report.FileScaleReport, want, md)
		}
	}
	var back report.Scale
	js, err := os.ReadFile(filepath.Join(dir, report.FileScaleResults))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(js, &back); err != nil || len(back.Points) != 2 || back.Points[1].HeapInuseKiB != 12500 {
		t.Errorf("%s does not read back: %v, %+v", report.FileScaleResults, err, back.Points)
	}
	for _, f := range []string{report.PlotScaleMemory, report.PlotScaleTime} {
		fh, err := os.Open(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := png.Decode(fh); err != nil {
			t.Errorf("%s: %v", f, err)
		}
		fh.Close()
	}
}

// TestWriteLoad writes the Load section of a synthetic run whose figures
// are known, and reads back the files it promises.
func TestWriteLoad(t *testing.T) {
	ours := report.Config{ID: "hbone2/ztunnel-epoll", Proxy: "ztunnel-go (epoll) pair, HBONE", Daemon: true,
		Procs: []string{"ztunnel in a", "ztunnel in b"}}
	peer := report.Config{ID: "hbone2/haproxy-mtls-pair", Proxy: "HAProxy mTLS pair", Procs: []string{"haproxy a", "haproxy b"}}
	pt := func(c report.Config, conns int, p999, cores float64, gc *report.GCStats) report.LoadPoint {
		p := report.LoadPoint{Config: c.ID, Conns: conns, Requests: 1000, PerSecond: 10000,
			Latency: report.LatencyUS{P50: 100, P99: 1000, P999: p999, Max: 2 * p999}}
		for _, name := range c.Procs {
			// Each process grows by 4 KiB a connection.
			p.Procs = append(p.Procs, report.LoadProc{Name: name, Cores: cores / 2, BaseRSSKiB: 10000,
				RSSKiB: 10000 + 4*int64(conns), GC: gc})
		}
		return p
	}
	direct := report.Config{ID: "direct", Proxy: "direct (no proxy)", Direct: true}
	gc := &report.GCStats{Cycles: 20, CPUSeconds: 0.1, PauseP50: 50, PauseP99: 200, PauseMax: 300, HeapGoalMB: 16}
	l := &report.Load{
		Machine: report.Machine{Host: "testhost", CPUModel: "Test CPU", Cores: 2, Kernel: "6.1", GoVersion: "go1.26"},
		Rate:    10000, Size: 64, Duration: 14 * time.Second, Warmup: 3 * time.Second, Window: 10 * time.Second,
		Paths: []report.Config{direct, ours, peer},
		Points: []report.LoadPoint{
			pt(direct, 1000, 500, 0, nil), pt(ours, 1000, 4000, 0.5, gc), pt(peer, 1000, 8000, 1.0, nil),
			pt(ours, 5000, 6000, 0.8, gc), pt(peer, 5000, 5000, 1.0, nil),
			// Two more rounds of ours at 5,000: the row is each figure's
			// median, p99.9 with its range.
			pt(ours, 5000, 8000, 1.0, gc), pt(ours, 5000, 2000, 0.6, gc),
		},
		Skipped: []report.Skip{{What: "hbone2/haproxy-mtls-pair at 10,000 connections", Reason: "descriptors"}},
	}
	if got := l.Points[1].RSSPerConnKiB(); got != 8 {
		t.Errorf("RSSPerConnKiB = %v, want 8 (two processes at 4)", got)
	}
	if g := l.Points[1].GC(); g == nil || g.Cycles != 40 || g.CPUSeconds != 0.2 || g.PauseP99 != 200 {
		t.Errorf("GC of two daemons = %+v, want 40 cycles, 0.2 s, p99 200 µs", g)
	}
	dir := t.TempDir()
	if err := report.WriteLoad(dir, l); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(dir, report.FileLoadReport))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		// 0.2 s of GC CPU over 0.5 cores for 10 s is 4%; 40 cycles in 10 s.
		"| 1,000 | `hbone2/ztunnel-epoll` | 10,000 | 0 | 100 | 1,000 | 4,000 | 8,000 | 0.50 (0.25 + 0.25) | 8.00 | 4.0% | 4.0 | 50.0 / 200 / 300 |",
		"| 1,000 | 1.00× | 1.00× | 0.50× | 0.50× | 1.00× |",
		// The direct path has no proxy: no CPU, memory or GC.
		"| 1,000 | `direct` | 10,000 | 0 | 100 | 1,000 | 500 | 1,000 | — | — | — | — | — |",
		// Round by round: ours' three runs of round 0 each against the
		// peer's one.
		"| 5,000 | 1.00× | 1.00× | 1.20× | 0.80× | 1.00× | 1.20× (0.40–1.60) | 0.80× (0.60–1.00) |",
		"| 5,000 | `hbone2/ztunnel-epoll` | 10,000 | 0 | 100 | 1,000 | 6,000 (2,000–8,000) | 12,000 | 0.80 (0.40 + 0.40) |",
		"Skipped: hbone2/haproxy-mtls-pair at 10,000 connections: descriptors.",
		"](" + report.PlotLoadLatency + ")", "](" + report.PlotLoadCPU + ")",
	} {
		if !strings.Contains(string(md), want) {
			t.Errorf("%s lacks %q:\n%s", report.FileLoadReport, want, md)
		}
	}
	var back report.Load
	js, err := os.ReadFile(filepath.Join(dir, report.FileLoadResults))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(js, &back); err != nil || len(back.Points) != 7 || back.Points[3].Latency.P999 != 6000 {
		t.Errorf("%s does not read back: %v, %+v", report.FileLoadResults, err, back.Points)
	}
	for _, f := range []string{report.PlotLoadLatency, report.PlotLoadCPU} {
		fh, err := os.Open(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := png.Decode(fh); err != nil {
			t.Errorf("%s: %v", f, err)
		}
		fh.Close()
	}
}
