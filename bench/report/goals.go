package report

import (
	"fmt"
	"math"
	"sort"
)

// Keys of the peers' configs; a config's ID is ConfigID(group, key).
const (
	KeyDirect        = "direct"
	KeyCopy          = "copy"
	KeyCopyCaptured  = "copy-captured"
	KeyHAProxySplice = "haproxy-splice"
	KeyHAProxy       = "haproxy"
	KeyTLS           = "tls"
	KeyH2            = "h2-naive"
	KeyCopyPair      = "copy-pair"
	// KeyHAProxyTLS is an HAProxy mTLS terminator (one hop).
	KeyHAProxyTLS = "haproxy-tls"
	// KeyHAProxyTLSCaptured is the terminator in the daemon's place: on
	// 15008 of a pod behind the capture rules, connecting to the app from
	// the client's address as the daemon does.
	KeyHAProxyTLSCaptured = "haproxy-tls-captured"
	// KeyHAProxyPair is a pair of HAProxies tunnelling over mTLS (two hops).
	KeyHAProxyPair = "haproxy-mtls-pair"
	// KeyHAProxyPairCaptured is the same pair in the daemons' places:
	// behind the pods' capture rules, carrying the original destination
	// and source as the daemons do (the like-for-like peer of the
	// daemons' two hops).
	KeyHAProxyPairCaptured = "haproxy-mtls-pair-captured"
)

// DirectID is the ID of the direct baseline.
const DirectID = KeyDirect

// DaemonKey is the key of the daemon's config for an engine backend.
func DaemonKey(backend string) string { return "ztunnel-" + backend }

// ConfigID is the ID of a group's config.
func ConfigID(group, key string) string { return group + "/" + key }

// Goal is one performance goal of the engine (issue 4) or HBONE (issue 5)
// issue, evaluated on a run.
type Goal struct {
	Issue    string `json:"issue"`
	Text     string `json:"text"`
	Target   string `json:"target"`
	Measured string `json:"measured"`
	// Score is 1 when the goal is exactly met, above when beaten, below by
	// the factor still missing (measured/target for "at least" goals,
	// target/measured for "at most" goals). NaN when it could not be
	// measured (a peer was skipped).
	Score float64 `json:"score"`
	// Binary goals (none of something) are met or not; they are not ranked
	// by Score.
	Binary bool `json:"binary,omitempty"`
	// Config is where to look (and which profile explains it).
	Config string `json:"config"`
}

// Met reports whether the goal is met.
func (g Goal) Met() bool { return g.Score >= 1 }

// Measurable reports whether the run had the numbers.
func (g Goal) Measurable() bool { return !math.IsNaN(g.Score) }

// EvaluateGoals checks every goal for the daemon with the given backend.
func EvaluateGoals(r *Run, st *Stats, backend string) []Goal {
	d := DaemonKey(backend)
	pass, one, two := ConfigID(GroupTCP, d), ConfigID(GroupHBONE1, d), ConfigID(GroupHBONE2, d)
	med := func(id, metric string, f func(Sample) float64) float64 {
		s := st.Get(id, metric, f)
		if s.N == 0 || s.Median <= 0 {
			return math.NaN()
		}
		return s.Median
	}
	idle := func(id string) (Idle, bool) {
		for _, i := range r.Idle {
			if i.Config == id {
				return i, true
			}
		}
		return Idle{}, false
	}
	rr1 := ""
	if len(r.Settings.RRSizes) > 0 {
		rr1 = RRMetric(r.Settings.RRSizes[0])
	}
	var goals []Goal
	atLeast := func(issue, text, config string, ratio, target float64) {
		goals = append(goals, Goal{Issue: issue, Text: text, Config: config,
			Target: fmt.Sprintf("≥ %.2f×", target), Measured: fmtRatio(ratio), Score: ratio / target})
	}
	atMost := func(issue, text, config string, ratio, target float64) {
		goals = append(goals, Goal{Issue: issue, Text: text, Config: config,
			Target: fmt.Sprintf("≤ %.2f×", target), Measured: fmtRatio(ratio), Score: target / ratio})
	}
	atMostAbs := func(issue, text, config string, v, target float64, unit string) {
		g := Goal{Issue: issue, Text: text, Config: config, Target: fmt.Sprintf("≤ %g %s", target, unit),
			Measured: fmt.Sprintf("%.2f %s", v, unit), Score: math.NaN()}
		if !math.IsNaN(v) {
			g.Score = target / math.Max(v, target/10) // at most 10× ahead
		} else {
			g.Measured = "n/a"
		}
		goals = append(goals, g)
	}
	// none checks that connections hold nothing of their own: below
	// shared per connection, which allows for what a pool of shared
	// objects (an HBONE tunnel's reader and writer goroutines, carrying up
	// to 100 connections) amortizes to, and for the daemon's background
	// goroutines coming and going.
	none := func(issue, text, config string, v, shared float64, unit string) {
		g := Goal{Issue: issue, Text: text, Config: config, Target: "0", Binary: true,
			Measured: fmt.Sprintf("%.2f %s", v, unit), Score: math.NaN()}
		switch {
		case math.IsNaN(v) || v < 0:
			g.Measured = "n/a"
		case v < shared:
			g.Score = 1
		default:
			g.Score = 0
		}
		goals = append(goals, g)
	}
	direct := func(id, metric string, f func(Sample) float64) float64 {
		return med(id, metric, f) / med(DirectID, metric, f)
	}
	const i4, i5 = "#4 engine", "#5 HBONE"

	atLeast(i4, "TCP passthrough throughput, 1 stream, vs direct", pass, direct(pass, MetricTput1, FieldGbps), 0.9)
	atLeast(i4, "TCP passthrough throughput, 1 stream, vs HAProxy splice", pass,
		med(pass, MetricTput1, FieldGbps)/med(ConfigID(GroupTCP, KeyHAProxySplice), MetricTput1, FieldGbps), 1.3)
	atMost(i4, "TCP passthrough CPU per Gbit/s vs the Go io.Copy proxy", pass,
		med(pass, MetricTput1, FieldCoresPerGbps)/med(ConfigID(GroupTCP, KeyCopy), MetricTput1, FieldCoresPerGbps), 0.7)
	atLeast(i4, "TCP passthrough connection rate vs direct", pass, direct(pass, MetricCPS, FieldPerSecond), 0.55)
	if rr1 != "" {
		hs := ConfigID(GroupTCP, KeyHAProxySplice)
		atMost(i4, "TCP passthrough RR p50 vs HAProxy splice", pass, med(pass, rr1, FieldP50)/med(hs, rr1, FieldP50), 1)
		atMost(i4, "TCP passthrough RR p99 vs HAProxy splice", pass, med(pass, rr1, FieldP99)/med(hs, rr1, FieldP99), 1)
	}
	if i, ok := idle(pass); ok {
		m := i.MaxPerProc()
		atMostAbs(i4, "idle passthrough connection: daemon RSS", pass, m.RSSKiB, 2, "KiB")
		atMostAbs(i4, "idle passthrough connection: daemon fds", pass, m.FDs, 2, "fds")
		none(i4, "idle passthrough connection holds no goroutine", pass, i.PerConn().Goroutines, 0.05, "goroutines")
	}
	if i, ok := idle(two); ok {
		m := i.MaxPerProc()
		atMostAbs(i4+", "+i5, "idle HBONE-carried connection: RSS per daemon (costlier one)", two, m.RSSKiB, 4, "KiB")
		// Each daemon runs a reader and a writer goroutine per pooled tunnel
		// of up to 100 connections: 4/100 per connection for the pair.
		none(i4, "idle HBONE-carried connection holds no goroutine of its own (both daemons; tunnels' shared)", two, i.PerConn().Goroutines, 4.0/100+0.05, "goroutines")
		if m.HeapCommittedKiB >= 0 && m.RSSKiB > 0 {
			atMost(i5, "idle tunnelled connection: committed heap vs RSS (costlier daemon)", two, math.Max(m.HeapCommittedKiB, 0.01)/m.RSSKiB, 2)
		}
	}

	atLeast(i5, "two hops throughput, 1 stream, vs direct", two, direct(two, MetricTput1, FieldGbps), 0.35)
	atLeast(i5, "two hops throughput, 1 stream, vs naive Go HBONE (x/net/http2 pair)", two,
		med(two, MetricTput1, FieldGbps)/med(ConfigID(GroupHBONE2, KeyH2), MetricTput1, FieldGbps), 2.7)
	atLeast(i5, "one hop throughput, 1 stream, vs raw Go TLS 1.3", one,
		med(one, MetricTput1, FieldGbps)/med(ConfigID(GroupHBONE1, KeyTLS), MetricTput1, FieldGbps), 0.9)
	if rr1 != "" {
		h2 := ConfigID(GroupHBONE2, KeyH2)
		atMost(i5, "two hops RR p50 vs naive Go HBONE", two, med(two, rr1, FieldP50)/med(h2, rr1, FieldP50), 0.5)
		atMost(i5, "two hops RR p99 vs naive Go HBONE", two, med(two, rr1, FieldP99)/med(h2, rr1, FieldP99), 0.5)
		cp := ConfigID(GroupHBONE2, KeyCopyPair)
		added := func(id string, f func(Sample) float64) float64 {
			return math.Max(med(id, rr1, f)-med(DirectID, rr1, f), 1) // at least 1 µs
		}
		atMost(i5, "two hops added RR p50 vs two plain hops' added p50", two, added(two, FieldP50)/added(cp, FieldP50), 1.2)
		atMost(i5, "two hops added RR p99 vs two plain hops' added p99", two, added(two, FieldP99)/added(cp, FieldP99), 1.2)
	}
	atLeast(i5, "two hops connection rate (pooled tunnels) vs direct", two, direct(two, MetricCPS, FieldPerSecond), 0.4)

	// Issue 23: against what an operator would take for a TLS tunnel.
	const i23 = "#23 latency"
	hp, ht := ConfigID(GroupHBONE2, KeyHAProxyPair), ConfigID(GroupHBONE1, KeyHAProxyTLS)
	vs := func(id, peer, metric string, f func(Sample) float64) float64 {
		return med(id, metric, f) / med(peer, metric, f)
	}
	if rr1 != "" {
		atMost(i23, "two hops RR p50 vs HAProxy mTLS pair", two, vs(two, hp, rr1, FieldP50), 1)
		atMost(i23, "two hops RR p99 vs HAProxy mTLS pair", two, vs(two, hp, rr1, FieldP99), 1)
		atMost(i23, "one hop RR p50 vs HAProxy mTLS terminator", one, vs(one, ht, rr1, FieldP50), 1)
		atMost(i23, "one hop RR p99 vs HAProxy mTLS terminator", one, vs(one, ht, rr1, FieldP99), 1)
	}
	atLeast(i23, "two hops throughput, 1 stream, vs HAProxy mTLS pair", two, vs(two, hp, MetricTput1, FieldGbps), 1.3)
	atMost(i23, "two hops CPU per Gbit/s vs HAProxy mTLS pair", two, vs(two, hp, MetricTput1, FieldCoresPerGbps), 0.75)
	atLeast(i23, "two hops connection rate vs HAProxy mTLS pair", two, vs(two, hp, MetricCPS, FieldPerSecond), 2)
	// The pair's cores summed against the HAProxy pair's: both pairs are a
	// client side and a server side doing the same work per request.
	atMost(i23, "two hops CPU at a fixed rate vs HAProxy mTLS pair", two, vs(two, hp, MetricFixedRate, FieldCores), 0.7)
	if i, ok := idle(two); ok {
		atMostAbs(i23, "idle HBONE-carried connection, tighter: RSS per daemon (costlier one)", two, i.MaxPerProc().RSSKiB, 3, "KiB")
	}
	return goals
}

// RankGoals orders goals worst first: measurable ranked goals by score,
// then binary goals (unmet first), then the unmeasurable.
func RankGoals(goals []Goal) []Goal {
	out := append([]Goal(nil), goals...)
	rank := func(g Goal) (int, float64) {
		switch {
		case !g.Measurable():
			return 2, 0
		case g.Binary:
			return 1, g.Score
		}
		return 0, g.Score
	}
	sort.SliceStable(out, func(i, j int) bool {
		ri, si := rank(out[i])
		rj, sj := rank(out[j])
		if ri != rj {
			return ri < rj
		}
		return si < sj
	})
	return out
}

func fmtRatio(r float64) string {
	if math.IsNaN(r) || math.IsInf(r, 0) {
		return "n/a"
	}
	return fmt.Sprintf("%.2f×", r)
}
