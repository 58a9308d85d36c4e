package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"

	"github.com/ztunnel-go/ztunnel/api/workloadapi"
	"github.com/ztunnel-go/ztunnel/hbone"
	"github.com/ztunnel-go/ztunnel/proxy/socks5"
	"github.com/ztunnel-go/ztunnel/state"
	"github.com/ztunnel-go/ztunnel/state/xdsconv"
	"github.com/ztunnel-go/ztunnel/xdsclient"
	"github.com/ztunnel-go/ztunnel/xdsclient/xdstest"
)

// onDemandClientYAML is the served workload; everything else comes from
// the control plane, on demand.
const onDemandClientYAML = `
workloads:
- uid: u-cli
  name: cli
  namespace: ns
  serviceAccount: cli
  workloadIps: ["127.0.0.2"]
  protocol: TCP
  services: {}
`

// startOnDemandXDS runs a real xDS client with Address on demand against a
// test server, feeding a store that starts from the local config.
func startOnDemandXDS(t *testing.T, srv *xdstest.Server) (*state.Store, *xdsclient.Client) {
	t.Helper()
	return startOnDemandXDSWith(t, srv, onDemandClientYAML)
}

// startOnDemandXDSWith is startOnDemandXDS over the local config yaml.
func startOnDemandXDSWith(t *testing.T, srv *xdstest.Server, yaml string) (*state.Store, *xdsclient.Client) {
	t.Helper()
	lc, err := xdsconv.ParseLocalConfig([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	store := state.NewStore(nil)
	xs, err := xdsconv.NewXDSState(store, lc, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	xc := xdsclient.New(xdsclient.Config{
		Address: srv.Address(), RootCA: srv.TLS().RootFile, OnDemandTypes: []string{xdsconv.AddressType},
		Logf: func(l slog.Level, f string, a ...any) { t.Logf(l.String()+" "+f, a...) },
	})
	xs.Register(xc)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- xc.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("xds client: %v", err)
		}
	})
	select {
	case <-xc.Synced():
	case <-time.After(10 * time.Second):
		t.Fatal("xds client did not sync")
	}
	return store, xc
}

// TestOutboundOnDemand: with XDS_ON_DEMAND a destination the snapshot
// lacks is asked for as "network/IP" before routing; istiod's answer (the
// workload under its uid, the asked-for name as an alias) is applied and
// the connection is routed to that workload. A name the control plane does
// not know comes back as a removal and the connection passes through, at
// once rather than after the wait bound.
func TestOutboundOnDemand(t *testing.T) {
	app := echoApp(t)
	srv := xdstest.NewServer(t, xdstest.Options{})
	res := xdstest.NewResource(t, "Kubernetes//Pod/ns/echo", "1", &workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: &workloadapi.Workload{
		Uid: "Kubernetes//Pod/ns/echo", Name: "echo", Namespace: "ns", ServiceAccount: "echo",
		Addresses: [][]byte{netip.MustParseAddr("127.0.0.1").AsSlice()}, TunnelProtocol: workloadapi.TunnelProtocol_NONE,
	}}})
	res.Aliases = []string{"/127.0.0.1"}
	srv.Update(xdsconv.AddressType, []*discoveryv3.Resource{res}, nil)
	srv.Update(xdsconv.AuthorizationType, nil, nil)
	store, xc := startOnDemandXDS(t, srv)
	if store.Load().WorkloadByAddr("", netip.MustParseAddr("127.0.0.1")) != nil {
		t.Fatal("the destination is in the snapshot before any lookup")
	}

	rig := startProxy(t, onDemandClientYAML, "cli", func(c *Config) {
		c.State, c.SOCKS5, c.SOCKS5Port, c.Resolver = store, true, freePort(t), noDNS
		c.OnDemand = func(ctx context.Context, name string) error { return xc.Lookup(ctx, xdsconv.AddressType, name) }
		c.OnDemandWait = time.Minute // a miss must not wait for it
	})
	c, rep, err := rig.socksDial(t, socks5.Target{Addr: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(app))})
	if err != nil || rep != socks5.ReplySucceeded {
		t.Fatalf("handshake: %v, %v", rep, err)
	}
	if got, err := echoOver(c, "on demand"); err != nil || got != "on demand" {
		t.Fatalf("echo: %q, %v", got, err)
	}
	m := nextLog(t, rig.logs)
	if m["msg"] != "connection complete" || m["dst.workload"] != "echo" {
		t.Errorf("access log %v, want a complete connection to the workload fetched on demand", m)
	}
	req := srv.WaitRequest(func(r *xdstest.Request) bool {
		return r.TypeUrl == xdsconv.AddressType && slices.Contains(r.ResourceNamesSubscribe, "/127.0.0.1")
	})
	if req.Node != nil {
		t.Errorf("the demand request carries a node: %v", req)
	}

	// A miss: the server removes the name, the connection passes through
	// (and fails: nothing listens there) without waiting a minute.
	miss := netip.MustParseAddr("127.0.0.9")
	start := time.Now()
	c, _, _ = rig.socksDial(t, socks5.Target{Addr: netip.AddrPortFrom(miss, uint16(app))})
	c.Close()
	m = nextLog(t, rig.logs)
	if m["dst.workload"] != "" {
		t.Errorf("a miss routed to workload %q", m["dst.workload"])
	}
	srv.WaitRequest(func(r *xdstest.Request) bool { return slices.Contains(r.ResourceNamesSubscribe, "/"+miss.String()) })
	t.Logf("miss answered in %v", time.Since(start).Round(time.Millisecond))
}

// TestOnDemandWaitIsBounded: a control plane that never answers holds a
// connection for OnDemandWait only; it then takes the path of a miss.
func TestOnDemandWaitIsBounded(t *testing.T) {
	app := echoApp(t)
	asked := make(chan string, 4)
	rig := startProxy(t, onDemandClientYAML, "cli", func(c *Config) {
		c.SOCKS5, c.SOCKS5Port, c.Resolver = true, freePort(t), noDNS
		c.OnDemand = func(ctx context.Context, name string) error {
			asked <- name
			<-ctx.Done()
			return ctx.Err()
		}
		c.OnDemandWait = 50 * time.Millisecond
	})
	c, rep, err := rig.socksDial(t, socks5.Target{Addr: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(app))})
	if err != nil || rep != socks5.ReplySucceeded {
		t.Fatalf("handshake: %v, %v", rep, err)
	}
	if got, err := echoOver(c, "passthrough"); err != nil || got != "passthrough" {
		t.Fatalf("echo after an unanswered lookup: %q, %v", got, err)
	}
	select {
	case name := <-asked:
		if name != "/127.0.0.1" {
			t.Errorf("asked for %q, want ztunnel's network/IP key", name)
		}
	default:
		t.Error("the connection was routed without asking the control plane")
	}
	if m := nextLog(t, rig.logs); m["msg"] != "connection complete" || m["dst.workload"] != "" {
		t.Errorf("access log %v, want a passthrough connection", m)
	}
}

// TestSandwichTargetOnDemand: a waypoint receives a tunnel addressed to a
// workload it serves (authority = that workload's IP, not the waypoint's).
// The workload is not in the snapshot; it is fetched on demand before
// validate_destination, which then allows the tunnel. Without the lookup the
// authority's IP mismatches and the CONNECT is refused with 400.
func TestSandwichTargetOnDemand(t *testing.T) {
	app := echoApp(t)
	srv := xdstest.NewServer(t, xdstest.Options{})
	res := xdstest.NewResource(t, "Kubernetes//Pod/ns/behind", "1", &workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: &workloadapi.Workload{
		Uid: "Kubernetes//Pod/ns/behind", Name: "behind", Namespace: "ns", ServiceAccount: "behind",
		Addresses: [][]byte{netip.MustParseAddr("127.0.0.7").AsSlice()}, TunnelProtocol: workloadapi.TunnelProtocol_HBONE,
		Waypoint: &workloadapi.GatewayAddress{
			Destination:   &workloadapi.GatewayAddress_Address{Address: &workloadapi.NetworkAddress{Address: netip.MustParseAddr("127.0.0.1").AsSlice()}},
			HboneMtlsPort: 15008,
		},
	}}})
	res.Aliases = []string{"/127.0.0.7"}
	srv.Update(xdsconv.AddressType, []*discoveryv3.Resource{res}, nil)
	srv.Update(xdsconv.AuthorizationType, nil, nil)
	store, xc := startOnDemandXDSWith(t, srv, `
workloads:
- uid: u-wp
  name: wp
  namespace: ns
  serviceAccount: wp
  workloadIps: ["127.0.0.1"]
  protocol: HBONE
  services: {}
`)
	rig := startProxy(t, onDemandClientYAML, "wp", func(c *Config) {
		c.State = store
		c.OnDemand = func(ctx context.Context, name string) error { return xc.Lookup(ctx, xdsconv.AddressType, name) }
	})
	in := &inboundRig{hbonePort: rig.p.Addrs()[2].(*net.TCPAddr).Port, ca: rig.ca}
	s, err := inConnect(t, in, "wp", fmt.Sprintf("127.0.0.7:%d", app))
	if err != nil {
		t.Fatalf("CONNECT to the workload behind the waypoint: %v", err)
	}
	s.Write([]byte("sandwich"))
	s.CloseWrite()
	if got, err := io.ReadAll(s); err != nil || string(got) != "sandwich" {
		t.Fatalf("echo: %q, %v", got, err)
	}
	s.Close()
	srv.WaitRequest(func(r *xdstest.Request) bool { return slices.Contains(r.ResourceNamesSubscribe, "/127.0.0.7") })
}

// inConnect opens an HBONE stream to in as identity ns/client, expecting
// the server to be ns/serverSA.
func inConnect(t *testing.T, in *inboundRig, serverSA, authority string) (*hbone.Stream, error) {
	t.Helper()
	s, _, err := connectHBONE(t, in.ca, in.hbonePort, "client", serverSA, &hbone.Request{Authority: authority})
	return s, err
}
