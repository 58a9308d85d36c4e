package proxy

import (
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/fuzzseed"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
	"github.com/ztunnel-go/ztunnel/state"
)

func TestParseForwardedHost(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"ztunnel's own header", `for="10.0.0.1:4000";host=svc.ns.svc.cluster.local`, "svc.ns.svc.cluster.local"},
		{"quoted host", `for="10.0.0.1:4000";host="svc.ns"`, "svc.ns"},
		{"spaces around parts", `for=x ; host=svc.ns `, "svc.ns"},
		{"no host", `for="10.0.0.1:4000"`, ""},
		{"empty host", `host=`, ""},
		{"first host wins", `host=a;host=b`, "a"},
		// ztunnel splits on ';' only, so a second element stays in the value.
		{"two elements", `for=a;host=x, for=b`, "x, for=b"},
		{"not ascii", "host=svc\u00e9", ""},
		{"host as a prefix of another key", `hostname=x`, ""},
		{"empty", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := parseForwardedHost(tc.in); got != tc.want {
				t.Errorf("parseForwardedHost(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

// FuzzParseForwardedHost: the client controls the header; the parser must
// never panic and never return what was not in the input.
func FuzzParseForwardedHost(f *testing.F) {
	for _, s := range []string{`for="10.0.0.1:4000";host=svc.ns.svc.cluster.local`, `host="x"`, `host=`, `;;host=a;`, "host=\xff"} {
		fuzzseed.Add(f, s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		h := parseForwardedHost(s)
		if h != "" && !strings.Contains(s, h) {
			t.Fatalf("host %q is not in %q", h, s)
		}
	})
}

func TestGuessInboundService(t *testing.T) {
	a := &state.Service{Name: "a", Namespace: "ns", Hostname: "a.ns.svc", Ports: map[uint16]uint16{80: 8080}}
	b := &state.Service{Name: "b", Namespace: "ns", Hostname: "b.ns.svc", Ports: map[uint16]uint16{80: 0, 9090: 9091}}
	w := &state.Workload{Services: state.ServicesOf(map[string]map[uint16]uint16{a.Key(): {80: 8080}, b.Key(): {80: 7070}})}
	both := []*state.Service{a, b}
	for _, tc := range []struct {
		name    string
		cands   []*state.Service
		forHost string
		dport   uint16
		want    *state.Service
	}{
		{"forwarded host names a candidate", both, "b.ns.svc", 8080, b},
		{"forwarded host not a candidate: by port", both, "evil.ns.svc", 8080, a},
		{"service target port", both, "", 9091, b},
		{"endpoint's own port for a named port", both, "", 7070, b},
		{"first by port", both, "", 8080, a},
		{"no port match", both, "", 1234, nil},
		{"no candidates", nil, "a.ns.svc", 8080, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := guessInboundService(tc.cands, tc.forHost, w, tc.dport); got != tc.want {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// waitConns polls p.Connections until want reports true (hang guard only).
func waitConns(t *testing.T, p *Proxy, want func([]Connection) bool) []Connection {
	t.Helper()
	var c []Connection
	if !nettest.Until(10*time.Second, func() bool { c = p.Connections(); return want(c) }) {
		t.Fatalf("connections %+v", c)
	}
	return c
}

// TestConnectionsInbound: an open inbound HBONE connection is listed with
// the service its client named and the app address, and leaves the list
// when it ends.
func TestConnectionsInbound(t *testing.T) {
	app := echoApp(t)
	rig := startProxy(t, fmt.Sprintf(srvConfig, ""), "srv", nil)
	s, local, err := rig.connectWith(t, fmt.Sprintf("127.0.0.1:%d", app),
		http.Header{"Forwarded": {`for="10.1.1.1:5000";host=echo.ns.svc.cluster.local`}})
	if err != nil {
		t.Fatal(err)
	}
	conns := waitConns(t, rig.p, func(c []Connection) bool { return len(c) == 1 })
	want := Connection{Inbound: true, Src: local, ForHost: "echo.ns.svc.cluster.local",
		ActualDst: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(app)), Protocol: "HBONE"}
	if conns[0] != want {
		t.Errorf("connection %+v, want %+v", conns[0], want)
	}
	streamEcho(t, s, "listed")
	waitConns(t, rig.p, func(c []Connection) bool { return len(c) == 0 })
}
