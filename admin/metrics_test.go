package admin

import (
	"bytes"
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

	"github.com/andybalholm/brotli"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zlib"
	"github.com/klauspost/compress/zstd"
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
	srv, err := Serve(ServeConfig{Name: "stats", Addr: "127.0.0.1:0", Handler: NewMetricsHandler(reg, nil)})
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

// decode undoes a Content-Encoding the metrics and admin servers answer
// with.
func decode(t *testing.T, coding string, body []byte) []byte {
	t.Helper()
	var r io.Reader
	switch coding {
	case "":
		return body
	case "gzip":
		zr, err := gzip.NewReader(bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		r = zr
	case "deflate":
		zr, err := zlib.NewReader(bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		r = zr
	case "br":
		r = brotli.NewReader(bytes.NewReader(body))
	case "zstd":
		zr, err := zstd.NewReader(bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer zr.Close()
		r = zr
	default:
		t.Fatalf("unexpected Content-Encoding %q", coding)
	}
	plain, err := io.ReadAll(r)
	if err != nil {
		t.Fatalf("%s: %v", coding, err)
	}
	return plain
}

// TestMetricsCompression is ztunnel's verify_metrics_compression (row C1
// of docs/ztunnel-scenarios.md): /metrics asked with each coding its
// compression layer offers answers in that coding, named in
// Content-Encoding, and decodes to the very text served plain.
func TestMetricsCompression(t *testing.T) {
	base := serveMetrics(t)
	for _, path := range MetricsPaths {
		resp, plain := get(t, base+path, nil)
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Encoding") != "" {
			t.Fatalf("%s plain: status %d, Content-Encoding %q", path, resp.StatusCode, resp.Header.Get("Content-Encoding"))
		}
		p := expfmt.NewTextParser(model.LegacyValidation)
		fams, err := p.TextToMetricFamilies(bytes.NewReader(plain))
		if err != nil {
			t.Fatalf("parse: %v\n%s", err, plain)
		}
		if n := len(fams["istio_tcp_connections_opened_total"].GetMetric()); n != 50 {
			t.Fatalf("%d series, want 50", n)
		}
		for _, tc := range []struct{ accept, coding string }{
			{"gzip", "gzip"},
			{"zstd", "zstd"},
			{"br", "br"},
			{"deflate", "deflate"},
			{"x-gzip", "gzip"},
			{"identity", ""},
		} {
			t.Run(path+" "+tc.accept, func(t *testing.T) {
				resp, body := get(t, base+path, map[string]string{"Accept-Encoding": tc.accept})
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("status %d", resp.StatusCode)
				}
				if got := resp.Header.Get("Content-Encoding"); got != tc.coding {
					t.Fatalf("Content-Encoding %q, want %q", got, tc.coding)
				}
				if !strings.Contains(resp.Header.Get("Vary"), "Accept-Encoding") {
					t.Errorf("Vary %q lacks Accept-Encoding", resp.Header.Get("Vary"))
				}
				if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
					t.Errorf("Content-Type %q", ct)
				}
				if tc.coding != "" && len(body) >= len(plain) {
					t.Errorf("%s did not shrink the body: %d -> %d", tc.coding, len(plain), len(body))
				}
				if got := decode(t, tc.coding, body); !bytes.Equal(got, plain) {
					t.Fatalf("decoded %d bytes differ from the %d plain ones", len(got), len(plain))
				}
			})
		}
	}
}

// TestAcceptEncodingNegotiation pins the choice tower-http's
// CompressionLayer makes for ztunnel's metrics server: highest q wins,
// ties go to zstd, br, gzip, deflate, identity in that order; "*" weighs
// every coding not named; a malformed weight drops its entry; nothing
// acceptable is a 406.
func TestAcceptEncodingNegotiation(t *testing.T) {
	tests := []struct {
		accept []string
		want   encoding
		ok     bool
	}{
		{nil, encIdentity, true},
		{[]string{""}, encIdentity, true},
		{[]string{"gzip"}, encGzip, true},
		{[]string{"GZIP"}, encGzip, true},
		{[]string{"gzip, deflate, br, zstd"}, encZstd, true},
		{[]string{"gzip, deflate, br"}, encBrotli, true},
		{[]string{"deflate, gzip"}, encGzip, true},
		{[]string{"br;q=0.5, gzip"}, encGzip, true},
		{[]string{"br, gzip;q=0.5"}, encBrotli, true},
		{[]string{"zstd;q=0.2, br;q=0.3"}, encBrotli, true},
		{[]string{"gzip;q=0.8", "br;q=0.9"}, encBrotli, true},
		{[]string{"gzip; q=0.5"}, encGzip, true},
		{[]string{"gzip;Q=1.000"}, encGzip, true},
		{[]string{"gzip;q=0"}, encIdentity, true},
		{[]string{"gzip;q=0.000"}, encIdentity, true},
		{[]string{"gzip;q=1.001"}, encIdentity, true},
		{[]string{"gzip;q=0.0001"}, encIdentity, true},
		{[]string{"gzip;q=.5"}, encIdentity, true},
		{[]string{"gzip;q="}, encIdentity, true},
		{[]string{"gzip;q=0.5;x=y"}, encIdentity, true},
		{[]string{"gzip;level=1"}, encIdentity, true},
		{[]string{"gzip;q=0.1, gzip;q=0.9, deflate;q=0.5"}, encGzip, true},
		{[]string{"identity"}, encIdentity, true},
		{[]string{"identity, gzip;q=0.5"}, encIdentity, true},
		{[]string{"identity;q=0.5, gzip"}, encGzip, true},
		{[]string{"identity;q=0"}, encIdentity, false},
		{[]string{"identity;q=0, gzip;q=0"}, encIdentity, false},
		{[]string{"identity;q=0, gzip"}, encGzip, true},
		{[]string{"compress, sdch"}, encIdentity, true},
		{[]string{"*"}, encZstd, true},
		{[]string{"*;q=0.1"}, encZstd, true},
		{[]string{"*;q=0"}, encIdentity, false},
		{[]string{"*;q=0, identity"}, encIdentity, true},
		{[]string{"*;q=0, br;q=0.1"}, encBrotli, true},
		{[]string{"zstd;q=0, *"}, encBrotli, true},
		{[]string{"*;q=0.5, gzip"}, encGzip, true},
		{[]string{"gzip;q=0.9, gzip;q=0.1, *;q=0.5"}, encGzip, true},
		{[]string{"gzip;q=0.1, gzip;q=0.9, *;q=0.5"}, encZstd, true},
		{[]string{"*;q=bad, *;q=0"}, encIdentity, false},
		{[]string{";;,,"}, encIdentity, true},
	}
	for _, tc := range tests {
		got, ok := negotiate(http.Header{"Accept-Encoding": tc.accept})
		if got != tc.want || ok != tc.ok {
			t.Errorf("%q: %v ok=%v, want %v ok=%v", tc.accept, got, ok, tc.want, tc.ok)
		}
	}
}

// TestMetricsNotAcceptable: a scraper that refuses identity and every
// coding offered gets 406 with the plain text, as from tower-http.
func TestMetricsNotAcceptable(t *testing.T) {
	base := serveMetrics(t)
	_, plain := get(t, base+"/metrics", nil)
	resp, body := get(t, base+"/metrics", map[string]string{"Accept-Encoding": "identity;q=0, compress"})
	if resp.StatusCode != http.StatusNotAcceptable || resp.Header.Get("Content-Encoding") != "" {
		t.Fatalf("status %d, Content-Encoding %q; want 406 plain", resp.StatusCode, resp.Header.Get("Content-Encoding"))
	}
	if !bytes.Equal(body, plain) {
		t.Fatalf("406 body differs from the plain scrape")
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

// TestConfigDumpCompressed: /config_dump shares the metrics server's
// negotiation and decodes to the same dump in every coding.
func TestConfigDumpCompressed(t *testing.T) {
	s := testServer(t)
	for _, coding := range []string{"gzip", "zstd", "br", "deflate"} {
		t.Run(coding, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodGet, "/config_dump", nil)
			req.RemoteAddr = "127.0.0.1:5555"
			req.Header.Set("Accept-Encoding", coding)
			rec := httptest.NewRecorder()
			s.ServeHTTP(rec, req)
			if got := rec.Header().Get("Content-Encoding"); got != coding {
				t.Fatalf("Content-Encoding %q, want %q", got, coding)
			}
			var d ConfigDump
			if err := json.Unmarshal(decode(t, coding, rec.Body.Bytes()), &d); err != nil {
				t.Fatal(err)
			}
			if len(d.Workloads) != 1 {
				t.Fatalf("workloads %+v", d.Workloads)
			}
		})
	}
}

// TestScrapeShowsLiveBytes serves the daemon's metric set and scrapes it
// over HTTP with gzip, as Prometheus does: an open connection's bytes show
// before it closes, and after it closes opened equals closed.
func TestScrapeShowsLiveBytes(t *testing.T) {
	m := metrics.New(metrics.Config{IstioVersion: "1.27.0"})
	srv, err := Serve(ServeConfig{Name: "stats", Addr: "127.0.0.1:0", Handler: NewMetricsHandler(m.Gatherer(), nil)})
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
