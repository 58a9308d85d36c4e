package e2e

// The security rows of docs/ztunnel-scenarios.md (issue 21): what ztunnel's
// tests/direct.rs and tests/namespaced.rs check where a slip would let
// traffic through that should not pass, reproduced through real daemons in
// the netns lab. The port rows (a port in use, the in-pod port matrix) are in
// scenarios_ports_test.go.

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/hbone"
	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/internal/labrun"
	"github.com/ztunnel-go/ztunnel/internal/netnslab"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
	"github.com/ztunnel-go/ztunnel/mtls"
	"github.com/ztunnel-go/ztunnel/mtls/caclient"
	"github.com/ztunnel-go/ztunnel/mtls/tlstest"
)

// hboneConnect opens an HBONE tunnel from inside pod from (not through a
// daemon) to dst's 15008 with cert, checking the server's identity san, and
// CONNECTs to authority. The tunnel is closed when the test ends.
func hboneConnect(ctx context.Context, t *testing.T, from *netnslab.Pod, cert *mtls.WorkloadCert, dst netip.Addr, authority, san string) (*hbone.Stream, error) {
	t.Helper()
	return hboneTunnel(ctx, t, from, mtls.ClientConfig(cert, []string{san}), dst, authority)
}

// policyConfig is test_policy's and hbone_ip_mismatch's mesh (namespaced.rs,
// shared mode, one node): a captured server, an uncaptured client (a TCP
// workload: no capture, not handed to the daemon), and a namespace ALLOW
// policy for the waypoint's principal only.
const policyConfig = `
workloads:
- {uid: cluster1//v1/Pod/default/server, name: server, namespace: default, serviceAccount: server, workloadIps: ["10.244.0.2"], protocol: HBONE, node: node-a, services: {}}
- {uid: cluster1//v1/Pod/default/client, name: client, namespace: default, serviceAccount: default, workloadIps: ["10.244.0.3"], protocol: TCP, node: node-a, services: {}}
policies:
- name: deny_bypass
  namespace: default
  scope: Namespace
  action: Allow
  dryRun: false
  rules:
  - - - principals:
        - Exact: cluster.local/ns/default/sa/waypoint
`

// TestInboundRefusalLogs is ztunnel's test_policy and hbone_ip_mismatch
// (rows 19 and 20): the uncaptured client opens HBONE to the captured
// server's 15008 itself, with a valid certificate of the same CA. As
// default/default, under an ALLOW policy for the waypoint only, its CONNECT
// is answered 401 and the server's daemon logs ztunnel's error text; a
// CONNECT whose authority is the client's own IP is answered 400 with
// "ip mismatch: <server> != <client>". The waypoint's identity gets 200:
// what refuses the others is the policy.
func TestInboundRefusalLogs(t *testing.T) {
	lab := netnslab.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := startSharedCluster(ctx, t, lab, policyConfig, labrun.SharedOptions{Binary: ztunnelBin, Dir: t.TempDir()})
	startEcho(t, c.Pods["server"], 8080)
	server, client := c.Pods["server"], c.Pods["client"]
	d := c.Daemons["node-a"]
	const serverSAN = "spiffe://cluster.local/ns/default/sa/server"
	srvAuthority := netip.AddrPortFrom(server.IP, 8080).String()

	t.Run("allowed principal gets 200", func(t *testing.T) {
		cert := tlstest.Cert(t, c.CA, identity.New("", "default", "waypoint"))
		s, err := hboneConnect(ctx, t, client, cert, server.IP, srvAuthority, serverSAN)
		if err != nil {
			t.Fatalf("CONNECT as the waypoint: %v, want 200", err)
		}
		s.Close()
	})

	t.Run("test_policy: another principal gets 401 and the policy rejection is logged", func(t *testing.T) {
		cert := tlstest.Cert(t, c.CA, identity.New("", "default", "default"))
		_, err := hboneConnect(ctx, t, client, cert, server.IP, srvAuthority, serverSAN)
		var se *hbone.StatusError
		if !errors.As(err, &se) || se.Code != 401 {
			t.Fatalf("CONNECT as default/default: %v, want status 401", err)
		}
		wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
		defer wcancel()
		if _, err := d.WaitLog(wctx, "\taccess\tconnection complete", "src.addr="+client.IP.String()+":", `direction="inbound"`,
			`error="connection closed due to policy rejection: allow policies exist, but none allowed"`); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("hbone_ip_mismatch: another workload's IP as authority gets 400 and the mismatch is logged", func(t *testing.T) {
		cert := tlstest.Cert(t, c.CA, identity.New("", "default", "default"))
		_, err := hboneConnect(ctx, t, client, cert, server.IP, netip.AddrPortFrom(client.IP, 8080).String(), serverSAN)
		var se *hbone.StatusError
		if !errors.As(err, &se) || se.Code != 400 {
			t.Fatalf("CONNECT to the client's IP through the server: %v, want status 400", err)
		}
		wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
		defer wcancel()
		want := fmt.Sprintf(`error="ip mismatch: %s != %s"`, server.IP, client.IP)
		if _, err := d.WaitLog(wctx, "\taccess\tconnection failed", "src.addr="+client.IP.String()+":", want); err != nil {
			t.Fatal(err)
		}
	})
}

// trustDomainConfig is trust_domain_mismatch_rejected's node (namespaced.rs,
// shared mode): a server, a client whose identity is in another trust
// domain (clusterset.local) with a certificate from the same CA, and a
// client of the mesh's own trust domain as the control.
const trustDomainConfig = `
workloads:
- {uid: cluster1//v1/Pod/default/server, name: server, namespace: default, serviceAccount: server, workloadIps: ["10.244.0.2"], protocol: HBONE, node: node-a, services: {}}
- {uid: cluster1//v1/Pod/default/client, name: client, namespace: default, serviceAccount: my-app, trustDomain: clusterset.local, workloadIps: ["10.244.0.3"], protocol: HBONE, node: node-a, services: {}}
- {uid: cluster1//v1/Pod/default/local, name: local, namespace: default, serviceAccount: local, workloadIps: ["10.244.0.4"], protocol: HBONE, node: node-a, services: {}}
`

// twoTrustDomainCA is a built-in CA whose root names every trust domain of
// tds (spiffe:// URI SANs), so that it signs for each: "the same CA" of
// ztunnel's test for identities of two trust domains.
func twoTrustDomainCA(t *testing.T, tds ...string) *caclient.BuiltinCA {
	t.Helper()
	return tlstest.NewRoot(t, tlstest.CAOptions{
		CommonName: "lab CA of two trust domains", TrustDomains: tds,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}).Builtin(t)
}

// TestTrustDomainMismatch is ztunnel's trust_domain_mismatch_rejected (row
// 24): the client's daemon tunnels with the client's certificate, of
// another trust domain; the server side refuses the handshake, and the
// client's app sees its connection reset, not data and not a clean close.
func TestTrustDomainMismatch(t *testing.T) {
	lab := netnslab.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := startSharedCluster(ctx, t, lab, trustDomainConfig, labrun.SharedOptions{
		Binary: ztunnelBin, Dir: t.TempDir(), CA: twoTrustDomainCA(t, "cluster.local", "clusterset.local"),
	})
	echo := startEcho(t, c.Pods["server"], 8080)
	d := c.Daemons["node-a"]

	t.Run("a client of the mesh's trust domain reaches the server", func(t *testing.T) {
		conn, err := c.Pods["local"].Dial(ctx, "tcp", echo.Addr.String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if err := nettest.RoundTrip(conn, "hello world!"); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("a client of another trust domain is reset", func(t *testing.T) {
		// The pod's own outbound listener accepts; the reset may come so
		// soon that the dial already reports it.
		conn, err := c.Pods["client"].Dial(ctx, "tcp", echo.Addr.String())
		if err != nil && !errors.Is(err, syscall.ECONNRESET) {
			t.Fatal(err)
		}
		if err == nil {
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := conn.Write([]byte("hello world!")); err != nil && !errors.Is(err, syscall.ECONNRESET) {
				t.Fatal(err)
			}
			n, err := conn.Read(make([]byte, 10))
			if !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("read %d bytes, %v; want the connection reset", n, err)
			}
		}
		wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
		defer wcancel()
		src := "src.addr=" + c.Pods["client"].IP.String() + ":"
		// The server side refused the client's certificate for its trust
		// domain (not the client side the server's).
		if _, err := d.WaitLog(wctx, "connection failed", `direction="inbound"`, src, "tls handshake",
			"peer is not in our trust domain", "spiffe://clusterset.local/ns/default/sa/my-app"); err != nil {
			t.Fatal(err)
		}
		for _, p := range echo.Peers() {
			if p.Addr() == c.Pods["client"].IP {
				t.Fatalf("the server's app saw a connection from the client of another trust domain")
			}
		}
	})
}

// serverShutdownConfig is test_server_shutdown's node (namespaced.rs,
// shared mode): a captured client and a captured server on one daemon.
const serverShutdownConfig = `
workloads:
- {uid: cluster1//v1/Pod/default/server, name: server, namespace: default, serviceAccount: server, workloadIps: ["10.244.0.2"], protocol: HBONE, node: node-a, services: {}}
- {uid: cluster1//v1/Pod/default/client, name: client, namespace: default, serviceAccount: client, workloadIps: ["10.244.0.3"], protocol: HBONE, node: node-a, services: {}}
`

// TestServerPodDeleted is ztunnel's test_server_shutdown (row 18): the
// destination pod is deleted from the daemon (ZDS Del; its app keeps
// running, its workload stays in the state) while the client holds a
// connection to it. A new connection still connects (the client's own
// outbound listener accepts) but its request fails, and the held
// connection breaks on its next round trip: the deleted pod's identity
// serves nothing any more.
func TestServerPodDeleted(t *testing.T) {
	lab := netnslab.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := startSharedCluster(ctx, t, lab, serverShutdownConfig, labrun.SharedOptions{Binary: ztunnelBin, Dir: t.TempDir()})
	echo := startEcho(t, c.Pods["server"], 8080)
	client := c.Pods["client"]

	held, err := client.Dial(ctx, "tcp", echo.Addr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if err := nettest.RoundTrip(held, "hello world"); err != nil {
		t.Fatalf("the held connection before the deletion: %v", err)
	}
	if err := c.RemoveFromMesh("server"); err != nil {
		t.Fatal(err)
	}

	conn, err := client.Dial(ctx, "tcp", echo.Addr.String())
	switch {
	case errors.Is(err, syscall.ECONNRESET):
		// Accepted by the client's outbound listener and reset (its
		// tunnel to the deleted pod failed) before the dial looked: the
		// request fails, as it must.
	case err != nil:
		t.Fatalf("a new connection after the deletion: %v, want it accepted by the client's outbound listener", err)
	default:
		defer conn.Close()
		err = nettest.RoundTrip(conn, "hello world")
		if err == nil {
			t.Fatal("a new connection to the deleted pod got its echo")
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatal("a new connection to the deleted pod hangs instead of failing")
		}
	}

	err = nettest.RoundTrip(held, "hello world")
	if err == nil {
		t.Fatal("the held connection to the deleted pod still works")
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal("the held connection to the deleted pod hangs instead of breaking")
	}
}

// namedPortConfig is test_svc_hostname_named_port's node (namespaced.rs,
// shared mode): the service's port 80 has target port 0 (a named
// targetPort), which only the endpoint's own port map resolves (80 -> 8080);
// the client is uncaptured.
const namedPortConfig = `
workloads:
- {uid: cluster1//v1/Pod/default/server, name: server, namespace: default, serviceAccount: server, workloadIps: ["10.244.0.2"], protocol: HBONE, node: node-a, services: {"default/server.default.svc.cluster.local": {80: 8080}}}
- {uid: cluster1//v1/Pod/default/client, name: client, namespace: default, serviceAccount: default, workloadIps: ["10.244.0.3"], protocol: TCP, node: node-a, services: {}}
services:
- name: server
  namespace: default
  hostname: server.default.svc.cluster.local
  vips: ["/10.96.0.10"]
  ports: {80: 0}
`

// TestServiceHostnameNamedPort is ztunnel's test_svc_hostname_named_port
// (row 22): the uncaptured client opens HBONE to the server pod's 15008
// itself and CONNECTs to the service's hostname and port 80; the server's
// daemon finds the target port in the endpoint's port map and answers 200,
// and the tunnel reaches the app on 8080.
func TestServiceHostnameNamedPort(t *testing.T) {
	lab := netnslab.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := startSharedCluster(ctx, t, lab, namedPortConfig, labrun.SharedOptions{Binary: ztunnelBin, Dir: t.TempDir()})
	echo := startEcho(t, c.Pods["server"], 8080)
	client := c.Pods["client"]
	cert := tlstest.Cert(t, c.CA, identity.New("", "default", "default"))
	s, err := hboneConnect(ctx, t, client, cert, c.Pods["server"].IP, "server.default.svc.cluster.local:80",
		"spiffe://cluster.local/ns/default/sa/server")
	if err != nil {
		t.Fatalf("CONNECT server.default.svc.cluster.local:80: %v, want 200", err)
	}
	defer s.Close()
	const msg = "hello over a named port"
	if _, err := s.Write([]byte(msg)); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
	defer rcancel()
	go func() { <-rctx.Done(); s.Close() }()
	if _, err := io.ReadFull(s, got); err != nil || string(got) != msg {
		t.Fatalf("echo over the tunnel: %q, %v", got, err)
	}
	if !sawPeer(echo, client.IP) {
		t.Fatalf("the app on 8080 saw no connection from the client (peers %v)", echo.Peers())
	}
}
