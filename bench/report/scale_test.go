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
			Released: true, Sync: 150 * time.Millisecond, CPU: 120 * time.Millisecond,
			Setup:         report.PercentilesOf([]time.Duration{time.Millisecond, 2 * time.Millisecond}),
			AddressChange: report.PercentilesOf([]time.Duration{3 * time.Millisecond}),
			AuthzChange:   report.PercentilesOf([]time.Duration{4 * time.Millisecond}),
		}
	}
	s := &report.Scale{
		Machine:        report.Machine{Host: "testhost", CPUModel: "Test CPU", Cores: 2, Kernel: "6.1", GoVersion: "go1.26"},
		ChurnPerSecond: 100,
		Baseline:       report.ScalePoint{RSSKiB: 20000, HeapInuseKiB: 5000},
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
		"| 1,000 | 200 | 20 | 22.5 | 21.5 | 2,048 | 1,536 | 150 | 120 | 1.00 / 2.00 (n=2) | 3.00 / 3.00 (n=1) | 4.00 / 4.00 (n=1) |",
		"| 10,000 | 2,000 | 200 | 30.3 | 29.3 | 1,024 | 768 |",
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
