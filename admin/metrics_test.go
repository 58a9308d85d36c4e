package admin

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/ztunnel-go/ztunnel/metrics"
)

// serveMetrics runs the metrics handler on a loopback port with a counter
// big enough for compression to matter.
func serveMetrics(t *testing.T) string {
	t.Helper()
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "istio_tcp_connections_opened_total", Help: "Total TCP connections opened."}, []string{"source_workload"})
	reg.MustRegister(c)
	for i := range 50 {
		c.WithLabelValues(strings.Repeat("w", i+1)).Add(float64(i))
	}
	srv, err := Serve("127.0.0.1:0", NewMetricsHandler(reg, nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	return "http://" + srv.Addr().String()
}

func get(t *testing.T, url string, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	// No transparent decompression and no idle connections left behind.
	tr := &http.Transport{DisableCompression: true, DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, body
}

func TestMetricsGzipNegotiation(t *testing.T) {
	base := serveMetrics(t)
	tests := []struct {
		path, acceptEncoding string
		gzipped              bool
	}{
		{"/metrics", "", false},
		{"/metrics", "gzip", true},
		{"/stats/prometheus", "gzip", true},
		{"/metrics", "br, gzip;q=0.5", true},
		{"/metrics", "GZIP", true},
		{"/metrics", "*", true},
		{"/metrics", "gzip;q=0", false},
		{"/metrics", "identity", false},
		{"/metrics", "deflate", false},
	}
	for _, tc := range tests {
		t.Run(tc.path+" "+tc.acceptEncoding, func(t *testing.T) {
			hdr := map[string]string{}
			if tc.acceptEncoding != "" {
				hdr["Accept-Encoding"] = tc.acceptEncoding
			}
			resp, body := get(t, base+tc.path, hdr)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			if got := resp.Header.Get("Content-Encoding") == "gzip"; got != tc.gzipped {
				t.Fatalf("Content-Encoding %q, want gzip=%v", resp.Header.Get("Content-Encoding"), tc.gzipped)
			}
			if tc.gzipped {
				zr, err := gzip.NewReader(strings.NewReader(string(body)))
				if err != nil {
					t.Fatal(err)
				}
				plain, err := io.ReadAll(zr)
				if err != nil {
					t.Fatal(err)
				}
				if len(plain) <= len(body) {
					t.Errorf("gzip did not shrink the body: %d -> %d", len(plain), len(body))
				}
				body = plain
			}
			p := expfmt.NewTextParser(model.LegacyValidation)
			fams, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
			if err != nil {
				t.Fatalf("parse: %v\n%s", err, body)
			}
			if n := len(fams["istio_tcp_connections_opened_total"].GetMetric()); n != 50 {
				t.Fatalf("%d series, want 50", n)
			}
			if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
				t.Errorf("Content-Type %q", ct)
			}
		})
	}
}

func TestMetricsOpenMetricsAndPaths(t *testing.T) {
	base := serveMetrics(t)
	resp, body := get(t, base+"/metrics", map[string]string{"Accept": "application/openmetrics-text; version=1.0.0; charset=utf-8"})
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/openmetrics-text") {
		t.Fatalf("Content-Type %q", ct)
	}
	// OpenMetrics names a counter family without _total and ends with EOF,
	// as ztunnel's exposition does.
	if s := string(body); !strings.Contains(s, "# TYPE istio_tcp_connections_opened counter") || !strings.HasSuffix(s, "# EOF\n") {
		t.Fatalf("not OpenMetrics:\n%s", s)
	}
	for _, path := range []string{"/", "/metricsx", "/stats"} {
		if resp, _ := get(t, base+path, nil); resp.StatusCode != http.StatusNotFound {
			t.Errorf("%s: status %d, want 404", path, resp.StatusCode)
		}
	}
}

func TestMetricsGatherFailure(t *testing.T) {
	h := NewMetricsHandler(prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		return nil, errors.New("collector broke")
	}), nil)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusInternalServerError || !strings.Contains(rec.Body.String(), "collector broke") {
		t.Fatalf("%d %q", rec.Code, rec.Body.String())
	}
}

func TestConfigDumpGzip(t *testing.T) {
	s := testServer(t)
	req := httptest.NewRequest(http.MethodGet, "/config_dump", nil)
	req.RemoteAddr = "127.0.0.1:5555"
	req.Header.Set("Accept-Encoding", "gzip")
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, req)
	if rec.Header().Get("Content-Encoding") != "gzip" {
		t.Fatalf("not compressed: %v", rec.Header())
	}
	zr, err := gzip.NewReader(rec.Body)
	if err != nil {
		t.Fatal(err)
	}
	var d ConfigDump
	if err := json.NewDecoder(zr).Decode(&d); err != nil {
		t.Fatal(err)
	}
	if len(d.Workloads) != 1 {
		t.Fatalf("workloads %+v", d.Workloads)
	}
}

// TestScrapeShowsLiveBytes serves the daemon's metric set and scrapes it
// over HTTP with gzip, as Prometheus does: an open connection's bytes show
// before it closes, and after it closes opened equals closed.
func TestScrapeShowsLiveBytes(t *testing.T) {
	m := metrics.New(metrics.Config{IstioVersion: "1.27.0"})
	srv, err := Serve("127.0.0.1:0", NewMetricsHandler(m.Gatherer(), nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(context.Background())
	scrape := func() map[string]*dto.MetricFamily {
		t.Helper()
		resp, body := get(t, "http://"+srv.Addr().String()+"/stats/prometheus", map[string]string{"Accept-Encoding": "gzip"})
		if resp.Header.Get("Content-Encoding") != "gzip" {
			t.Fatal("not gzipped")
		}
		zr, err := gzip.NewReader(strings.NewReader(string(body)))
		if err != nil {
			t.Fatal(err)
		}
		p := expfmt.NewTextParser(model.LegacyValidation)
		fams, err := p.TextToMetricFamilies(zr)
		if err != nil {
			t.Fatal(err)
		}
		return fams
	}
	value := func(fams map[string]*dto.MetricFamily, name string) float64 {
		var v float64
		for _, mm := range fams[name].GetMetric() {
			v += mm.GetCounter().GetValue()
		}
		return v
	}
	var l metrics.ConnLabels
	l.Reporter = metrics.ReporterDestination
	var recv, sent atomic.Int64
	c := m.ConnOpened(&l, &recv, &sent)
	recv.Add(5000)
	fams := scrape()
	if v := value(fams, "istio_tcp_received_bytes_total"); v != 5000 {
		t.Fatalf("received while open = %v, want 5000", v)
	}
	if v := value(fams, "istio_tcp_connections_closed_total"); v != 0 {
		t.Fatalf("closed while open = %v", v)
	}
	sent.Add(7)
	c.Closed(metrics.FlagNone)
	fams = scrape()
	if o, cl := value(fams, "istio_tcp_connections_opened_total"), value(fams, "istio_tcp_connections_closed_total"); o != 1 || cl != 1 {
		t.Fatalf("opened %v closed %v", o, cl)
	}
	if v := value(fams, "istio_tcp_sent_bytes_total"); v != 7 {
		t.Fatalf("sent = %v", v)
	}
	if fams["istio_build"] == nil || fams["process_open_fds"] == nil {
		t.Fatal("istio_build or process_open_fds missing")
	}
}
