package admin

import (
	"log/slog"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
)

// MetricsPaths are the paths the metrics server answers on, ztunnel's.
var MetricsPaths = []string{"/metrics", "/stats/prometheus"}

// metricsFormats are the expositions offered, as ztunnel: the Prometheus
// text format unless the scraper asks for OpenMetrics.
var metricsFormats = []expfmt.Format{expfmt.FmtText, expfmt.FmtOpenMetrics_1_0_0, expfmt.FmtOpenMetrics_0_0_1}

// MetricsHandler serves a Prometheus registry the way ztunnel's stats
// server on 15020 does: /metrics and /stats/prometheus, text or
// OpenMetrics by the Accept header, compressed as Accept-Encoding asks
// (see negotiate).
type MetricsHandler struct {
	g   prometheus.Gatherer
	log *slog.Logger
}

// NewMetricsHandler returns the handler for g; log (nil discards) receives
// gather and write errors.
func NewMetricsHandler(g prometheus.Gatherer, log *slog.Logger) *MetricsHandler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &MetricsHandler{g: g, log: log}
}

// ServeHTTP answers a scrape. A gather error is logged and what could be
// gathered is still served: one broken collector should not blind the
// dashboards.
func (h *MetricsHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != MetricsPaths[0] && r.URL.Path != MetricsPaths[1] {
		http.NotFound(w, r)
		return
	}
	fams, err := h.g.Gather()
	if err != nil {
		h.log.Error("gathering metrics failed", "error", err, "scope", "metrics")
		if len(fams) == 0 {
			http.Error(w, "gathering metrics failed: "+err.Error(), http.StatusInternalServerError)
			return
		}
	}
	format := expfmt.NegotiateAccept(r.Header, metricsFormats...)
	w.Header().Set("Content-Type", string(format))
	body, done := compressed(w, r)
	enc := expfmt.NewEncoder(body, format)
	for _, f := range fams {
		if err = enc.Encode(f); err != nil {
			break
		}
	}
	if c, ok := enc.(expfmt.Closer); ok && err == nil {
		err = c.Close()
	}
	if derr := done(); err == nil {
		err = derr
	}
	if err != nil {
		// The status is out already; the scraper sees a truncated body.
		h.log.Debug("writing metrics failed", "error", err, "scope", "metrics")
	}
}
