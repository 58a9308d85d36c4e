package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/labrun"
	"github.com/ztunnel-go/ztunnel/internal/netnslab"
	"github.com/ztunnel-go/ztunnel/proxy/proxyproto"
	"github.com/ztunnel-go/ztunnel/proxy/socks5"
)

// extraConfig: client on node-a; on node-b, tunneled (an application
// tunnel of protocol PROXY on 15088) and server, the endpoint of the
// service echo (VIP 10.96.0.10, port 80 -> 8080).
const extraConfig = `
workloads:
- uid: cluster1//v1/Pod/default/client
  name: client
  namespace: default
  serviceAccount: client
  workloadIps: ["10.244.0.2"]
  protocol: HBONE
  node: node-a
  services: {}
- uid: cluster1//v1/Pod/default/tunneled
  name: tunneled
  namespace: default
  serviceAccount: tunneled
  workloadIps: ["10.244.1.2"]
  protocol: HBONE
  node: node-b
  applicationTunnel: {protocol: PROXY, port: 15088}
  services: {}
- uid: cluster1//v1/Pod/default/server
  name: server
  namespace: default
  serviceAccount: server
  workloadIps: ["10.244.1.3"]
  protocol: HBONE
  node: node-b
  services:
    default/echo.default.svc.cluster.local: {80: 8080}
services:
- name: echo
  namespace: default
  hostname: echo.default.svc.cluster.local
  vips: ["/10.96.0.10"]
  ports: {80: 8080}
`

func startExtraCluster(t *testing.T) *labrun.Cluster {
	t.Helper()
	lab := netnslab.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := startCluster(ctx, t, lab, extraConfig, labrun.ClusterOptions{
		Binary: ztunnelBin, Dir: t.TempDir(), DaemonEnv: []string{"UNSTABLE_ENABLE_SOCKS5=true"},
	})
	return c
}

// startProxyProtocolApp listens on port in pod: each connection must start
// with a PROXY v2 header, which is reported; the rest is echoed.
func startProxyProtocolApp(t *testing.T, pod *netnslab.Pod, port uint16) <-chan *proxyproto.Header {
	t.Helper()
	headers := make(chan *proxyproto.Header, 8)
	servePod(t, pod, port, func(c net.Conn) {
		c.SetDeadline(time.Now().Add(60 * time.Second))
		h, err := proxyproto.Read(c)
		if err != nil {
			if !errors.Is(err, net.ErrClosed) { // not the test's end closing it
				t.Errorf("app behind the tunnel: %v", err)
			}
			return
		}
		headers <- h
		io.Copy(c, c)
		c.(*net.TCPConn).CloseWrite()
	})
	return headers
}

func TestRoutingExtras(t *testing.T) {
	c := startExtraCluster(t)
	clientIP := c.Pods["client"].IP
	echo := startEcho(t, c.Pods["server"], 8080)
	headers := startProxyProtocolApp(t, c.Pods["tunneled"], 15088)

	t.Run("application tunnel gets a PROXY v2 header with the SPIFFE TLV", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		target := netip.AddrPortFrom(c.Pods["tunneled"].IP, 8080)
		conn, err := c.Pods["client"].Dial(ctx, "tcp", target.String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		got, err := roundTrip(conn.(*net.TCPConn), []byte("through the app tunnel"))
		if err != nil || string(got) != "through the app tunnel" {
			t.Fatalf("echo %q, %v", got, err)
		}
		var h *proxyproto.Header
		select {
		case h = <-headers:
		case <-ctx.Done():
			t.Fatal("the app got no PROXY header")
		}
		if h.Command != proxyproto.Proxy || h.Src.Addr() != clientIP || h.Dst != target {
			t.Errorf("header %v %s -> %s, want PROXY from %s to %s", h.Command, h.Src, h.Dst, clientIP, target)
		}
		const want = "spiffe://cluster.local/ns/default/sa/client"
		if id, ok := h.TLV(proxyproto.TypeSPIFFEID); !ok || string(id) != want {
			t.Errorf("TLV 0xD0 = %q (present %v), want %q", id, ok, want)
		}
	})

	socksTargets := []struct {
		name   string
		target socks5.Target
	}{
		{"socks5 to a service VIP", socks5.Target{Addr: netip.MustParseAddrPort("10.96.0.10:80")}},
		{"socks5 to a service hostname", socks5.Target{Host: "echo.default.svc.cluster.local", Port: 80}},
	}
	for _, tc := range socksTargets {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			before := len(echo.Peers())
			// The app speaks SOCKS5 to the daemon's loopback listener in its own pod.
			conn, err := c.Pods["client"].Dial(ctx, "tcp", fmt.Sprintf("127.0.0.1:%d", 15080))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(60 * time.Second))
			if rep, err := socks5.ClientHandshake(conn, tc.target); err != nil {
				t.Fatalf("socks5 handshake: %v (reply %#x)", err, byte(rep))
			}
			got, err := roundTrip(conn.(*net.TCPConn), []byte("socks to the service"))
			if err != nil || string(got) != "socks to the service" {
				t.Fatalf("echo %q, %v", got, err)
			}
			// Over HBONE to the endpoint, which saw the client pod's address.
			peers := echo.Peers()
			if len(peers) != before+1 || peers[len(peers)-1].Addr() != clientIP {
				t.Fatalf("server peers %v, want one more from %s", peers, clientIP)
			}
			lctx, lcancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer lcancel()
			if _, err := c.Daemons["client"].WaitLog(lctx, "connection complete", `direction="outbound"`,
				`dst.service="echo.default.svc.cluster.local"`, `dst.hbone_addr="10.244.1.3:8080"`); err != nil {
				t.Fatal(err)
			}
		})
	}
}
