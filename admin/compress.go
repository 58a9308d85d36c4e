package admin

import (
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/andybalholm/brotli"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zlib"
	"github.com/klauspost/compress/zstd"
)

// encoding is a content coding the admin and metrics servers can answer
// with. The order is the preference among equal q-values, least preferred
// first, as the compression layer of ztunnel's metrics server (tower-http)
// ranks them: zstd over br over gzip over deflate over identity.
type encoding uint8

const (
	encIdentity encoding = iota
	encDeflate
	encGzip
	encBrotli
	encZstd
	numEncodings
)

// String is the coding's token in Accept-Encoding and Content-Encoding.
func (e encoding) String() string {
	return [...]string{"identity", "deflate", "gzip", "br", "zstd"}[e]
}

// parseCoding maps a token to its encoding, case-insensitively; x-gzip is
// gzip. Unknown tokens report false.
func parseCoding(s string) (encoding, bool) {
	switch {
	case strings.EqualFold(s, "gzip"), strings.EqualFold(s, "x-gzip"):
		return encGzip, true
	case strings.EqualFold(s, "deflate"):
		return encDeflate, true
	case strings.EqualFold(s, "br"):
		return encBrotli, true
	case strings.EqualFold(s, "zstd"):
		return encZstd, true
	case strings.EqualFold(s, "identity"):
		return encIdentity, true
	}
	return 0, false
}

// parseQ reads a weight as RFC 9110 writes it, "q=" then 0 or 1 with at
// most three decimals and no more than 1, in thousandths. Anything else,
// other parameters included, reports false and the entry it belongs to is
// ignored, as tower-http does.
func parseQ(s string) (int, bool) {
	if len(s) < 3 || (s[0] != 'q' && s[0] != 'Q') || s[1] != '=' {
		return 0, false
	}
	s = s[2:]
	var v int
	switch s[0] {
	case '0':
	case '1':
		v = 1000
	default:
		return 0, false
	}
	s = s[1:]
	if s == "" {
		return v, true
	}
	if s[0] != '.' || len(s) > 4 {
		return 0, false
	}
	factor := 100
	for _, c := range []byte(s[1:]) {
		if c < '0' || c > '9' {
			return 0, false
		}
		v += factor * int(c-'0')
		factor /= 10
	}
	return v, v <= 1000
}

// negotiate picks the response's encoding from the request's
// Accept-Encoding the way tower-http's CompressionLayer (ztunnel's metrics
// server, 15020) does: the highest q-value wins, ties go to the preferred
// coding (see encoding); "*" gives its weight to every coding not named;
// without "*" an unnamed identity stays acceptable. ok is false when
// nothing is acceptable (identity;q=0 and no coding we have), which
// tower-http answers with 406.
func negotiate(h http.Header) (enc encoding, ok bool) {
	// q in thousandths, -1 where not named: the first entry of each coding
	// and the best one. Without "*" the best counts, with it the first
	// (tower-http's two paths differ so).
	var first, most [numEncodings]int
	for i := range first {
		first[i], most[i] = -1, -1
	}
	wildcard := -1
	for _, v := range h.Values("Accept-Encoding") {
		for entry := range strings.SplitSeq(v, ",") {
			name, params, hasParams := strings.Cut(entry, ";")
			name = strings.TrimSpace(name)
			q := 1000
			if hasParams {
				var valid bool
				if q, valid = parseQ(strings.TrimSpace(params)); !valid {
					continue
				}
			}
			if name == "*" {
				if wildcard < 0 {
					wildcard = q
				}
				continue
			}
			e, known := parseCoding(name)
			if !known {
				continue
			}
			if first[e] < 0 {
				first[e] = q
			}
			most[e] = max(most[e], q)
		}
	}
	explicit := most
	if wildcard >= 0 {
		explicit = first
	}
	best, bestQ := encIdentity, 0
	for e := encIdentity; e < numEncodings; e++ {
		q := explicit[e]
		if q < 0 {
			q = wildcard
		}
		if q > 0 && q >= bestQ {
			best, bestQ = e, q
		}
	}
	if bestQ > 0 {
		return best, true
	}
	if wildcard < 0 && explicit[encIdentity] != 0 {
		return encIdentity, true
	}
	return encIdentity, false
}

// compressor is what every encoder here offers: a stream that can be
// pointed at a new destination and reused.
type compressor interface {
	io.WriteCloser
	Reset(io.Writer)
}

// compressors recycles encoders per coding: a scrape every few seconds
// would otherwise allocate a compressor's state (hundreds of KiB) each
// time. Levels favour speed: a scrape is read once.
var compressors = [numEncodings]sync.Pool{
	encDeflate: {New: func() any {
		z, _ := zlib.NewWriterLevel(io.Discard, zlib.BestSpeed)
		return compressor(z)
	}},
	encGzip: {New: func() any {
		z, _ := gzip.NewWriterLevel(io.Discard, gzip.BestSpeed)
		return compressor(z)
	}},
	encBrotli: {New: func() any {
		return compressor(brotli.NewWriterLevel(io.Discard, 4))
	}},
	encZstd: {New: func() any {
		z, _ := zstd.NewWriter(io.Discard, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1))
		return compressor(z)
	}},
}

// compressed returns the writer a handler should write its body to, and a
// function to call when done: w itself when r asks for no compression,
// else a stream in the coding negotiate picks into w, with the response
// headers set for it. When no coding is acceptable the status is 406 and
// the body goes out plain, as tower-http does. Call it before writing the
// status.
func compressed(w http.ResponseWriter, r *http.Request) (io.Writer, func() error) {
	w.Header().Add("Vary", "Accept-Encoding")
	enc, ok := negotiate(r.Header)
	if !ok {
		w.WriteHeader(http.StatusNotAcceptable)
	}
	if enc == encIdentity {
		return w, func() error { return nil }
	}
	w.Header().Set("Content-Encoding", enc.String())
	w.Header().Del("Content-Length")
	z := compressors[enc].Get().(compressor)
	z.Reset(w)
	return z, func() error {
		err := z.Close()
		z.Reset(io.Discard)
		compressors[enc].Put(z)
		return err
	}
}
