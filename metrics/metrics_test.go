package metrics

import (
	"bufio"
	"bytes"
	"math"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// scrape renders g in the Prometheus text format and parses it back, as a
// scraper would.
func scrape(t testing.TB, g prometheus.Gatherer) map[string]*dto.MetricFamily {
	t.Helper()
	fams, err := g.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	var buf bytes.Buffer
	enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, f := range fams {
		if err := enc.Encode(f); err != nil {
			t.Fatalf("encode %s: %v", f.GetName(), err)
		}
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	out, err := p.TextToMetricFamilies(&buf)
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	return out
}

func labelMap(m *dto.Metric) map[string]string {
	out := make(map[string]string, len(m.GetLabel()))
	for _, lp := range m.GetLabel() {
		out[lp.GetName()] = lp.GetValue()
	}
	return out
}

// sum adds the values of family name's samples whose labels include want.
// ok is false when no sample matches.
func sum(fams map[string]*dto.MetricFamily, name string, want map[string]string) (total float64, ok bool) {
	f := fams[name]
	if f == nil {
		return 0, false
	}
next:
	for _, m := range f.GetMetric() {
		got := labelMap(m)
		for k, v := range want {
			if got[k] != v {
				continue next
			}
		}
		ok = true
		switch {
		case m.Counter != nil:
			total += m.Counter.GetValue()
		case m.Gauge != nil:
			total += m.Gauge.GetValue()
		case m.Untyped != nil:
			total += m.Untyped.GetValue()
		case m.Histogram != nil:
			total += float64(m.Histogram.GetSampleCount())
		}
	}
	return total, ok
}

type goldenFamily struct {
	name, typ string
	labels    []string
}

func readGolden(t *testing.T) []goldenFamily {
	t.Helper()
	f, err := os.Open("testdata/families.golden")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []goldenFamily
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		parts := strings.Fields(line)
		if len(parts) != 3 {
			t.Fatalf("golden line %q: want 3 fields", line)
		}
		g := goldenFamily{name: parts[0], typ: parts[1]}
		if parts[2] != "-" {
			g.labels = strings.Split(parts[2], ",")
		}
		out = append(out, g)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// exerciseAll records one sample in every family, so that families which
// appear only once used are exposed.
func exerciseAll(m *Metrics) {
	var recv, sent atomic.Int64
	l := ConnLabels{Reporter: ReporterSource, SecurityPolicy: SecurityMutualTLS}
	m.ConnOpened(&l, &recv, &sent).Closed(FlagConnect)
	m.SocketOpened(ReporterDestination)
	m.OnDemandDNS(&Workload{WorkloadName: "w"}, "example.com")
	m.CRLRejected(ReporterDestination)
	m.CRLUntracked(ReporterSource)
	m.CRLLoadFailed()
	m.FDBudgetRefused("inbound_plaintext", "peer")
	m.HBONEPeerRefused("handshakes")
	m.DNSRefused("udp")
	m.XDSConnectionTerminated(XDSReconnect)
	m.XDSMessage("type.googleapis.com/istio.workload.Address", 100)
	dl := DNSLabels{QueryType: "a", Protocol: "udp"}
	m.DNSRequest(dl)
	m.DNSUpstreamRequest(dl)
	m.DNSUpstreamFailure(dl)
	m.DNSUpstreamDuration(dl, 3*time.Millisecond)
	m.ProxyStarted()
	m.ProxyStopped()
	m.SetActiveProxies(2)
	m.SetPendingProxies(1)
	m.AdminConnRefused("readiness", "peer")
}

func TestFamiliesMatchGolden(t *testing.T) {
	m := New(Config{IstioVersion: "1.27.0"})
	exerciseAll(m)
	fams := scrape(t, m.Gatherer())
	golden := readGolden(t)
	listed := map[string]bool{}
	for _, g := range golden {
		listed[g.name] = true
		f := fams[g.name]
		if f == nil {
			t.Errorf("family %s is not exposed", g.name)
			continue
		}
		if got := strings.ToLower(f.GetType().String()); got != g.typ {
			t.Errorf("family %s: type %s, want %s", g.name, got, g.typ)
		}
		want := slices.Sorted(slices.Values(g.labels))
		for _, metric := range f.GetMetric() {
			var got []string
			for _, lp := range metric.GetLabel() {
				got = append(got, lp.GetName())
			}
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Errorf("family %s: labels %v, want %v", g.name, got, want)
				break
			}
		}
	}
	for name := range fams {
		if !listed[name] && !strings.HasPrefix(name, "go_") && !strings.HasPrefix(name, "process_") {
			t.Errorf("family %s is exposed but not in testdata/families.golden", name)
		}
	}
}

// TestHelpMarksUnstable keeps ztunnel's convention (tests/direct.rs): the
// help text of every family but the stable ones says "(unstable)".
func TestHelpMarksUnstable(t *testing.T) {
	m := New(Config{})
	exerciseAll(m)
	stable := map[string]bool{
		"istio_build": true, "istio_tcp_connections_opened_total": true, "istio_tcp_connections_closed_total": true,
		"istio_tcp_received_bytes_total": true, "istio_tcp_sent_bytes_total": true,
	}
	for name, f := range scrape(t, m.Gatherer()) {
		if strings.HasPrefix(name, "go_") || strings.HasPrefix(name, "process_") {
			continue
		}
		if unstable := strings.Contains(f.GetHelp(), "(unstable)"); unstable == stable[name] {
			t.Errorf("%s: help %q: stable=%v", name, f.GetHelp(), stable[name])
		}
	}
}

func TestBuildAndProcess(t *testing.T) {
	for _, tc := range []struct{ version, tag string }{{"", "unknown"}, {"1.27.1", "1.27.1"}} {
		fams := scrape(t, New(Config{IstioVersion: tc.version}).Gatherer())
		if v, ok := sum(fams, "istio_build", map[string]string{"component": "ztunnel", "tag": tc.tag}); !ok || v != 1 {
			t.Errorf("istio_build{tag=%q} = %v, %v; want 1", tc.tag, v, ok)
		}
		for _, name := range []string{"process_open_fds", "process_max_fds"} {
			if v, ok := sum(fams, name, nil); !ok || v <= 0 {
				t.Errorf("%s = %v, %v; want > 0", name, v, ok)
			}
		}
		if _, ok := fams["go_goroutines"]; !ok {
			t.Error("no Go runtime metrics (go_goroutines)")
		}
		// Families with no sample yet are left out, as ztunnel does.
		if _, ok := fams["istio_tcp_connections_opened_total"]; ok {
			t.Error("istio_tcp_connections_opened_total exposed before any connection")
		}
	}
}

func TestOtherFamiliesValues(t *testing.T) {
	m := New(Config{})
	src := &Workload{WorkloadName: "sleep", CanonicalName: "sleep", CanonicalRevision: "v1", Namespace: "default",
		Identity: "spiffe://cluster.local/ns/default/sa/sleep", ClusterID: "Kubernetes"}
	m.OnDemandDNS(src, "db.example.com")
	m.OnDemandDNS(nil, "")
	m.XDSMessage("type.googleapis.com/istio.workload.Address", 300)
	m.XDSMessage("type.googleapis.com/istio.workload.Address", 200)
	m.SocketOpened(ReporterSource)
	m.SocketOpened(ReporterSource)
	m.SocketClosed(ReporterSource)
	m.DNSUpstreamDuration(DNSLabels{Protocol: "tcp"}, 2*time.Second)
	fams := scrape(t, m.Gatherer())
	checks := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"istio_on_demand_dns_total", map[string]string{"source_workload": "sleep", "source_principal": "spiffe://cluster.local/ns/default/sa/sleep",
			"source_app": "sleep", "source_version": "v1", "source_cluster": "Kubernetes", "hostname": "db.example.com"}, 1},
		{"istio_on_demand_dns_total", map[string]string{"source_workload": "unknown", "hostname": "unknown"}, 1},
		{"istio_xds_message_total", map[string]string{"url": "type.googleapis.com/istio.workload.Address"}, 2},
		{"istio_xds_message_bytes_total", map[string]string{"url": "type.googleapis.com/istio.workload.Address"}, 500},
		{"istio_tcp_sockets_open", map[string]string{"reporter": "source"}, 1},
		{"istio_tcp_sockets_open", map[string]string{"reporter": "destination"}, 0},
		{"istio_dns_upstream_request_duration_seconds", map[string]string{"request_query_type": "unknown", "request_protocol": "tcp"}, 1},
	}
	for _, c := range checks {
		if got, ok := sum(fams, c.name, c.labels); !ok || got != c.want {
			t.Errorf("%s%v = %v (found %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
	h := fams["istio_dns_upstream_request_duration_seconds"].GetMetric()[0].GetHistogram()
	var bounds []float64
	for _, b := range h.GetBucket() {
		if !math.IsInf(b.GetUpperBound(), 1) { // the text format spells out +Inf
			bounds = append(bounds, b.GetUpperBound())
		}
	}
	if !slices.Equal(bounds, DNSUpstreamBuckets) {
		t.Errorf("buckets %v, want %v", bounds, DNSUpstreamBuckets)
	}
}

func TestNilMetricsIsANoOp(t *testing.T) {
	var m *Metrics
	var n atomic.Int64
	c := m.ConnOpened(&ConnLabels{}, &n, &n)
	c.Closed(FlagDeny)
	exerciseAll(m)
}
