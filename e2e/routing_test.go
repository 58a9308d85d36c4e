package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/api/workloadapi"
	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/internal/labrun"
	"github.com/ztunnel-go/ztunnel/internal/netnslab"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
	"github.com/ztunnel-go/ztunnel/mtls/tlstest"
	"github.com/ztunnel-go/ztunnel/state/xdsconv"
)

// routingConfig is the mesh of the service routing tests. node-a holds the
// client; node-b holds three endpoints of the service "web" (VIP
// 10.96.0.10, capacities 1, 2 and 3) and a test waypoint pod (protocol TCP,
// so no daemon: the test runs its own HBONE server there). The service
// "behind" (VIP 10.96.0.20) has web-1 as its endpoint and the waypoint
// service (VIP 10.96.0.50) as its waypoint.
const routingConfig = `
workloads:
- {uid: u-client, name: client, namespace: default, serviceAccount: client, workloadIps: ["10.244.0.2"], protocol: HBONE, node: node-a, services: {}}
- uid: u-web-1
  name: web-1
  namespace: default
  serviceAccount: web
  workloadIps: ["10.244.1.2"]
  protocol: HBONE
  node: node-b
  capacity: 1
  services: {"default/web.default.svc.cluster.local": {80: 8080}, "default/behind.default.svc.cluster.local": {80: 8080}}
- uid: u-web-2
  name: web-2
  namespace: default
  serviceAccount: web
  workloadIps: ["10.244.1.3"]
  protocol: HBONE
  node: node-b
  capacity: 2
  services: {"default/web.default.svc.cluster.local": {80: 8080}}
- uid: u-web-3
  name: web-3
  namespace: default
  serviceAccount: web
  workloadIps: ["10.244.1.4"]
  protocol: HBONE
  node: node-b
  capacity: 3
  services: {"default/web.default.svc.cluster.local": {80: 8080}}
- uid: u-waypoint
  name: waypoint
  namespace: default
  serviceAccount: waypoint
  workloadIps: ["10.244.1.5"]
  protocol: TCP
  node: node-b
  services: {"default/waypoint.default.svc.cluster.local": {15008: 15008}}
services:
- name: web
  namespace: default
  hostname: web.default.svc.cluster.local
  vips: ["/10.96.0.10"]
  ports: {80: 8080}
- name: behind
  namespace: default
  hostname: behind.default.svc.cluster.local
  vips: ["/10.96.0.20"]
  ports: {80: 8080}
  waypoint: {destination: default/waypoint.default.svc.cluster.local, hboneMtlsPort: 15008}
- name: waypoint
  namespace: default
  hostname: waypoint.default.svc.cluster.local
  vips: ["/10.96.0.50"]
  ports: {15008: 15008}
`

// roundTripTo connects from pod to dst through its capture rules, sends
// payload, half-closes and returns what came back.
func roundTripTo(t *testing.T, pod *netnslab.Pod, dst string, payload []byte) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pod.Dial(ctx, "tcp", dst)
	if err != nil {
		t.Fatalf("dial %s from %s: %v", dst, pod.Name, err)
	}
	defer c.Close()
	got, err := roundTrip(c.(*net.TCPConn), payload)
	if err != nil {
		t.Fatalf("%s -> %s: %v (read %q)", pod.Name, dst, err, got)
	}
	return got
}

func startRoutingCluster(t *testing.T) *labrun.Cluster {
	t.Helper()
	lab := netnslab.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := startCluster(ctx, t, lab, routingConfig, labrun.ClusterOptions{Binary: ztunnelBin, Dir: t.TempDir()})
	return c
}

// TestServiceCapacityWeights sends connections to a service VIP whose three
// endpoints have capacities 1, 2 and 3, and checks that each endpoint got
// its share within a generous tolerance.
func TestServiceCapacityWeights(t *testing.T) {
	c := startRoutingCluster(t)
	pods := []string{"web-1", "web-2", "web-3"}
	echo := map[string]*labrun.EchoServer{}
	for _, name := range pods {
		echo[name] = startEcho(t, c.Pods[name], 8080)
	}
	const n = 300
	for i := range n {
		msg := fmt.Appendf(nil, "conn %d", i)
		if got := roundTripTo(t, c.Pods["client"], "10.96.0.10:80", msg); string(got) != string(msg) {
			t.Fatalf("connection %d: echoed %q", i, got)
		}
	}
	// Shares 1/6, 2/6, 3/6 of 300: 50, 100, 150, with standard deviations
	// of about 6.5, 8.2 and 8.7; ±35 is over four of them.
	total := 0
	for i, name := range pods {
		got, want := len(echo[name].Peers()), n*(i+1)/6
		total += got
		t.Logf("%s (capacity %d): %d connections, expected about %d", name, i+1, got, want)
		if got < want-35 || got > want+35 {
			t.Errorf("%s (capacity %d) got %d of %d connections, want %d±35", name, i+1, got, n, want)
		}
	}
	if total != n {
		t.Errorf("endpoints saw %d connections, want %d", total, n)
	}
}

// TestServiceWaypoint sends a connection to a service with a waypoint: the
// client's daemon must open HBONE to the waypoint pod (verifying the
// waypoint's identity), with the service VIP:port as the authority.
func TestServiceWaypoint(t *testing.T) {
	c := startRoutingCluster(t)
	cert := tlstest.Cert(t, c.CA, identity.New("", "default", "waypoint"))
	wp, err := labrun.StartWaypoint(c.Pods["waypoint"], 15008, cert)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { wp.Close() })
	direct := startEcho(t, c.Pods["web-1"], 8080)

	got := roundTripTo(t, c.Pods["client"], "10.96.0.20:80", []byte("through the waypoint"))
	line, rest, _ := strings.Cut(string(got), "\n")
	if line != "waypoint 10.96.0.20:80" || rest != "through the waypoint" {
		t.Fatalf("reply %q, want the waypoint's line with the VIP authority, then the echo", got)
	}
	reqs := wp.Requests()
	if len(reqs) != 1 {
		t.Fatalf("waypoint saw %d requests, want 1", len(reqs))
	}
	if want := identity.New("", "default", "client"); reqs[0].Peer != want {
		t.Errorf("waypoint peer %s, want %s", reqs[0].Peer, want)
	}
	if reqs[0].From.Addr() != c.Pods["client"].IP {
		t.Errorf("tunnel came from %s, want the client pod %s", reqs[0].From, c.Pods["client"].IP)
	}
	if n := len(direct.Peers()); n != 0 {
		t.Errorf("the endpoint behind the waypoint was reached directly %d times", n)
	}

	// Traffic to the service without a waypoint still goes direct.
	for _, name := range []string{"web-2", "web-3"} {
		startEcho(t, c.Pods[name], 8080)
	}
	if got := roundTripTo(t, c.Pods["client"], "10.96.0.10:80", []byte("direct")); string(got) != "direct" {
		t.Errorf("service without a waypoint: %q", got)
	}
	if n := len(wp.Requests()); n != 1 {
		t.Errorf("waypoint saw %d requests after direct traffic, want still 1", n)
	}
}

// failoverTopology lays out the pods of the failover test (node "cp" hosts
// the fake istiod, so node-a's pods are 10.244.1.x and node-b's 10.244.2.x).
// The daemons read none of it: they get everything from xDS.
const failoverTopology = `
workloads:
- {uid: u-client, name: client, namespace: default, serviceAccount: client, workloadIps: ["10.244.1.2"], protocol: HBONE, node: node-a, services: {}}
- {uid: u-near, name: near, namespace: default, serviceAccount: near, workloadIps: ["10.244.1.3"], protocol: HBONE, node: node-a, services: {}}
- {uid: u-far, name: far, namespace: default, serviceAccount: far, workloadIps: ["10.244.2.2"], protocol: HBONE, node: node-b, services: {}}
`

const failoverSvcKey = "default/web.default.svc.cluster.local"

func localityWorkload(name, ip, node, zone string, svc bool) *workloadapi.Address {
	a := xdsWorkload(name, ip, node)
	w := a.GetWorkload()
	w.Locality = &workloadapi.Locality{Region: "r1", Zone: zone}
	if svc {
		w.Services = map[string]*workloadapi.PortList{failoverSvcKey: {Ports: []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}}}}
	}
	return a
}

// TestLocalityFailover checks a FAILOVER service over [region, zone]: the
// client's connections go to the endpoint in its zone; once that endpoint
// is removed by an xDS push they fail over to the other zone.
func TestLocalityFailover(t *testing.T) {
	lab := netnslab.New(t)
	cp := startControlPlane(t, lab)
	xds := cp.xds
	xds.Set(xdsconv.AddressType, "u-client", "1", localityWorkload("client", "10.244.1.2", "node-a", "z1", false))
	xds.Set(xdsconv.AddressType, "u-near", "1", localityWorkload("near", "10.244.1.3", "node-a", "z1", true))
	xds.Set(xdsconv.AddressType, "u-far", "1", localityWorkload("far", "10.244.2.2", "node-b", "z2", true))
	xds.Set(xdsconv.AddressType, failoverSvcKey, "1", &workloadapi.Address{Type: &workloadapi.Address_Service{Service: &workloadapi.Service{
		Name: "web", Namespace: "default", Hostname: "web.default.svc.cluster.local",
		Addresses: []*workloadapi.NetworkAddress{{Address: netip.MustParseAddr("10.96.0.10").AsSlice()}},
		Ports:     []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}},
		LoadBalancing: &workloadapi.LoadBalancing{
			Mode:              workloadapi.LoadBalancing_FAILOVER,
			RoutingPreference: []workloadapi.LoadBalancing_Scope{workloadapi.LoadBalancing_REGION, workloadapi.LoadBalancing_ZONE},
		},
	}}})

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := startCluster(ctx, t, lab, failoverTopology, labrun.ClusterOptions{
		Binary: ztunnelBin, Dir: t.TempDir(),
		DaemonEnv: cp.env(),
	})
	// Each endpoint answers with its name, so the client sees who served it.
	for _, name := range []string{"near", "far"} {
		stop := startNamer(t, c.Pods[name], 8080, name)
		t.Cleanup(stop)
	}
	ask := func() string {
		return string(roundTripTo(t, c.Pods["client"], "10.96.0.10:80", nil))
	}
	// During the switch a connection may fail: the client's daemon can
	// still pick the removed endpoint after that endpoint's own daemon has
	// learnt it no longer exists.
	try := func() (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		conn, err := c.Pods["client"].Dial(ctx, "tcp", "10.96.0.10:80")
		if err != nil {
			return "", err
		}
		defer conn.Close()
		got, err := roundTrip(conn.(*net.TCPConn), nil)
		return string(got), err
	}

	const n = 20
	for i := range n {
		if got := ask(); got != "near" {
			t.Fatalf("connection %d served by %q, want the same-zone endpoint", i, got)
		}
	}

	// Remove the same-zone endpoint; the push reaches the client's daemon
	// some time later, after which every connection goes to the other zone.
	xds.Remove(xdsconv.AddressType, "u-near")
	switched := nettest.Until(10*time.Second, func() bool {
		got, err := try()
		if err == nil && got != "near" && got != "far" {
			t.Fatalf("served by %q", got)
		}
		return err == nil && got == "far"
	})
	if !switched {
		t.Fatal("connections never failed over to the other zone after the same-zone endpoint was removed")
	}
	for i := range n {
		if got := ask(); got != "far" {
			t.Fatalf("after failover, connection %d served by %q", i, got)
		}
	}
}

// startNamer runs a server in pod that answers every connection with name
// and closes; the returned function stops it.
func startNamer(t *testing.T, pod *netnslab.Pod, port uint16, name string) func() {
	t.Helper()
	s := servePod(t, pod, port, func(c net.Conn) {
		c.SetDeadline(time.Now().Add(10 * time.Second))
		io.WriteString(c, name)
		c.(*net.TCPConn).CloseWrite()
		io.Copy(io.Discard, bufio.NewReader(c))
	})
	return func() { s.Close() }
}
