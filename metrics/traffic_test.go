package metrics

import (
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func outboundLabels() ConnLabels {
	var l ConnLabels
	l.Reporter = ReporterSource
	l.SecurityPolicy = SecurityMutualTLS
	l.SetPeerSource(&Peer{Identity: "spiffe://cluster.local/ns/default/sa/sleep"})
	l.SetSource(&Workload{WorkloadName: "sleep", CanonicalName: "sleep", CanonicalRevision: "v1", Namespace: "default",
		Identity: "spiffe://cluster.local/ns/default/sa/sleep", ClusterID: "Kubernetes", Region: "r1"})
	l.SetDestination(&Workload{WorkloadName: "httpbin", CanonicalName: "httpbin", CanonicalRevision: "v2", Namespace: "apps",
		Identity: "spiffe://cluster.local/ns/apps/sa/httpbin", ClusterID: "Kubernetes", Zone: "z2"})
	l.SetDestinationService("httpbin.apps.svc.cluster.local", "httpbin", "apps")
	return l
}

func TestTrafficLabels(t *testing.T) {
	m := New(Config{})
	l := outboundLabels()
	m.ConnOpened(&l, nil, nil)
	fams := scrape(t, m.Gatherer())
	ms := fams["istio_tcp_connections_opened_total"].GetMetric()
	if len(ms) != 1 {
		t.Fatalf("%d opened series, want 1", len(ms))
	}
	want := map[string]string{
		"reporter":                       "source",
		"source_workload":                "sleep",
		"source_canonical_service":       "sleep",
		"source_canonical_revision":      "v1",
		"source_workload_namespace":      "default",
		"source_principal":               "spiffe://cluster.local/ns/default/sa/sleep",
		"source_app":                     "sleep",
		"source_version":                 "v1",
		"source_cluster":                 "Kubernetes",
		"destination_service":            "httpbin.apps.svc.cluster.local",
		"destination_service_namespace":  "apps",
		"destination_service_name":       "httpbin",
		"destination_workload":           "httpbin",
		"destination_canonical_service":  "httpbin",
		"destination_canonical_revision": "v2",
		"destination_workload_namespace": "apps",
		"destination_principal":          "spiffe://cluster.local/ns/apps/sa/httpbin",
		"destination_app":                "httpbin",
		"destination_version":            "v2",
		"destination_cluster":            "Kubernetes",
		"request_protocol":               "tcp",
		"response_flags":                 "-",
		"connection_security_policy":     "mutual_tls",
		"source_region":                  "r1",
		"source_zone":                    "unknown",
		"destination_region":             "unknown",
		"destination_zone":               "z2",
	}
	got := labelMap(ms[0])
	if len(got) != len(want) {
		t.Errorf("got %d labels, want %d", len(got), len(want))
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s=%q, want %q", k, got[k], v)
		}
	}
}

func TestSetSourceKeepsOnlyProvenPrincipal(t *testing.T) {
	var l ConnLabels
	l.SetSource(&Workload{WorkloadName: "a", Identity: "spiffe://td/ns/x/sa/a"})
	if l.SourcePrincipal != "" {
		t.Errorf("SetSource set the source principal from the record: %q", l.SourcePrincipal)
	}
	l.SetPeerSource(&Peer{WorkloadName: "baggage-name", App: "baggage-app", Identity: "spiffe://td/ns/x/sa/a"})
	l.SetSource(&Workload{WorkloadName: "a", CanonicalName: "app-a"})
	if l.SourcePrincipal != "spiffe://td/ns/x/sa/a" || l.SourceWorkload != "a" || l.SourceApp != "app-a" {
		t.Errorf("record should override the peer's claims but keep its identity: %+v", l)
	}
	var d ConnLabels
	d.SetPeerDestination(&Peer{WorkloadName: "w", App: "svc", Revision: "r"})
	if d.DestinationApp != "w" || d.DestinationCanonicalService != "svc" || d.DestinationVersion != "r" {
		t.Errorf("peer destination: %+v", d)
	}
}

// TestLiveCountersShowProgress is the point of the design: bytes counted
// by an open connection are visible before it closes, and after it closes
// the totals stay and opened equals closed.
func TestLiveCountersShowProgress(t *testing.T) {
	m := New(Config{})
	l := outboundLabels()
	var recv, sent atomic.Int64
	c := m.ConnOpened(&l, &recv, &sent)
	get := func(name string, flags string) float64 {
		t.Helper()
		want := map[string]string{}
		if flags != "" {
			want["response_flags"] = flags
		}
		v, _ := sum(scrape(t, m.Gatherer()), name, want)
		return v
	}
	if got := get("istio_tcp_received_bytes_total", ""); got != 0 {
		t.Fatalf("received before any byte: %v", got)
	}
	recv.Add(1000)
	sent.Add(10)
	if got := get("istio_tcp_received_bytes_total", ""); got != 1000 {
		t.Fatalf("received mid-connection = %v, want 1000", got)
	}
	recv.Add(24)
	sent.Add(5)
	if got := get("istio_tcp_received_bytes_total", ""); got != 1024 {
		t.Fatalf("received later = %v, want 1024", got)
	}
	if got := get("istio_tcp_sent_bytes_total", ""); got != 15 {
		t.Fatalf("sent = %v, want 15", got)
	}
	if got := get("istio_tcp_connections_opened_total", ""); got != 1 {
		t.Fatalf("opened = %v, want 1", got)
	}
	if _, ok := scrape(t, m.Gatherer())["istio_tcp_connections_closed_total"]; ok {
		t.Fatal("closed family exposed while the connection is open")
	}
	c.Closed(FlagNone)
	c.Closed(FlagDeny) // a second close is ignored
	recv.Add(1 << 20)  // and the counters are no longer read
	fams := scrape(t, m.Gatherer())
	for _, tc := range []struct {
		name string
		want float64
	}{
		{"istio_tcp_connections_opened_total", 1},
		{"istio_tcp_connections_closed_total", 1},
		{"istio_tcp_received_bytes_total", 1024},
		{"istio_tcp_sent_bytes_total", 15},
	} {
		if got, _ := sum(fams, tc.name, map[string]string{"response_flags": "-"}); got != tc.want {
			t.Errorf("%s = %v, want %v", tc.name, got, tc.want)
		}
	}
	if _, ok := fams["istio_tcp_connections_failed_total"]; ok {
		t.Error("failed family exposed with no failure")
	}
}

func TestFailedConnectionsCarryTheirFlag(t *testing.T) {
	m := New(Config{})
	l := outboundLabels()
	m.ConnOpened(&l, nil, nil).Closed(FlagNone)
	m.ConnOpened(&l, nil, nil).Closed(FlagConnect)
	m.ConnOpened(&l, nil, nil).Closed(FlagConnect)
	m.ConnOpened(&l, nil, nil).Closed(FlagDeny)
	in := l
	in.Reporter = ReporterDestination
	m.ConnOpened(&in, nil, nil).Closed(FlagCertRevoked)
	fams := scrape(t, m.Gatherer())
	for _, tc := range []struct {
		name, reporter, flags string
		want                  float64
	}{
		{"istio_tcp_connections_opened_total", "source", "-", 4},
		{"istio_tcp_connections_closed_total", "source", "-", 1},
		{"istio_tcp_connections_closed_total", "source", "CONNECT", 2},
		{"istio_tcp_connections_closed_total", "source", "DENY", 1},
		{"istio_tcp_connections_failed_total", "source", "CONNECT", 2},
		{"istio_tcp_connections_failed_total", "source", "DENY", 1},
		{"istio_tcp_connections_opened_total", "destination", "-", 1},
		{"istio_tcp_connections_failed_total", "destination", "CERT_REVOKED", 1},
		{"istio_tcp_received_bytes_total", "source", "-", 0}, // byte series exist from the open
	} {
		got, ok := sum(fams, tc.name, map[string]string{"reporter": tc.reporter, "response_flags": tc.flags})
		if !ok || got != tc.want {
			t.Errorf("%s{reporter=%s,response_flags=%s} = %v (found %v), want %v", tc.name, tc.reporter, tc.flags, got, ok, tc.want)
		}
	}
	if _, ok := sum(fams, "istio_tcp_connections_failed_total", map[string]string{"response_flags": "-"}); ok {
		t.Error("a clean close was counted as failed")
	}
	for _, f := range []ResponseFlags{FlagNone, FlagDeny, FlagConnect, FlagTLSFailure, FlagH2HandshakeFailure, FlagNetworkPolicy, FlagIdentityError, FlagCertRevoked} {
		if f.String() == "" {
			t.Errorf("flag %d has no name", f)
		}
	}
}

// TestTrafficFamiliesAreConsistent runs the directly built families through
// client_golang's merge checks (unique series, valid and unique label names,
// valid UTF-8) and checks the label order a registry would produce.
func TestTrafficFamiliesAreConsistent(t *testing.T) {
	m := New(Config{})
	exerciseAll(m)
	l := outboundLabels()
	m.ConnOpened(&l, nil, nil).Closed(FlagDeny)
	m.ConnOpened(&l, nil, nil)
	g := prometheus.Gatherers{prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) { return m.traffic.gather(), nil })}
	fams, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		for _, mm := range f.GetMetric() {
			names := make([]string, 0, len(mm.GetLabel()))
			for _, lp := range mm.GetLabel() {
				names = append(names, lp.GetName())
			}
			if !slices.IsSorted(names) {
				t.Fatalf("%s: labels not sorted: %v", f.GetName(), names)
			}
		}
	}
}

// TestConcurrentOpenCloseScrape: scrapes racing with connections opening,
// counting and closing never see a counter go backwards (a closing
// connection is counted once, not zero or two times), and the end totals
// are exact.
func TestConcurrentOpenCloseScrape(t *testing.T) {
	m := New(Config{})
	const workers, conns, chunks = 8, 200, 5
	labels := []ConnLabels{outboundLabels(), {Reporter: ReporterDestination}}
	var wg sync.WaitGroup
	done := make(chan struct{})
	scrapeErr := make(chan string, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		var last float64
		for {
			select {
			case <-done:
				return
			default:
			}
			fams, err := m.Gatherer().Gather()
			if err != nil {
				scrapeErr <- err.Error()
				return
			}
			var total float64
			for _, f := range fams {
				if f.GetName() == "istio_tcp_received_bytes_total" {
					for _, mm := range f.GetMetric() {
						total += mm.GetCounter().GetValue()
					}
				}
			}
			if total < last {
				scrapeErr <- "received bytes went backwards"
				return
			}
			last = total
		}
	}()
	var writers sync.WaitGroup
	for w := range workers {
		writers.Add(1)
		go func() {
			defer writers.Done()
			for i := range conns {
				l := labels[(w+i)%len(labels)]
				var recv, sent atomic.Int64
				c := m.ConnOpened(&l, &recv, &sent)
				for range chunks {
					recv.Add(3)
					sent.Add(1)
				}
				c.Closed(FlagNone)
			}
		}()
	}
	writers.Wait()
	close(done)
	wg.Wait()
	select {
	case e := <-scrapeErr:
		t.Fatal(e)
	default:
	}
	fams := scrape(t, m.Gatherer())
	n := float64(workers * conns)
	for _, tc := range []struct {
		name string
		want float64
	}{
		{"istio_tcp_connections_opened_total", n},
		{"istio_tcp_connections_closed_total", n},
		{"istio_tcp_received_bytes_total", n * chunks * 3},
		{"istio_tcp_sent_bytes_total", n * chunks},
	} {
		if got, _ := sum(fams, tc.name, nil); got != tc.want {
			t.Errorf("%s = %v, want %v", tc.name, got, tc.want)
		}
	}
}
