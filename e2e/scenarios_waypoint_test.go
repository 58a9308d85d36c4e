package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/internal/labrun"
	"github.com/ztunnel-go/ztunnel/internal/netnslab"
	"github.com/ztunnel-go/ztunnel/mtls/tlstest"
	"github.com/ztunnel-go/ztunnel/proxy/proxyproto"
)

// scenWaypointConfig holds ztunnel's waypoint scenarios on one node in
// shared mode. The waypoints are uncaptured TCP workloads (no daemon in
// their pods, as ztunnel's register_waypoint makes them) running a test
// HBONE server: "waypoint" (10.244.0.6), a member of the service
// waypoint.default.svc (VIP 10.96.0.50, port 15008) with ztunnel's odd
// port map 80 -> 8080, and "waypoint-host", known also by its own hostname
// waypoint.example.com. The servers name their workload waypoint by
// address (wl-addr), by the service's hostname (svc-host) and by the
// workload's hostname (wl-host); the service "svc" (VIP 10.96.0.10, no
// endpoints) names "waypoint" by address.
const scenWaypointConfig = `
workloads:
- {uid: u-client, name: client, namespace: default, serviceAccount: client, workloadIps: ["10.244.0.2"], protocol: HBONE, node: node-a, services: {}}
- uid: u-wl-addr
  name: wl-addr
  namespace: default
  serviceAccount: wl-addr
  workloadIps: ["10.244.0.3"]
  protocol: HBONE
  node: node-a
  waypoint: {destination: "/10.244.0.6", hboneMtlsPort: 15008}
  services: {}
- uid: u-svc-host
  name: svc-host
  namespace: default
  serviceAccount: svc-host
  workloadIps: ["10.244.0.4"]
  protocol: HBONE
  node: node-a
  waypoint: {destination: default/waypoint.default.svc.cluster.local, hboneMtlsPort: 15008}
  services: {}
- uid: u-wl-host
  name: wl-host
  namespace: default
  serviceAccount: wl-host
  workloadIps: ["10.244.0.5"]
  protocol: HBONE
  node: node-a
  waypoint: {destination: default/waypoint.example.com, hboneMtlsPort: 15008}
  services: {}
- uid: u-waypoint
  name: waypoint
  namespace: default
  serviceAccount: waypoint
  workloadIps: ["10.244.0.6"]
  protocol: TCP
  node: node-a
  services: {"default/waypoint.default.svc.cluster.local": {80: 8080}}
- uid: u-waypoint-host
  name: waypoint-host
  namespace: default
  serviceAccount: waypoint
  hostname: waypoint.example.com
  workloadIps: ["10.244.0.7"]
  protocol: TCP
  node: node-a
  services: {}
services:
- name: waypoint
  namespace: default
  hostname: waypoint.default.svc.cluster.local
  vips: ["/10.96.0.50"]
  ports: {15008: 15008}
- name: svc
  namespace: default
  hostname: svc.default.svc.cluster.local
  vips: ["/10.96.0.10"]
  ports: {80: 80}
  waypoint: {destination: "/10.244.0.6", hboneMtlsPort: 15008}
`

// helloWaypoint is ztunnel's client against its waypoint test server:
// write "hello world", read the waypoint's line and the echo. Ours names
// the authority in its line ("waypoint <authority>\n"); it returns how many
// bytes came back.
func helloWaypoint(ctx context.Context, pod *netnslab.Pod, dst, authority string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := pod.Dial(ctx, "tcp", dst)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, helloMsg); err != nil {
		return 0, err
	}
	want := "waypoint " + authority + "\n" + helloMsg
	got := make([]byte, len(want))
	if _, err := io.ReadFull(c, got); err != nil {
		return 0, fmt.Errorf("read %q: %w", got, err)
	}
	if string(got) != want {
		return 0, fmt.Errorf("read %q, want %q", got, want)
	}
	return len(got), nil
}

// TestScenarioWaypoint runs ztunnel's waypoint scenarios (rows 8, 11, 12
// and 13 of docs/ztunnel-scenarios.md): the client's daemon tunnels to the
// waypoint pod with the original destination as authority, never to the
// server; the source reporter counts opened=1 closed=1, received 11 and
// sent what the waypoint wrote back; the outbound log names the waypoint as
// dst.workload, its HBONE address as dst.addr, the authority as
// dst.hbone_addr, and both identities.
func TestScenarioWaypoint(t *testing.T) {
	lab := netnslab.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := startSharedCluster(ctx, t, lab, scenWaypointConfig, labrun.SharedOptions{
		Binary: ztunnelBin, Dir: t.TempDir(), DaemonEnv: []string{"LOG_FORMAT=json"},
	})
	cert := tlstest.Cert(t, c.CA, identity.New("", "default", "waypoint"))
	wps := map[string]*labrun.Waypoint{}
	for _, name := range []string{"waypoint", "waypoint-host"} {
		wp, err := labrun.StartWaypoint(c.Pods[name], 15008, cert)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { wp.Close() })
		wps[name] = wp
	}
	// The servers answer too: a connection that skipped the waypoint would
	// get their double echo instead of the waypoint's line.
	for _, name := range []string{"wl-addr", "svc-host", "wl-host"} {
		startDoubler(t, c.Pods[name], 8080)
	}
	d := c.Daemons["node-a"]

	cases := []struct {
		name     string
		dst      string // what the client dials
		waypoint string // the waypoint pod that must get the tunnel
		dstNS    bool   // ztunnel's row also asserts dst.namespace
	}{
		{"workload waypoint by address", "10.244.0.3:8080", "waypoint", true},                 // row 8
		{"service waypoint by address", "10.96.0.10:80", "waypoint", false},                   // row 11
		{"workload waypoint by service hostname", "10.244.0.4:8080", "waypoint", false},       // row 12
		{"workload waypoint by workload hostname", "10.244.0.5:8080", "waypoint-host", false}, // row 13
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			wp := wps[tc.waypoint]
			labels := map[string]string{"reporter": "source", "source_workload": "client"}
			base := readCounts(ctx, t, d, labels)
			before := len(wp.Requests())
			n, err := helloWaypoint(ctx, c.Pods["client"], tc.dst, tc.dst)
			if err != nil {
				t.Fatalf("client -> %s: %v", tc.dst, err)
			}
			reqs := wp.Requests()
			if len(reqs) != before+1 {
				t.Fatalf("waypoint %s saw %d new requests, want 1", tc.waypoint, len(reqs)-before)
			}
			if r := reqs[len(reqs)-1]; r.Authority != tc.dst || r.Peer != identity.New("", "default", "client") || r.From.Addr() != c.Pods["client"].IP {
				t.Errorf("waypoint request %+v, want authority %s from the client pod with the client's identity", r, tc.dst)
			}
			checkCounts(ctx, t, d, labels, base, tcpCounts{1, 1, float64(helloSize), float64(n)})
			want := map[string]string{
				"scope": "access", "message": "connection complete", "direction": "outbound",
				"src.workload": "client", "dst.workload": tc.waypoint,
				"dst.hbone_addr": tc.dst, "dst.addr": netip.AddrPortFrom(c.Pods[tc.waypoint].IP, 15008).String(),
				"bytes_sent": fmt.Sprint(helloSize), "bytes_recv": fmt.Sprint(n),
				"src.identity": spiffe("client"), "dst.identity": spiffe("waypoint"),
			}
			if tc.dstNS {
				want["dst.namespace"] = "default"
			}
			checkAccessLog(ctx, t, d, want)
		})
	}
}

// scenSandwichConfig holds ztunnel's two sandwich scenarios on one node in
// shared mode; every workload is captured, the waypoints included (their
// own ztunnel serves them: the "sandwich"). Row 14: "wp-plain" has an
// application tunnel of protocol NONE and is the workload waypoint of
// "srv-plain" by address. Row 15: "wp-proxy" has an application tunnel of
// protocol PROXY on 15088 and is the one endpoint of the service
// wp-proxy.default.svc (VIP 10.96.0.60, no ports: the tunnel makes it
// work), which is the waypoint of "srv-proxy" by the VIP.
const scenSandwichConfig = `
workloads:
- {uid: u-client, name: client, namespace: default, serviceAccount: client, workloadIps: ["10.244.0.2"], protocol: HBONE, node: node-a, services: {}}
- uid: u-wp-plain
  name: wp-plain
  namespace: default
  serviceAccount: wp-plain
  workloadIps: ["10.244.0.3"]
  protocol: HBONE
  node: node-a
  applicationTunnel: {protocol: NONE}
  services: {}
- uid: u-srv-plain
  name: srv-plain
  namespace: default
  serviceAccount: srv-plain
  workloadIps: ["10.244.0.4"]
  protocol: HBONE
  node: node-a
  waypoint: {destination: "/10.244.0.3", hboneMtlsPort: 15008}
  services: {}
- uid: u-wp-proxy
  name: wp-proxy
  namespace: default
  serviceAccount: wp-proxy
  workloadIps: ["10.244.0.5"]
  protocol: HBONE
  node: node-a
  applicationTunnel: {protocol: PROXY, port: 15088}
  services: {"default/wp-proxy.default.svc.cluster.local": {15088: 15088}}
- uid: u-srv-proxy
  name: srv-proxy
  namespace: default
  serviceAccount: srv-proxy
  workloadIps: ["10.244.0.6"]
  protocol: HBONE
  node: node-a
  waypoint: {destination: "/10.96.0.60", hboneMtlsPort: 15008}
  services: {}
services:
- name: wp-proxy
  namespace: default
  hostname: wp-proxy.default.svc.cluster.local
  vips: ["/10.96.0.60"]
  ports: {}
`

// startForwarder runs a TCP proxy on port in pod, as ztunnel's sandwich
// tests run in the waypoint pod: each connection is relayed to the address
// target returns for it (target may read from the connection first, as a
// PROXY-protocol server reads its header). The proxy's own connections go
// out through the pod's capture rules. It returns the number of
// connections relayed so far.
func startForwarder(t *testing.T, pod *netnslab.Pod, port uint16, target func(net.Conn) (string, error)) func() int64 {
	t.Helper()
	var relayed atomic.Int64
	servePod(t, pod, port, func(c net.Conn) {
		c.SetDeadline(time.Now().Add(30 * time.Second))
		dst, err := target(c)
		if err != nil {
			if !errors.Is(err, net.ErrClosed) { // not the test's end closing it
				t.Errorf("forwarder in %s: %v", pod.Name, err)
			}
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		up, err := pod.Dial(ctx, "tcp", dst)
		cancel()
		if err != nil {
			t.Errorf("forwarder in %s: dial %s: %v", pod.Name, dst, err)
			return
		}
		defer up.Close()
		up.SetDeadline(time.Now().Add(30 * time.Second))
		relayed.Add(1)
		done := make(chan struct{})
		go func() {
			io.Copy(up, c)
			up.(*net.TCPConn).CloseWrite()
			close(done)
		}()
		io.Copy(c, up)
		c.(*net.TCPConn).CloseWrite()
		<-done
	})
	return relayed.Load
}

// TestScenarioSandwich runs ztunnel's sandwich scenarios (rows 14 and 15
// of docs/ztunnel-scenarios.md): the client's connection to a server goes
// through its captured waypoint, whose own daemon hands it to the waypoint
// app (plain, or behind a PROXY v2 header on 15088); the waypoint app's
// connection onwards goes to the server directly, over HBONE with the
// waypoint's identity. ztunnel asserts the traffic; this also checks that
// the waypoint app relayed it, the PROXY header's addresses and SPIFFE TLV,
// and the server daemon's inbound log.
func TestScenarioSandwich(t *testing.T) {
	lab := netnslab.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := startSharedCluster(ctx, t, lab, scenSandwichConfig, labrun.SharedOptions{
		Binary: ztunnelBin, Dir: t.TempDir(), DaemonEnv: []string{"LOG_FORMAT=json"},
	})
	d := c.Daemons["node-a"]
	for _, name := range []string{"srv-plain", "srv-proxy"} {
		startDoubler(t, c.Pods[name], 8080)
	}
	srvPlain := netip.AddrPortFrom(c.Pods["srv-plain"].IP, 8080)
	plainRelayed := startForwarder(t, c.Pods["wp-plain"], 8080, func(net.Conn) (string, error) {
		return srvPlain.String(), nil
	})
	headers := make(chan *proxyproto.Header, 4)
	proxyRelayed := startForwarder(t, c.Pods["wp-proxy"], 15088, func(c net.Conn) (string, error) {
		h, err := proxyproto.Read(c)
		if err != nil {
			return "", err
		}
		headers <- h
		return h.Dst.String(), nil
	})

	cases := []struct {
		name     string
		server   string
		waypoint string
		relayed  func() int64
	}{
		{"application tunnel NONE", "srv-plain", "wp-plain", plainRelayed},               // row 14
		{"application tunnel PROXY behind a VIP", "srv-proxy", "wp-proxy", proxyRelayed}, // row 15
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dst := netip.AddrPortFrom(c.Pods[tc.server].IP, 8080)
			before := tc.relayed()
			if err := helloDouble(ctx, c.Pods["client"], dst.String()); err != nil {
				t.Fatalf("client -> %s: %v", dst, err)
			}
			if n := tc.relayed() - before; n != 1 {
				t.Fatalf("the waypoint app relayed %d connections, want 1", n)
			}
			if tc.waypoint == "wp-proxy" {
				select {
				case h := <-headers:
					if h.Command != proxyproto.Proxy || h.Src.Addr() != c.Pods["client"].IP || h.Dst != dst {
						t.Errorf("PROXY header %v %s -> %s, want PROXY from the client %s to %s", h.Command, h.Src, h.Dst, c.Pods["client"].IP, dst)
					}
					if id, ok := h.TLV(proxyproto.TypeSPIFFEID); !ok || string(id) != spiffe("client") {
						t.Errorf("SPIFFE TLV %q (present %v), want %s", id, ok, spiffe("client"))
					}
				default:
					t.Fatal("the waypoint app got no PROXY header")
				}
			}
			// The client's tunnel ends at the waypoint; the waypoint's own
			// connection reaches the server with the waypoint's identity.
			checkAccessLog(ctx, t, d, map[string]string{
				"message": "connection complete", "direction": "outbound", "src.workload": "client",
				"dst.workload": tc.waypoint, "dst.hbone_addr": dst.String(),
				"dst.addr": netip.AddrPortFrom(c.Pods[tc.waypoint].IP, 15008).String(),
			})
			checkAccessLog(ctx, t, d, map[string]string{
				"message": "connection complete", "direction": "inbound", "src.workload": tc.waypoint,
				"src.identity": spiffe(tc.waypoint), "dst.workload": tc.server, "dst.identity": spiffe(tc.server),
				"bytes_sent": "22", "bytes_recv": "11",
			})
		})
	}
}
