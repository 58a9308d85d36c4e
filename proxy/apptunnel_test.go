package proxy

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/engine"
	"github.com/ztunnel-go/ztunnel/hbone"
	"github.com/ztunnel-go/ztunnel/proxy/meta"
	"github.com/ztunnel-go/ztunnel/proxy/proxyproto"
	"github.com/ztunnel-go/ztunnel/state/xdsconv"
)

// connectWith opens an HBONE stream to the rig's 15008 as ns/client with
// extra request headers, returning the raw connection's local address.
func (r *proxyRig) connectWith(t *testing.T, authority string, hdr http.Header) (*hbone.Stream, netip.AddrPort, error) {
	t.Helper()
	s, local, err := connectHBONE(t, r.ca, r.hbonePort(), "client", "srv", &hbone.Request{Authority: authority, Header: hdr})
	if s != nil {
		s.SetDeadline(time.Now().Add(20 * time.Second))
	}
	return s, local, err
}

func streamEcho(t *testing.T, s *hbone.Stream, msg string) {
	t.Helper()
	if _, err := s.Write([]byte(msg)); err != nil {
		t.Fatal(err)
	}
	s.CloseWrite()
	got, err := io.ReadAll(s)
	if err != nil || string(got) != msg {
		t.Fatalf("echo %q, %v; want %q", got, err, msg)
	}
}

const srvConfig = `
workloads:
- uid: u-srv
  name: srv
  namespace: ns
  serviceAccount: srv
  workloadIps: ["127.0.0.1"]
  protocol: HBONE
  workloadType: pod
  services:
    ns/echo.ns.svc.cluster.local: {80: 8080}
%s
services:
- name: echo
  namespace: ns
  hostname: echo.ns.svc.cluster.local
  vips: ["/10.96.0.1"]
  ports: {80: 8080}
- name: other
  namespace: ns
  hostname: other.ns.svc.cluster.local
  vips: ["/10.96.0.2"]
  ports: {80: 8080}
`

func TestInboundMetadata(t *testing.T) {
	app := echoApp(t)
	rig := startProxy(t, fmt.Sprintf(srvConfig, ""), "srv", func(c *Config) { c.Network = "net1" })
	authority := fmt.Sprintf("127.0.0.1:%d", app)

	tests := []struct {
		name string
		hdr  http.Header
		// want lists access-log fields; "" = must be absent. The peer's
		// address 127.0.0.1 is no workload on network net1, so the source
		// is what its baggage says (ztunnel's derived source): the log names
		// it by its canonical service (service.name), as ztunnel does.
		want map[string]string
	}{
		{"forwarded host names our service",
			http.Header{"Forwarded": {`for="10.1.1.1:5000";host=echo.ns.svc.cluster.local`}},
			map[string]string{"dst.service": "echo.ns.svc.cluster.local"}},
		{"forwarded host of a service we are not in",
			http.Header{"Forwarded": {`for="10.1.1.1:5000";host=nope.ns.svc.cluster.local`}},
			map[string]string{"dst.service": ""}},
		{"unparsable forwarded ignored",
			http.Header{"Forwarded": {`host="unterminated`}},
			map[string]string{"dst.service": ""}},
		{"forwarded host in quotes",
			http.Header{"Forwarded": {`for="10.1.1.1:5000";host="echo.ns.svc.cluster.local"`}},
			map[string]string{"dst.service": "echo.ns.svc.cluster.local"}},
		{"baggage across a network gateway",
			http.Header{"X-Forwarded-Network": {"net2"}, "Baggage": {"k8s.namespace.name=far,k8s.deployment.name=remote-app,service.name=remote-svc,k8s.cluster.name=c2"}},
			map[string]string{"src.workload": "remote-svc", "src.namespace": "far", "src.cluster": "c2", "src.identity": "spiffe://cluster.local/ns/ns/sa/client"}},
		{"baggage on our own network describes an unknown source",
			http.Header{"X-Forwarded-Network": {"net1"}, "Baggage": {"k8s.namespace.name=far,k8s.deployment.name=remote-app"}},
			map[string]string{"src.workload": "", "src.namespace": "far"}},
		{"no baggage, no source",
			http.Header{},
			map[string]string{"src.workload": "", "src.namespace": "", "src.identity": "spiffe://cluster.local/ns/ns/sa/client"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, _, err := rig.connectWith(t, authority, tc.hdr)
			if err != nil {
				t.Fatal(err)
			}
			streamEcho(t, s, "meta")
			m := nextLog(t, rig.logs)
			for k, v := range tc.want {
				if got, ok := m[k]; got != v || (v == "" && ok) {
					t.Errorf("%s = %q, want %q (log %v)", k, got, v, m)
				}
			}
		})
	}

	t.Run("200 carries our baggage", func(t *testing.T) {
		s, _, err := rig.connectWith(t, authority, nil)
		if err != nil {
			t.Fatal(err)
		}
		b, err := meta.ParseBaggage(s.ResponseHeader().Get("Baggage"))
		if err != nil || b.Namespace != "ns" || b.WorkloadType != "pod" || b.WorkloadName != "srv" {
			t.Errorf("response baggage %q: %+v, %v", s.ResponseHeader().Get("Baggage"), b, err)
		}
		streamEcho(t, s, "x")
		nextLog(t, rig.logs)
	})
}

// proxyApp is an app behind an application tunnel: it reads the PROXY
// header, reports it, then echoes.
func proxyApp(t *testing.T) (int, chan *proxyproto.Header) {
	t.Helper()
	headers := make(chan *proxyproto.Header, 4)
	port := serveApp(t, func(c *net.TCPConn) {
		c.SetDeadline(time.Now().Add(20 * time.Second))
		h, err := proxyproto.Read(c)
		if err != nil {
			return
		}
		headers <- h
		io.Copy(c, c)
		c.CloseWrite()
	})
	return port, headers
}

func TestApplicationTunnel(t *testing.T) {
	onEachBackend(t, func(t *testing.T, eng *engine.Engine) {
		tunnelPort, headers := proxyApp(t)
		spiffe := "spiffe://cluster.local/ns/ns/sa/client"
		tests := []struct {
			name       string
			tunnelPort int  // 0: the target port
			direct     bool // LOCALHOST_APP_TUNNEL=false
			targetPort int
			// authority, when set, names another address than the pod's (a
			// waypoint's tunnel carries its destination's): the header names
			// it, as ztunnel's tunnel_target, while the app is still dialled
			// on the pod's tunnel port.
			authority string
		}{
			{"dedicated tunnel port", tunnelPort, false, 8080, ""},
			{"target port", 0, false, tunnelPort, ""},
			{"direct to the pod address", tunnelPort, true, 8080, ""},
			{"authority of another address is the header's destination", tunnelPort, false, 8080, "10.96.7.7:8080"},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				extra := fmt.Sprintf("  applicationTunnel: {protocol: PROXY, port: %d}", tc.tunnelPort)
				rig := startProxy(t, fmt.Sprintf(srvConfig, extra), "srv", func(c *Config) { c.DirectAppTunnel = tc.direct; withEngine(eng)(c) })
				target := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(tc.targetPort))
				if tc.authority != "" {
					target = netip.MustParseAddrPort(tc.authority)
				}
				s, local, err := rig.connectWith(t, target.String(), nil)
				if err != nil {
					t.Fatal(err)
				}
				streamEcho(t, s, "tunneled bytes")
				var h *proxyproto.Header
				select {
				case h = <-headers:
				case <-time.After(10 * time.Second):
					t.Fatal("the app got no PROXY header")
				}
				if h.Command != proxyproto.Proxy || h.Src != local || h.Dst != target {
					t.Errorf("header %v %s -> %s, want PROXY %s -> %s", h.Command, h.Src, h.Dst, local, target)
				}
				if id, ok := h.TLV(proxyproto.TypeSPIFFEID); !ok || string(id) != spiffe {
					t.Errorf("TLV 0xD0 = %q (%v), want %q", id, ok, spiffe)
				}
				nextLog(t, rig.logs)
			})
		}

		t.Run("no tunnel, no header", func(t *testing.T) {
			app := echoApp(t)
			rig := startProxy(t, fmt.Sprintf(srvConfig, ""), "srv", withEngine(eng))
			s, _, err := rig.connectWith(t, fmt.Sprintf("127.0.0.1:%d", app), nil)
			if err != nil {
				t.Fatal(err)
			}
			streamEcho(t, s, "plain") // an echo app would return a header too
			nextLog(t, rig.logs)
		})
	})
}

// TestTunnelTarget pins the PROXY header's destination for each authority
// form, as ztunnel's tunnel_target: an address as sent; a service hostname
// as a VIP of the service, one on the local network first, then IPv4
// first, with the authority's port; a hostname without a VIP fails.
func TestTunnelTarget(t *testing.T) {
	snap, err := xdsconv.LocalSnapshot([]byte(`
workloads:
- uid: srv
  name: srv
  namespace: ns
  serviceAccount: srv
  workloadIps: ["127.0.0.1"]
  protocol: HBONE
  network: net-a
  services: {"ns/mixed.ns.svc.cluster.local": {80: 8080}, "ns/novip.ns.svc.cluster.local": {80: 8080}}
services:
- {name: mixed, namespace: ns, hostname: mixed.ns.svc.cluster.local, vips: ["net-b/10.0.0.9", "net-a/fd00::9", "net-a/10.0.0.8"], ports: {80: 8080}}
- {name: novip, namespace: ns, hostname: novip.ns.svc.cluster.local, vips: [], ports: {80: 8080}}
`))
	if err != nil {
		t.Fatal(err)
	}
	w := snap.WorkloadByUID("srv")
	tests := []struct {
		name, host, authority, want string
	}{
		{"address authority as sent", "", "10.96.7.7:8080", "10.96.7.7:8080"},
		{"hostname: local network, IPv4 first", "mixed.ns.svc.cluster.local", "0.0.0.0:80", "10.0.0.8:80"},
		{"hostname without a VIP", "novip.ns.svc.cluster.local", "0.0.0.0:80", ""},
		{"hostname of no service of the workload", "other.ns.svc.cluster.local", "0.0.0.0:80", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tunnelTarget(snap, w, tc.host, netip.MustParseAddrPort(tc.authority), "net-a")
			if tc.want == "" {
				if err == nil {
					t.Fatalf("got %s, want an error", got)
				}
				return
			}
			if err != nil || got.String() != tc.want {
				t.Fatalf("got %s, %v; want %s", got, err, tc.want)
			}
		})
	}
}
