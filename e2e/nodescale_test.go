package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/bench/harness"
	"github.com/ztunnel-go/ztunnel/bench/report"
	"github.com/ztunnel-go/ztunnel/inpod/zdstest"
	"github.com/ztunnel-go/ztunnel/internal/labrun"
	"github.com/ztunnel-go/ztunnel/internal/netnslab"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
)

// nodePodsEnv overrides the Node scenario's pod counts (comma-separated,
// ascending; the largest is also the storm's, the restart's and the
// churn's node). Unset, the quick run has 10 pods and the full one
// (ZTUNNEL_SCALE set) 10, 100 and 250.
const nodePodsEnv = "ZTUNNEL_NODE_PODS"

// nodeChurnPerSecond is the churn's rate: as many adds and deletes a
// second.
const nodeChurnPerSecond = 10

// nodeServerPort is the app outside the mesh that served pods reach
// through their proxies.
const nodeServerPort = 8080

// TestNodeScale is issue 36's Node scenario: one shared-mode daemon handed
// pods through ZDS by the fake CNI agent, in real pod namespaces with the
// capture rules installed first (as istio-cni does). Pods are added one
// after the other up to each count (add-to-ack and add-to-serving, the
// daemon's memory, descriptors and goroutines per pod), then all deleted
// and added again at once (the storm), the daemon restarted with every pod
// (the time until each is served again), and pods churned at 10 adds and
// 10 deletes a second while the pods that stay carry traffic, of which
// nothing may be lost. See scaleEnv and nodePodsEnv for the variants; the
// quick one checks that every figure was produced and the churn lost
// nothing.
func TestNodeScale(t *testing.T) {
	if missing := netnslab.Missing(); missing != "" {
		netnslab.Skip(t, missing)
	}
	counts, quick := []int{10}, true
	if os.Getenv(scaleEnv) != "" {
		counts, quick = []int{10, 100, 250}, false
	}
	if v := os.Getenv(nodePodsEnv); v != "" {
		counts = nil
		for f := range strings.SplitSeq(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 5 || n > 250 || (len(counts) > 0 && n <= counts[len(counts)-1]) {
				t.Fatalf("%s=%q: want ascending pod counts from 5 to 250", nodePodsEnv, v)
			}
			counts = append(counts, n)
		}
	}
	out := scaleOutDir(t, quick)
	churnFor := 20 * time.Second
	if quick {
		churnFor = 2 * time.Second
	}
	pods := counts[len(counts)-1]
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	// Apps of five pods, each app a service account (the daemon's
	// certificates are per identity).
	var cfg strings.Builder
	cfg.WriteString("workloads:\n")
	names := make([]string, pods)
	for i := range pods {
		names[i] = fmt.Sprintf("pod-%03d", i)
		fmt.Fprintf(&cfg, "- {uid: uid-%s, name: %s, namespace: default, serviceAccount: app-%d, workloadIps: [\"10.244.0.%d\"], protocol: HBONE, node: node-a, services: {}}\n",
			names[i], names[i], i/5, i+2)
	}
	lab := netnslab.New(t)
	c := startSharedCluster(ctx, t, lab, cfg.String(), labrun.SharedOptions{
		// The memory releaser's debug line says when what the adds freed
		// has gone back to the OS (see point).
		Binary: ztunnelBin, Dir: t.TempDir(), Later: names, LogLevel: "warn,gc=debug",
		ExtraPods: map[string][]string{"node-a": {"server"}},
	})
	srv := startEcho(t, c.Pods["server"], nodeServerPort).Addr
	k := &nodeKit{ctx: ctx, t: t, c: c, agent: c.Agents["node-a"], srv: srv, settle: !quick}
	for _, n := range names {
		// istio-cni installs the rules before it sends the Add; the time
		// iptables-restore takes is not the daemon's.
		if err := c.Pods[n].InstallCapture(); err != nil {
			t.Fatal(err)
		}
		k.pods = append(k.pods, c.Pods[n])
	}

	run := &report.Node{Machine: harness.DescribeMachine(""), Quick: quick}
	d := c.Daemons["node-a"]
	run.Baseline = k.point(d, 0)
	added := 0
	for ci, n := range counts {
		var ack, serving []time.Duration
		var wait func()
		if secs := os.Getenv(scaleProfileEnv); secs != "" && ci == len(counts)-1 {
			// The last segment's adds, profiled and traced as the Mesh
			// scenario's churn (PROFILING.md).
			wait = profileDaemon(ctx, t, d, out, secs, fmt.Sprintf("node-adds-%d", n))
		}
		for ; added < n; added++ {
			a, s := k.add(added)
			ack, serving = append(ack, a), append(serving, s)
		}
		if wait != nil {
			wait()
		}
		p := k.point(d, n)
		p.AddToAck, p.AddToServing = report.PercentilesOf(ack), report.PercentilesOf(serving)
		run.Points = append(run.Points, p)
		rss, heap, fds, gos := run.PerPod(p)
		t.Logf("%d pods: add→ack p50 %v p99 %v, add→serving p50 %v p99 %v; per pod: RSS %.0f B (anonymous %.0f B), heap+stacks %.0f B, %.2f fds, %.2f goroutines; %d threads",
			n, p.AddToAck.P50, p.AddToAck.P99, p.AddToServing.P50, p.AddToServing.P99, rss, run.AnonPerPod(p), heap, fds, gos, p.Threads)
	}
	if !quick {
		run.HeapProfile = &report.ScaleHeap{}
		writeScaleHeap(ctx, t, d, out, fmt.Sprintf("node-heap-%d.pb.gz", pods), pods, run.HeapProfile)
		run.Goroutines = writeGoroutines(ctx, t, d, filepath.Join(out, fmt.Sprintf("node-goroutines-%d.txt", pods)), 8)
	}

	run.Storm = k.storm()
	t.Logf("storm of %d adds: last ack %v, all served %v, add→serving p50 %v p99 %v",
		run.Storm.Pods, run.Storm.LastAck, run.Storm.LastServed, run.Storm.Serving.P50, run.Storm.Serving.P99)
	run.Restart = k.restart(d)
	t.Logf("restart with %d pods: ready %v, every pod served %v", run.Restart.Pods, run.Restart.Ready, run.Restart.AllServed)
	run.Churn = k.churn(churnFor)
	t.Logf("churn %d/s for %v: %d adds, %d dels (add→ack p99 %v); %d stayers: %d ok, %d failed; held %d, lost %d",
		run.Churn.PerSecond, churnFor, run.Churn.Adds, run.Churn.Dels, run.Churn.AddToAck.P99, run.Churn.Stayers,
		run.Churn.OK, run.Churn.Failed, run.Churn.Held, run.Churn.HeldLost)
	run.Machine.LoadEnd = harness.LoadAvg()
	if t.Failed() {
		return
	}
	for _, p := range run.Points {
		if p.AddToServing.N == 0 || p.RSSKiB <= 0 || p.HeapInuseKiB <= 0 || p.FDs <= run.Baseline.FDs {
			t.Errorf("%d pods: a figure is missing: %+v", p.Pods, p)
		}
	}
	if run.Storm.Serving.N != pods || run.Restart.AllServed <= 0 || run.Churn.Adds == 0 || run.Churn.OK == 0 {
		t.Errorf("a figure is missing: storm %+v, restart %+v, churn %+v", run.Storm, run.Restart, run.Churn)
	}
	if run.Churn.Failed != 0 || run.Churn.HeldLost != 0 {
		t.Errorf("the churn broke connections of pods that stayed: %d of %d failed, %d of %d held lost",
			run.Churn.Failed, run.Churn.OK+run.Churn.Failed, run.Churn.HeldLost, run.Churn.Held)
	}
	if err := report.WriteNode(out, run); err != nil {
		t.Fatal(err)
	}
	t.Logf("report: %s", filepath.Join(out, report.FileNodeReport))
}

// nodeKit drives the Node scenario's pods.
type nodeKit struct {
	ctx   context.Context
	t     *testing.T
	c     *labrun.SharedCluster
	agent *zdstest.Server
	srv   netip.AddrPort
	pods  []*netnslab.Pod
	// settle makes point wait for the daemon to go quiet first.
	settle bool
}

func (k *nodeKit) zdsPod(i int) zdstest.Pod {
	p := k.pods[i]
	return zdstest.Pod{UID: "uid-" + p.Name, Name: p.Name, Namespace: "default",
		ServiceAccount: "app-" + strconv.Itoa(i/5), NetnsPath: p.Path()}
}

// sendAdd sends pod i's Add and returns how long until its Ack.
func (k *nodeKit) sendAdd(i int) time.Duration {
	start := time.Now()
	nack, err := k.agent.Add(k.zdsPod(i))
	if err != nil || nack != "" {
		k.t.Errorf("add %s: %q %v", k.pods[i].Name, nack, err)
	}
	return time.Since(start)
}

// add adds pod i and returns add-to-ack and add-to-serving.
func (k *nodeKit) add(i int) (ack, serving time.Duration) {
	start := time.Now()
	ack = k.sendAdd(i)
	if !k.waitServed(i, 10*time.Second) {
		k.t.Fatalf("pod %s not served within 10s of its Ack", k.pods[i].Name)
	}
	return ack, time.Since(start)
}

func (k *nodeKit) del(i int) {
	nack, err := k.agent.Del(k.zdsPod(i).UID)
	if err != nil || nack != "" {
		k.t.Errorf("del %s: %q %v", k.pods[i].Name, nack, err)
	}
}

// waitServed retries a connection from pod i through the daemon until one
// goes through (the capture rules refuse it at once while the pod has no
// proxy) and reports whether one did within limit.
func (k *nodeKit) waitServed(i int, limit time.Duration) bool {
	deadline := time.Now().Add(limit)
	for !scaleAttempt(k.ctx, k.pods[i], k.srv) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
	return true
}

// point reads the daemon's figures with pods pods served. With settle it
// first waits (at most 30 s) for the daemon to go quiet: its memory
// releaser has handed back what the adds and their probes freed
// (internal/app/release.go: 3 s after the burst, at most one release per
// 10 s, none when less than 1 MiB is to be had) and the probes' connection
// workers have ended (5 s idle), as on a node whose pods are served and
// quiet. The quick run does not wait.
func (k *nodeKit) point(d *labrun.Daemon, pods int) report.NodePoint {
	if k.settle {
		const released = "returned freed memory to the OS"
		before := strings.Count(d.Log(), released)
		eventually(30*time.Second, 100*time.Millisecond, func() bool {
			if strings.Count(d.Log(), released) == before {
				return false
			}
			_, body, err := d.Get(k.ctx, "http://127.0.0.1:15000/debug/pprof/goroutine?debug=1")
			return err == nil && !bytes.Contains(body, []byte("proxy.(*Proxy).worker"))
		})
	}
	st, err := d.Stats(k.ctx)
	if err != nil {
		k.t.Fatal(err)
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", d.PID()))
	if err != nil {
		k.t.Fatal(err)
	}
	return report.NodePoint{Pods: pods, RSSKiB: int64(st.RSS >> 10), AnonKiB: statusKiB(status, "RssAnon"),
		HeapInuseKiB: int64(st.HeapInuse >> 10), StackInuseKiB: int64(st.StackInuse >> 10),
		FDs: st.FDs, Goroutines: st.Goroutines, Threads: st.Threads}
}

// statusKiB reads the field (in kB) of a /proc/PID/status.
func statusKiB(status []byte, field string) int64 {
	for line := range strings.SplitSeq(string(status), "\n") {
		k, v, _ := strings.Cut(line, ":")
		if f := strings.Fields(v); k == field && len(f) > 0 {
			n, _ := strconv.ParseInt(f[0], 10, 64)
			return n
		}
	}
	return 0
}

// storm deletes every pod, then sends all their Adds at once and waits for
// each pod to be served.
func (k *nodeKit) storm() report.NodeStorm {
	for i := range k.pods {
		k.del(i)
	}
	n := len(k.pods)
	acks, served := make([]time.Duration, n), make([]time.Duration, n)
	start := time.Now()
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			k.sendAdd(i)
			acks[i] = time.Since(start)
			if !k.waitServed(i, 30*time.Second) {
				k.t.Errorf("pod %s not served within 30s of its Ack in the storm", k.pods[i].Name)
			}
			served[i] = time.Since(start)
		})
	}
	wg.Wait()
	return report.NodeStorm{Pods: n, LastAck: slices.Max(acks), LastServed: slices.Max(served), Serving: report.PercentilesOf(served)}
}

// restart stops the daemon and starts a new one, which finds every pod in
// its first snapshot, and times its readiness and the moment the last pod
// is served again (8 probers go round the pods not served yet, each pod
// retried 5 ms after a refusal).
func (k *nodeKit) restart(old *labrun.Daemon) report.NodeRestart {
	if err := k.c.StopDaemon(old); err != nil {
		k.t.Fatal(err)
	}
	d, err := k.c.StartDaemonWith(k.ctx, "node-a", labrun.DaemonStart{NoWait: true})
	if err != nil {
		k.t.Fatal(err)
	}
	start := time.Now()
	r := report.NodeRestart{Pods: len(k.pods)}
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := d.WaitReady(k.ctx, 30*time.Second); err != nil {
			k.t.Errorf("restarted daemon: %v", err)
		}
		r.Ready = time.Since(start)
	})
	type try struct {
		i  int
		at time.Time
	}
	queue := make(chan try, len(k.pods))
	for i := range k.pods {
		queue <- try{i: i}
	}
	var left atomic.Int64
	left.Store(int64(len(k.pods)))
	var last atomic.Int64
	deadline := start.Add(30 * time.Second)
	for range 8 {
		wg.Go(func() {
			for left.Load() > 0 && time.Now().Before(deadline) {
				var x try
				select {
				case x = <-queue:
				case <-time.After(10 * time.Millisecond):
					continue
				}
				time.Sleep(time.Until(x.at))
				if scaleAttempt(k.ctx, k.pods[x.i], k.srv) {
					last.Store(int64(time.Since(start)))
					left.Add(-1)
					continue
				}
				queue <- try{i: x.i, at: time.Now().Add(5 * time.Millisecond)}
			}
		})
	}
	wg.Wait()
	if n := left.Load(); n > 0 {
		k.t.Errorf("%d pods not served within 30s of the restart", n)
	}
	r.AllServed = time.Duration(last.Load())
	return r
}

// churn deletes and adds pods at nodeChurnPerSecond each a second for
// length, among the last four fifths of the pods, while the first fifth
// (the stayers) open connections through the daemon without pause and
// each holds one more open across it.
func (k *nodeKit) churn(length time.Duration) report.NodeChurn {
	n := len(k.pods)
	stayers := max(1, n/5)
	res := report.NodeChurn{PerSecond: nodeChurnPerSecond, Duration: length, Stayers: stayers}
	// Long-lived connections, one per stayer, checked before and after.
	var held []net.Conn
	for i := range stayers {
		cn, err := k.pods[i].Dial(k.ctx, "tcp", k.srv.String())
		if err != nil {
			k.t.Fatalf("held connection of %s: %v", k.pods[i].Name, err)
		}
		defer cn.Close()
		if err := nettest.RoundTrip(cn, "x"); err != nil {
			k.t.Fatalf("held connection of %s: %v", k.pods[i].Name, err)
		}
		held = append(held, cn)
	}
	res.Held = len(held)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var ok, failed atomic.Int64
	var next atomic.Int64
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				i := int(next.Add(1)) % stayers
				if scaleAttempt(k.ctx, k.pods[i], k.srv) {
					ok.Add(1)
				} else {
					failed.Add(1)
				}
			}
		})
	}
	// Churners out of the mesh, to be added back in turn; up to a second's
	// worth are taken out first.
	churners := k.pods[stayers:]
	var out []int
	for i := range min(nodeChurnPerSecond, len(churners)/2) {
		k.del(stayers + i)
		out = append(out, stayers+i)
	}
	nextIn := stayers + len(out)
	var acks []time.Duration
	tick := time.NewTicker(time.Second / nodeChurnPerSecond)
	end := time.Now().Add(length)
	for time.Now().Before(end) {
		<-tick.C
		in := out[0]
		out = out[1:]
		acks = append(acks, k.sendAdd(in))
		res.Adds++
		k.del(nextIn)
		res.Dels++
		out = append(out, nextIn)
		if nextIn++; nextIn == n {
			nextIn = stayers
		}
		for slices.Contains(out, nextIn) {
			if nextIn++; nextIn == n {
				nextIn = stayers
			}
		}
	}
	tick.Stop()
	close(stop)
	wg.Wait()
	res.OK, res.Failed, res.AddToAck = ok.Load(), failed.Load(), report.PercentilesOf(acks)
	for _, cn := range held {
		if err := nettest.RoundTrip(cn, "y"); err != nil {
			res.HeldLost++
		}
	}
	return res
}

// writeGoroutines saves the daemon's goroutine profile (debug=1: goroutines
// grouped by stack) to file and returns its top biggest groups, each named
// by its first frames outside the runtime.
func writeGoroutines(ctx context.Context, t *testing.T, d *labrun.Daemon, file string, top int) []report.GoroutineGroup {
	code, body, err := d.Get(ctx, "http://127.0.0.1:15000/debug/pprof/goroutine?debug=1")
	if err != nil || code != 200 {
		t.Fatalf("goroutine profile: %d %v", code, err)
	}
	if err := os.WriteFile(file, body, 0o644); err != nil {
		t.Fatal(err)
	}
	var groups []report.GoroutineGroup
	var cur *report.GoroutineGroup
	var frames []string
	flush := func() {
		if cur != nil {
			cur.Where = strings.Join(frames, " ← ")
			groups = append(groups, *cur)
		}
		cur, frames = nil, nil
	}
	sc := bufio.NewScanner(bytes.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			flush()
		case strings.Contains(line, " @ 0x"):
			flush()
			n, _, _ := strings.Cut(line, " @ ")
			count, err := strconv.Atoi(n)
			if err != nil {
				continue
			}
			cur = &report.GoroutineGroup{Count: count}
		case cur != nil && strings.HasPrefix(line, "#\t"):
			// "#\t0xADDR\tfunc+0xOFF\tfile:line"
			f := strings.Fields(line)
			if len(f) < 3 || len(frames) >= 3 {
				continue
			}
			fn, _, _ := strings.Cut(f[2], "+0x")
			if strings.HasPrefix(fn, "runtime.") || strings.HasPrefix(fn, "internal/poll.") {
				continue
			}
			frames = append(frames, shortFrame(fn))
		}
	}
	flush()
	slices.SortStableFunc(groups, func(a, b report.GoroutineGroup) int { return b.Count - a.Count })
	return groups[:min(top, len(groups))]
}

// shortFrame drops the module path from a function name.
func shortFrame(fn string) string {
	fn = strings.TrimPrefix(fn, "github.com/ztunnel-go/ztunnel/")
	if i := strings.LastIndex(fn, "/"); i >= 0 && !strings.Contains(fn[:i], "(") {
		return fn[i+1:]
	}
	return fn
}
