package admin

import (
	"net/http"
	"testing"

	"github.com/ztunnel-go/ztunnel/internal/fuzzseed"
)

// FuzzAcceptsGzip: the metrics server listens on every address, so its
// Accept-Encoding parsing reads anyone's bytes.
func FuzzAcceptsGzip(f *testing.F) {
	for _, s := range []string{"gzip", "br, gzip;q=0.5", "gzip;q=0", "*;q=0.1", "gzip;q=", ";;,,", "gzip; q = 1 ; x=y"} {
		fuzzseed.Add(f, s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		acceptsGzip(http.Header{"Accept-Encoding": []string{v}})
	})
}
