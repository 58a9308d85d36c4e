package controlplane

import (
	"net"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/net/http/httpguts"

	"github.com/ztunnel-go/ztunnel/internal/fuzzseed"
)

// FuzzHeadersFromEnv feeds environments, one KEY=value per line, to
// HeadersFromEnv. Every header it returns came from a prefixed variable and
// is a valid lower-case HTTP/2 field.
func FuzzHeadersFromEnv(f *testing.F) {
	for _, env := range []string{
		"XDS_HEADER_X-Team=blue\nXDS_HEADER_Trace=on=1\nCA_HEADER_Y=z\nPATH=/bin",
		"XDS_HEADER_=x",
		"XDS_HEADER_a b=x",
		"XDS_HEADER_a=x\ty\x7f",
		"XDS_HEADER_A=1\nXDS_HEADER_a=2",
	} {
		fuzzseed.Add(f, env)
	}
	f.Fuzz(func(t *testing.T, env string) {
		environ := strings.Split(env, "\n")
		h, err := HeadersFromEnv(environ, "XDS_HEADER_")
		if err != nil {
			return
		}
		for k, v := range h {
			if k != strings.ToLower(k) || !httpguts.ValidHeaderFieldName(k) || !httpguts.ValidHeaderFieldValue(v) {
				t.Fatalf("header %q: %q passed", k, v)
			}
			found := false
			for _, kv := range environ {
				name, value, _ := strings.Cut(kv, "=")
				if strings.EqualFold(name, "XDS_HEADER_"+k) && value == v {
					found = true
				}
			}
			if !found {
				t.Fatalf("header %q: %q comes from no variable", k, v)
			}
		}
	})
}

// FuzzParseAddress feeds XDS_ADDRESS / CA_ADDRESS values to parseAddress.
// What it accepts is a host and a port in range that dial as given.
func FuzzParseAddress(f *testing.F) {
	for _, s := range []string{"https://istiod.istio-system.svc:15012", "istiod:15012", "https://[fd00::1]:15012", "https://10.0.0.1",
		"http://istiod:15012", "https://:15012", "https://istiod:99999", "dns:///istiod:15012", "https://user@istiod:15012/path?q"} {
		fuzzseed.Add(f, s)
	}
	f.Fuzz(func(t *testing.T, addr string) {
		hostport, host, err := parseAddress(addr)
		if err != nil {
			return
		}
		h, port, err := net.SplitHostPort(hostport)
		if err != nil || h != host || host == "" {
			t.Fatalf("%q gave %q, host %q (%v)", addr, hostport, host, err)
		}
		if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
			t.Fatalf("%q gave port %q", addr, port)
		}
	})
}

func TestParseAddress(t *testing.T) {
	for _, tc := range []struct {
		name, addr, hostport string // hostport "" means refused
	}{
		{"default port", "istiod.istio-system.svc", "istiod.istio-system.svc:443"},
		{"https with port", "https://istiod:15012", "istiod:15012"},
		{"ipv6", "https://[fd00::1]:15012", "[fd00::1]:15012"},
		{"plain http", "http://istiod:15012", ""},
		{"no host", "https://:15012", ""},
		{"port out of range", "https://istiod:99999", ""},
		{"port zero", "https://istiod:0", ""},
		{"bracket host", "]", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hp, _, err := parseAddress(tc.addr)
			if hp != tc.hostport || (err == nil) != (tc.hostport != "") {
				t.Fatalf("got %q, %v; want %q", hp, err, tc.hostport)
			}
		})
	}
}
