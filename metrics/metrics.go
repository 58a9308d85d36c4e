package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Config configures the metric set.
type Config struct {
	// IstioVersion is the tag label of istio_build: the Istio release this
	// daemon stands in for (ztunnel reads ISTIO_META_ISTIO_VERSION). ""
	// reports "unknown", as ztunnel does.
	IstioVersion string
}

// Metrics is the daemon's metric set and the registry that exposes it. All
// methods are safe for concurrent use, and all are no-ops on a nil
// *Metrics, so a component built without metrics needs no special case.
type Metrics struct {
	reg     *prometheus.Registry
	traffic *traffic

	socketsOpen [2]prometheus.Gauge // by Reporter

	onDemandDNS    *prometheus.CounterVec
	crlRejections  *prometheus.CounterVec
	crlUntracked   *prometheus.CounterVec
	crlFailures    *prometheus.CounterVec
	xdsTerminated  *prometheus.CounterVec
	xdsMessages    *prometheus.CounterVec
	xdsBytes       *prometheus.CounterVec
	dnsRequests    *prometheus.CounterVec
	dnsUpstream    *prometheus.CounterVec
	dnsFailures    *prometheus.CounterVec
	dnsUpstreamDur *prometheus.HistogramVec
	fdRefusals     *prometheus.CounterVec
	peerRefusals   *prometheus.CounterVec
	dnsRefused     *prometheus.CounterVec

	activeProxies  prometheus.Gauge
	pendingProxies prometheus.Gauge
	proxiesStarted prometheus.Counter
	proxiesStopped prometheus.Counter

	adminRefused *prometheus.CounterVec
}

// dnsLabelNames is the label set of the istio_dns_* families.
var dnsLabelNames = []string{"request_query_type", "request_protocol", "source_canonical_service", "source_canonical_revision"}

// onDemandLabelNames is the label set of istio_on_demand_dns_total.
var onDemandLabelNames = []string{
	"source_workload", "source_canonical_service", "source_canonical_revision", "source_workload_namespace",
	"source_principal", "source_app", "source_version", "source_cluster", "hostname",
}

// DNSUpstreamBuckets are the bucket bounds of
// istio_dns_upstream_request_duration_seconds, ztunnel's.
var DNSUpstreamBuckets = []float64{0.0005, 0.001, 0.01, 0.1, 1, 5}

// New builds the metric set in a registry of its own: the Istio families,
// istio_build set to 1, the process collector (process_open_fds,
// process_max_fds and the other process_* gauges) and the Go runtime
// collector (go_*), which stands in for ztunnel's tokio_* runtime metrics.
//
// Families are exposed once they have a sample, as in ztunnel: a counter
// family with no label set yet used does not appear. The unlabelled
// workload_manager_* families and istio_tcp_sockets_open appear from the
// start, at zero.
func New(cfg Config) *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry(), traffic: newTraffic()}
	counterVec := func(name, help string, labels []string) *prometheus.CounterVec {
		v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
		m.reg.MustRegister(v)
		return v
	}
	reporter := []string{"reporter"}

	sockets := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "istio_tcp_sockets_open", Help: "Open TCP sockets accepted by the proxies (unstable)."}, reporter)
	m.reg.MustRegister(sockets)
	m.socketsOpen[ReporterSource] = sockets.WithLabelValues(ReporterSource.String())
	m.socketsOpen[ReporterDestination] = sockets.WithLabelValues(ReporterDestination.String())

	m.onDemandDNS = counterVec("istio_on_demand_dns_total", "Requests that needed an on-demand DNS lookup of a workload hostname (unstable).", onDemandLabelNames)
	m.crlRejections = counterVec("istio_crl_policy_rejections_total", "Connections refused because a certificate is revoked by the CRL (unstable).", reporter)
	m.crlUntracked = counterVec("istio_crl_untracked_connections_total", "Connections not tracked for CRL enforcement (unstable).", reporter)
	// ztunnel has no such counter (it only logs at debug); a CRL file that
	// stopped loading leaves stale revocations in force, so it is counted.
	m.crlFailures = counterVec("istio_crl_load_failures_total", "CRL file loads that failed; the last good CRLs stay in force (unstable).", nil)
	// ztunnel-go only: the descriptor budget (fdbudget) ztunnel does not have.
	m.dnsRefused = counterVec("ztunnel_go_dns_requests_refused_total", "DNS queries to forward refused for want of capacity (forwarding slots or descriptors), by transport: udp (dropped, the client retries) or tcp (answered SERVFAIL) (unstable).", []string{"transport"})
	m.peerRefusals = counterVec("ztunnel_go_hbone_peer_refusals_total", "Connections on 15008 refused by an opt-in per-source-IP cap (ZTUNNEL_HBONE_MAX_*_PER_PEER), by reason: handshakes or connections (unstable).", []string{"reason"})
	m.fdRefusals = counterVec("ztunnel_go_fd_budget_refusals_total", "Connections and inbound HBONE streams refused by the descriptor budget, by listener and reason: peer (the source IP holds its share) or total (the budget is spent) (unstable).", []string{"listener", "reason"})
	m.xdsTerminated = counterVec("istio_xds_connection_terminations_total", "Ended connections to the xDS server, by reason (unstable).", []string{"reason"})
	m.xdsMessages = counterVec("istio_xds_message_total", "xDS messages received, by type URL (unstable).", []string{"url"})
	m.xdsBytes = counterVec("istio_xds_message_bytes_total", "Bytes of xDS resources received, by type URL (unstable).", []string{"url"})
	m.dnsRequests = counterVec("istio_dns_requests_total", "DNS requests received by the DNS proxy (unstable).", dnsLabelNames)
	m.dnsUpstream = counterVec("istio_dns_upstream_requests_total", "DNS requests forwarded to an upstream resolver (unstable).", dnsLabelNames)
	m.dnsFailures = counterVec("istio_dns_upstream_failures_total", "DNS requests whose forwarding upstream failed (unstable).", dnsLabelNames)
	m.dnsUpstreamDur = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "istio_dns_upstream_request_duration_seconds", Help: "Time taken by upstream resolvers to answer forwarded DNS requests (unstable).",
		Buckets: DNSUpstreamBuckets,
	}, dnsLabelNames)
	m.reg.MustRegister(m.dnsUpstreamDur)

	m.activeProxies = prometheus.NewGauge(prometheus.GaugeOpts{Name: "workload_manager_active_proxy_count", Help: "Workloads with a running proxy (unstable)."})
	m.pendingProxies = prometheus.NewGauge(prometheus.GaugeOpts{Name: "workload_manager_pending_proxy_count", Help: "Workloads whose proxy is waiting to start (unstable)."})
	m.proxiesStarted = prometheus.NewCounter(prometheus.CounterOpts{Name: "workload_manager_proxies_started_total", Help: "Workload proxies started (unstable)."})
	m.proxiesStopped = prometheus.NewCounter(prometheus.CounterOpts{Name: "workload_manager_proxies_stopped_total", Help: "Workload proxies stopped (unstable)."})
	m.reg.MustRegister(m.activeProxies, m.pendingProxies, m.proxiesStarted, m.proxiesStopped)
	// ztunnel's servers have no connection caps, so no such family: ours
	// carries the project's prefix rather than istio_.
	m.adminRefused = counterVec("ztunnel_go_admin_connections_refused_total",
		"Connections refused at accept by the admin (15000), metrics (15020) and readiness (15021) servers, by server and cap (unstable).",
		[]string{"listener", "reason"})

	tag := cfg.IstioVersion
	if tag == "" {
		tag = "unknown"
	}
	build := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "istio_build", Help: "Build information of the Istio component."}, []string{"component", "tag"})
	build.WithLabelValues("ztunnel", tag).Set(1)

	m.reg.MustRegister(build,
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		collectors.NewGoCollector())
	return m
}

// Gatherer is what the metrics server on 15020 exposes.
func (m *Metrics) Gatherer() prometheus.Gatherer { return gatherer{reg: m.reg, traffic: m.traffic} }

// Registerer lets other packages add families of their own to the same
// exposition. The istio_tcp_* counter names are taken (they are served
// beside the registry, not through it).
func (m *Metrics) Registerer() prometheus.Registerer { return m.reg }

// SocketOpened counts a socket accepted by a proxy listener
// (istio_tcp_sockets_open); SocketClosed undoes it. Unlike ConnOpened it
// counts every accepted socket, including those refused before a route
// was decided.
func (m *Metrics) SocketOpened(r Reporter) {
	if m != nil {
		m.socketsOpen[r&1].Inc()
	}
}

// SocketClosed is the counterpart of SocketOpened.
func (m *Metrics) SocketClosed(r Reporter) {
	if m != nil {
		m.socketsOpen[r&1].Dec()
	}
}

// OnDemandDNS counts a connection whose destination workload had only a
// hostname, resolved on demand (istio_on_demand_dns_total). src is the
// source workload (its principal is its identity here, as in ztunnel).
func (m *Metrics) OnDemandDNS(src *Workload, hostname string) {
	if m == nil {
		return
	}
	var w Workload
	if src != nil {
		w = *src
	}
	m.onDemandDNS.WithLabelValues(orUnknown(w.WorkloadName), orUnknown(w.CanonicalName), orUnknown(w.CanonicalRevision),
		orUnknown(w.Namespace), orUnknown(w.Identity), orUnknown(w.CanonicalName), orUnknown(w.CanonicalRevision),
		orUnknown(w.ClusterID), orUnknown(hostname)).Inc()
}

// CRLRejected counts a connection refused because a peer certificate is
// revoked (istio_crl_policy_rejections_total).
func (m *Metrics) CRLRejected(r Reporter) {
	if m != nil {
		m.crlRejections.WithLabelValues(r.String()).Inc()
	}
}

// CRLLoadFailed counts a CRL file load that failed
// (istio_crl_load_failures_total).
func (m *Metrics) CRLLoadFailed() {
	if m != nil {
		m.crlFailures.WithLabelValues().Inc()
	}
}

// CRLUntracked counts a connection not tracked for CRL enforcement
// (istio_crl_untracked_connections_total).
func (m *Metrics) CRLUntracked(r Reporter) {
	if m != nil {
		m.crlUntracked.WithLabelValues(r.String()).Inc()
	}
}

// FDBudgetRefused counts a connection or an inbound HBONE stream the
// descriptor budget refused (ztunnel_go_fd_budget_refusals_total): listener is
// the listener's name (outbound, inbound_plaintext, inbound_hbone, socks5,
// dns) or inbound_hbone_stream for a stream, reason "peer" or "total".
func (m *Metrics) FDBudgetRefused(listener, reason string) {
	if m != nil {
		m.fdRefusals.WithLabelValues(listener, reason).Inc()
	}
}

// DNSRefused counts a DNS query to forward that the proxy refused for want
// of capacity (ztunnel_go_dns_requests_refused_total): transport "udp" (it
// was dropped) or "tcp" (answered SERVFAIL).
func (m *Metrics) DNSRefused(transport string) {
	if m != nil {
		m.dnsRefused.WithLabelValues(transport).Inc()
	}
}

// HBONEPeerRefused counts a connection on 15008 refused by an opt-in
// per-source-IP cap (ztunnel_go_hbone_peer_refusals_total): reason is
// "handshakes" or "connections".
func (m *Metrics) HBONEPeerRefused(reason string) {
	if m != nil {
		m.peerRefusals.WithLabelValues(reason).Inc()
	}
}

// XDSTermination is why a connection to the xDS server ended: the reason
// label of istio_xds_connection_terminations_total.
type XDSTermination string

// The reasons ztunnel reports.
const (
	XDSConnectionError XDSTermination = "ConnectionError" // the connection could not be made or broke
	XDSError           XDSTermination = "Error"           // the stream failed
	XDSReconnect       XDSTermination = "Reconnect"       // the server asked for a reconnect
	XDSComplete        XDSTermination = "Complete"        // the stream ended cleanly
)

// XDSConnectionTerminated counts an ended xDS connection.
func (m *Metrics) XDSConnectionTerminated(reason XDSTermination) {
	if m != nil {
		m.xdsTerminated.WithLabelValues(string(reason)).Inc()
	}
}

// XDSMessage counts one received xDS response of typeURL carrying
// resourceBytes bytes of resources (istio_xds_message_total and
// istio_xds_message_bytes_total).
func (m *Metrics) XDSMessage(typeURL string, resourceBytes int) {
	if m == nil {
		return
	}
	m.xdsMessages.WithLabelValues(typeURL).Inc()
	m.xdsBytes.WithLabelValues(typeURL).Add(float64(resourceBytes))
}

// DNSLabels is the label set of the istio_dns_* families.
type DNSLabels struct {
	QueryType               string // lower case: "a", "aaaa", ...; "" = unknown
	Protocol                string // "udp" or "tcp"
	SourceCanonicalService  string
	SourceCanonicalRevision string
}

func (l *DNSLabels) values() []string {
	return []string{orUnknown(l.QueryType), l.Protocol, orUnknown(l.SourceCanonicalService), orUnknown(l.SourceCanonicalRevision)}
}

// DNSRequest counts a request received by the DNS proxy.
func (m *Metrics) DNSRequest(l DNSLabels) {
	if m != nil {
		m.dnsRequests.WithLabelValues(l.values()...).Inc()
	}
}

// DNSUpstreamRequest counts a request forwarded upstream.
func (m *Metrics) DNSUpstreamRequest(l DNSLabels) {
	if m != nil {
		m.dnsUpstream.WithLabelValues(l.values()...).Inc()
	}
}

// DNSUpstreamFailure counts a forwarded request that failed.
func (m *Metrics) DNSUpstreamFailure(l DNSLabels) {
	if m != nil {
		m.dnsFailures.WithLabelValues(l.values()...).Inc()
	}
}

// DNSUpstreamDuration records how long an upstream resolver took.
func (m *Metrics) DNSUpstreamDuration(l DNSLabels, d time.Duration) {
	if m != nil {
		m.dnsUpstreamDur.WithLabelValues(l.values()...).Observe(d.Seconds())
	}
}

// ProxyStarted counts a workload proxy started by the in-pod manager.
func (m *Metrics) ProxyStarted() {
	if m != nil {
		m.proxiesStarted.Inc()
	}
}

// ProxyStopped counts a workload proxy stopped by the in-pod manager.
func (m *Metrics) ProxyStopped() {
	if m != nil {
		m.proxiesStopped.Inc()
	}
}

// SetActiveProxies sets the number of workloads with a running proxy.
func (m *Metrics) SetActiveProxies(n int) {
	if m != nil {
		m.activeProxies.Set(float64(n))
	}
}

// SetPendingProxies sets the number of workloads whose proxy waits to start.
func (m *Metrics) SetPendingProxies(n int) {
	if m != nil {
		m.pendingProxies.Set(float64(n))
	}
}

// AdminConnRefused counts a connection the admin, stats or readiness server
// (listener) refused at accept over its per-peer or total cap (reason:
// "peer" or "total"; ztunnel_go_admin_connections_refused_total).
func (m *Metrics) AdminConnRefused(listener, reason string) {
	if m != nil {
		m.adminRefused.WithLabelValues(listener, reason).Inc()
	}
}
