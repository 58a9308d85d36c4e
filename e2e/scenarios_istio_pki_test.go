package e2e

import (
	"context"
	"crypto/x509"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/internal/labrun"
	"github.com/ztunnel-go/ztunnel/internal/netnslab"
	"github.com/ztunnel-go/ztunnel/mtls"
)

// Scenarios of Istio's ambient integration tests about certificates and
// failover (rows A17, A19 and A21 of docs/ztunnel-scenarios.md).

// failoverMultiNetworkConfig is the lab of Istio's
// TestMulticlusterFailover/without-waypoint: two global services,
// broken1.ns1 and broken2.ns2, each with its one ready endpoint on net-b
// (behind the east-west gateway "eastwest") and none on net-a. broken1 has
// a not-ready endpoint on net-a ("local-1", status Unhealthy); broken2 has
// no endpoint at all there (zero replicas). A client on each network calls
// both. node-a's pods are 10.244.0.x, node-b's 10.244.1.x.
const failoverMultiNetworkConfig = `
workloads:
- uid: cluster-a//v1/Pod/ns1/client-a
  name: client-a
  namespace: ns1
  serviceAccount: client
  workloadIps: ["10.244.0.2"]
  network: net-a
  protocol: HBONE
  node: node-a
  services: {}
- uid: cluster-a//v1/Pod/ns1/local-1
  name: local-1
  namespace: ns1
  serviceAccount: broken1
  workloadIps: ["10.244.0.3"]
  network: net-a
  protocol: TCP
  status: Unhealthy
  node: node-a
  services:
    ns1/broken1.ns1.svc.cluster.local: {80: 8080}
- uid: cluster-b//v1/Pod/ns1/client-b
  name: client-b
  namespace: ns1
  serviceAccount: client
  workloadIps: ["10.244.1.2"]
  network: net-b
  protocol: HBONE
  node: node-b
  services: {}
- uid: cluster-b//v1/Pod/ns1/server-1
  name: server-1
  namespace: ns1
  serviceAccount: broken1
  workloadIps: ["10.244.1.3"]
  network: net-b
  protocol: HBONE
  node: node-b
  networkGateway: {destination: "net-b/10.244.1.5", hboneMtlsPort: 15008}
  services:
    ns1/broken1.ns1.svc.cluster.local: {80: 8080}
- uid: cluster-b//v1/Pod/ns2/server-2
  name: server-2
  namespace: ns2
  serviceAccount: broken2
  workloadIps: ["10.244.1.4"]
  network: net-b
  protocol: HBONE
  node: node-b
  networkGateway: {destination: "net-b/10.244.1.5", hboneMtlsPort: 15008}
  services:
    ns2/broken2.ns2.svc.cluster.local: {80: 8080}
- uid: cluster-b//v1/Pod/istio-system/eastwest
  name: eastwest
  namespace: istio-system
  serviceAccount: istio-eastwestgateway
  workloadIps: ["10.244.1.5"]
  network: net-b
  protocol: TCP
  node: node-b
  services:
    istio-system/eastwest.istio-system.svc.cluster.local: {15008: 15008}
services:
- name: broken1
  namespace: ns1
  hostname: broken1.ns1.svc.cluster.local
  vips: ["net-a/10.96.0.10", "net-b/10.96.0.10"]
  ports: {80: 8080}
- name: broken2
  namespace: ns2
  hostname: broken2.ns2.svc.cluster.local
  vips: ["net-a/10.96.0.11", "net-b/10.96.0.11"]
  ports: {80: 8080}
- name: eastwest
  namespace: istio-system
  hostname: eastwest.istio-system.svc.cluster.local
  vips: []
  ports: {15008: 15008}
`

// TestMulticlusterFailover mirrors Istio's
// TestMulticlusterFailover/without-waypoint: every call from either
// network to a service with no ready endpoint on the caller's network
// succeeds without a retry. From net-a it reaches the net-b endpoint
// through the east-west gateway (one inner tunnel per call); from net-b it
// goes direct. The not-ready net-a endpoint is never used.
func TestMulticlusterFailover(t *testing.T) {
	t.Run("without-waypoint", func(t *testing.T) {
		lab := netnslab.New(t)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		c := startCluster(ctx, t, lab, failoverMultiNetworkConfig, labrun.ClusterOptions{
			Binary: ztunnelBin, Dir: t.TempDir(), LogLevel: "info,access=debug",
		})
		// Each endpoint answers with its name; the not-ready one too, so a
		// connection routed to it would be seen.
		for _, name := range []string{"local-1", "server-1", "server-2"} {
			t.Cleanup(startNamer(t, c.Pods[name], 8080, name))
		}
		hbone := func(pod string) netip.AddrPort { return netip.AddrPortFrom(c.Pods[pod].IP, 15008) }
		gw, err := labrun.StartEWGateway(ctx, c.Pods["eastwest"], 15008, c.CA, identity.New("", "istio-system", "istio-eastwestgateway"),
			map[string]netip.AddrPort{
				"broken1.ns1.svc.cluster.local:80": hbone("server-1"),
				"broken2.ns2.svc.cluster.local:80": hbone("server-2"),
			})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { gw.Close() })

		type call struct{ client, vip, host, want string }
		calls := []call{
			{"client-a", "10.96.0.10:80", "broken1.ns1.svc.cluster.local", "server-1"},
			{"client-a", "10.96.0.11:80", "broken2.ns2.svc.cluster.local", "server-2"},
			{"client-b", "10.96.0.10:80", "broken1.ns1.svc.cluster.local", "server-1"},
			{"client-b", "10.96.0.11:80", "broken2.ns2.svc.cluster.local", "server-2"},
		}
		const rounds = 5
		// Each round makes the four calls at once, like Istio's two
		// concurrent calls per client (istio#58630 needed two services).
		for r := range rounds {
			var g errgroup.Group
			for _, cl := range calls {
				g.Go(func() error {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					defer cancel()
					conn, err := c.Pods[cl.client].Dial(ctx, "tcp", cl.vip)
					if err != nil {
						return fmt.Errorf("round %d: %s -> %s: %w", r, cl.client, cl.host, err)
					}
					defer conn.Close()
					got, err := roundTrip(conn.(*net.TCPConn), nil)
					if err != nil {
						return fmt.Errorf("round %d: %s -> %s: %w", r, cl.client, cl.host, err)
					}
					if string(got) != cl.want {
						return fmt.Errorf("round %d: %s -> %s served by %q, want %q", r, cl.client, cl.host, got, cl.want)
					}
					return nil
				})
			}
			if err := g.Wait(); err != nil {
				t.Fatal(err)
			}
		}
		// Only net-a's calls crossed networks: one inner tunnel each, all in
		// one pooled outer connection to the gateway.
		if got, want := gw.Tunnels(), int64(rounds*2); got != want {
			t.Errorf("gateway spliced %d inner tunnels, want %d (net-a's calls only)", got, want)
		}
		if got := gw.Conns(); got != 1 {
			t.Errorf("gateway accepted %d outer connections, want 1", got)
		}
		logCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, host := range []string{"broken1.ns1.svc.cluster.local", "broken2.ns2.svc.cluster.local"} {
			// net-a's daemon went to the gateway with the service authority.
			if _, err := c.Daemons["client-a"].WaitLog(logCtx, "connection complete", `direction="outbound"`,
				"dst.addr="+hbone("eastwest").String()+" ", `dst.hbone_addr="`+host+`:80"`); err != nil {
				t.Fatal(err)
			}
		}
		// net-b's daemon went straight to the endpoints.
		for _, pod := range []string{"server-1", "server-2"} {
			if _, err := c.Daemons["client-b"].WaitLog(logCtx, "connection complete", `direction="outbound"`,
				"dst.addr="+hbone(pod).String()+" "); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// TestZtunnelCrlOutbound mirrors Istio's crl TestZtunnelCrlOutbound: the
// server's certificate chains through an intermediate CA of the mesh's
// root, and the client side's CRL revokes that intermediate. The client's
// daemon refuses the server in the handshake (no CONNECT is answered) and
// counts the rejection with reporter=source. The server is an HBONE server
// in the server's pod (its daemon stopped) presenting [leaf, intermediate]:
// the lab's daemons sign with the root only.
func TestZtunnelCrlOutbound(t *testing.T) {
	l := startCRLLab(t, false)
	if err := l.daemons["server"].Stop(); err != nil {
		t.Fatalf("stopping the server's daemon: %v", err)
	}
	inter := l.intermediate(t)
	leaf := leafFrom(t, inter, "spiffe://cluster.local/ns/default/sa/server")
	roots := x509.NewCertPool()
	roots.AddCert(l.ca.Cert)
	srv, err := labrun.StartWaypoint(l.pods["server"], 15008, &mtls.WorkloadCert{
		Identity: identity.New("", "default", "server"), Certificate: leaf, Roots: roots,
		NotBefore: leaf.Leaf.NotBefore, NotAfter: leaf.Leaf.NotAfter,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	ask := func() (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		conn, err := l.pods["client"].Dial(ctx, "tcp", l.srv.String())
		if err != nil {
			return "", err
		}
		defer conn.Close()
		got, err := roundTrip(conn.(*net.TCPConn), []byte("hello"))
		return string(got), err
	}

	// Not revoked: the chain [leaf, intermediate] verifies to the root.
	want := "waypoint " + l.srv.String() + "\nhello"
	if got, err := ask(); err != nil || got != want {
		t.Fatalf("before the CRL: %q, %v; want %q", got, err, want)
	}
	if n := len(srv.Requests()); n != 1 {
		t.Fatalf("server saw %d CONNECTs, want 1", n)
	}

	// The root's CRL revokes the intermediate; the client's daemon reloads
	// the file (the server's is stopped).
	before := l.metric(t, "client", rejections, source)
	reloads := logCount(l.daemons["client"], "crl reloaded")
	l.write(t, crl(t, l.ca, inter.Cert.SerialNumber))
	waitLogCount(t, l.daemons["client"], reloads+1, "crl reloaded")
	l.expectNoEcho(t)
	l.waitMetric(t, "client", rejections, source, before+1)
	if n := len(srv.Requests()); n != 1 {
		t.Errorf("server saw %d CONNECTs after the revocation, want still 1", n)
	}
}
