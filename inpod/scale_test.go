package inpod

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/inpod/zdstest"
	"github.com/ztunnel-go/ztunnel/internal/netnslab"
)

// procFigures are the process-wide costs a pod proxy adds.
type procFigures struct {
	heap, rss         uint64
	fds, threads, gos int
}

func measure(t testing.TB) procFigures {
	t.Helper()
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	f := procFigures{heap: ms.HeapInuse + ms.StackInuse, gos: runtime.NumGoroutine()}
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	f.fds = len(ents)
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		k, v, _ := strings.Cut(line, ":")
		fields := strings.Fields(v)
		if len(fields) == 0 {
			continue
		}
		n, _ := strconv.ParseUint(fields[0], 10, 64)
		switch k {
		case "VmRSS":
			f.rss = n << 10
		case "Threads":
			f.threads = int(n)
		}
	}
	return f
}

// BenchmarkPods100 measures what 100 pods cost one in-process daemon (real
// proxies in real pod namespaces, built-in CA): the time from the first
// connect until the manager is ready with all 100 proxies up (the snapshot
// path of a daemon start), the time of 100 live Adds one after the other
// (the CNI path), and per pod proxy: Go heap and stacks, RSS, descriptors,
// goroutines, OS threads. Run with -benchtime=1x (root).
func BenchmarkPods100(b *testing.B) {
	const pods = 100
	requireRoot(b)
	lab := netnslab.New(b)
	node, err := lab.AddNode("node-a")
	if err != nil {
		b.Fatal(err)
	}
	var cfg strings.Builder
	cfg.WriteString("workloads:\n")
	var nsPods []*netnslab.Pod
	for i := range pods {
		name := fmt.Sprintf("pod-%03d", i)
		p, err := node.AddPod(name)
		if err != nil {
			b.Fatal(err)
		}
		if err := p.InstallCapture(); err != nil {
			b.Fatal(err)
		}
		nsPods = append(nsPods, p)
		fmt.Fprintf(&cfg, "- uid: uid-%s\n  name: %s\n  namespace: default\n  serviceAccount: sa-%d\n  workloadIps: [%q]\n  protocol: HBONE\n  node: node-a\n  services: {}\n", name, name, i%10, p.IP)
	}
	w := newWorld(b, lab, cfg.String())
	agent := w.agent("node-a")
	podOf := func(i int) zdstest.Pod {
		p := nsPods[i]
		return zdstest.Pod{UID: "uid-" + p.Name, Name: p.Name, Namespace: "default", ServiceAccount: fmt.Sprintf("sa-%d", i%10), NetnsPath: p.Path()}
	}
	for b.Loop() {
		// Snapshot path: the agent knows every pod; the daemon starts.
		for i := range pods {
			if _, err := agent.Add(podOf(i)); err != nil && !errors.Is(err, zdstest.ErrNotConnected) {
				b.Fatal(err)
			}
		}
		before := measure(b)
		start := time.Now()
		d := w.startDaemon("node-a", false)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		for !d.ready.ready() || len(d.mgr.WorkloadState()) != pods {
			if ctx.Err() != nil {
				b.Fatal("not ready within a minute")
			}
			time.Sleep(time.Millisecond)
		}
		cancel()
		snapshotReady := time.Since(start)
		after := measure(b)

		// CNI path: the same pods deleted, then added live one by one.
		for i := range pods {
			if ack, err := agent.Del(podOf(i).UID); err != nil || ack != "" {
				b.Fatalf("del: %q %v", ack, err)
			}
		}
		for len(d.mgr.WorkloadState()) != 0 {
			time.Sleep(time.Millisecond)
		}
		start = time.Now()
		for i := range pods {
			if ack, err := agent.Add(podOf(i)); err != nil || ack != "" {
				b.Fatalf("add: %q %v", ack, err)
			}
		}
		liveAdds := time.Since(start)
		d.drain(0)

		per := func(a, b uint64) float64 { return float64(int64(a)-int64(b)) / pods }
		b.ReportMetric(float64(snapshotReady.Milliseconds()), "ms-to-ready")
		b.ReportMetric(float64(liveAdds.Microseconds())/pods, "µs/live-add")
		b.ReportMetric(per(after.heap, before.heap), "heap-B/pod")
		b.ReportMetric(per(after.rss, before.rss), "rss-B/pod")
		b.ReportMetric(float64(after.fds-before.fds)/pods, "fds/pod")
		b.ReportMetric(float64(after.gos-before.gos)/pods, "goroutines/pod")
		b.ReportMetric(float64(after.threads-before.threads), "threads-added")
	}
}
