package proxy

import (
	"net/netip"
	"testing"

	"github.com/ztunnel-go/ztunnel/internal/fuzzseed"
)

// FuzzParseAuthority feeds the CONNECT authority any HBONE peer with a
// certificate controls. What it accepts is a plain unmapped address and a
// port whose printed form reads back the same, and it never accepts a
// name, a zone or trailing bytes.
func FuzzParseAuthority(f *testing.F) {
	for _, s := range []string{"10.244.1.2:8080", "[fd00::1]:80", "[::ffff:10.0.0.1]:15008", "10.0.0.1", "web.ns:80",
		"[fe80::1%eth0]:80", "10.0.0.1:80/x", "10.0.0.1:65536", "0.0.0.0:0", "[::]:1"} {
		fuzzseed.Add(f, s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ap, err := parseAuthority(s)
		if err != nil {
			return
		}
		if !ap.IsValid() || ap.Addr().Is4In6() || ap.Addr().Zone() != "" {
			t.Fatalf("%q parsed as %v", s, ap)
		}
		again, err := parseAuthority(ap.String())
		if err != nil || again != ap {
			t.Fatalf("%q -> %v -> %v (%v)", s, ap, again, err)
		}
		if std, err := netip.ParseAddrPort(s); err != nil || std.Port() != ap.Port() {
			t.Fatalf("%q accepted but not an address and port: %v", s, err)
		}
	})
}

func TestParseAuthority(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string // want "" means refused
	}{
		{"ipv4", "10.244.1.2:8080", "10.244.1.2:8080"},
		{"ipv6", "[fd00::1]:80", "[fd00::1]:80"},
		{"mapped ipv4 read as ipv4", "[::ffff:10.0.0.1]:80", "10.0.0.1:80"},
		{"zone", "[fe80::1%eth0]:80", ""},
		{"name", "web.ns.svc:80", ""},
		{"no port", "10.0.0.1", ""},
		{"port too large", "10.0.0.1:65536", ""},
		{"path", "10.0.0.1:80/x", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ap, err := parseAuthority(tc.in)
			if tc.want == "" {
				if err == nil {
					t.Fatalf("accepted as %v", ap)
				}
				return
			}
			if err != nil || ap.String() != tc.want {
				t.Fatalf("got %v, %v; want %s", ap, err, tc.want)
			}
		})
	}
}
