package proxy

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/ztunnel-go/ztunnel/hbone"
	"github.com/ztunnel-go/ztunnel/internal/fuzzseed"
	"github.com/ztunnel-go/ztunnel/state/xdsconv"
)

func TestSplitAuthority(t *testing.T) {
	tests := []struct {
		name      string
		in        string
		wantHost  string
		wantAddr  string // "" for a hostname
		wantPort  uint16
		wantError string // a part of the error
	}{
		{name: "ipv4", in: "10.0.0.1:8080", wantAddr: "10.0.0.1", wantPort: 8080},
		{name: "ipv6", in: "[fd00::1]:80", wantAddr: "fd00::1", wantPort: 80},
		{name: "ipv6 upper-case hex", in: "[FD00::A]:80", wantAddr: "fd00::a", wantPort: 80},
		// ztunnel parses the authority as a Rust SocketAddr: a mapped
		// address is an IPv6 address, never the IPv4 one.
		{name: "mapped ipv4 stays mapped", in: "[::ffff:10.0.0.1]:80", wantAddr: "::ffff:10.0.0.1", wantPort: 80},
		{name: "embedded ipv4", in: "[::10.0.0.1]:80", wantAddr: "::10.0.0.1", wantPort: 80},
		{name: "numeric scope is dropped", in: "[fe80::1%2]:80", wantAddr: "fe80::1", wantPort: 80},
		// Anything else is a hostname: the URI's host, brackets and all.
		{name: "bracketed ipv4 is a hostname", in: "[10.0.0.1]:80", wantHost: "[10.0.0.1]", wantPort: 80},
		{name: "named zone is a hostname", in: "[fe80::1%eth0]:80", wantHost: "[fe80::1%eth0]", wantPort: 80},
		{name: "scope over u32 is a hostname", in: "[fe80::1%4294967296]:80", wantHost: "[fe80::1%4294967296]", wantPort: 80},
		{name: "ipv4 with a leading zero is a hostname", in: "10.0.0.01:80", wantHost: "10.0.0.01", wantPort: 80},
		{name: "userinfo before an ipv4", in: "user@10.0.0.1:80", wantHost: "10.0.0.1", wantPort: 80},
		{name: "userinfo before an ipv6", in: "u:p@[::1]:80", wantHost: "[::1]", wantPort: 80},
		{name: "service hostname", in: "echo.ns.svc.cluster.local:80", wantHost: "echo.ns.svc.cluster.local", wantPort: 80},
		{name: "short hostname", in: "echo:9090", wantHost: "echo", wantPort: 9090},
		{name: "underscore", in: "ec_ho:80", wantHost: "ec_ho", wantPort: 80},
		{name: "label ends with dash", in: "echo-.ns:80", wantHost: "echo-.ns", wantPort: 80},
		{name: "name longer than DNS allows", in: strings.Repeat("a.", 127) + "a:80", wantHost: strings.Repeat("a.", 127) + "a", wantPort: 80},
		{name: "empty host", in: ":80", wantError: "no service or workload for hostname: "},
		// What ztunnel answers 400 for (NoValidAuthority).
		{name: "no port", in: "echo.ns.svc.cluster.local", wantError: "no valid authority pseudo header: echo.ns.svc.cluster.local"},
		{name: "empty port", in: "echo:", wantError: "no valid authority pseudo header"},
		{name: "port too big", in: "10.0.0.1:65536", wantError: "no valid authority pseudo header"},
		{name: "ipv6 without a port", in: "[fd00::1]", wantError: "no valid authority pseudo header"},
		// What ztunnel's HTTP/2 server would not take as an authority.
		{name: "empty", in: "", wantError: "not an RFC 3986 authority"},
		{name: "unbracketed ipv6", in: "fd00::1:80", wantError: "not an RFC 3986 authority"},
		{name: "two ports", in: "echo:80:81", wantError: "not an RFC 3986 authority"},
		{name: "path", in: "echo/x:80", wantError: "not an RFC 3986 authority"},
		{name: "query", in: "echo:80?x", wantError: "not an RFC 3986 authority"},
		{name: "percent in the host", in: "ec%68o:80", wantError: "not an RFC 3986 authority"},
		{name: "unclosed bracket", in: "[fd00::1:80", wantError: "not an RFC 3986 authority"},
		{name: "two brackets", in: "[[fd00::1]]:80", wantError: "not an RFC 3986 authority"},
		{name: "nothing after @", in: "user@", wantError: "not an RFC 3986 authority"},
		{name: "space", in: "ec ho:80", wantError: "not an RFC 3986 authority"},
		// Ports ztunnel's parsers take that we refuse.
		{name: "port zero", in: "10.0.0.1:0", wantError: "without a sign or a leading zero"},
		{name: "signed port", in: "echo:+80", wantError: "without a sign or a leading zero"},
		{name: "leading zero port", in: "echo:080", wantError: "without a sign or a leading zero"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			host, target, err := splitAuthority(tc.in)
			if tc.wantError != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantError) {
					t.Fatalf("splitAuthority(%q) = %q, %v, %v; want an error saying %q", tc.in, host, target, err, tc.wantError)
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
	for _, s := range []string{
		"10.0.0.1:80", "[fd00::1]:443", "echo.ns.svc.cluster.local:80", "a:1", ":80", "x:0",
		"[::1%lo]:1", "[::1%1]:1", "[::ffff:10.0.0.1]:80", "[10.0.0.1]:80", "u@[::1]:80",
		"a-.b:080", "[fd00::1]:15008", "[fe80::1%eth0]:80", "a:+1", "a:b:1",
	} {
		fuzzseed.Add(f, s)
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
		if !validURIAuthority(in) {
			t.Fatalf("%q: accepted what is not an authority", in)
		}
		if !strings.HasSuffix(in, ":"+strconv.Itoa(int(target.Port()))) {
			t.Fatalf("%q: port %d is not the one written", in, target.Port())
		}
		if ip := target.Addr(); ip.IsValid() {
			if host != "" || ip.Zone() != "" || strings.Contains(in, "@") {
				t.Fatalf("%q: address %v with host %q", in, ip, host)
			}
			if strings.HasPrefix(in, "[") != ip.Is6() {
				t.Fatalf("%q: address %v of the wrong family", in, ip)
			}
			return
		}
		if strings.ContainsAny(host, "@/?#") || (!strings.HasPrefix(host, "[") && strings.Contains(host, ":")) {
			t.Fatalf("%q: accepted host %q", in, host)
		}
		// A bracketed IPv6 address right before the port colon is an
		// address unless userinfo precedes it. Anything between the bracket
		// and the colon ("[::]0:1") fails Rust's SocketAddr, and the http
		// crate's host() then reads the bracketed part as ztunnel's hostname.
		if inner, ok := strings.CutPrefix(host, "["); ok && !strings.Contains(in, "@") && in == host+":"+strconv.Itoa(int(target.Port())) {
			a, _, _ := strings.Cut(strings.TrimSuffix(inner, "]"), "%")
			if ip, err := netip.ParseAddr(a); err == nil && ip.Is6() && !strings.Contains(host, "%") {
				t.Fatalf("%q: IPv6 address %v read as host %q", in, ip, host)
			}
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
		{name: "unknown hostname", host: "missing.ns.svc.cluster.local", port: 80, wantStatus: 503},
		{name: "bracketed ipv4", host: "[127.0.0.1]", port: 80, wantStatus: 503},
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

// TestInboundAuthoritySpellings: CONNECT authorities through the proxy's
// real 15008, each answered with ztunnel's status and logged with its error
// text. The tunnel arrives on 127.0.0.1.
func TestInboundAuthoritySpellings(t *testing.T) {
	app := echoApp(t)
	var logs logBuf
	rig := startInbound(t, 1, withLog(&logs))
	for _, tc := range []struct {
		name, authority string
		want            int
		log             string // the error the log says; "" for a 200
	}{
		{name: "the address the tunnel arrived on", authority: fmt.Sprintf("127.0.0.1:%d", app), want: 200},
		{
			name: "IPv4-mapped spelling of it", authority: fmt.Sprintf("[::ffff:127.0.0.1]:%d", app),
			want: 400, log: `error="ip mismatch: 127.0.0.1 != ::ffff:127.0.0.1"`,
		},
		{
			name: "bracketed IPv4 is a hostname", authority: fmt.Sprintf("[127.0.0.1]:%d", app),
			want: 503, log: `error="no service or workload for hostname: [127.0.0.1]"`,
		},
		{
			name: "unknown service hostname", authority: "missing.ns.svc.cluster.local:80",
			want: 503, log: `error="no service or workload for hostname: missing.ns.svc.cluster.local"`,
		},
		{
			name: "empty host", authority: fmt.Sprintf(":%d", app),
			want: 503, log: `error="no service or workload for hostname: "`,
		},
		{
			name: "no port", authority: "127.0.0.1",
			want: 400, log: `error="no valid authority pseudo header: 127.0.0.1"`,
		},
		{
			name: "two ports", authority: fmt.Sprintf("127.0.0.1:%d:%d", app, app),
			want: 400, log: fmt.Sprintf(`error="invalid authority \"127.0.0.1:%d:%d\": not an RFC 3986 authority"`, app, app),
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := rig.connect(t, "client", tc.authority)
			if tc.want == 200 {
				if err != nil {
					t.Fatalf("CONNECT %s: %v", tc.authority, err)
				}
				s.Close()
				return
			}
			var se *hbone.StatusError
			if !errors.As(err, &se) || se.Code != tc.want {
				t.Fatalf("CONNECT %s: %v, want status %d", tc.authority, err, tc.want)
			}
			logs.waitFor(t, tc.log)
		})
	}
}
