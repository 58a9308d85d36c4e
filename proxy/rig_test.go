package proxy

// The proxy rig of this package's tests: a proxy on loopback with free
// ports over a local config (startProxy; startInbound for the inbound
// HBONE tests), its access log as records (logCapture), echo apps, and a
// mesh client of its 15008 (connectHBONE). onEachBackend (backends_test.go)
// runs a rig test on every engine backend.

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/hbone"
	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/mtls"
	"github.com/ztunnel-go/ztunnel/mtls/caclient"
	"github.com/ztunnel-go/ztunnel/mtls/tlstest"
	"github.com/ztunnel-go/ztunnel/proxy/connmgr"
	"github.com/ztunnel-go/ztunnel/state"
	"github.com/ztunnel-go/ztunnel/state/xdsconv"
)

func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// startOnFreePorts makes and starts a proxy from cfg, whose listener
// ports (and SOCKS5's, when on) freePort picked. A port freePort saw free
// can be taken before the proxy binds it (the local port of any test's
// outgoing connection, or another process's), so a bind conflict picks
// them all again, up to five times.
func startOnFreePorts(t testing.TB, cfg Config) *Proxy {
	t.Helper()
	for try := 1; ; try++ {
		p, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		err = p.Start(context.Background())
		if err == nil {
			return p
		}
		p.Close()
		if !errors.Is(err, syscall.EADDRINUSE) || try == 5 {
			t.Fatal(err)
		}
		cfg.OutboundPort, cfg.InboundPlainPort, cfg.InboundHBONEPort = freePort(t), freePort(t), freePort(t)
		if cfg.SOCKS5 {
			cfg.SOCKS5Port = freePort(t)
		}
	}
}

// echoApp is the local application behind the proxy.
func echoApp(t testing.TB) int {
	t.Helper()
	return serveApp(t, func(c *net.TCPConn) {
		io.Copy(c, c)
		c.CloseWrite()
	})
}

// serveApp runs an app on a loopback port, serving each connection with
// serve (which need not close it) in a goroutine of its own, until the
// test ends.
func serveApp(t testing.TB, serve func(c *net.TCPConn)) int {
	t.Helper()
	return serveAppOn(t, "127.0.0.1", serve)
}

// serveAppOn is serveApp on the loopback address ip.
func serveAppOn(t testing.TB, ip string, serve func(c *net.TCPConn)) int {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				serve(c.(*net.TCPConn))
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().(*net.TCPAddr).Port
}

// logCapture is a slog handler that hands every "connection complete"
// record's attributes to a channel.
type logCapture struct {
	attrs []slog.Attr
	ch    chan map[string]string
}

func (h *logCapture) Enabled(context.Context, slog.Level) bool { return true }
func (h *logCapture) WithGroup(string) slog.Handler            { return h }
func (h *logCapture) WithAttrs(a []slog.Attr) slog.Handler {
	return &logCapture{attrs: append(append([]slog.Attr(nil), h.attrs...), a...), ch: h.ch}
}
func (h *logCapture) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "connection complete" && r.Message != "connection failed" {
		return nil
	}
	m := map[string]string{"msg": r.Message}
	for _, a := range h.attrs {
		m[a.Key] = a.Value.String()
	}
	r.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value.String(); return true })
	select {
	case h.ch <- m:
	default: // a test that does not read its log must not block the proxy
	}
	return nil
}

// nextLog waits for the next connection record.
func nextLog(t *testing.T, ch chan map[string]string) map[string]string {
	t.Helper()
	select {
	case m := <-ch:
		return m
	case <-time.After(10 * time.Second):
		t.Fatal("no connection record logged")
		return nil
	}
}

type proxyRig struct {
	p     *Proxy
	ca    *caclient.BuiltinCA
	store *state.Store
	logs  chan map[string]string
}

// startProxy runs a proxy for workload ns/name (service account = name)
// over the local config yaml, on loopback with free ports; mutate adjusts
// its Config first.
func startProxy(t *testing.T, yaml, name string, mutate func(*Config)) *proxyRig {
	t.Helper()
	snap, err := xdsconv.LocalSnapshot([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	ca := tlstest.NewCA(t, "cluster.local")
	certs := mtls.NewStore(mtls.StoreConfig{Source: caclient.New(caclient.Config{Signer: ca})})
	rig := &proxyRig{ca: ca, store: state.NewStore(snap), logs: make(chan map[string]string, 16)}
	cfg := Config{
		Workload: WorkloadRef{Namespace: "ns", Name: name, ServiceAccount: name},
		State:    rig.store, Certs: certs,
		BindHost: "127.0.0.1", OutboundPort: freePort(t), InboundPlainPort: freePort(t), InboundHBONEPort: freePort(t),
		OrigSrc: new(bool), Logger: slog.New(&logCapture{ch: rig.logs}),
	}
	if mutate != nil {
		mutate(&cfg)
	}
	// The pool's connections are driven as the inbound server's are
	// (withEngine on an "epoll+loop" backend sets the Drive).
	pool := hbone.NewPool(hbone.PoolConfig{Config: hbone.Config{Drive: cfg.HBONE.Drive}})
	cfg.Pool = pool
	p := startOnFreePorts(t, cfg)
	rig.p = p
	t.Cleanup(func() {
		p.Close()
		pool.Close()
		certs.Close()
	})
	return rig
}

// inboundRig is a rig proxy (startInbound) seen from a mesh client of
// its 15008.
type inboundRig struct {
	hbonePort int
	ca        *caclient.BuiltinCA
	store     *state.Store
	p         *Proxy
}

// startInbound runs a proxy serving the workload "srv" at 127.0.0.1, with a
// DENY policy on denyPort and a connection manager re-checking its inbound
// connections; opts adjust its Config.
func startInbound(t *testing.T, denyPort int, opts ...func(*Config)) *inboundRig {
	t.Helper()
	yaml := fmt.Sprintf(srvPolicyConfig+`- name: deny-port
  namespace: ns
  scope: Namespace
  action: Deny
  dryRun: false
  rules:
  - - - destinationPorts: [%d]
`, denyPort)
	rig := startProxy(t, yaml, "srv", func(c *Config) {
		conns := connmgr.New(connmgr.Config{Store: c.State})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); conns.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done }) // after the proxy's close
		c.Conns, c.Logger = conns, nil
		for _, o := range opts {
			o(c)
		}
	})
	return &inboundRig{hbonePort: rig.hbonePort(), ca: rig.ca, store: rig.store, p: rig.p}
}

// connect opens an HBONE stream to the rig as identity sa.
func (r *inboundRig) connect(t *testing.T, sa, authority string) (*hbone.Stream, error) {
	t.Helper()
	s, _, err := connectHBONE(t, r.ca, r.hbonePort, sa, "srv", &hbone.Request{Authority: authority})
	return s, err
}

// hbonePort is the port of the rig proxy's 15008 listener.
func (r *proxyRig) hbonePort() int { return r.p.Addrs()[2].(*net.TCPAddr).Port }

// connectHBONE is a mesh client of a rig proxy's 15008 on loopback port:
// identity ns/sa from ca, expecting the server to be ns/serverSA, it sends
// req and returns the stream and the client connection's local address. A
// failure before the CONNECT fails the test; the CONNECT's error is
// returned.
func connectHBONE(t *testing.T, ca *caclient.BuiltinCA, port int, sa, serverSA string, req *hbone.Request) (*hbone.Stream, netip.AddrPort, error) {
	t.Helper()
	_, s, local, err := connectHBONEConn(t, ca, port, sa, serverSA, req)
	return s, local, err
}

// connectHBONEConn is connectHBONE that also returns the client connection
// (closed when the test ends, or earlier by the test).
func connectHBONEConn(t *testing.T, ca *caclient.BuiltinCA, port int, sa, serverSA string, req *hbone.Request) (*hbone.ClientConn, *hbone.Stream, netip.AddrPort, error) {
	t.Helper()
	cert := tlstest.Cert(t, ca, identity.New("", "ns", sa))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	raw, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	local := raw.LocalAddr().(*net.TCPAddr).AddrPort()
	tc := tls.Client(raw, mtls.ClientConfig(cert, []string{"spiffe://cluster.local/ns/ns/sa/" + serverSA}))
	if err := tc.HandshakeContext(ctx); err != nil {
		raw.Close()
		t.Fatal(err)
	}
	cc, err := hbone.NewClientConn(tc, hbone.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	s, err := cc.Connect(ctx, req)
	return cc, s, local, err
}
