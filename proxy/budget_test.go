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
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/engine"
	"github.com/ztunnel-go/ztunnel/fdbudget"
	"github.com/ztunnel-go/ztunnel/hbone"
	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/internal/netnslab"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
	"github.com/ztunnel-go/ztunnel/metrics"
	"github.com/ztunnel-go/ztunnel/mtls"
	"github.com/ztunnel-go/ztunnel/mtls/caclient"
	"github.com/ztunnel-go/ztunnel/mtls/tlstest"
	"github.com/ztunnel-go/ztunnel/proxy/socks5"
)

// The descriptor budget through the real listeners: a peer that floods a
// listener is refused at its share while another peer is served, each
// refusal is counted and logged, and every way a connection ends gives back
// exactly what it took.

// budgetDenyPort is the port the budget rigs' policy denies; nothing
// listens on budgetClosedPort.
const (
	budgetDenyPort   = 1
	budgetClosedPort = 2
)

// budgetConfig is the budget rigs' snapshot: the served workload "srv" at
// 127.0.0.1, an HBONE destination "dst" at 127.0.8.8 (budgetDestination),
// and a policy denying the port %d.
const budgetConfig = `
workloads:
- {uid: u-srv, name: srv, namespace: ns, serviceAccount: srv, workloadIps: ["127.0.0.1"], protocol: HBONE, services: {}}
- {uid: u-dst, name: dst, namespace: ns, serviceAccount: dst, workloadIps: ["127.0.8.8"], protocol: HBONE, services: {}}
policies:
- name: deny-port
  namespace: ns
  scope: Namespace
  action: Deny
  dryRun: false
  rules:
  - - - destinationPorts: [%d]
`

// budgetRig is a proxy serving "srv" at 127.0.0.1 with a descriptor budget.
type budgetRig struct {
	*proxyRig
	in      *inboundRig
	budget  *fdbudget.Budget
	metrics *metrics.Metrics
	logs    *logBuf
}

// startBudgetRig starts the rig with a budget of total units (no floor, so
// the share rule alone bounds a peer); opts adjust its Config.
func startBudgetRig(t *testing.T, total int, opts ...func(*Config)) *budgetRig {
	t.Helper()
	r := &budgetRig{budget: fdbudget.New(fdbudget.Config{Total: total, Floor: -1}),
		metrics: metrics.New(metrics.Config{}), logs: &logBuf{}}
	yaml := fmt.Sprintf(budgetConfig, budgetDenyPort)
	r.proxyRig = startProxy(t, yaml, "srv", func(c *Config) {
		c.Budget, c.Metrics = r.budget, r.metrics
		withLog(r.logs)(c)
		c.HandshakeTimeout = time.Minute // silent peers hold their connection for the test
		c.Resolver = noDNS
		for _, o := range opts {
			o(c)
		}
	})
	r.in = &inboundRig{hbonePort: r.hbonePort(), ca: r.ca, store: r.store}
	return r
}

// refusals is ztunnel_go_fd_budget_refusals_total{listener, reason}.
func (r *budgetRig) refusals(t *testing.T, listener, reason string) int {
	t.Helper()
	fams, err := r.metrics.Gatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "ztunnel_go_fd_budget_refusals_total" {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if (l.GetName() == "listener" && l.GetValue() != listener) || (l.GetName() == "reason" && l.GetValue() != reason) {
					continue next
				}
			}
			return int(m.GetCounter().GetValue())
		}
	}
	return 0
}

// waitBudget waits until cond holds of the budget's figures (a hang guard
// bounds it: the proxy gives units back on its own time, after a close).
func (r *budgetRig) waitBudget(t *testing.T, what string, cond func(fdbudget.Stats) bool) {
	t.Helper()
	var st fdbudget.Stats
	if !nettest.Until(20*time.Second, func() bool { st = r.budget.Stats(); return cond(st) }) {
		t.Fatalf("budget never %s: %+v", what, st)
	}
}

// waitEmpty waits until everything taken was given back, exactly.
func (r *budgetRig) waitEmpty(t *testing.T) {
	t.Helper()
	r.waitBudget(t, "emptied", func(st fdbudget.Stats) bool { return st.Used == 0 && st.Peers == 0 })
	if st := r.budget.Stats(); st.Unbalanced != 0 {
		t.Fatalf("%d releases of more than was held", st.Unbalanced)
	}
}

// waitHeld waits until peer holds want units.
func (r *budgetRig) waitHeld(t *testing.T, peer string, want int) {
	t.Helper()
	ip := netip.MustParseAddr(peer)
	r.waitBudget(t, fmt.Sprintf("held %d for %s", want, peer), func(fdbudget.Stats) bool { return r.budget.Held(ip) == want })
}

// budgetDestination runs the inbound side of the workload "dst" at
// 127.0.8.8:15008 (a proxy of its own, without a budget, its certificate
// from the rig's CA), so that the rig's outbound connections to it are
// carried over HBONE; it returns the port of an echo app behind it.
func (r *budgetRig) budgetDestination(t *testing.T) int {
	t.Helper()
	certs := mtls.NewStore(mtls.StoreConfig{Source: caclient.New(caclient.Config{Signer: r.ca})})
	pool := hbone.NewPool(hbone.PoolConfig{})
	p, err := New(Config{
		Workload: WorkloadRef{Namespace: "ns", Name: "dst", ServiceAccount: "dst"},
		State:    r.store, Certs: certs, Pool: pool, OrigSrc: new(bool),
		BindHost: "127.0.8.8", InboundHBONEPort: InboundHBONEPort, InboundOnly: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(context.Background()); err != nil {
		t.Fatalf("the destination's 15008: %v", err)
	}
	t.Cleanup(func() {
		p.Close()
		pool.Close()
		certs.Close()
	})
	return echoOn(t, "127.0.8.8")
}

// echoOn runs an echo app on ip and returns its port.
func echoOn(t *testing.T, ip string) int {
	t.Helper()
	return serveAppOn(t, ip, func(c *net.TCPConn) { io.Copy(c, c) })
}

// hboneFrom opens an HBONE connection to the rig's 15008 from the loopback
// address local, as a mesh client.
func (r *budgetRig) hboneFrom(t *testing.T, local string) *hbone.ClientConn {
	t.Helper()
	cert := tlstest.Cert(t, r.ca, identity.New("", "ns", "client"))
	tc := tls.Client(r.in.dialFrom(t, local), mtls.ClientConfig(cert, []string{"spiffe://cluster.local/ns/ns/sa/srv"}))
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	cc, err := hbone.NewClientConn(tc, hbone.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func connect(cc *hbone.ClientConn, authority string) (*hbone.Stream, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return cc.Connect(ctx, &hbone.Request{Authority: authority})
}

// statusOf is the HTTP status a CONNECT was refused with, 0 for another
// error.
func statusOf(err error) int {
	if se, ok := errors.AsType[*hbone.StatusError](err); ok {
		return se.Code
	}
	return 0
}

// TestBudgetHBONEFlood: one peer floods 15008, with CONNECT streams over
// two connections or with silent connections, until the budget refuses it
// at its share (half the budget, as it is alone); another peer's connection
// and stream still get through; the refusals are counted and logged; and
// once the flooder lets go the budget is empty again.
func TestBudgetHBONEFlood(t *testing.T) {
	const total = 40
	app := echoApp(t)
	appAddr := fmt.Sprintf("127.0.0.1:%d", app)
	for _, tc := range []struct {
		name     string
		listener string
		// flood opens what the flooder can from 127.0.0.2 and returns the
		// closers of what it holds.
		flood func(t *testing.T, r *budgetRig) []io.Closer
	}{
		{"streams on two connections", listenerHBONEStream, func(t *testing.T, r *budgetRig) []io.Closer {
			conns := []*hbone.ClientConn{r.hboneFrom(t, "127.0.0.2"), r.hboneFrom(t, "127.0.0.2")}
			held := []io.Closer{conns[0], conns[1]}
			for i := 0; ; i++ {
				if i == 4*total {
					t.Fatalf("%d streams from one peer, none refused", i)
				}
				s, err := connect(conns[i%2], appAddr)
				if err == nil {
					held = append(held, s)
					continue
				}
				if statusOf(err) != http.StatusServiceUnavailable {
					t.Fatalf("stream %d: %v, want a 503", i, err)
				}
				return held
			}
		}},
		{"silent connections", listenerInboundHBONE, func(t *testing.T, r *budgetRig) []io.Closer {
			var held []io.Closer
			for i := 0; r.refusals(t, listenerInboundHBONE, "peer") == 0; i++ {
				if i == 4*total {
					t.Fatalf("%d connections from one peer, none refused", i)
				}
				if c, err := r.in.tryDialFrom(t, "127.0.0.2"); err == nil {
					held = append(held, c)
				}
				// The accept loop takes them in order: wait until this one
				// is counted or refused before the next.
				r.waitBudget(t, "took the connection", func(st fdbudget.Stats) bool {
					return st.Used == i+1 || r.refusals(t, listenerInboundHBONE, "peer") > 0
				})
			}
			return held
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := startBudgetRig(t, total)
			held := tc.flood(t, r)
			flooder := netip.MustParseAddr("127.0.0.2")
			if h := r.budget.Held(flooder); h != total/2 {
				t.Errorf("the flooder holds %d, want its share, half of %d", h, total)
			}
			if n := r.refusals(t, tc.listener, "peer"); n == 0 {
				t.Errorf("no refusal counted for %s", tc.listener)
			}
			r.logs.waitFor(t, "descriptor budget refused a connection", "listener="+tc.listener, "peer=127.0.0.2", "reason=peer")
			if err := r.in.echoFrom(t, "127.0.0.3", app); err != nil {
				t.Fatalf("another peer during the flood: %v", err)
			}
			for _, c := range held {
				c.Close()
			}
			r.waitEmpty(t)
		})
	}
}

// TestBudgetReturnsToZero: every way a connection through 15008, the
// outbound path (SOCKS5, and 15001 itself) and 15006 can end gives back
// exactly what it took, on every engine backend: after many connections
// of each kind, and after refusals, the budget is empty. While a
// connection is open its peer holds its units.
func TestBudgetReturnsToZero(t *testing.T) {
	onEachBackend(t, func(t *testing.T, eng *engine.Engine) {
		const rounds = 10
		app := echoApp(t)
		// An app that is no workload, for the outbound passthrough.
		app9Addr := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.9"), uint16(echoOn(t, "127.0.0.9")))
		const closedPort = budgetClosedPort
		r := startBudgetRig(t, 30, withEngine(eng), func(c *Config) { c.SOCKS5 = true })
		dstAddr := netip.AddrPortFrom(netip.MustParseAddr("127.0.8.8"), uint16(r.budgetDestination(t)))
		addrs := r.p.Addrs()

		socks := func(local string, target netip.AddrPort) (net.Conn, error) {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}, Timeout: 10 * time.Second}
			c, err := d.Dial("tcp", addrs[3].String())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			_ = c.SetDeadline(time.Now().Add(20 * time.Second))
			_, err = socks5.ClientHandshake(c, socks5.Target{Addr: target, Port: target.Port()})
			return c, err
		}
		// directTo connects to one of the proxy's own listeners: with no
		// capture rule in front, 15001 and 15006 see their own port as
		// the destination and reset the connection (a self call).
		directTo := func(addr net.Addr) {
			c, err := net.Dial("tcp", addr.String())
			if err != nil {
				if !isReset(err) {
					t.Fatal(err)
				}
				return // reset before connect returned
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(20 * time.Second))
			if _, err := io.ReadAll(c); err != nil && !isReset(err) {
				t.Fatalf("self call: %v", err)
			}
		}

		for range rounds {
			// 15008: a relayed stream (while open its peer holds the
			// connection's unit and the stream's), streams refused by
			// policy, by a bad authority and by the app, and a peer that
			// leaves before the handshake.
			cc := r.hboneFrom(t, "127.0.0.6")
			s, err := connect(cc, fmt.Sprintf("127.0.0.1:%d", app))
			if err != nil {
				t.Fatal(err)
			}
			r.waitHeld(t, "127.0.0.6", budgetSocket+budgetUpstream)
			if _, err := s.Write([]byte("stream")); err != nil {
				t.Fatal(err)
			}
			_ = s.CloseWrite()
			if got, err := io.ReadAll(s); err != nil || string(got) != "stream" {
				t.Fatalf("echo over the stream: %q, %v", got, err)
			}
			for _, a := range []struct {
				authority string
				status    int
			}{
				{fmt.Sprintf("127.0.0.1:%d", budgetDenyPort), http.StatusUnauthorized},
				{"nonsense", http.StatusBadRequest},
				{fmt.Sprintf("127.0.0.1:%d", closedPort), http.StatusServiceUnavailable},
			} {
				if _, err := connect(cc, a.authority); statusOf(err) != a.status {
					t.Fatalf("CONNECT %s: %v, want %d", a.authority, err, a.status)
				}
			}
			cc.Close()
			r.in.dialFrom(t, "127.0.0.6").Close()

			// The outbound path over SOCKS5: a relayed passthrough
			// (while open it holds its socket and the one it dialled), one
			// over HBONE (its socket only), a connect refused upstream, a
			// handshake the client breaks off.
			for _, o := range []struct {
				dst  netip.AddrPort
				held int
			}{
				{app9Addr, budgetSocket + budgetUpstream},
				{dstAddr, budgetSocket},
			} {
				c, err := socks("127.0.0.5", o.dst)
				if err != nil {
					t.Fatal(err)
				}
				r.waitHeld(t, "127.0.0.5", o.held)
				if got, err := echoOver(c, "outbound"); err != nil || got != "outbound" {
					t.Fatalf("echo over SOCKS5 to %s: %q, %v", o.dst, got, err)
				}
				c.Close()
				r.waitHeld(t, "127.0.0.5", 0)
			}
			if c, err := socks("127.0.0.5", netip.AddrPortFrom(app9Addr.Addr(), uint16(closedPort))); err == nil {
				if _, err := io.ReadAll(c); err == nil {
					t.Fatal("a refused upstream connect was not reset")
				}
			}
			half, err := net.Dial("tcp", addrs[3].String())
			if err != nil {
				t.Fatal(err)
			}
			half.Write([]byte{socks5.Version})
			half.Close()

			directTo(addrs[0])
			directTo(addrs[1])
		}
		// Refusals: a peer takes its share of silent 15008 connections and
		// is refused past it, another its share of SOCKS5 passthroughs
		// (refused at the accept or at the dial); then they let go.
		var held []net.Conn
		for i := 0; r.refusals(t, listenerInboundHBONE, "peer") == 0; i++ {
			if i == 100 {
				t.Fatal("no refusal on 15008")
			}
			if c, err := r.in.tryDialFrom(t, "127.0.0.7"); err == nil {
				held = append(held, c)
			}
		}
		for i := 0; r.refusals(t, listenerOutbound, "peer")+r.refusals(t, listenerSOCKS5, "peer") == 0; i++ {
			if i == 100 {
				t.Fatal("no refusal of SOCKS5 passthroughs")
			}
			if c, err := socks("127.0.0.8", app9Addr); err == nil {
				held = append(held, c)
				r.waitBudget(t, "took the passthrough", func(fdbudget.Stats) bool {
					return r.budget.Held(netip.MustParseAddr("127.0.0.8")) == 2*(i+1) ||
						r.refusals(t, listenerOutbound, "peer") > 0
				})
			}
		}
		for _, c := range held {
			c.Close()
		}
		r.waitEmpty(t)
	})
}

// TestBudgetPlaintextFlood: through capture rules in a network namespace
// (the plaintext into a pod is redirected to 15006, the pod's outgoing
// connections to 15001), one peer floods 15006 with idle connections until
// the budget refuses it at its share; another peer's connection still
// relays; the refusals are counted and logged. Then connections that relay,
// are denied by policy, find no app, and pass through 15001 all give their
// units back: the budget ends empty.
func TestBudgetPlaintextFlood(t *testing.T) {
	const total = 40
	lab := netnslab.New(t)
	ns := lab.Net()
	inNS := func(fn func() error) error { return ns.Do(fn) }
	ln, err := ns.Listen("tcp", "0.0.0.0:0") // 127.0.0.1 for 15006, 127.0.0.9 for 15001
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	app := ln.Addr().(*net.TCPAddr).Port
	r := startBudgetRig(t, total, func(c *Config) { c.Control = inNS })
	addrs := r.p.Addrs()
	port := func(a net.Addr) string { return fmt.Sprint(a.(*net.TCPAddr).Port) }
	// The peers 127.0.0.2 and .3 reach the app's IP through 15006; 127.0.0.4
	// is the pod's app, whose connections to 127.0.0.9 go out through 15001.
	ports := fmt.Sprintf("%d,%d,%d", app, budgetDenyPort, budgetClosedPort)
	for _, rule := range [][]string{
		{"-s", "127.0.0.2/31", "-d", "127.0.0.1", "-m", "multiport", "--dports", ports, "-j", "REDIRECT", "--to-ports", port(addrs[1])},
		{"-s", "127.0.0.4", "-d", "127.0.0.9", "-j", "REDIRECT", "--to-ports", port(addrs[0])},
	} {
		args := append([]string{"-t", "nat", "-A", "OUTPUT", "-p", "tcp"}, rule...)
		if out, err := ns.Command(context.Background(), "iptables", args...).CombinedOutput(); err != nil {
			t.Fatalf("iptables %v: %v: %s", args, err, out)
		}
	}
	dialFrom := func(local string, dst string) (net.Conn, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := ns.DialWith(ctx, &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}, "tcp", dst)
		if err != nil {
			return nil, err
		}
		t.Cleanup(func() { c.Close() })
		_ = c.SetDeadline(time.Now().Add(20 * time.Second))
		return c, nil
	}
	appAddr := fmt.Sprintf("127.0.0.1:%d", app)
	echo := func(local, dst, msg string) error {
		c, err := dialFrom(local, dst)
		if err != nil {
			return err
		}
		defer c.Close()
		if got, err := echoOver(c, msg); err != nil || got != msg {
			return fmt.Errorf("echo %q, %v", got, err)
		}
		return nil
	}

	// The flood: each idle connection holds two units (the accepted
	// socket and the dial to the app).
	var held []net.Conn
	for i := 0; r.refusals(t, listenerInboundPlain, "peer") == 0; i++ {
		if i == total {
			t.Fatalf("%d connections from one peer, none refused", i)
		}
		if c, err := dialFrom("127.0.0.2", appAddr); err == nil {
			held = append(held, c)
		}
		r.waitBudget(t, "took the connection", func(st fdbudget.Stats) bool {
			return st.Used == 2*(i+1) || r.refusals(t, listenerInboundPlain, "peer") > 0
		})
	}
	if h := r.budget.Held(netip.MustParseAddr("127.0.0.2")); h != total/2 {
		t.Errorf("the flooder holds %d, want its share, half of %d", h, total)
	}
	r.logs.waitFor(t, "descriptor budget refused a connection", "listener=inbound_plaintext", "peer=127.0.0.2", "reason=peer")
	if err := echo("127.0.0.3", appAddr, "honest"); err != nil {
		t.Fatalf("another peer during the flood: %v", err)
	}
	for _, c := range held {
		c.Close()
	}
	r.waitEmpty(t)

	// Every kind of ending gives back what it took.
	for range 10 {
		if err := echo("127.0.0.2", appAddr, "plaintext"); err != nil {
			t.Fatal(err)
		}
		if err := echo("127.0.0.4", fmt.Sprintf("127.0.0.9:%d", app), "outbound"); err != nil {
			t.Fatalf("through 15001: %v", err)
		}
		// Denied by policy; no app listening.
		for _, dst := range []string{fmt.Sprintf("127.0.0.1:%d", budgetDenyPort), fmt.Sprintf("127.0.0.1:%d", budgetClosedPort)} {
			c, err := dialFrom("127.0.0.3", dst)
			if err != nil {
				continue // reset before connect returned
			}
			if _, err := io.ReadAll(c); !isReset(err) {
				t.Fatalf("%s: %v, want a reset", dst, err)
			}
		}
	}
	r.waitEmpty(t)
}
