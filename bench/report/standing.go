package report

import (
	"fmt"
	"slices"
)

// The report's first table: against the peer a user would pick instead
// (HAProxy) and the Go baseline of each path, where the shipped daemon
// stands, metric by metric, as ratios measured side by side in this run.

// standingPeers are, per path, the HAProxy peer and the Go baseline the
// daemon is held against, by config key, in order of preference (the first
// one the run measured is used); captured is the HAProxy peer in the
// daemons' places, behind the pods' capture rules, where the run has one
// (a row of its own: the like-for-like peer).
var standingPeers = map[string]struct{ haproxy, captured, baseline []string }{
	GroupTCP:    {haproxy: []string{KeyHAProxySplice, KeyHAProxy}, baseline: []string{KeyCopyCaptured, KeyCopy}},
	GroupHBONE1: {haproxy: []string{KeyHAProxyTLS}, captured: []string{KeyHAProxyTLSCaptured}, baseline: []string{KeyH2, KeyTLS}},
	GroupHBONE2: {haproxy: []string{KeyHAProxyPair}, captured: []string{KeyHAProxyPairCaptured}, baseline: []string{KeyH2, KeyCopyPair}},
}

// shippedBackends are the backend names of the daemon as it ships (the
// engine ZTUNNEL_ENGINE=auto picks, with the other defaults): the row the
// first table speaks for.
var shippedBackends = []string{"epoll", "auto", "default", "block", "loop"}

// shippedDaemon is the daemon config of group the first table speaks for:
// the shipped backend's, else the run's first daemon config.
func shippedDaemon(r *Run, group string) (Config, bool) {
	var first *Config
	for i, c := range r.Configs {
		if !c.Daemon || c.Group != group {
			continue
		}
		if slices.Contains(shippedBackends, c.Backend) {
			return c, true
		}
		if first == nil {
			first = &r.Configs[i]
		}
	}
	if first == nil {
		return Config{}, false
	}
	return *first, true
}

// peerConfig is the first of keys group measured.
func peerConfig(r *Run, group string, keys []string) (Config, bool) {
	for _, k := range keys {
		for _, c := range r.Configs {
			if c.ID == ConfigID(group, k) {
				return c, true
			}
		}
	}
	return Config{}, false
}

// standingMetric is one column of the first table.
type standingMetric struct {
	head   string
	value  func(st *Stats, id string) float64
	higher bool // higher is better
}

// writeStanding writes "Where we stand".
func writeStanding(m *md, r *Run, st *Stats) {
	rr1 := ""
	if len(r.Settings.RRSizes) > 0 {
		rr1 = RRMetric(r.Settings.RRSizes[0])
	}
	metrics := []standingMetric{
		{"Gbit/s, 1 stream", func(st *Stats, id string) float64 { return st.Get(id, MetricTput1, FieldGbps).Median }, true},
		{"cores per Gbit/s", func(st *Stats, id string) float64 { return st.Get(id, MetricTput1, FieldCoresPerGbps).Median }, false},
		{"RR p50", func(st *Stats, id string) float64 { return st.Get(id, rr1, FieldP50).Median }, false},
		{"RR p99", func(st *Stats, id string) float64 { return st.Get(id, rr1, FieldP99).Median }, false},
		{"new conns/s ¹", func(st *Stats, id string) float64 { return st.Get(id, MetricCPS, FieldPerSecond).Median }, true},
		{"idle KiB per conn ¹", func(st *Stats, id string) float64 {
			if i, ok := idleOf(r, id); ok {
				return i.PerConn().RSSKiB
			}
			return 0
		}, false},
	}
	head := []string{"Path", "ztunnel-go, against"}
	for _, mt := range metrics {
		head = append(head, mt.head)
	}
	var rows [][]string
	for _, g := range []string{GroupTCP, GroupHBONE1, GroupHBONE2} {
		ours, ok := shippedDaemon(r, g)
		if !ok {
			continue
		}
		peers := standingPeers[g]
		for _, against := range []struct {
			keys []string
		}{{peers.haproxy}, {peers.captured}, {peers.baseline}} {
			peer, ok := peerConfig(r, g, against.keys)
			if !ok {
				continue
			}
			row := []string{fmt.Sprintf("%s (%s)", g, ours.Backend), peer.Proxy}
			for _, mt := range metrics {
				row = append(row, standingCell(mt.value(st, ours.ID), mt.value(st, peer.ID), mt.higher))
			}
			rows = append(rows, row)
		}
	}
	if len(rows) == 0 {
		return
	}
	m.p("## Where we stand")
	m.p("")
	m.p("The daemon as it ships (the row's backend) against the peer a user would pick instead and the Go baseline of each path, measured side by side in this run: each cell is ztunnel-go's figure divided by the peer's, **bold** where ztunnel-go is ahead (higher throughput and connection rate, lower latency, CPU and memory). The tables below give the figures.")
	m.p("")
	m.table(2, head, rows)
	m.p("¹ HBONE paths: ztunnel-go carries each new connection as a stream on a pooled mTLS connection (one TLS handshake per pooled connection, up to 100 streams each), as ztunnel does; HAProxy and the raw TLS terminator make a TLS handshake per connection. The connection rate and the idle memory per connection compare those two designs, not two implementations of one.")
	m.p("")
}

// standingCell is ours/peer as "0.86×", bold when ours is ahead.
func standingCell(ours, peer float64, higher bool) string {
	if ours <= 0 || peer <= 0 {
		return "—"
	}
	ratio := ours / peer
	s := fmt.Sprintf("%.2f×", ratio)
	if (higher && ratio > 1) || (!higher && ratio < 1) {
		return "**" + s + "**"
	}
	return s
}
