package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/ztunnel-go/ztunnel/internal/labrun"
	"github.com/ztunnel-go/ztunnel/internal/netnslab"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
)

// Cases of istio/istio's tests/integration/ambient that exercise ztunnel
// itself (docs/ztunnel-scenarios.md, section "istio/istio
// tests/integration/ambient"). Istio applies each policy in turn to one
// destination; here every case has a destination pod of its own with the
// policy istiod would send for it, so one cluster serves them all.

// istioAuthzConfig: client (captured, node-a) and outsider (uncaptured, no
// daemon, node-c) call the captured pods on node-b, each with one policy in
// the shape istiod converts it to, and plain (uncaptured, node-c), which a
// policy names but no ztunnel serves.
const istioAuthzConfig = `
workloads:
- {uid: u-client, name: client, namespace: default, serviceAccount: client, workloadIps: ["10.244.0.2"], protocol: HBONE, node: node-a, services: {}}
- {uid: u-open, name: open, namespace: default, serviceAccount: open, workloadIps: ["10.244.1.2"], protocol: HBONE, node: node-b, services: {}}
- {uid: u-allowed, name: allowed, namespace: default, serviceAccount: allowed, workloadIps: ["10.244.1.3"], protocol: HBONE, node: node-b, services: {}, authorizationPolicies: ["default/allow-client"]}
- {uid: u-notallowed, name: notallowed, namespace: default, serviceAccount: notallowed, workloadIps: ["10.244.1.4"], protocol: HBONE, node: node-b, services: {}, authorizationPolicies: ["default/allow-else"]}
- {uid: u-strict, name: strict, namespace: default, serviceAccount: strict, workloadIps: ["10.244.1.5"], protocol: HBONE, node: node-b, services: {}, authorizationPolicies: ["default/pa-strict"]}
- {uid: u-strictport, name: strictport, namespace: default, serviceAccount: strictport, workloadIps: ["10.244.1.6"], protocol: HBONE, node: node-b, services: {}, authorizationPolicies: ["default/pa-strict-permissive-8080"]}
- {uid: u-permport, name: permport, namespace: default, serviceAccount: permport, workloadIps: ["10.244.1.7"], protocol: HBONE, node: node-b, services: {}, authorizationPolicies: ["default/pa-permissive-strict-8080"]}
- {uid: u-plain, name: plain, namespace: default, serviceAccount: plain, workloadIps: ["10.244.2.2"], protocol: TCP, node: node-c, services: {}, authorizationPolicies: ["default/deny-all"]}
- {uid: u-outsider, name: outsider, namespace: default, serviceAccount: outsider, workloadIps: ["10.244.2.3"], protocol: TCP, node: node-c, services: {}}
policies:
# TestAuthorizationL4 "allow": the source's principal.
- name: allow-client
  namespace: default
  scope: WorkloadSelector
  action: Allow
  dryRun: false
  rules:
  - - - principals:
        - Exact: cluster.local/ns/default/sa/client
# TestAuthorizationL4 "not allow": a principal nobody has.
- name: allow-else
  namespace: default
  scope: WorkloadSelector
  action: Allow
  dryRun: false
  rules:
  - - - principals:
        - Exact: cluster.local/ns/something/sa/else
# PeerAuthentication STRICT: deny a peer without a principal.
- name: pa-strict
  namespace: default
  scope: WorkloadSelector
  action: Deny
  dryRun: false
  rules:
  - - - notPrincipals:
        - Presence: []
# STRICT with port 8080 PERMISSIVE: one rule of two clauses.
- name: pa-strict-permissive-8080
  namespace: default
  scope: WorkloadSelector
  action: Deny
  dryRun: false
  rules:
  - - - notPrincipals:
        - Presence: []
    - - notDestinationPorts: [8080]
# PERMISSIVE with port 8080 STRICT: one rule per STRICT port.
- name: pa-permissive-strict-8080
  namespace: default
  scope: WorkloadSelector
  action: Deny
  dryRun: false
  rules:
  - - - destinationPorts: [8080]
        notPrincipals:
        - Presence: []
# On a workload no ztunnel serves: nothing enforces it.
- name: deny-all
  namespace: default
  scope: WorkloadSelector
  action: Deny
  dryRun: false
  rules:
  - - - destinationPorts: [8080, 9090]
`

// istioCall connects from pod to dst, sends a line and reads everything
// back until the server closes; it returns what came back.
func istioCall(ctx context.Context, l *trafficLab, from, to string, port uint16) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	dst := netip.AddrPortFrom(l.pods[to].IP, port).String()
	c, err := l.pods[from].Dial(ctx, "tcp", dst)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return roundTrip(c.(*net.TCPConn), []byte(fmt.Sprintf("%s to %s:%d", from, to, port)))
}

// TestIstioAuthorizationL4 is istio/istio's TestAuthorizationL4 (allow /
// not allow, L4 TCP) and TestPeerAuthentication (strict, permissive, and
// the port-level overrides), from a captured and an uncaptured client, in
// both modes. Istio's expectations: the allowed principal passes; another
// principal, and any plaintext client into a pod with a policy, is denied
// (the connection ends without the app's answer, here also: the app never
// sees it, and the destination's ztunnel logs the rejection); PERMISSIVE
// ports take plaintext; a destination without a ztunnel applies no policy.
// An admitted connection reaches the app from the client's own address
// (TestServices' original-source check).
func TestIstioAuthorizationL4(t *testing.T) {
	cases := []struct {
		name string
		from string
		to   string
		port uint16
		// denied is the access log text of the rejection; empty: admitted.
		denied string
	}{
		{"allow/captured", "client", "allowed", 9090, ""},
		{"allow/uncaptured", "outsider", "allowed", 9090, "none allowed"},
		{"not allow/captured", "client", "notallowed", 9090, "none allowed"},
		{"not allow/uncaptured", "outsider", "notallowed", 9090, "none allowed"},
		{"permissive/captured", "client", "open", 9090, ""},
		{"permissive/uncaptured", "outsider", "open", 9090, ""},
		{"strict/captured", "client", "strict", 9090, ""},
		{"strict/uncaptured", "outsider", "strict", 9090, "default/pa-strict"},
		{"strict-permissive-ports/captured", "client", "strictport", 8080, ""},
		{"strict-permissive-ports/uncaptured to the permissive port", "outsider", "strictport", 8080, ""},
		{"strict-permissive-ports/uncaptured to another port", "outsider", "strictport", 9090, "default/pa-strict-permissive-8080"},
		{"permissive-strict-ports/captured", "client", "permport", 8080, ""},
		{"permissive-strict-ports/uncaptured to the strict port", "outsider", "permport", 8080, "default/pa-permissive-strict-8080"},
		{"permissive-strict-ports/uncaptured to another port", "outsider", "permport", 9090, ""},
		{"uncaptured destination/captured", "client", "plain", 9090, ""},
	}
	for _, mode := range []string{"shared", "dedicated"} {
		t.Run(mode, func(t *testing.T) {
			l := startTrafficLab(t, mode == "shared", istioAuthzConfig)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			echo := map[string]*labrun.EchoServer{}
			for _, pod := range []string{"open", "allowed", "notallowed", "strict", "strictport", "permport", "plain"} {
				for _, port := range []uint16{8080, 9090} {
					echo[fmt.Sprintf("%s:%d", pod, port)] = startEcho(t, l.pods[pod], port)
				}
			}
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					app := echo[fmt.Sprintf("%s:%d", tc.to, tc.port)]
					before := len(app.Peers())
					want := fmt.Sprintf("%s to %s:%d", tc.from, tc.to, tc.port)
					got, err := istioCall(ctx, l, tc.from, tc.to, tc.port)
					if tc.denied == "" {
						if err != nil || string(got) != want {
							t.Fatalf("%s -> %s:%d: read %q, %v; want the echo", tc.from, tc.to, tc.port, got, err)
						}
						peers := app.Peers()
						if len(peers) != before+1 {
							t.Fatalf("the app saw %d new connections, want 1", len(peers)-before)
						}
						if src := peers[len(peers)-1].Addr(); src != l.pods[tc.from].IP {
							t.Errorf("the app saw the connection from %s, want the client's address %s", src, l.pods[tc.from].IP)
						}
						return
					}
					if len(got) != 0 {
						t.Fatalf("%s -> %s:%d: read %q (%v), want nothing: a policy denies it", tc.from, tc.to, tc.port, got, err)
					}
					if n := len(app.Peers()); n != before {
						t.Errorf("the app behind the policy saw %d connections", n-before)
					}
					lctx, lcancel := context.WithTimeout(ctx, 10*time.Second)
					defer lcancel()
					line, err := l.daemon(tc.to).WaitLog(lctx, "connection complete", tc.denied, l.pods[tc.from].IP.String())
					if err != nil {
						t.Fatal(err)
					}
					if !strings.Contains(line, "policy") {
						t.Errorf("the rejection's log line names no policy: %s", line)
					}
				})
			}
		})
	}
}

// istioServicesConfig: client (captured, node-a); server (captured, node-b)
// behind the service web; uncaptured (TCP, node-b) behind a ServiceEntry
// test.example.com with a VIP, port 80 to target port 8080, as istio's
// TestServiceEntrySelectsUncapturedPod declares it. The lab adds a
// resolver pod on node-b, the pods' nameserver, whose queries the DNS
// capture hands to the daemon's proxy, and external, a pod in no config
// (outside the mesh, like the API server).
const istioServicesConfig = `
workloads:
- {uid: u-client, name: client, namespace: default, serviceAccount: client, workloadIps: ["10.244.0.2"], protocol: HBONE, node: node-a, services: {}}
- {uid: u-server, name: server, namespace: default, serviceAccount: server, workloadIps: ["10.244.1.2"], protocol: HBONE, node: node-b, services: {"default/web.default.svc.cluster.local": {80: 8080}}}
- {uid: u-uncaptured, name: uncaptured, namespace: default, serviceAccount: uncaptured, workloadIps: ["10.244.1.3"], protocol: TCP, node: node-b, services: {"default/test.example.com": {80: 8080}}}
services:
- {name: web, namespace: default, hostname: web.default.svc.cluster.local, vips: ["/10.96.0.10"], ports: {80: 8080}}
- {name: test.example.com, namespace: default, hostname: test.example.com, vips: ["/240.240.240.251"], ports: {80: 8080}}
`

// TestIstioServices is the ztunnel part of istio/istio's TestServices,
// TestPodIP and TestServiceEntrySelectsUncapturedPod (with
// TestServiceEntryDNSWithAutoAssign, whose auto-assigned VIP reaches
// ztunnel as any VIP), TestAPIServer and TestMetadataServer, in shared mode
// with DNS capture: a service VIP, a pod IP and an address outside the
// mesh reach their app from the client's own address, and so does the
// client's own pod IP; an app
// listening on localhost only cannot be reached; the ServiceEntry's host is
// answered by ztunnel's DNS proxy with its VIP, and the VIP reaches the
// uncaptured pod it selects on the target port.
func TestIstioServices(t *testing.T) {
	lab := netnslab.New(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := startSharedCluster(ctx, t, lab, istioServicesConfig, labrun.SharedOptions{
		Binary: ztunnelBin, Dir: dir, ExtraPods: map[string][]string{"node-b": {"resolver", "external"}},
		Capture:   netnslab.CaptureOptions{RedirectDNS: true},
		DaemonEnv: []string{"ISTIO_META_DNS_CAPTURE=true", "ZTUNNEL_RESOLV_CONF=" + writeResolvConf(t, dir, "10.244.1.4")},
	})
	if ip := c.Pods["resolver"].IP.String(); ip != "10.244.1.4" {
		t.Fatalf("resolver pod got %s; the resolv.conf names 10.244.1.4", ip)
	}
	client := c.Pods["client"]
	server := startEcho(t, c.Pods["server"], 8080)
	uncaptured := startEcho(t, c.Pods["uncaptured"], 8080)
	external := startEcho(t, c.Pods["external"], 443)
	self := startEcho(t, client, 7070)
	// An app of the server pod listening on localhost only (istio's
	// LocalhostIP port).
	ln, err := c.Pods["server"].Listen("tcp", "127.0.0.1:8081")
	if err != nil {
		t.Fatal(err)
	}
	nettest.Handle(t, ln, func(conn net.Conn) { conn.Write([]byte("localhost app")) })

	reach := func(t *testing.T, dst string, app *labrun.EchoServer) {
		t.Helper()
		before := len(app.Peers())
		msg := []byte("to " + dst)
		if got := roundTripTo(t, client, dst, msg); string(got) != string(msg) {
			t.Fatalf("%s: read %q, want the echo", dst, got)
		}
		peers := app.Peers()
		if len(peers) != before+1 {
			t.Fatalf("%s: the app saw %d new connections, want 1", dst, len(peers)-before)
		}
		if src := peers[len(peers)-1].Addr(); src != client.IP {
			t.Errorf("%s: the app saw the connection from %s, want the client's address %s", dst, src, client.IP)
		}
	}
	t.Run("service VIP keeps the original source", func(t *testing.T) { reach(t, "10.96.0.10:80", server) })
	t.Run("pod IP keeps the original source", func(t *testing.T) { reach(t, "10.244.1.2:8080", server) })
	// TestPodIP's self call: a pod calling its own address.
	t.Run("pod IP of the caller itself", func(t *testing.T) { reach(t, "10.244.0.2:7070", self) })
	// TestAPIServer, TestMetadataServer: a destination outside the mesh
	// (passthrough) sees the pod's own address, not ztunnel's.
	t.Run("passthrough to an address outside the mesh keeps the original source", func(t *testing.T) {
		reach(t, netip.AddrPortFrom(c.Pods["external"].IP, 443).String(), external)
	})
	t.Run("app on localhost only is not reachable", func(t *testing.T) {
		cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
		defer ccancel()
		conn, err := client.Dial(cctx, "tcp", "10.244.1.2:8081")
		if err != nil {
			return // refused: what istio accepts
		}
		defer conn.Close()
		got, _ := roundTrip(conn.(*net.TCPConn), []byte("hello"))
		if len(got) != 0 {
			t.Fatalf("the localhost-only app answered %q through the mesh", got)
		}
	})
	t.Run("ServiceEntry host answered with its VIP", func(t *testing.T) {
		resp := podQuery(ctx, t, client, "udp", "10.244.1.4:53", "test.example.com")
		var got []string
		for _, rr := range resp.Answer {
			if a, ok := rr.(*dns.A); ok {
				got = append(got, a.A.String())
			}
		}
		if resp.Rcode != dns.RcodeSuccess || len(got) != 1 || got[0] != "240.240.240.251" {
			t.Fatalf("%s %q, want the VIP 240.240.240.251", dns.RcodeToString[resp.Rcode], got)
		}
	})
	t.Run("ServiceEntry VIP reaches the uncaptured pod on the target port", func(t *testing.T) {
		reach(t, "240.240.240.251:80", uncaptured)
	})
}

// TestIstioCRLRevokedIntermediate is istio/istio's crl TestZtunnelCrlInbound
// in the lab, both modes: the client's chain goes through an intermediate
// CA; once the root's CRL revokes that intermediate (the leaf itself is
// revoked by nobody), the destination's ztunnel refuses the client and
// counts istio_crl_policy_rejections_total{reporter="destination"}, while
// a client signed by the root directly is still served.
func TestIstioCRLRevokedIntermediate(t *testing.T) {
	for _, mode := range []string{"dedicated", "shared"} {
		t.Run(mode, func(t *testing.T) {
			l := startCRLLab(t, mode == "shared")
			inter := l.intermediate(t)
			leaf := leafFrom(t, inter, "spiffe://cluster.local/ns/default/sa/outsider")
			l.reload(t, crl(t, l.ca))
			if err := l.connectAs(t, leaf); err != nil {
				t.Fatalf("baseline: a leaf of the intermediate before any revocation: %v", err)
			}
			before := l.metric(t, "server", rejections, destination)
			l.reload(t, crl(t, l.ca, inter.Cert.SerialNumber))
			if err := l.connectAs(t, leaf); err == nil {
				t.Fatal("a leaf of a revoked intermediate got a tunnel")
			}
			l.waitMetric(t, "server", rejections, destination, before+1)
			c := l.open(t) // the client pod's certificate comes from the root
			c.Close()
		})
	}
}

// istioTelemetryConfig: two captured pods with the workload names and
// canonical labels of istio's echo deployments, the server behind the
// service server.
const istioTelemetryConfig = `
workloads:
- {uid: u-client, name: client-v1-abc, namespace: default, serviceAccount: client, workloadName: client-v1, canonicalName: client, canonicalRevision: v1, workloadIps: ["10.244.0.2"], protocol: HBONE, node: node-a, services: {}}
- {uid: u-server, name: server-v1-def, namespace: default, serviceAccount: server, workloadName: server-v1, canonicalName: server, canonicalRevision: v1, workloadIps: ["10.244.1.2"], protocol: HBONE, node: node-b, services: {"default/server.default.svc.cluster.local": {80: 8080}}}
services:
- {name: server, namespace: default, hostname: server.default.svc.cluster.local, vips: ["/10.96.0.20"], ports: {80: 8080}}
`

// TestIstioL4Telemetry is istio/istio's TestL4Telemetry in shared mode:
// five TCP connections from a captured client to a captured service are
// counted by the destination's ztunnel under every label istio's
// Prometheus query names (reporter, security policy, canonical service
// and revision, version, workload, namespaces, principals, service), here
// with the exact counts: 5 opened, 5 closed, and their bytes.
func TestIstioL4Telemetry(t *testing.T) {
	l := startTrafficLab(t, true, istioTelemetryConfig)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	client, server := l.pods["client-v1-abc"], l.pods["server-v1-def"]
	startDoubler(t, server, 8080)
	labels := map[string]string{
		"reporter":                       "destination",
		"connection_security_policy":     "mutual_tls",
		"destination_canonical_service":  "server",
		"destination_canonical_revision": "v1",
		"destination_service":            "server.default.svc.cluster.local",
		"destination_service_name":       "server",
		"destination_service_namespace":  "default",
		"destination_principal":          spiffe("server"),
		"destination_version":            "v1",
		"destination_workload":           "server-v1",
		"destination_workload_namespace": "default",
		"source_canonical_service":       "client",
		"source_canonical_revision":      "v1",
		"source_principal":               spiffe("client"),
		"source_version":                 "v1",
		"source_workload":                "client-v1",
		"source_workload_namespace":      "default",
	}
	d := l.daemon("server-v1-def")
	base := readCounts(ctx, t, d, labels)
	const n = 5
	for i := 0; i < n; i++ {
		if err := helloDouble(ctx, client, "10.96.0.20:80"); err != nil {
			t.Fatalf("connection %d to the service: %v", i, err)
		}
	}
	checkCounts(ctx, t, d, labels, base, tcpCounts{n, n, n * float64(helloSize), n * float64(2*helloSize)})
}
