package admin

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/ztunnel-go/ztunnel/internal/fuzzseed"
	"github.com/ztunnel-go/ztunnel/internal/logging"
	"github.com/ztunnel-go/ztunnel/state"
)

// FuzzNegotiate: the metrics server listens on every address, so its
// Accept-Encoding parsing reads anyone's bytes. Whatever they are, the
// answer is one of our codings, and a refusal is always identity.
func FuzzNegotiate(f *testing.F) {
	for _, s := range []string{"gzip", "br, gzip;q=0.5", "gzip;q=0", "*;q=0.1", "gzip;q=", ";;,,", "gzip; q = 1 ; x=y",
		"zstd;q=0.999, br;q=1", "identity;q=0", "*;q=0, x-gzip"} {
		fuzzseed.Add(f, s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		enc, ok := negotiate(http.Header{"Accept-Encoding": []string{v}})
		if enc >= numEncodings || (!ok && enc != encIdentity) {
			t.Fatalf("%q: %v ok=%v", v, enc, ok)
		}
	})
}

// FuzzLoggingQuery drives /logging with any query string and method, as
// anyone on the node's loopback can. The answer is 200, 400 or 405; only a
// 200 may change the filter, and it reports the filter now in force.
func FuzzLoggingQuery(f *testing.F) {
	for _, q := range []string{"", "level=", "level=access=debug", "level=access:warn,hbone:debug", "level=info&reset",
		"reset&level=access%3Ddebug", "level=loud", "level=%zz", "reset", "level=a=b=c;x"} {
		fuzzseed.Add(f, q, uint8(0))
	}
	fuzzseed.Add(f, "level=debug", uint8(1))
	fuzzseed.Add(f, "", uint8(2))
	methods := []string{http.MethodPost, http.MethodGet, http.MethodPut, http.MethodHead}
	f.Fuzz(func(t *testing.T, query string, m uint8) {
		levels, err := logging.NewLevels("info")
		if err != nil {
			t.Fatal(err)
		}
		s := NewServer(Config{State: state.NewStore(state.Empty()), Logging: levels, Logger: slog.New(slog.DiscardHandler)})
		req := httptest.NewRequest(methods[int(m)%len(methods)], "/logging", nil)
		req.URL.RawQuery = query
		req.RemoteAddr = "127.0.0.1:1"
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		switch rec.Code {
		case http.StatusOK:
			if req.Method != http.MethodHead && rec.Body.String() != "current log level is "+levels.String()+"\n" {
				t.Fatalf("body %q, filter %q", rec.Body.String(), levels.String())
			}
		case http.StatusBadRequest, http.StatusMethodNotAllowed:
			if levels.String() != "info" {
				t.Fatalf("refused with %d, yet the filter changed to %q", rec.Code, levels.String())
			}
		default:
			t.Fatalf("status %d for %s ?%s", rec.Code, req.Method, query)
		}
	})
}
