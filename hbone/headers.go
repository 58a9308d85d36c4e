package hbone

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"golang.org/x/net/http/httpguts"
	"golang.org/x/net/http2/hpack"
)

// connectionSpecific reports header fields RFC 9113 section 8.2.2 forbids in
// HTTP/2 (te is allowed with the value "trailers" only). Host is dropped
// from what we send because CONNECT carries :authority.
func connectionSpecific(name string) bool {
	switch name {
	case "connection", "proxy-connection", "keep-alive", "transfer-encoding", "upgrade":
		return true
	}
	return false
}

// appendFields converts h into lower-case HPACK fields.
func appendFields(dst []hpack.HeaderField, h http.Header) ([]hpack.HeaderField, error) {
	for k, vs := range h {
		name := lowerASCII(k)
		if !httpguts.ValidHeaderFieldName(name) {
			return nil, fmt.Errorf("hbone: invalid header name %q", k)
		}
		if connectionSpecific(name) || name == "host" {
			continue
		}
		for _, v := range vs {
			if !httpguts.ValidHeaderFieldValue(v) {
				return nil, fmt.Errorf("hbone: invalid value for header %q", k)
			}
			if name == "te" && v != "trailers" {
				continue
			}
			dst = append(dst, hpack.HeaderField{Name: name, Value: v})
		}
	}
	return dst, nil
}

func lowerASCII(s string) string {
	for i := 0; i < len(s); i++ {
		if 'A' <= s[i] && s[i] <= 'Z' {
			return strings.ToLower(s)
		}
	}
	return s
}

// validAuthority reports whether s can be a CONNECT :authority: host:port
// in the characters RFC 3986 allows there (no space, no slash). Client and
// server apply the same rule, so what one side sends the other accepts.
func validAuthority(s string) bool {
	return s != "" && httpguts.ValidHostHeader(s)
}

func requestFields(req *Request) ([]hpack.HeaderField, error) {
	if req == nil || req.Authority == "" {
		return nil, fmt.Errorf("hbone: request without authority")
	}
	if !validAuthority(req.Authority) {
		return nil, fmt.Errorf("hbone: invalid authority %q", req.Authority)
	}
	fields := make([]hpack.HeaderField, 0, 2+len(req.Header))
	fields = append(fields,
		hpack.HeaderField{Name: ":method", Value: http.MethodConnect},
		hpack.HeaderField{Name: ":authority", Value: req.Authority})
	return appendFields(fields, req.Header)
}

func responseFields(status int, h http.Header) ([]hpack.HeaderField, error) {
	if status < 200 || status > 999 {
		return nil, fmt.Errorf("hbone: invalid response status %d", status)
	}
	fields := make([]hpack.HeaderField, 0, 1+len(h))
	fields = append(fields, hpack.HeaderField{Name: ":status", Value: strconv.Itoa(status)})
	return appendFields(fields, h)
}

// headerListSize is the size SETTINGS_MAX_HEADER_LIST_SIZE limits (RFC 9113
// section 6.5.2).
func headerListSize(fields []hpack.HeaderField) uint32 {
	var n uint32
	for _, f := range fields {
		n += f.Size()
	}
	return n
}

// headerFromFields builds an http.Header of the regular fields.
func headerFromFields(fields []hpack.HeaderField) http.Header {
	h := make(http.Header, len(fields))
	for _, f := range fields {
		if f.IsPseudo() {
			continue
		}
		k := http.CanonicalHeaderKey(f.Name)
		h[k] = append(h[k], f.Value)
	}
	return h
}
