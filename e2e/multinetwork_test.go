package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/internal/labrun"
	"github.com/ztunnel-go/ztunnel/internal/netnslab"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
)

// multiNetworkConfig puts the client on network net-a (node-a) and the
// echo service's only endpoint on net-b (node-b), behind the east-west
// gateway pod "eastwest" on net-b, named by its address. Every daemon runs
// with NETWORK set to its workload's network. (The lab's nodes can all
// route to each other; the client's daemon goes through the gateway because
// the config says so.) The gateway's service lists the HBONE port, which a
// gateway named by hostname needs (multiNetworkByHostnameConfig).
const multiNetworkConfig = `
workloads:
- uid: cluster-a//v1/Pod/default/client
  name: client
  namespace: default
  serviceAccount: client
  workloadIps: ["10.244.0.2"]
  network: net-a
  protocol: HBONE
  node: node-a
  services: {}
- uid: cluster-b//v1/Pod/default/server
  name: server
  namespace: default
  serviceAccount: server
  workloadIps: ["10.244.1.2"]
  network: net-b
  protocol: HBONE
  node: node-b
  networkGateway: {destination: "net-b/10.244.1.3", hboneMtlsPort: 15008}
  services:
    default/echo.default.svc.cluster.local: {80: 8080}
- uid: cluster-b//v1/Pod/istio-system/eastwest
  name: eastwest
  namespace: istio-system
  serviceAccount: istio-eastwestgateway
  workloadIps: ["10.244.1.3"]
  network: net-b
  protocol: TCP
  node: node-b
  services:
    istio-system/eastwest.istio-system.svc.cluster.local: {15008: 15008}
services:
- name: echo
  namespace: default
  hostname: echo.default.svc.cluster.local
  vips: ["net-a/10.96.0.10", "net-b/10.96.0.10"]
  ports: {80: 8080}
- name: eastwest
  namespace: istio-system
  hostname: eastwest.istio-system.svc.cluster.local
  vips: []
  ports: {15008: 15008}
`

// multiNetworkByHostnameConfig is multiNetworkConfig with the server's
// network gateway named by its service's hostname: the client's daemon
// load-balances over the service's endpoints on the HBONE port.
var multiNetworkByHostnameConfig = strings.Replace(multiNetworkConfig,
	`networkGateway: {destination: "net-b/10.244.1.3", hboneMtlsPort: 15008}`,
	`networkGateway: {destination: "istio-system/eastwest.istio-system.svc.cluster.local", hboneMtlsPort: 15008}`, 1)

// multiNetwork is the running lab of multiNetworkConfig.
type multiNetwork struct {
	cluster *labrun.Cluster
	echo    *labrun.EchoServer
	gw      *labrun.EWGateway
}

// startMultiNetwork runs the lab of config (multiNetworkConfig or a
// variant), the server's echo app and the gateway; env adds variables to
// every daemon.
func startMultiNetwork(t *testing.T, config string, env ...string) *multiNetwork {
	t.Helper()
	lab := netnslab.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := startCluster(ctx, t, lab, config, labrun.ClusterOptions{
		Binary: ztunnelBin, Dir: t.TempDir(), LogLevel: "info,access=debug", DaemonEnv: env,
	})
	echo := startEcho(t, c.Pods["server"], 8080)
	serverHBONE := netip.AddrPortFrom(c.Pods["server"].IP, 15008)
	gw, err := labrun.StartEWGateway(ctx, c.Pods["eastwest"], 15008, c.CA, identity.New("", "istio-system", "istio-eastwestgateway"),
		map[string]netip.AddrPort{"echo.default.svc.cluster.local:80": serverHBONE})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gw.Close() })
	return &multiNetwork{cluster: c, echo: echo, gw: gw}
}

// dialVIP connects from the client pod to the echo service's VIP.
func (mn *multiNetwork) dialVIP(t *testing.T) *net.TCPConn {
	t.Helper()
	conn, err := mn.tryDialVIP()
	if err != nil {
		t.Fatal(err)
	}
	return conn
}

// tryDialVIP is dialVIP for goroutines other than the test's, which must
// not call t.Fatal.
func (mn *multiNetwork) tryDialVIP() (*net.TCPConn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := mn.cluster.Pods["client"].Dial(ctx, "tcp", "10.96.0.10:80")
	if err != nil {
		return nil, fmt.Errorf("dial the echo VIP: %w", err)
	}
	return conn.(*net.TCPConn), nil
}

// echoMany runs conns small echo connections, 8 at a time.
func (mn *multiNetwork) echoMany(t *testing.T, conns int) {
	t.Helper()
	var g errgroup.Group
	g.SetLimit(8)
	for i := range conns {
		g.Go(func() error {
			conn, err := mn.tryDialVIP()
			if err != nil {
				return fmt.Errorf("conn %d: %w", i, err)
			}
			defer conn.Close()
			var want bytes.Buffer
			for j := range 50 {
				fmt.Fprintf(&want, "conn %d line %d\n", i, j)
			}
			got, err := roundTrip(conn, want.Bytes())
			if err != nil {
				return fmt.Errorf("conn %d: %w", i, err)
			}
			if !bytes.Equal(got, want.Bytes()) {
				return fmt.Errorf("conn %d: echo differs", i)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
}

// TestMultiNetworkDoubleHBONE: a client on net-a reaches a service whose
// endpoint is on net-b through the east-west gateway: outer HBONE to the
// gateway, inner TLS + CONNECT to the server's daemon, which maps the
// service port and sees x-forwarded-network.
func TestMultiNetworkDoubleHBONE(t *testing.T) {
	mn := startMultiNetwork(t, multiNetworkConfig)
	c, echo, gw := mn.cluster, mn.echo, mn.gw
	logCtx := func() context.Context {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		t.Cleanup(cancel)
		return ctx
	}

	t.Run("one connection: source counters and outbound log", func(t *testing.T) {
		// ztunnel's double_hbone1: the source reporter counts the one
		// connection with its bytes; the outbound log names the final
		// workload and its identity, the gateway as dst.addr and the
		// service hostname as dst.hbone_addr.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		d := c.Daemons["client"]
		src := map[string]string{"reporter": "source"}
		base := readCounts(ctx, t, d, src)
		conn := mn.dialVIP(t)
		defer conn.Close()
		if got, err := roundTrip(conn, []byte(helloMsg)); err != nil || string(got) != helloMsg {
			t.Fatalf("echo %q, %v", got, err)
		}
		checkCounts(ctx, t, d, src, base, tcpCounts{1, 1, float64(helloSize), float64(helloSize)})
		if _, err := d.WaitLog(logCtx(), "connection complete", `direction="outbound"`, `src.workload="client"`,
			`src.identity="spiffe://cluster.local/ns/default/sa/client"`, `dst.workload="server"`,
			`dst.identity="spiffe://cluster.local/ns/default/sa/server"`, "dst.addr="+netip.AddrPortFrom(c.Pods["eastwest"].IP, 15008).String()+" ",
			`dst.hbone_addr="echo.default.svc.cluster.local:80"`, fmt.Sprintf("bytes_sent=%d ", helloSize), fmt.Sprintf("bytes_recv=%d ", helloSize)); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("large transfer through the gateway", func(t *testing.T) {
		payload := make([]byte, 16<<20)
		rand.Read(payload)
		conn := mn.dialVIP(t)
		defer conn.Close()
		got, err := roundTrip(conn, payload)
		if err != nil {
			t.Fatal(err)
		}
		if sha256.Sum256(got) != sha256.Sum256(payload) {
			t.Fatalf("echo of %d bytes came back as %d different bytes", len(payload), len(got))
		}
		// The client's daemon routed by double HBONE with the service authority.
		if _, err := c.Daemons["client"].WaitLog(logCtx(), "connection complete", `direction="outbound"`,
			`dst.hbone_addr="echo.default.svc.cluster.local:80"`, `dst.workload="server"`); err != nil {
			t.Fatal(err)
		}
		// The server's daemon mapped the service port, saw the client's
		// identity, and did not credit the gateway with the connection
		// (dst.addr is where the tunnel arrived, as ztunnel logs it).
		line, err := c.Daemons["server"].WaitLog(logCtx(), "connection complete", `direction="inbound"`,
			`dst.hbone_addr="echo.default.svc.cluster.local:80"`, "dst.addr=10.244.1.2:15008", `dst.service="echo.default.svc.cluster.local"`,
			`src.identity="spiffe://cluster.local/ns/default/sa/client"`, fmt.Sprintf("bytes_sent=%d", len(payload)))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(line, `src.workload="eastwest"`) || strings.Contains(line, `src.namespace="istio-system"`) {
			t.Fatalf("server attributed a cross-network connection to the gateway: %s", line)
		}
		if _, err := c.Daemons["server"].WaitLog(logCtx(), "connection from another network", `src.network="net-a"`,
			"src.addr=10.244.1.3"); err != nil {
			t.Fatal(err)
		}
		// The app's peer is the gateway: the bytes went through it.
		if !sawPeer(echo, c.Pods["eastwest"].IP) {
			t.Fatalf("server app peers %v lack the gateway %s", echo.Peers(), c.Pods["eastwest"].IP)
		}
	})

	t.Run("many connections share one outer connection", func(t *testing.T) {
		before := gw.Tunnels()
		const conns = 24
		mn.echoMany(t, conns)
		// ztunnel's behaviour: one inner tunnel per connection, all in one
		// pooled outer connection to the gateway.
		if got := gw.Tunnels() - before; got != conns {
			t.Errorf("gateway spliced %d inner tunnels for %d connections", got, conns)
		}
		if got := gw.Conns(); got != 1 {
			t.Errorf("gateway accepted %d outer connections, want 1", got)
		}
	})
}

// TestMultiNetworkInnerPooling runs the daemons with
// ZTUNNEL_POOL_INNER_HBONE=true: the connections to the remote service
// share one inner tunnel (one CONNECT through the gateway) instead of one
// each.
func TestMultiNetworkInnerPooling(t *testing.T) {
	mn := startMultiNetwork(t, multiNetworkConfig, "ZTUNNEL_POOL_INNER_HBONE=true")
	const conns = 24
	mn.echoMany(t, conns)
	if got := mn.gw.Tunnels(); got != 1 {
		t.Errorf("gateway spliced %d inner tunnels for %d connections, want 1 (pooled)", got, conns)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Each stream still carries its own x-forwarded-network and authority.
	line, err := mn.cluster.Daemons["server"].WaitLog(ctx, "connection complete", `direction="inbound"`,
		`dst.hbone_addr="echo.default.svc.cluster.local:80"`, `src.identity="spiffe://cluster.local/ns/default/sa/client"`)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(line, `src.workload="eastwest"`) || strings.Contains(line, `src.namespace="istio-system"`) {
		t.Fatalf("server attributed a cross-network connection to the gateway: %s", line)
	}
	// The log arrives through a pipe: poll (the deadline is a hang guard).
	var n int
	if !nettest.Until(time.Minute, func() bool {
		n = strings.Count(mn.cluster.Daemons["server"].Log(), `src.network="net-a"`)
		return n >= conns
	}) || n != conns {
		t.Fatalf("server saw x-forwarded-network on %d streams, want %d", n, conns)
	}
}

// TestMultiNetworkGatewayByHostname: the server's network gateway is named
// by its service's hostname. The client's daemon resolves it through the
// service (which lists the HBONE port) to the gateway pod, and the
// connections go through it by double HBONE as with a gateway address.
func TestMultiNetworkGatewayByHostname(t *testing.T) {
	if strings.Contains(multiNetworkByHostnameConfig, `"net-b/10.244.1.3"`) {
		t.Fatal("the hostname variant still names the gateway by address")
	}
	mn := startMultiNetwork(t, multiNetworkByHostnameConfig)
	const conns = 4
	mn.echoMany(t, conns)
	if got := mn.gw.Tunnels(); got != conns {
		t.Errorf("gateway spliced %d inner tunnels for %d connections", got, conns)
	}
	if !sawPeer(mn.echo, mn.cluster.Pods["eastwest"].IP) {
		t.Fatalf("server app peers %v lack the gateway %s", mn.echo.Peers(), mn.cluster.Pods["eastwest"].IP)
	}
}
