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

// TestWriteNode writes the node-scale section of a synthetic run whose
// per-pod figures are known, and reads back the files it promises.
func TestWriteNode(t *testing.T) {
	pt := func(pods int, kibPerPod int64) report.NodePoint {
		k := int64(pods) * kibPerPod
		return report.NodePoint{
			Pods: pods, RSSKiB: 20000 + k + 1000, AnonKiB: 5000 + k, HeapInuseKiB: 3000 + k/2, StackInuseKiB: 600,
			FDs: 20 + 8*pods, Goroutines: 60, Threads: 10,
			AddToAck:     report.PercentilesOf([]time.Duration{time.Millisecond, 2 * time.Millisecond}),
			AddToServing: report.PercentilesOf([]time.Duration{2 * time.Millisecond, 6 * time.Millisecond}),
		}
	}
	n := &report.Node{
		Machine:  report.Machine{Host: "testhost", CPUModel: "Test CPU", Cores: 2, Kernel: "6.1", GoVersion: "go1.26"},
		Baseline: report.NodePoint{RSSKiB: 20000, AnonKiB: 5000, HeapInuseKiB: 3000, StackInuseKiB: 600, FDs: 20, Goroutines: 60},
		// 16 KiB of anonymous RSS per pod at 100 pods (the goal), 32 at 10.
		Points:  []report.NodePoint{pt(10, 32), pt(100, 16)},
		Storm:   report.NodeStorm{Pods: 100, LastAck: 300 * time.Millisecond, LastServed: 310 * time.Millisecond, Serving: report.PercentilesOf([]time.Duration{time.Millisecond})},
		Restart: report.NodeRestart{Pods: 100, Ready: 500 * time.Millisecond, AllServed: 600 * time.Millisecond},
		Churn:   report.NodeChurn{PerSecond: 10, Duration: 20 * time.Second, Adds: 200, Dels: 200, Stayers: 20, OK: 40000, Held: 20},
	}
	if rss, heap, fds, gos := n.PerPod(n.Points[1]); rss != 16*1024+10240 || heap != 8*1024 || fds != 8 || gos != 0 {
		t.Errorf("PerPod = %v, %v, %v, %v; want 26,624 B, 8,192 B, 8 fds, 0 goroutines", rss, heap, fds, gos)
	}
	if anon := n.AnonPerPod(n.Points[1]); anon != 16*1024 {
		t.Errorf("AnonPerPod = %v, want 16,384", anon)
	}
	dir := t.TempDir()
	if err := report.WriteNode(dir, n); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(dir, report.FileNodeReport))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"| 10 | 1.00 / 2.00 (n=2) | 2.00 / 6.00 (n=2) ✗ |",
		"| 100 | 1.00 / 2.00 (n=2) | 2.00 / 6.00 (n=2) ✗ | 22.1 | 26,624 | 16,384 ✓ | 8,192 | 8.00 | 0.00 | 10 |",
		"every pod served again after 600 ms (goal ≤ 2,000) ✓",
		"40,000 ok, 0 failed; 20 long-lived connections held across it, 0 lost",
		"](" + report.PlotNodeCost + ")", "](" + report.PlotNodeLatency + ")",
	} {
		if !strings.Contains(string(md), want) {
			t.Errorf("%s lacks %q:\n%s", report.FileNodeReport, want, md)
		}
	}
	var back report.Node
	js, err := os.ReadFile(filepath.Join(dir, report.FileNodeResults))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(js, &back); err != nil || len(back.Points) != 2 || back.Points[1].AnonKiB != 5000+1600 {
		t.Errorf("%s does not read back: %v, %+v", report.FileNodeResults, err, back.Points)
	}
	for _, f := range []string{report.PlotNodeCost, report.PlotNodeLatency} {
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
