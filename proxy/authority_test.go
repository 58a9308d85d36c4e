package proxy

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/ztunnel-go/ztunnel/state/xdsconv"
)

func TestSplitAuthority(t *testing.T) {
	tests := []struct {
		name      string
		in        string
		wantHost  string
		wantAddr  string // "" for a hostname
		wantPort  uint16
		wantError bool
	}{
		{name: "ipv4", in: "10.0.0.1:8080", wantAddr: "10.0.0.1", wantPort: 8080},
		{name: "ipv6", in: "[fd00::1]:80", wantAddr: "fd00::1", wantPort: 80},
		{name: "mapped ipv4 is unmapped", in: "[::ffff:10.0.0.1]:80", wantAddr: "10.0.0.1", wantPort: 80},
		{name: "service hostname", in: "echo.ns.svc.cluster.local:80", wantHost: "echo.ns.svc.cluster.local", wantPort: 80},
		{name: "short hostname", in: "echo:9090", wantHost: "echo", wantPort: 9090},
		{name: "no port", in: "echo.ns.svc.cluster.local", wantError: true},
		{name: "port zero", in: "10.0.0.1:0", wantError: true},
		{name: "port too big", in: "10.0.0.1:65536", wantError: true},
		{name: "signed port", in: "echo:+80", wantError: true},
		{name: "leading zero port", in: "echo:080", wantError: true},
		{name: "empty host", in: ":80", wantError: true},
		{name: "zoned address", in: "[fe80::1%eth0]:80", wantError: true},
		{name: "underscore", in: "ec_ho:80", wantError: true},
		{name: "empty label", in: "echo..ns:80", wantError: true},
		{name: "label ends with dash", in: "echo-.ns:80", wantError: true},
		{name: "label starts with dash", in: "-echo:80", wantError: true},
		{name: "label too long", in: strings.Repeat("a", 64) + ":80", wantError: true},
		{name: "name too long", in: strings.Repeat("a.", 127) + "a:80", wantError: true},
		{name: "path", in: "echo/x:80", wantError: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			host, target, err := splitAuthority(tc.in)
			if tc.wantError {
				if err == nil {
					t.Fatalf("splitAuthority(%q) = %q, %v; want an error", tc.in, host, target)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var wantAddr netip.Addr
			if tc.wantAddr != "" {
				wantAddr = netip.MustParseAddr(tc.wantAddr)
			}
			if host != tc.wantHost || target.Addr() != wantAddr || target.Port() != tc.wantPort {
				t.Fatalf("splitAuthority(%q) = %q, %v", tc.in, host, target)
			}
		})
	}
}

func FuzzSplitAuthority(f *testing.F) {
	for _, s := range []string{"10.0.0.1:80", "[fd00::1]:443", "echo.ns.svc.cluster.local:80", "a:1", ":80", "x:0", "[::1%lo]:1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		host, target, err := splitAuthority(in)
		if err != nil {
			return
		}
		if target.Port() == 0 {
			t.Fatalf("%q: accepted port 0", in)
		}
		if (host == "") == !target.Addr().IsValid() {
			t.Fatalf("%q: host %q with address %v", in, host, target.Addr())
		}
		if host != "" && (!validHostname(host) || strings.ContainsAny(host, ":/[]% ")) {
			t.Fatalf("%q: accepted host %q", in, host)
		}
	})
}

func TestHostAuthorityTarget(t *testing.T) {
	snap, err := xdsconv.LocalSnapshot(fmt.Appendf(nil, multiNetConfig, 15008, 7070))
	if err != nil {
		t.Fatal(err)
	}
	w := snap.WorkloadByUID("srv")
	local := netip.MustParseAddr("127.0.0.1")
	tests := []struct {
		name       string
		host       string
		port       uint16
		want       string
		wantStatus int
	}{
		{name: "endpoint port wins over the service's", host: "echo.ns.svc.cluster.local", port: 80, want: "127.0.0.1:7070"},
		{name: "neither maps the port", host: "echo.ns.svc.cluster.local", port: 81, wantStatus: 503},
		{name: "port the service lacks", host: "echo.ns.svc.cluster.local", port: 82, wantStatus: 503},
		{name: "not an endpoint", host: "other.ns.svc.cluster.local", port: 80, wantStatus: 400},
		{name: "unknown hostname", host: "missing.ns.svc.cluster.local", port: 80, wantStatus: 400},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := hostAuthorityTarget(snap, w, tc.host, tc.port, local)
			if tc.wantStatus != 0 {
				var ie *inboundError
				if !errors.As(err, &ie) || ie.status != tc.wantStatus {
					t.Fatalf("got %v, %v; want status %d", got, err, tc.wantStatus)
				}
				return
			}
			if err != nil || got.String() != tc.want {
				t.Fatalf("got %v, %v; want %s", got, err, tc.want)
			}
		})
	}
}
