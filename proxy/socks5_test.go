package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/engine"
	"github.com/ztunnel-go/ztunnel/hbone"
	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/mtls"
	"github.com/ztunnel-go/ztunnel/mtls/caclient"
	"github.com/ztunnel-go/ztunnel/mtls/tlstest"
	"github.com/ztunnel-go/ztunnel/proxy/meta"
	"github.com/ztunnel-go/ztunnel/proxy/socks5"
)

// socksDial runs the SOCKS5 handshake for target against the rig.
func (r *proxyRig) socksDial(t *testing.T, target socks5.Target) (net.Conn, socks5.Reply, error) {
	t.Helper()
	addrs := r.p.Addrs()
	if len(addrs) < 4 {
		t.Fatalf("no SOCKS5 listener: %v", addrs)
	}
	c, err := net.Dial("tcp", addrs[3].String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(20 * time.Second))
	rep, err := socks5.ClientHandshake(c, target)
	return c, rep, err
}

func echoOver(c net.Conn, msg string) (string, error) {
	if _, err := c.Write([]byte(msg)); err != nil {
		return "", err
	}
	c.(*net.TCPConn).CloseWrite()
	got, err := io.ReadAll(c)
	return string(got), err
}

// noDNS fails every lookup that /etc/hosts cannot answer, so tests never
// depend on the machine's network.
var noDNS = &net.Resolver{PreferGo: true, Dial: func(context.Context, string, string) (net.Conn, error) {
	return nil, errors.New("no DNS in tests")
}}

func TestSOCKS5(t *testing.T) {
	onEachBackend(t, func(t *testing.T, eng *engine.Engine) {
		app := echoApp(t)
		yaml := fmt.Sprintf(`
workloads:
- uid: u-cli
  name: cli
  namespace: ns
  serviceAccount: cli
  workloadIps: ["127.0.0.2"]
  protocol: TCP
  services: {}
- uid: u-echo
  name: echo
  namespace: ns
  serviceAccount: echo
  workloadIps: ["127.0.0.1"]
  protocol: TCP
  services:
    ns/echo.ns.svc.cluster.local: {80: %d}
services:
- name: echo
  namespace: ns
  hostname: echo.ns.svc.cluster.local
  vips: ["/127.0.0.3"]
  ports: {80: %d}
- name: hidden
  namespace: other
  hostname: hidden.other.svc.cluster.local
  vips: ["/127.0.0.4"]
  ports: {80: %d}
  visibility: Namespace
`, app, app, app)
		rig := startProxy(t, yaml, "cli", func(c *Config) {
			c.SOCKS5, c.SOCKS5Port, c.Resolver, c.Engine = true, freePort(t), noDNS, eng
		})

		ok := []struct {
			name   string
			target socks5.Target
			dst    string // dst.addr in the access log: the address dialled, as ztunnel logs it
		}{
			{"ipv4 passthrough", socks5.Target{Addr: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(app))}, fmt.Sprintf("127.0.0.1:%d", app)},
			{"service vip", socks5.Target{Addr: netip.MustParseAddrPort("127.0.0.3:80")}, fmt.Sprintf("127.0.0.1:%d", app)},
			{"service hostname to its vip", socks5.Target{Host: "echo.ns.svc.cluster.local", Port: 80}, fmt.Sprintf("127.0.0.1:%d", app)},
			{"name from the system resolver", socks5.Target{Host: "localhost", Port: uint16(app)}, fmt.Sprintf("127.0.0.1:%d", app)},
		}
		for _, tc := range ok {
			t.Run(tc.name, func(t *testing.T) {
				c, rep, err := rig.socksDial(t, tc.target)
				if err != nil || rep != socks5.ReplySucceeded {
					t.Fatalf("handshake: %v, %v", rep, err)
				}
				got, err := echoOver(c, "through socks")
				if err != nil || got != "through socks" {
					t.Fatalf("echo: %q, %v", got, err)
				}
				m := nextLog(t, rig.logs)
				if m["msg"] != "connection complete" || m["dst.addr"] != tc.dst || m["direction"] != "outbound" {
					t.Fatalf("access log %v, want a complete outbound connection to %s", m, tc.dst)
				}
			})
		}

		refused := []struct {
			name   string
			target socks5.Target
			cmd    byte
			want   socks5.Reply
		}{
			{"bind", socks5.Target{Addr: netip.MustParseAddrPort("127.0.0.1:80")}, socks5.CmdBind, socks5.ReplyCommandNotSupported},
			{"unknown name", socks5.Target{Host: "nothing.invalid", Port: 80}, socks5.CmdConnect, socks5.ReplyHostUnreachable},
			{"service hidden from the namespace", socks5.Target{Host: "hidden.other.svc.cluster.local", Port: 80}, socks5.CmdConnect, socks5.ReplyHostUnreachable},
		}
		for _, tc := range refused {
			t.Run(tc.name, func(t *testing.T) {
				c, err := net.Dial("tcp", rig.p.Addrs()[3].String())
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				c.SetDeadline(time.Now().Add(20 * time.Second))
				req, _ := socks5.AppendRequest([]byte{5, 1, 0}, tc.cmd, tc.target)
				c.Write(req)
				resp := make([]byte, 2+10)
				if _, err := io.ReadFull(c, resp); err != nil {
					t.Fatal(err)
				}
				if socks5.Reply(resp[3]) != tc.want {
					t.Fatalf("reply % x, want code %#x", resp, byte(tc.want))
				}
				if m := nextLog(t, rig.logs); m["msg"] != "connection failed" {
					t.Fatalf("access log %v, want a failed connection", m)
				}
			})
		}

		t.Run("refused upstream is reset after success", func(t *testing.T) {
			dst := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(freePort(t)))
			c, rep, err := rig.socksDial(t, socks5.Target{Addr: dst})
			if err != nil || rep != socks5.ReplySucceeded {
				t.Fatalf("handshake: %v, %v", rep, err)
			}
			if _, err := io.ReadAll(c); !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("client read %v, want a reset", err)
			}
			m := nextLog(t, rig.logs)
			want := fmt.Sprintf("connect to %s: dial tcp %s: connect: connection refused", dst, dst)
			if m["msg"] != "connection complete" || m["error"] != want {
				t.Fatalf("access log %v, want a complete connection with error %q", m, want)
			}
		})

		t.Run("illegal port is reset after success", func(t *testing.T) {
			own := rig.p.Addrs()[0].(*net.TCPAddr).AddrPort()
			c, rep, err := rig.socksDial(t, socks5.Target{Addr: own})
			if err != nil || rep != socks5.ReplySucceeded {
				t.Fatalf("handshake: %v, %v", rep, err)
			}
			if got, err := echoOver(c, "loop"); err == nil && got != "" {
				t.Fatalf("self call answered %q", got)
			}
			if m := nextLog(t, rig.logs); m["msg"] != "connection failed" {
				t.Fatalf("access log %v, want a failed connection", m)
			}
		})
	})
}

func TestSOCKS5Disabled(t *testing.T) {
	rig := startProxy(t, "workloads: []", "cli", nil)
	if n := len(rig.p.Addrs()); n != 3 {
		t.Fatalf("%d listeners, want 3 without SOCKS5", n)
	}
}

// fakePeer is an HBONE server at ip:15008 that records each CONNECT's
// headers, answers 200 with a baggage header and echoes.
type fakePeer struct {
	mu      sync.Mutex // guards headers
	headers []http.Header
}

func startFakePeer(t *testing.T, ca *caclient.BuiltinCA, ip string) *fakePeer {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, fmt.Sprint(InboundHBONEPort)))
	if err != nil {
		t.Skipf("cannot listen on %s:15008: %v", ip, err)
	}
	fp := &fakePeer{}
	cert := tlstest.Cert(t, ca, identity.New("", "ns", "peer"))
	srv := hbone.NewServer(hbone.Config{}, func(ctx context.Context, req *hbone.ServerRequest) {
		fp.mu.Lock()
		fp.headers = append(fp.headers, req.Header.Clone())
		fp.mu.Unlock()
		s, err := req.Respond(http.StatusOK, http.Header{"Baggage": []string{"k8s.namespace.name=ns"}})
		if err != nil {
			return
		}
		io.Copy(s, s)
		s.CloseWrite()
	})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				tc := tls.Server(c, mtls.ServerConfig(func() (*mtls.WorkloadCert, error) { return cert, nil }))
				if tc.Handshake() == nil {
					srv.ServeConn(context.Background(), tc)
				}
				c.Close()
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		srv.Close()
		wg.Wait()
	})
	return fp
}

// TestOutboundConnectHeaders sends a connection over SOCKS5 to an HBONE
// workload and checks the CONNECT's metadata headers.
func TestOutboundConnectHeaders(t *testing.T) {
	onEachBackend(t, func(t *testing.T, eng *engine.Engine) {
		const peerIP = "127.0.83.1"
		yaml := `
workloads:
- uid: u-cli
  name: cli
  namespace: ns
  serviceAccount: cli
  workloadIps: ["127.0.83.2"]
  protocol: HBONE
  clusterId: c1
  workloadName: cli-deploy
  workloadType: deployment
  canonicalName: cli-app
  canonicalRevision: v7
  locality: {region: r1, zone: z1, subzone: ""}
  services: {}
- uid: u-peer
  name: peer
  namespace: ns
  serviceAccount: peer
  workloadIps: ["` + peerIP + `"]
  protocol: HBONE
  services: {}
`
		rig := startProxy(t, yaml, "cli", func(c *Config) { c.SOCKS5, c.SOCKS5Port, c.Engine = true, freePort(t), eng })
		fp := startFakePeer(t, rig.ca, peerIP)

		c, rep, err := rig.socksDial(t, socks5.Target{Addr: netip.MustParseAddrPort(peerIP + ":8080")})
		if err != nil || rep != socks5.ReplySucceeded {
			t.Fatalf("handshake: %v, %v", rep, err)
		}
		if got, err := echoOver(c, "hi"); err != nil || got != "hi" {
			t.Fatalf("echo: %q, %v", got, err)
		}
		m := nextLog(t, rig.logs)
		fp.mu.Lock()
		defer fp.mu.Unlock()
		if len(fp.headers) != 1 {
			t.Fatalf("%d CONNECTs, want 1 (log %v)", len(fp.headers), m)
		}
		h := fp.headers[0]
		fwd, err := meta.ParseForwarded(h.Get("Forwarded"))
		if err != nil || len(fwd) != 1 || fwd[0].For != c.LocalAddr().String() {
			t.Errorf("forwarded %q (%v), want for=%q", h.Get("Forwarded"), err, c.LocalAddr())
		}
		b, err := meta.ParseBaggage(h.Get("Baggage"))
		want := meta.Baggage{ClusterID: "c1", Namespace: "ns", WorkloadType: "deployment", WorkloadName: "cli-deploy",
			ServiceName: "cli-app", ServiceVersion: "v7", Region: "r1", Zone: "z1"}
		if err != nil || b != want {
			t.Errorf("baggage %q parsed as %+v (%v), want %+v", h.Get("Baggage"), b, err, want)
		}
		if _, err := meta.ParseTraceParent(h.Get("Traceparent")); err != nil {
			t.Errorf("traceparent %q: %v", h.Get("Traceparent"), err)
		}
	})
}
