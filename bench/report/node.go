package report

import (
	"fmt"
	"math"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// Files of the node-scale report (issue 36's Node scenario), relative to
// its directory (the mesh-scale report's, when both run).
const (
	FileNodeReport  = "NODE.md"
	FileNodeResults = "node.json"
	PlotNodeCost    = "node-cost.png"
	PlotNodeLatency = "node-latency.png"
)

// Issue 36's goals for a node.
const (
	// NodeGoalBytesPerPod is the daemon memory one served pod may cost.
	NodeGoalBytesPerPod = 16 << 10
	// NodeGoalAddToServing is the add-to-serving p99.
	NodeGoalAddToServing = 5 * time.Millisecond
	// NodeGoalRestart bounds the time until every pod of 250 is served
	// again after a daemon restart.
	NodeGoalRestart = 2 * time.Second
)

// Node is one run of the Node scenario: a shared-mode daemon handed pods
// through ZDS by a fake CNI agent, measured at growing pod counts, then in a
// storm of adds, across a restart and under churn.
type Node struct {
	Machine Machine `json:"machine"`
	// Quick marks the CI smoke run (few pods, a short churn).
	Quick bool `json:"quick"`
	// Baseline is the daemon with no pod: the per-pod figures are the
	// growth above it.
	Baseline NodePoint   `json:"baseline"`
	Points   []NodePoint `json:"points"`
	Storm    NodeStorm   `json:"storm"`
	Restart  NodeRestart `json:"restart"`
	Churn    NodeChurn   `json:"churn"`
	// HeapProfile is the daemon's heap profile (gc=1) at the largest pod
	// count, summarized; Goroutines the goroutine profile's biggest
	// groups then. The files sit next to the report.
	// (ScaleHeap.Workloads holds the pod count.)
	HeapProfile *ScaleHeap       `json:"heap_profile,omitempty"`
	Goroutines  []GoroutineGroup `json:"goroutines,omitempty"`
	// Notes are paragraphs the run adds under the figures.
	Notes []string `json:"notes,omitempty"`
}

// GoroutineGroup is one stack the goroutine profile groups goroutines by:
// how many wait there and the function that started them.
type GoroutineGroup struct {
	Count int    `json:"count"`
	Where string `json:"where"`
}

// NodePoint is the daemon serving Pods pods, added one after the other.
type NodePoint struct {
	Pods int `json:"pods"`
	// AddToAck is from sending a pod's Add to reading its Ack;
	// AddToServing from sending the Add to the end of the first round trip
	// of a connection the pod opened through the daemon. Both cover the
	// pods added to reach this count (not the ones before).
	AddToAck     Percentiles `json:"add_to_ack"`
	AddToServing Percentiles `json:"add_to_serving"`
	// The daemon's figures with Pods pods served: resident memory, Go heap
	// and goroutine stacks in use after a collection, descriptors,
	// goroutines and OS threads.
	RSSKiB int64 `json:"rss_kib"`
	// AnonKiB is the anonymous part of RSS (RssAnon): RSS less the
	// binary's code and data pages that serving a first pod pages in, which
	// all pods share.
	AnonKiB       int64 `json:"anon_kib"`
	HeapInuseKiB  int64 `json:"heap_inuse_kib"`
	StackInuseKiB int64 `json:"stack_inuse_kib"`
	FDs           int   `json:"fds"`
	Goroutines    int   `json:"goroutines"`
	Threads       int   `json:"threads"`
}

// NodeStorm is Pods adds sent at once (after every pod was deleted), as
// the CNI agent does when a node's pods start together: the agent sends
// them back to back on its one stream, each after the previous Ack.
type NodeStorm struct {
	Pods int `json:"pods"`
	// LastAck and LastServed are from the storm's start to the last Ack
	// and to the last pod's first served round trip; Serving is each pod's
	// add-to-serving from the storm's start.
	LastAck    time.Duration `json:"last_ack_ns"`
	LastServed time.Duration `json:"last_served_ns"`
	Serving    Percentiles   `json:"serving"`
}

// NodeRestart is a daemon stopped and a new one started with Pods pods on
// the node (all in its first ZDS snapshot).
type NodeRestart struct {
	Pods int `json:"pods"`
	// Ready is from the new daemon's start to its /healthz/ready; AllServed
	// to the last pod's first served round trip (each pod probed until its
	// connection went through).
	Ready     time.Duration `json:"ready_ns"`
	AllServed time.Duration `json:"all_served_ns"`
}

// NodeChurn is pods leaving and joining at PerSecond adds and as many
// deletes a second while the pods that stay carry traffic.
type NodeChurn struct {
	PerSecond int           `json:"per_second"`
	Duration  time.Duration `json:"duration_ns"`
	Adds      int           `json:"adds"`
	Dels      int           `json:"dels"`
	AddToAck  Percentiles   `json:"add_to_ack"`
	// Stayers is how many pods carried traffic; OK and Failed count their
	// connections (each a connect and a 1-byte round trip through the
	// daemon); Held is how many long-lived connections, one per stayer,
	// were checked before and after the churn, HeldLost how many of them
	// broke.
	Stayers  int   `json:"stayers"`
	OK       int64 `json:"ok"`
	Failed   int64 `json:"failed"`
	Held     int   `json:"held"`
	HeldLost int   `json:"held_lost"`
}

// PerPod is what one served pod adds to the daemon above the baseline:
// RSS and Go heap plus stacks in bytes, descriptors and goroutines.
func (n *Node) PerPod(p NodePoint) (rss, heap, fds, goroutines float64) {
	if p.Pods == 0 {
		return math.NaN(), math.NaN(), math.NaN(), math.NaN()
	}
	k := float64(p.Pods)
	b := n.Baseline
	return float64(p.RSSKiB-b.RSSKiB) * 1024 / k,
		float64(p.HeapInuseKiB+p.StackInuseKiB-b.HeapInuseKiB-b.StackInuseKiB) * 1024 / k,
		float64(p.FDs-b.FDs) / k, float64(p.Goroutines-b.Goroutines) / k
}

// AnonPerPod is what one served pod adds to the daemon's anonymous
// resident memory, in bytes.
func (n *Node) AnonPerPod(p NodePoint) float64 {
	if p.Pods == 0 {
		return math.NaN()
	}
	return float64(p.AnonKiB-n.Baseline.AnonKiB) * 1024 / float64(p.Pods)
}

// WriteNode writes NODE.md, node.json and the plots into dir.
func WriteNode(dir string, n *Node) error {
	return writeScenario(dir, n, FileNodeResults, FileNodeReport,
		func() ([]string, error) { return writeNodePlots(dir, n) },
		func(p []string) []byte { return NodeMarkdown(n, p) })
}

// goalCell is v with "✓" or "✗" against the goal (at most goal).
func goalCell(v, goal float64, s string) string {
	if math.IsNaN(v) {
		return s
	}
	if v <= goal {
		return s + " ✓"
	}
	return s + " ✗"
}

// NodeMarkdown renders the node-scale section.
func NodeMarkdown(n *Node, plots []string) []byte {
	var m md
	m.p("# A node of pods (issue 36, Node scenario)")
	m.p("")
	mc := n.Machine
	m.p("Machine: %s, %s, %d cores, %s MiB, kernel %s, %s; load %.2f → %.2f.", mc.Host, mc.CPUModel, mc.Cores,
		commas(mc.MemTotalKiB/1024), mc.Kernel, mc.GoVersion, mc.LoadStart[0], mc.LoadEnd[0])
	if n.Quick {
		m.p("")
		m.p("Quick run (CI smoke): few pods and a short churn; the figures only show the scenario still runs.")
	}
	m.p("")
	m.p("One shared-mode daemon (PROXY_MODE=shared) on a lab node; a fake CNI agent (inpod/zdstest) hands it each pod's "+
		"network namespace over ZDS after installing the pod's capture rules, as istio-cni does. A pod is served when a "+
		"connection it opens to an app outside the mesh goes through its proxy in the daemon (a 1-byte round trip). Per-pod "+
		"figures are the growth above the daemon with no pod (RSS %s KiB, heap and stacks %s KiB, %d fds, %d goroutines).",
		commas(n.Baseline.RSSKiB), commas(n.Baseline.HeapInuseKiB+n.Baseline.StackInuseKiB), n.Baseline.FDs, n.Baseline.Goroutines)
	m.p("")
	var rows [][]string
	for _, p := range n.Points {
		rss, heap, fds, gos := n.PerPod(p)
		anon := n.AnonPerPod(p)
		rows = append(rows, []string{
			commas(int64(p.Pods)), pcts(p.AddToAck), goalCell(float64(p.AddToServing.P99), float64(NodeGoalAddToServing), pcts(p.AddToServing)),
			num(float64(p.RSSKiB) / 1024), num(rss), goalCell(anon, NodeGoalBytesPerPod, num(anon)), num(heap),
			// Zero goroutines per pod is the point: no dash for it.
			fmt.Sprintf("%.2f", fds), fmt.Sprintf("%.2f", gos), fmt.Sprint(p.Threads),
		})
	}
	m.table(0, []string{"pods", "add → ack p50/p99 ms", "add → serving p50/p99 ms (goal p99 ≤ 5)", "RSS MiB",
		"RSS B/pod", "anonymous RSS B/pod (goal ≤ 16,384)", "heap+stacks B/pod", "fds/pod", "goroutines/pod", "threads"}, rows)
	m.p("RSS counts the daemon binary's pages that serving pods first touches (code and data shared by all pods, paid once); " +
		"anonymous RSS (RssAnon) leaves them out, and is what the goal is read against.")
	m.p("")
	if s := n.Storm; s.Pods > 0 {
		m.p("Storm: %d adds sent at once: last Ack after %s ms, every pod served after %s ms; add → serving from the storm's "+
			"start p50/p99 %s ms.", s.Pods, ms(s.LastAck), ms(s.LastServed), pcts(s.Serving))
		m.p("")
	}
	if r := n.Restart; r.Pods > 0 {
		m.p("Restart with %d pods: the new daemon ready after %s ms, every pod served again after %s.", r.Pods, ms(r.Ready),
			goalCell(float64(r.AllServed), float64(NodeGoalRestart), ms(r.AllServed)+" ms (goal ≤ 2,000)"))
		m.p("")
	}
	if c := n.Churn; c.Duration > 0 {
		m.p("Churn: %d adds and %d deletes a second for %s s (%d adds, %d deletes; add → ack p50/p99 %s ms) while %d pods "+
			"that stay open connections through the daemon: %s ok, %s failed; %d long-lived connections held across it, %d lost.",
			c.PerSecond, c.PerSecond, num(c.Duration.Seconds()), c.Adds, c.Dels, pcts(c.AddToAck), c.Stayers,
			commas(c.OK), commas(c.Failed), c.Held, c.HeldLost)
		m.p("")
	}
	for _, note := range n.Notes {
		m.p("%s", note)
		m.p("")
	}
	for _, f := range plots {
		m.p("![%s](%s)", f, f)
		m.p("")
	}
	if h := n.HeapProfile; h != nil {
		m.p("Heap profile at %s pods (`%s`, %s KiB live), top sites by live bytes:", commas(int64(h.Workloads)),
			h.File, num(h.Summary.InuseKiB))
		m.p("")
		var rows [][]string
		for _, f := range h.Summary.Flat {
			rows = append(rows, []string{"`" + shortFunc(f.Name) + "`", num(f.KiB), fmt.Sprintf("%.1f%%", 100*f.Share)})
		}
		m.table(1, []string{"allocated in", "KiB", "share"}, rows)
	}
	if len(n.Goroutines) > 0 {
		m.p("Goroutines at the largest pod count, by where they wait (the biggest groups):")
		m.p("")
		var rows [][]string
		for _, g := range n.Goroutines {
			rows = append(rows, []string{commas(int64(g.Count)), "`" + g.Where + "`"})
		}
		m.table(1, []string{"goroutines", "stack (top frames)"}, rows)
	}
	return m.Bytes()
}

func writeNodePlots(dir string, n *Node) ([]string, error) {
	if len(n.Points) == 0 {
		return nil, nil
	}
	cost := plot.New()
	cost.Title.Text = "Daemon cost per served pod"
	cost.X.Label.Text = "pods"
	cost.Y.Label.Text = "bytes per pod above the daemon with none"
	var rss, anon, heap plotter.XYs
	for _, p := range n.Points {
		r, h, _, _ := n.PerPod(p)
		rss = append(rss, plotter.XY{X: float64(p.Pods), Y: r})
		anon = append(anon, plotter.XY{X: float64(p.Pods), Y: n.AnonPerPod(p)})
		heap = append(heap, plotter.XY{X: float64(p.Pods), Y: h})
	}
	if err := addLine(cost, rss, 0, "RSS"); err != nil {
		return nil, err
	}
	if err := addLine(cost, anon, 1, "anonymous RSS"); err != nil {
		return nil, err
	}
	if err := addLine(cost, heap, 2, "Go heap + stacks"); err != nil {
		return nil, err
	}
	goal := plotter.NewFunction(func(float64) float64 { return NodeGoalBytesPerPod })
	goal.Dashes = []vg.Length{vg.Points(4), vg.Points(4)}
	cost.Add(goal)
	cost.Legend.Add("goal (16 KiB)", goal)
	cost.Y.Min = 0
	if err := saveLines(cost, dir, PlotNodeCost, false); err != nil {
		return nil, err
	}

	lat := plot.New()
	lat.Title.Text = "Pod add latency against pod count"
	lat.X.Label.Text = "pods"
	lat.Y.Label.Text = "ms"
	err := addDurationLines(lat, n.Points, func(p NodePoint) float64 { return float64(p.Pods) }, []durationSeries[NodePoint]{
		{"add → ack p50", func(p NodePoint) time.Duration { return p.AddToAck.P50 }},
		{"add → ack p99", func(p NodePoint) time.Duration { return p.AddToAck.P99 }},
		{"add → serving p50", func(p NodePoint) time.Duration { return p.AddToServing.P50 }},
		{"add → serving p99", func(p NodePoint) time.Duration { return p.AddToServing.P99 }},
	})
	if err != nil {
		return nil, err
	}
	lat.Y.Min = 0
	if err := saveLines(lat, dir, PlotNodeLatency, true); err != nil {
		return nil, err
	}
	return []string{PlotNodeCost, PlotNodeLatency}, nil
}
