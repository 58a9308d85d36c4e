package e2e

import (
	"bytes"
	"context"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// scrape fetches and parses a daemon's /metrics.
func (dp *dataplane) scrape(t *testing.T, pod string) map[string]*dto.MetricFamily {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	code, body, err := dp.cluster.Daemons[pod].Get(ctx, "http://127.0.0.1:15020/metrics")
	if err != nil || code != 200 {
		t.Fatalf("scrape %s: %d %v", pod, code, err)
	}
	parser := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// sum adds the samples of family whose labels include all of want.
func sum(fams map[string]*dto.MetricFamily, family string, want map[string]string) float64 {
	var total float64
	f := fams[family]
	if f == nil {
		return 0
	}
	for _, m := range f.GetMetric() {
		if hasLabels(m, want) {
			total += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return total
}

// hasLabels reports whether m carries every label of want with its value.
func hasLabels(m *dto.Metric, want map[string]string) bool {
	got := map[string]string{}
	for _, l := range m.GetLabel() {
		got[l.GetName()] = l.GetValue()
	}
	for k, v := range want {
		if got[k] != v {
			return false
		}
	}
	return true
}

func TestMetricsCountTraffic(t *testing.T) {
	dp := startDataplane(t)
	const payload = 3 << 20
	for range 3 {
		c := dp.dial(t, "client", "server", 8080)
		got, err := roundTrip(c, make([]byte, payload))
		c.Close()
		if err != nil || len(got) != payload {
			t.Fatalf("echo: %d bytes, %v", len(got), err)
		}
	}
	dp.expectRefused(t, "client", "server", 9999)

	labels := map[string]string{
		"reporter":                   "destination",
		"source_principal":           "spiffe://cluster.local/ns/default/sa/client",
		"destination_principal":      "spiffe://cluster.local/ns/default/sa/server",
		"destination_workload":       "server",
		"connection_security_policy": "mutual_tls",
		"request_protocol":           "tcp",
	}
	// Connections end asynchronously in the daemon; poll briefly for the
	// closes, then check exact values.
	var fams map[string]*dto.MetricFamily
	eventually(10*time.Second, 50*time.Millisecond, func() bool {
		fams = dp.scrape(t, "server")
		return sum(fams, "istio_tcp_connections_closed_total", labels) >= 4
	})
	if got := sum(fams, "istio_tcp_connections_opened_total", labels); got != 4 {
		t.Errorf("opened = %v, want 4 (3 echoes + 1 denied)", got)
	}
	if got := sum(fams, "istio_tcp_connections_closed_total", labels); got != 4 {
		t.Errorf("closed = %v, want 4", got)
	}
	if got := sum(fams, "istio_tcp_received_bytes_total", labels); got != 3*payload {
		t.Errorf("received bytes = %v, want %d", got, 3*payload)
	}
	if got := sum(fams, "istio_tcp_sent_bytes_total", labels); got != 3*payload {
		t.Errorf("sent bytes = %v, want %d", got, 3*payload)
	}
	deny := map[string]string{"reporter": "destination", "response_flags": "DENY"}
	if got := sum(fams, "istio_tcp_connections_failed_total", deny); got != 1 {
		t.Errorf("failed with DENY = %v, want 1", got)
	}
	src := map[string]string{"reporter": "source", "destination_principal": "spiffe://cluster.local/ns/default/sa/server"}
	if got := sum(dp.scrape(t, "client"), "istio_tcp_connections_opened_total", src); got != 4 {
		t.Errorf("client side opened = %v, want 4", got)
	}
}
