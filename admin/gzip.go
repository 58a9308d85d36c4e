package admin

import (
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/klauspost/compress/gzip"
)

// acceptsGzip reports whether an Accept-Encoding header admits gzip: named
// (or "*") with a q-value above zero.
func acceptsGzip(h http.Header) bool {
	for _, v := range h.Values("Accept-Encoding") {
		for _, part := range strings.Split(v, ",") {
			name, params, _ := strings.Cut(strings.TrimSpace(part), ";")
			name = strings.TrimSpace(name)
			if !strings.EqualFold(name, "gzip") && name != "*" {
				continue
			}
			q := 1.0
			for _, p := range strings.Split(params, ";") {
				k, val, ok := strings.Cut(strings.TrimSpace(p), "=")
				if ok && strings.EqualFold(strings.TrimSpace(k), "q") {
					if f, err := strconv.ParseFloat(strings.TrimSpace(val), 64); err == nil {
						q = f
					}
				}
			}
			if q > 0 {
				return true
			}
		}
	}
	return false
}

// gzipWriters recycles compressors: a scrape every few seconds would
// otherwise allocate a deflate state (hundreds of KiB) each time.
var gzipWriters = sync.Pool{New: func() any {
	z, _ := gzip.NewWriterLevel(io.Discard, gzip.BestSpeed)
	return z
}}

// compressed returns the writer a handler should write its body to, and a
// function to call when done: w itself when r does not ask for gzip, else
// a gzip stream into w with the response headers set for it. Call it
// before writing the status.
func compressed(w http.ResponseWriter, r *http.Request) (io.Writer, func() error) {
	w.Header().Add("Vary", "Accept-Encoding")
	if !acceptsGzip(r.Header) {
		return w, func() error { return nil }
	}
	w.Header().Set("Content-Encoding", "gzip")
	w.Header().Del("Content-Length")
	z := gzipWriters.Get().(*gzip.Writer)
	z.Reset(w)
	return z, func() error {
		err := z.Close()
		z.Reset(io.Discard)
		gzipWriters.Put(z)
		return err
	}
}
