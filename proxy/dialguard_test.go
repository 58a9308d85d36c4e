package proxy

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/state"
)

// TestCheckInboundTarget: an inbound path dials only the served workload's
// own addresses (unmapped), never an own port; what the attacker of issue
// 32 named (unspecified, v4-mapped loopback, loopback, a host behind the
// pod) is refused with an error saying why.
func TestCheckInboundTarget(t *testing.T) {
	p := &Proxy{cfg: Config{OutboundPort: 15001, InboundPlainPort: 15006, InboundHBONEPort: 15008}}
	w := &state.Workload{Name: "srv", Addresses: []netip.Addr{netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("fd00::5")}}
	for _, tc := range []struct {
		dst  string
		want string // "" = allowed; else a substring of the error
	}{
		{"10.0.0.5:8080", ""},
		{"[::ffff:10.0.0.5]:8080", ""},
		{"[fd00::5]:8080", ""},
		{"0.0.0.0:15000", "not a workload address"},
		{"[::]:15000", "not a workload address"},
		{"[::ffff:127.0.0.1]:15000", "a loopback address"},
		{"127.0.0.1:9000", "a loopback address"},
		{"[::1]:9000", "a loopback address"},
		{"10.88.0.1:9000", "an address of another host"},
		{"10.0.0.6:8080", "an address of another host"},
		{"224.0.0.1:80", "not a workload address"},
		{"10.0.0.5:15001", "illegal target port 15001"},
		{"10.0.0.5:15006", "illegal target port 15006"},
		{"10.0.0.5:15008", "illegal target port 15008"},
	} {
		t.Run(tc.dst, func(t *testing.T) {
			err := p.checkInboundTarget(netip.MustParseAddrPort(tc.dst), w)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// TestIsSelfTarget: a destination lands on one of the proxy's listeners
// when its port is an own one and its address is local: loopback,
// unspecified, the workload's or the accepted connection's own address
// (a secondary interface the record does not list).
func TestIsSelfTarget(t *testing.T) {
	p := &Proxy{cfg: Config{OutboundPort: 15001, InboundPlainPort: 15006, InboundHBONEPort: 15008, SOCKS5: true, SOCKS5Port: 15080}}
	w := &state.Workload{Addresses: []netip.Addr{netip.MustParseAddr("10.0.0.5")}}
	local := netip.MustParseAddr("192.168.7.2")
	for _, tc := range []struct {
		dst  string
		w    *state.Workload
		self bool
	}{
		{"10.0.0.5:15001", w, true},
		{"[::ffff:10.0.0.5]:15001", w, true},
		{"10.0.0.5:15001", nil, false}, // before the workload is known: only what the socket says
		{"192.168.7.2:15001", nil, true},
		{"127.0.0.1:15006", nil, true},
		{"127.0.0.9:15080", nil, true},
		{"0.0.0.0:15008", nil, true},
		{"[::1]:15001", nil, true},
		{"10.0.0.5:8080", w, false},
		{"10.0.0.9:15001", w, false}, // another pod's 15001
		{"127.0.0.1:15000", w, false},
	} {
		t.Run(tc.dst, func(t *testing.T) {
			if got := p.isSelfTarget(netip.MustParseAddrPort(tc.dst), tc.w, local); got != tc.self {
				t.Fatalf("isSelfTarget = %v, want %v", got, tc.self)
			}
		})
	}
}

// TestPassthroughRefusesOtherHosts: a captured connection whose original
// destination is not the workload's address (here the app stands at
// 127.0.0.2 while the workload is 127.0.0.1: a host behind the pod, as a
// route via the pod makes it) is reset and logged, and the app never sees a
// connection; the workload's own address is still served.
func TestPassthroughRefusesOtherHosts(t *testing.T) {
	const yaml = `
workloads:
- {uid: u-srv, name: srv, namespace: ns, serviceAccount: srv, workloadIps: ["127.0.0.1"], protocol: TCP, services: {}}
`
	rig := startProxy(t, yaml, "srv", nil)
	behind, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)})
	if err != nil {
		t.Fatal(err)
	}
	defer behind.Close()
	client, captured := dialCaptured(t, behind)
	rig.servePassthrough(captured)
	if _, err := io.ReadAll(client); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("client read %v, want a reset", err)
	}
	m := nextLog(t, rig.logs)
	if m["msg"] != "connection failed" || !strings.Contains(m["error"], "refused destination "+behind.Addr().String()) {
		t.Fatalf("access log %v, want a refused destination", m)
	}

	app, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	client, captured = dialCaptured(t, app)
	rig.servePassthrough(captured)
	upstream, err := app.AcceptTCP()
	if err != nil {
		t.Fatal(err)
	}
	echoThrough(t, client, upstream, "own address")
	// Nothing reached the host behind the pod.
	behind.SetDeadline(time.Now())
	if c, err := behind.AcceptTCP(); err == nil {
		c.Close()
		t.Fatal("the host behind the pod got a connection")
	}
}
