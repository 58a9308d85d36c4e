package proxy

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/engine"
	"github.com/ztunnel-go/ztunnel/hbone"
	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/internal/labrun"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
	"github.com/ztunnel-go/ztunnel/metrics"
	"github.com/ztunnel-go/ztunnel/mtls"
	"github.com/ztunnel-go/ztunnel/mtls/caclient"
	"github.com/ztunnel-go/ztunnel/mtls/tlstest"
	"github.com/ztunnel-go/ztunnel/state"
	"github.com/ztunnel-go/ztunnel/state/xdsconv"
)

// routingConfig has a client on net-a and services whose endpoints sit on
// net-b behind gateways of every kind.
const routingConfig = `
workloads:
- {uid: client, name: client, namespace: ns, serviceAccount: client, workloadIps: ["10.0.0.2"], network: net-a, protocol: HBONE, services: {}}
- {uid: local, name: local, namespace: ns, serviceAccount: local, workloadIps: ["10.0.0.3"], network: net-a, protocol: HBONE,
   services: {"ns/local.ns.svc.cluster.local": {80: 8080}}}
- {uid: remote, name: remote, namespace: ns, serviceAccount: remote, workloadIps: ["10.1.0.2"], network: net-b, protocol: HBONE,
   networkGateway: {destination: "net-b/192.0.2.10", hboneMtlsPort: 15008},
   services: {"ns/echo.ns.svc.cluster.local": {80: 8080}}}
- {uid: remote-by-host, name: remote-by-host, namespace: ns, serviceAccount: remote, workloadIps: [], network: net-b, protocol: HBONE,
   networkGateway: {destination: "istio-system/eastwest.istio-system.svc.cluster.local", hboneMtlsPort: 15443},
   services: {"ns/byhost.ns.svc.cluster.local": {80: 8080}}}
- {uid: remote-by-vip, name: remote-by-vip, namespace: ns, serviceAccount: remote, workloadIps: ["10.1.0.4"], network: net-b, protocol: HBONE,
   networkGateway: {destination: "net-b/192.0.2.30", hboneMtlsPort: 0},
   services: {"ns/byvip.ns.svc.cluster.local": {80: 8080}}}
- {uid: remote-lost, name: remote-lost, namespace: ns, serviceAccount: remote, workloadIps: ["10.1.0.5"], network: net-b, protocol: HBONE,
   networkGateway: {destination: "net-b/192.0.2.99", hboneMtlsPort: 15008},
   services: {"ns/lost.ns.svc.cluster.local": {80: 8080}}}
- {uid: remote-tcp, name: remote-tcp, namespace: ns, serviceAccount: remote, workloadIps: ["10.1.0.6"], network: net-b, protocol: TCP,
   networkGateway: {destination: "net-b/192.0.2.10", hboneMtlsPort: 15008},
   services: {"ns/plain.ns.svc.cluster.local": {80: 8080}}}
- {uid: remote-noport, name: remote-noport, namespace: ns, serviceAccount: remote, workloadIps: ["10.1.0.7"], network: net-b, protocol: HBONE,
   networkGateway: {destination: "istio-system/eastwest.istio-system.svc.cluster.local", hboneMtlsPort: 15012},
   services: {"ns/noport.ns.svc.cluster.local": {80: 8080}}}
- {uid: remote-empty, name: remote-empty, namespace: ns, serviceAccount: remote, workloadIps: ["10.1.0.8"], network: net-b, protocol: HBONE,
   networkGateway: {destination: "istio-system/empty-gw.istio-system.svc.cluster.local", hboneMtlsPort: 15008},
   services: {"ns/empty.ns.svc.cluster.local": {80: 8080}}}
- {uid: remote-mapped, name: remote-mapped, namespace: ns, serviceAccount: remote, workloadIps: ["10.1.0.9"], network: net-b, protocol: HBONE,
   networkGateway: {destination: "istio-system/mapped-gw.istio-system.svc.cluster.local", hboneMtlsPort: 15009},
   services: {"ns/mapped.ns.svc.cluster.local": {80: 8080}}}
- {uid: remote-near, name: remote-near, namespace: ns, serviceAccount: remote, workloadIps: ["10.1.0.10"], network: net-b, protocol: HBONE,
   networkGateway: {destination: "istio-system/near-gw.istio-system.svc.cluster.local", hboneMtlsPort: 15008},
   services: {"ns/near.ns.svc.cluster.local": {80: 8080}}}
- {uid: gw, name: gw, namespace: istio-system, serviceAccount: gw, workloadIps: ["192.0.2.10"], network: net-b, protocol: TCP, services: {}}
- {uid: ew, name: ew, namespace: istio-system, serviceAccount: eastwest, workloadIps: ["192.0.2.20"], network: net-b, protocol: TCP,
   services: {"istio-system/eastwest.istio-system.svc.cluster.local": {15443: 15443, 15008: 15008}}}
- {uid: ew-b, name: ew-b, namespace: istio-system, serviceAccount: eastwest, workloadIps: ["192.0.2.21"], network: net-b, protocol: TCP,
   services: {"istio-system/eastwest.istio-system.svc.cluster.local": {15443: 15443, 15008: 15008}}}
- {uid: mapped-gw, name: mapped-gw, namespace: istio-system, serviceAccount: mapped-gw, workloadIps: ["192.0.2.40"], network: net-b, protocol: TCP,
   services: {"istio-system/mapped-gw.istio-system.svc.cluster.local": {15009: 15008}}}
- {uid: near-gw, name: near-gw, namespace: istio-system, serviceAccount: near-gw, workloadIps: ["10.0.0.9"], network: net-a, protocol: TCP,
   services: {"istio-system/near-gw.istio-system.svc.cluster.local": {15008: 15008}}}
services:
- {name: local, namespace: ns, hostname: local.ns.svc.cluster.local, vips: ["net-a/10.96.0.1"], ports: {80: 8080}}
- {name: echo, namespace: ns, hostname: echo.ns.svc.cluster.local, vips: ["net-a/10.96.0.2"], ports: {80: 8080},
   subjectAltNames: ["spiffe://cluster.local/ns/ns/sa/echo-alt"]}
- {name: byhost, namespace: ns, hostname: byhost.ns.svc.cluster.local, vips: ["net-a/10.96.0.3"], ports: {80: 8080}}
- {name: byvip, namespace: ns, hostname: byvip.ns.svc.cluster.local, vips: ["net-a/10.96.0.4"], ports: {80: 8080}}
- {name: lost, namespace: ns, hostname: lost.ns.svc.cluster.local, vips: ["net-a/10.96.0.5"], ports: {80: 8080}}
- {name: plain, namespace: ns, hostname: plain.ns.svc.cluster.local, vips: ["net-a/10.96.0.6"], ports: {80: 8080}}
- {name: noport, namespace: ns, hostname: noport.ns.svc.cluster.local, vips: ["net-a/10.96.0.7"], ports: {80: 8080}}
- {name: empty, namespace: ns, hostname: empty.ns.svc.cluster.local, vips: ["net-a/10.96.0.8"], ports: {80: 8080}}
- {name: mapped, namespace: ns, hostname: mapped.ns.svc.cluster.local, vips: ["net-a/10.96.0.9"], ports: {80: 8080}}
- {name: near, namespace: ns, hostname: near.ns.svc.cluster.local, vips: ["net-a/10.96.0.11"], ports: {80: 8080}}
- {name: eastwest, namespace: istio-system, hostname: eastwest.istio-system.svc.cluster.local, vips: ["net-b/192.0.2.30"],
   ports: {15443: 15443, 15008: 15008}, subjectAltNames: ["spiffe://cluster.local/ns/istio-system/sa/eastwest-alt"]}
- {name: empty-gw, namespace: istio-system, hostname: empty-gw.istio-system.svc.cluster.local, vips: [], ports: {15008: 15008}}
- {name: mapped-gw, namespace: istio-system, hostname: mapped-gw.istio-system.svc.cluster.local, vips: [], ports: {15009: 15009}}
- {name: near-gw, namespace: istio-system, hostname: near-gw.istio-system.svc.cluster.local, vips: [], ports: {15008: 15008}}
`

func TestRouteViaGateway(t *testing.T) {
	snap, err := xdsconv.LocalSnapshot([]byte(routingConfig))
	if err != nil {
		t.Fatal(err)
	}
	src := snap.WorkloadByUID("client")
	const (
		remoteID = "spiffe://cluster.local/ns/ns/sa/remote"
		ewID     = "spiffe://cluster.local/ns/istio-system/sa/eastwest"
		ewSAN    = "spiffe://cluster.local/ns/istio-system/sa/eastwest-alt"
	)
	tests := []struct {
		name      string
		dst       string
		poolInner bool
		rnd       uint64 // the proxy's random source returns this modulo n
		wantErr   string
		wantIs    error
		direct    bool     // no gateway: an ordinary route
		gw        string   // outer tunnel peer
		gwSANs    []string // identities the gateway must present
		innerSANs []string
		wantPool  bool
	}{
		{name: "gateway by workload address", dst: "10.96.0.2:80", gw: "192.0.2.10:15008",
			gwSANs:    []string{"spiffe://cluster.local/ns/istio-system/sa/gw"},
			innerSANs: []string{remoteID, "spiffe://cluster.local/ns/ns/sa/echo-alt"}},
		{name: "gateway by service hostname with the HBONE port", dst: "10.96.0.3:80", gw: "192.0.2.20:15443",
			gwSANs: []string{ewID, ewSAN}, innerSANs: []string{remoteID}},
		{name: "gateway service endpoint chosen by the proxy's random source", dst: "10.96.0.3:80", rnd: 1, gw: "192.0.2.21:15443",
			gwSANs: []string{ewID, ewSAN}, innerSANs: []string{remoteID}},
		{name: "gateway by service VIP, default port", dst: "10.96.0.4:80", gw: "192.0.2.20:15008",
			gwSANs: []string{ewID, ewSAN}, innerSANs: []string{remoteID}},
		{name: "gateway service maps the HBONE port to its target port", dst: "10.96.0.9:80", gw: "192.0.2.40:15008",
			gwSANs: []string{"spiffe://cluster.local/ns/istio-system/sa/mapped-gw"}, innerSANs: []string{remoteID}},
		{name: "gateway on the source's own network", dst: "10.96.0.11:80", gw: "10.0.0.9:15008",
			gwSANs: []string{"spiffe://cluster.local/ns/istio-system/sa/near-gw"}, innerSANs: []string{remoteID}},
		{name: "inner pooling for a ztunnel destination", dst: "10.96.0.2:80", poolInner: true, wantPool: true, gw: "192.0.2.10:15008",
			gwSANs:    []string{"spiffe://cluster.local/ns/istio-system/sa/gw"},
			innerSANs: []string{remoteID, "spiffe://cluster.local/ns/ns/sa/echo-alt"}},
		{name: "no inner pooling for a non-HBONE destination", dst: "10.96.0.6:80", poolInner: true, gw: "192.0.2.10:15008",
			gwSANs: []string{"spiffe://cluster.local/ns/istio-system/sa/gw"}, innerSANs: []string{remoteID}},
		{name: "unknown gateway", dst: "10.96.0.5:80", wantIs: state.ErrUnknownGateway,
			wantErr: "network gateway net-b/192.0.2.99: state: gateway not found"},
		{name: "gateway by service hostname without the HBONE port", dst: "10.96.0.7:80", wantIs: state.ErrNoHealthyUpstream,
			wantErr: "service istio-system/eastwest.istio-system.svc.cluster.local has no port 15012"},
		{name: "gateway service with no healthy endpoint", dst: "10.96.0.8:80", wantIs: state.ErrNoHealthyUpstream,
			wantErr: "network gateway istio-system/empty-gw.istio-system.svc.cluster.local: state: no healthy upstream"},
		{name: "same network goes direct", dst: "10.96.0.1:80", direct: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// Every pick of the route shares the random source: modulo
			// n, picks among one candidate stay in range.
			rt := newRouter(&Config{Network: "net-a", PoolInnerHBONE: tc.poolInner})
			rt.rnd = func(n uint64) uint64 { return tc.rnd % n }
			r, err := rt.routeOutbound(context.Background(), snap, src, netip.AddrPort{}, netip.MustParseAddrPort(tc.dst))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, tc.wantIs) {
					t.Fatalf("error %v, want %q wrapping %v", err, tc.wantErr, tc.wantIs)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.direct {
				if r.gateway != nil {
					t.Fatalf("same-network endpoint routed through a gateway: %+v", r)
				}
				return
			}
			if r.gateway == nil || !r.hbone {
				t.Fatalf("route %+v: want double HBONE", r)
			}
			wantAuth := r.service.Hostname + ":80"
			if r.dst.String() != tc.gw || r.authority != wantAuth || r.gateway.authority != wantAuth {
				t.Errorf("outer %s %q, inner %q; want %s %q", r.dst, r.authority, r.gateway.authority, tc.gw, wantAuth)
			}
			if !slices.Equal(r.sans, tc.gwSANs) || !slices.Equal(r.gateway.sans, tc.innerSANs) {
				t.Errorf("gateway SANs %v (want %v), inner SANs %v (want %v)", r.sans, tc.gwSANs, r.gateway.sans, tc.innerSANs)
			}
			if r.gateway.pool != tc.wantPool {
				t.Errorf("inner pooling %v, want %v", r.gateway.pool, tc.wantPool)
			}
			if tc.wantPool && !strings.Contains(r.gateway.key.String(), "spiffe://cluster.local/ns/ns/sa/client") {
				t.Errorf("pool key %q lacks the source identity", r.gateway.key.String())
			}
		})
	}
	t.Run("workload address without a service", func(t *testing.T) {
		rt := newRouter(&Config{Network: "net-a"})
		_, err := rt.routeViaGateway(context.Background(), snap, src, snap.WorkloadByUID("remote"), nil, netip.MustParseAddrPort("10.1.0.2:8080"))
		if err == nil || !strings.Contains(err.Error(), "needs a service address") {
			t.Fatalf("error %v, want the service-address explanation", err)
		}
	})
}

// multiNetConfig: client on net-a (127.0.0.2), srv on net-b (127.0.0.1)
// behind the gateway workload at 127.0.0.3.
const multiNetConfig = `
workloads:
- {uid: client, name: client, namespace: ns, serviceAccount: client, workloadIps: ["127.0.0.2"], network: net-a, protocol: HBONE, services: {}}
- uid: srv
  name: srv
  namespace: ns
  serviceAccount: srv
  workloadIps: ["127.0.0.1"]
  network: net-b
  protocol: HBONE
  networkGateway: {destination: "net-b/127.0.0.3", hboneMtlsPort: %d}
  services:
    ns/echo.ns.svc.cluster.local: {80: %d, 81: 0}
    ns/nowhere.ns.svc.cluster.local: {}
- {uid: gw, name: ew-gateway, namespace: istio-system, serviceAccount: ew-gateway, workloadIps: ["127.0.0.3"], network: net-b, protocol: TCP, services: {}}
services:
- {name: echo, namespace: ns, hostname: echo.ns.svc.cluster.local, vips: ["net-a/10.96.0.10", "net-b/10.96.0.10"], ports: {80: 9, 81: 0}}
- {name: nowhere, namespace: ns, hostname: nowhere.ns.svc.cluster.local, vips: [], ports: {80: 0}}
- {name: other, namespace: ns, hostname: other.ns.svc.cluster.local, vips: [], ports: {80: 8080}}
`

// syncBuffer is a log sink read while the proxy writes to it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) lines(substrs ...string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for l := range strings.Lines(s.b.String()) {
		ok := true
		for _, sub := range substrs {
			ok = ok && strings.Contains(l, sub)
		}
		if ok {
			out = append(out, l)
		}
	}
	return out
}

type multiNetRig struct {
	snap   *state.Snapshot
	srcW   *state.Workload
	client *Proxy
	gw     *labrun.EWGateway
	dstLog *syncBuffer
}

// startMultiNet runs the destination's proxy (net-b), the E/W gateway and a
// client proxy (net-a, not listening: the tests call its outbound steps).
func startMultiNet(t testing.TB, poolInner bool, opts ...func(*Config)) *multiNetRig {
	t.Helper()
	app := echoApp(t)
	gwLn, err := net.Listen("tcp", "127.0.0.3:0")
	if err != nil {
		t.Fatal(err)
	}
	gwPort := gwLn.Addr().(*net.TCPAddr).Port
	snap, err := xdsconv.LocalSnapshot(fmt.Appendf(nil, multiNetConfig, gwPort, app))
	if err != nil {
		gwLn.Close()
		t.Fatal(err)
	}
	store := state.NewStore(snap)
	ca := tlstest.NewCA(t, "cluster.local")
	certs := mtls.NewStore(mtls.StoreConfig{Source: caclient.New(caclient.Config{Signer: ca})})
	dstPool, clientPool := hbone.NewPool(hbone.PoolConfig{}), hbone.NewPool(hbone.PoolConfig{})
	rig := &multiNetRig{snap: snap, srcW: snap.WorkloadByUID("client"), dstLog: &syncBuffer{}}
	dcfg := Config{
		Workload: WorkloadRef{Namespace: "ns", Name: "srv", ServiceAccount: "srv"}, Network: "net-b",
		State: store, Certs: certs, Pool: dstPool,
		BindHost: "127.0.0.1", OutboundPort: freePort(t), InboundPlainPort: freePort(t), InboundHBONEPort: freePort(t),
		OrigSrc: new(bool),
		Logger:  slog.New(slog.NewTextHandler(rig.dstLog, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	for _, o := range opts {
		o(&dcfg)
	}
	t.Cleanup(func() { gwLn.Close() }) // for a failed start; once served, the gateway closes it (twice is harmless)
	dst := startOnFreePorts(t, dcfg)   // rig_test.go
	dstHBONE := addrPortOf(dst.Addrs()[2])
	rig.gw = labrun.ServeEWGateway(gwLn, labrun.EWGatewayOptions{
		Cert: tlstest.Cert(t, ca, identity.New("", "istio-system", "ew-gateway")),
		Routes: map[string]netip.AddrPort{
			"echo.ns.svc.cluster.local:80":    dstHBONE,
			"echo.ns.svc.cluster.local:81":    dstHBONE,
			"other.ns.svc.cluster.local:80":   dstHBONE,
			"nowhere.ns.svc.cluster.local:80": dstHBONE,
		},
	})
	rig.client, err = New(Config{
		Workload: WorkloadRef{Namespace: "ns", Name: "client", ServiceAccount: "client"}, Network: "net-a",
		State: store, Certs: certs, Pool: clientPool, PoolInnerHBONE: poolInner,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		clientPool.Close()
		rig.gw.Close()
		dst.Close()
		dstPool.Close()
		certs.Close()
	})
	return rig
}

// route returns the client's route to the echo service VIP.
func (r *multiNetRig) route(t testing.TB) outboundRoute {
	t.Helper()
	route, err := r.client.router.routeOutbound(context.Background(), r.snap, r.srcW, netip.AddrPort{}, netip.MustParseAddrPort("10.96.0.10:80"))
	if err != nil {
		t.Fatal(err)
	}
	if route.gateway == nil {
		t.Fatalf("route %+v does not go through the gateway", route)
	}
	return route
}

func (r *multiNetRig) connect(t testing.TB, route outboundRoute) (*hbone.Stream, metrics.ResponseFlags, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := newTunnel(r.client, r.srcW, netip.MustParseAddrPort("127.0.0.2:40000"), &route).openInner(ctx)
	return s, responseFlags(err), err
}

// checksumEcho sends n random bytes through s and compares the echo's hash.
func checksumEcho(t *testing.T, s *hbone.Stream, n int) {
	t.Helper()
	s.SetDeadline(time.Now().Add(30 * time.Second))
	payload := make([]byte, n)
	rand.Read(payload)
	errc := make(chan error, 1)
	go func() {
		_, err := s.Write(payload)
		if err == nil {
			err = s.CloseWrite()
		}
		errc <- err
	}()
	got, err := io.ReadAll(s)
	if werr := <-errc; err == nil {
		err = werr
	}
	if err != nil {
		t.Fatal(err)
	}
	if sha256.Sum256(got) != sha256.Sum256(payload) {
		t.Fatalf("echo of %d bytes came back as %d different bytes", n, len(got))
	}
}

// waitLines polls the log for count lines with all substrs (hang guard only).
func waitLines(t *testing.T, log *syncBuffer, count int, substrs ...string) []string {
	t.Helper()
	var l []string
	if !nettest.Until(20*time.Second, func() bool { l = log.lines(substrs...); return len(l) >= count }) {
		t.Fatalf("log lacks %d lines with %q:\n%s", count, substrs, strings.Join(log.lines(), ""))
	}
	return l
}

// TestDoubleHBONE sends connections through the gateway to the destination
// proxy, without and with inner pooling, and checks what each hop saw.
func TestDoubleHBONE(t *testing.T) {
	onEachBackend(t, func(t *testing.T, eng *engine.Engine) {
		const conns = 5
		tests := []struct {
			name        string
			poolInner   bool
			wantTunnels int64 // CONNECTs the gateway spliced = inner connections
		}{
			{"one inner connection per connection", false, conns},
			{"pooled inner connection", true, 1},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				rig := startMultiNet(t, tc.poolInner, withEngine(eng))
				route := rig.route(t)
				for i := range conns {
					s, flags, err := rig.connect(t, route)
					if err != nil {
						t.Fatalf("connection %d: %v (flags %v)", i, err, flags)
					}
					checksumEcho(t, s, 256<<10+i)
					s.Close()
				}
				if got := rig.gw.Conns(); got != 1 {
					t.Errorf("gateway accepted %d outer connections, want 1 (pooled)", got)
				}
				if got := rig.gw.Tunnels(); got != tc.wantTunnels {
					t.Errorf("gateway spliced %d tunnels, want %d", got, tc.wantTunnels)
				}
				// The destination mapped service port 80 to the endpoint's
				// port, saw the client's identity, and did not take the
				// gateway's address for the client's workload: the client is what
				// its baggage says (namespace; no canonical name to log it by),
				// and the service is the one the inner Forwarded host= named.
				done := waitLines(t, rig.dstLog, conns, "connection complete", "dst.hbone_addr=echo.ns.svc.cluster.local:80")
				for _, l := range done {
					if !strings.Contains(l, "src.identity=spiffe://cluster.local/ns/ns/sa/client") || strings.Contains(l, "src.workload=") ||
						!strings.Contains(l, "src.namespace=ns") || !strings.Contains(l, "dst.service=echo.ns.svc.cluster.local") ||
						!strings.Contains(l, "dst.addr=127.0.0.1:") || strings.Contains(l, "level=ERROR") {
						t.Errorf("destination access log: %s", l)
					}
				}
				waitLines(t, rig.dstLog, conns, "connection from another network", "src.network=net-a")
			})
		}
	})
}

// TestDoubleHBONEFailures: each hop's refusal surfaces as an error with the
// right response flags, and the rig keeps serving afterwards.
func TestDoubleHBONEFailures(t *testing.T) {
	rig := startMultiNet(t, false)
	withAuthority := func(a string) func(*outboundRoute) {
		return func(r *outboundRoute) {
			g := *r.gateway
			g.authority = a
			r.authority, r.gateway = a, &g
		}
	}
	tests := []struct {
		name      string
		edit      func(*outboundRoute)
		wantFlags metrics.ResponseFlags
		wantErr   string
	}{
		{"gateway presents another identity", func(r *outboundRoute) {
			r.sans = []string{"spiffe://cluster.local/ns/istio-system/sa/other"}
		}, metrics.FlagTLSFailure, "network gateway"},
		{"destination presents another identity", func(r *outboundRoute) {
			g := *r.gateway
			g.sans = []string{"spiffe://cluster.local/ns/ns/sa/other"}
			r.gateway = &g
		}, metrics.FlagTLSFailure, "inner tls handshake"},
		{"gateway does not know the service", withAuthority("unknown.ns.svc.cluster.local:80"), metrics.FlagConnect, "404"},
		{"destination is not an endpoint of the service", withAuthority("other.ns.svc.cluster.local:80"), metrics.FlagConnect, "400"},
		{"service port without a target port", withAuthority("echo.ns.svc.cluster.local:81"), metrics.FlagConnect, "503"},
		{"endpoint listed without the port", withAuthority("nowhere.ns.svc.cluster.local:80"), metrics.FlagConnect, "503"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			route := rig.route(t)
			tc.edit(&route)
			s, flags, err := rig.connect(t, route)
			if err == nil {
				s.Close()
				t.Fatal("connected")
			}
			if flags != tc.wantFlags || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %v (flags %v), want %q with flags %v", err, flags, tc.wantErr, tc.wantFlags)
			}
		})
	}
	s, _, err := rig.connect(t, rig.route(t))
	if err != nil {
		t.Fatalf("after the failures: %v", err)
	}
	checksumEcho(t, s, 1<<10)
	s.Close()
}
