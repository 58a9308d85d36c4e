package proxy

import (
	"context"
	"errors"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/ztunnel-go/ztunnel/metrics"
	"github.com/ztunnel-go/ztunnel/state"
)

// fakeResolver answers on-demand DNS lookups from a table.
type fakeResolver struct {
	answers map[string][]netip.Addr
	asked   []string
}

func (r *fakeResolver) LookupNetIP(_ context.Context, network, host string) ([]netip.Addr, error) {
	r.asked = append(r.asked, network+":"+host)
	a, ok := r.answers[host]
	if !ok {
		return nil, errors.New("no such host")
	}
	return a, nil
}

func rwl(uid, ns, sa string, ips ...string) *state.Workload {
	w := &state.Workload{UID: uid, Name: uid, Protocol: state.ProtocolHBONE, Capacity: 1, Labels: &state.WorkloadLabels{Namespace: ns, ServiceAccount: sa}}
	for _, ip := range ips {
		w.Addresses = append(w.Addresses, netip.MustParseAddr(ip))
	}
	return w
}

func rsvc(ns, host string, vips ...string) *state.Service {
	s := &state.Service{Name: strings.Split(host, ".")[0], Namespace: ns, Hostname: host, Ports: map[uint16]uint16{80: 8080}}
	for _, v := range vips {
		s.VIPs = append(s.VIPs, state.NetworkAddress{Addr: netip.MustParseAddr(v)})
	}
	return s
}

func hostGW(ns, host string) *state.GatewayAddress {
	return &state.GatewayAddress{Hostname: &state.NamespacedHostname{Namespace: ns, Hostname: host}, HBONEMTLSPort: 15008}
}

// routeMesh is the snapshot the route tests run against. Pods live in
// 10.0.0.0/24, VIPs in 10.96.0.0/24.
func routeMesh(t *testing.T) *state.Snapshot {
	t.Helper()
	var (
		ws []*state.Workload
		ss []*state.Service
	)
	add := func(w *state.Workload, svcPorts map[string]map[uint16]uint16) *state.Workload {
		m := w.Services.Map()
		for k, v := range svcPorts {
			m[k] = v
		}
		w.Services = state.ServicesOf(m)
		ws = append(ws, w)
		return w
	}
	client := add(rwl("client", "app", "client", "10.0.0.1"), nil)
	_ = client

	// A service with one HBONE endpoint and one TCP endpoint.
	web := rsvc("app", "web.app.svc", "10.96.0.10", "fd96::10")
	web.EditExtra().SubjectAltNames = []string{"spiffe://cluster.local/ns/app/sa/web-alt"}
	ss = append(ss, web)
	add(rwl("web-1", "app", "web", "10.0.0.10", "fd00::10"), map[string]map[uint16]uint16{"app/web.app.svc": {80: 9090}})
	tcp := rsvc("app", "tcp.app.svc", "10.96.0.11")
	ss = append(ss, tcp)
	tcpPod := add(rwl("tcp-1", "app", "tcp", "10.0.0.11"), map[string]map[uint16]uint16{"app/tcp.app.svc": {}})
	tcpPod.Protocol = state.ProtocolTCP

	// Waypoint: a service with one pod.
	wpSvc := rsvc("app", "waypoint.app.svc", "10.96.0.50")
	wpSvc.Ports = map[uint16]uint16{15008: 15008}
	wpSvc.EditExtra().SubjectAltNames = []string{"spiffe://cluster.local/ns/app/sa/waypoint-alt"}
	ss = append(ss, wpSvc)
	add(rwl("waypoint-1", "app", "waypoint", "10.0.0.50"), map[string]map[uint16]uint16{"app/waypoint.app.svc": {}})
	wp2 := add(rwl("waypoint-2", "app", "waypoint2", "10.0.0.51"), nil)
	wp2.Protocol = state.ProtocolTCP // waypoints are reached over HBONE whatever the protocol says

	// A service behind the waypoint, a passthrough one, and one with a
	// weighted pair of waypoints.
	behind := rsvc("app", "behind.app.svc", "10.96.0.20")
	behind.Waypoint = hostGW("app", "waypoint.app.svc")
	pass := rsvc("app", "pass.app.svc", "10.96.0.21")
	pass.EditExtra().LoadBalancer = &state.LoadBalancer{Mode: state.LBModePassthrough}
	passWP := rsvc("app", "passwp.app.svc", "10.96.0.22")
	passWP.EditExtra().LoadBalancer = &state.LoadBalancer{Mode: state.LBModePassthrough}
	passWP.Waypoint = hostGW("app", "waypoint.app.svc")
	canary := rsvc("app", "canary.app.svc", "10.96.0.23")
	canary.Waypoint = hostGW("app", "waypoint.app.svc")
	canary.EditExtra().WeightedWaypoints = []state.WeightedWaypoint{
		{Destination: *hostGW("app", "waypoint.app.svc"), Weight: 1},
		{Destination: state.GatewayAddress{Address: &state.NetworkAddress{Addr: netip.MustParseAddr("10.0.0.51")}, HBONEMTLSPort: 15009}, Weight: 1},
	}
	lostWP := rsvc("app", "lost.app.svc", "10.96.0.24")
	lostWP.Waypoint = hostGW("app", "nowhere.app.svc")
	empty := rsvc("app", "empty.app.svc", "10.96.0.25")
	ss = append(ss, behind, pass, passWP, canary, lostWP, empty)
	add(rwl("behind-1", "app", "behind", "10.0.0.20"), map[string]map[uint16]uint16{"app/behind.app.svc": {}})

	// A workload with its own waypoint, also reachable through a service
	// without one.
	guarded := add(rwl("guarded", "app", "guarded", "10.0.0.30"), map[string]map[uint16]uint16{"app/guarded.app.svc": {}})
	guarded.Extra = &state.WorkloadExtra{Waypoint: hostGW("app", "waypoint.app.svc")}
	ss = append(ss, rsvc("app", "guarded.app.svc", "10.96.0.30"))

	// Two services share a VIP; a private one is visible only in its namespace.
	ss = append(ss, rsvc("team-a", "shared.example.com", "10.96.0.40"), rsvc("team-b", "shared.example.com", "10.96.0.40"))
	add(rwl("shared-a", "team-a", "a", "10.0.0.40"), map[string]map[uint16]uint16{"team-a/shared.example.com": {}})
	add(rwl("shared-b", "team-b", "b", "10.0.0.41"), map[string]map[uint16]uint16{"team-b/shared.example.com": {}})
	private := rsvc("secret", "private.secret.svc", "10.96.0.45")
	private.Visibility = state.VisibilityNamespace
	ss = append(ss, private)
	add(rwl("private-1", "secret", "p", "10.0.0.45"), map[string]map[uint16]uint16{"secret/private.secret.svc": {}})

	// A CIDR VIP, an IPv4-only service in front of a dual-stack pod, a
	// hostname-only endpoint, and an endpoint on another network.
	cidr := rsvc("app", "range.app.svc")
	cidr.EditExtra().CIDRVIPs = []state.NetworkPrefix{{Prefix: netip.MustParsePrefix("10.97.0.0/16")}}
	v4only := rsvc("app", "v4.app.svc", "fd96::60")
	v4only.IPFamilies = state.IPFamiliesIPv4
	ext := rsvc("app", "ext.app.svc", "10.96.0.70", "fd96::70")
	remote := rsvc("app", "remote.app.svc", "10.96.0.80")
	ss = append(ss, cidr, v4only, ext, remote)
	add(rwl("range-1", "app", "range", "10.0.0.60"), map[string]map[uint16]uint16{"app/range.app.svc": {}})
	add(rwl("dual-1", "app", "dual", "10.0.0.61", "fd00::61"), map[string]map[uint16]uint16{"app/v4.app.svc": {}})
	vm := add(rwl("vm-1", "app", "vm"), map[string]map[uint16]uint16{"app/ext.app.svc": {}})
	vm.Extra, vm.Protocol = &state.WorkloadExtra{Hostname: "vm.example.com"}, state.ProtocolTCP
	far := add(rwl("far-1", "app", "far"), map[string]map[uint16]uint16{"app/remote.app.svc": {}})
	far.EditLabels().Network = "net2"
	far.Extra = &state.WorkloadExtra{NetworkGateway: &state.GatewayAddress{Address: &state.NetworkAddress{Network: "net2", Addr: netip.MustParseAddr("192.0.2.1")}, HBONEMTLSPort: 15008}}

	snap, err := state.NewSnapshot(ws, ss, nil)
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

func TestRouteOutbound(t *testing.T) {
	snap := routeMesh(t)
	id := func(ns, sa string) string { return "spiffe://cluster.local/ns/" + ns + "/sa/" + sa }
	type want struct {
		hbone     bool
		dst       string
		authority string
		sans      []string
		workload  string // UID, "" for none
		service   string // key, "" for none
	}
	tests := []struct {
		name      string
		src       string // workload UID
		client    string // the app's address; "" = the source's first
		dst       string
		preferred string
		rnd       uint64 // what the random source returns
		want      want
		wantErr   error
		errText   string
	}{
		{name: "unknown destination passes through", src: "client", dst: "192.0.2.99:443",
			want: want{dst: "192.0.2.99:443"}},
		{name: "workload address over HBONE", src: "client", dst: "10.0.0.20:8080",
			want: want{hbone: true, dst: "10.0.0.20:15008", authority: "10.0.0.20:8080", sans: []string{id("app", "behind")}, workload: "behind-1"}},
		{name: "workload address over TCP", src: "client", dst: "10.0.0.11:7000",
			want: want{dst: "10.0.0.11:7000", workload: "tcp-1"}},
		{name: "service VIP to an HBONE endpoint with its own port", src: "client", dst: "10.96.0.10:80",
			want: want{hbone: true, dst: "10.0.0.10:15008", authority: "10.0.0.10:9090",
				sans: []string{id("app", "web"), id("app", "web-alt")}, workload: "web-1", service: "app/web.app.svc"}},
		{name: "service VIP to a TCP endpoint with the service target port", src: "client", dst: "10.96.0.11:80",
			want: want{dst: "10.0.0.11:8080", workload: "tcp-1", service: "app/tcp.app.svc"}},
		{name: "service port not on the service", src: "client", dst: "10.96.0.10:81", wantErr: state.ErrNoHealthyUpstream},
		{name: "service without endpoints", src: "client", dst: "10.96.0.25:80", wantErr: state.ErrNoHealthyUpstream},
		{name: "passthrough service", src: "client", dst: "10.96.0.21:80", want: want{dst: "10.96.0.21:80"}},
		{name: "passthrough service with a waypoint goes to the waypoint", src: "client", dst: "10.96.0.22:80",
			want: want{hbone: true, dst: "10.0.0.50:15008", authority: "10.96.0.22:80",
				sans: []string{id("app", "waypoint"), id("app", "waypoint-alt")}, workload: "waypoint-1", service: "app/passwp.app.svc"}},
		{name: "service waypoint keeps the VIP as authority", src: "client", dst: "10.96.0.20:80",
			want: want{hbone: true, dst: "10.0.0.50:15008", authority: "10.96.0.20:80",
				sans: []string{id("app", "waypoint"), id("app", "waypoint-alt")}, workload: "waypoint-1", service: "app/behind.app.svc"}},
		{name: "weighted waypoint, first", src: "client", dst: "10.96.0.23:80", rnd: 0,
			want: want{hbone: true, dst: "10.0.0.50:15008", authority: "10.96.0.23:80",
				sans: []string{id("app", "waypoint"), id("app", "waypoint-alt")}, workload: "waypoint-1", service: "app/canary.app.svc"}},
		{name: "weighted waypoint, second by address and its port", src: "client", dst: "10.96.0.23:80", rnd: 1,
			want: want{hbone: true, dst: "10.0.0.51:15009", authority: "10.96.0.23:80",
				sans: []string{id("app", "waypoint2")}, workload: "waypoint-2", service: "app/canary.app.svc"}},
		{name: "unknown waypoint", src: "client", dst: "10.96.0.24:80", wantErr: state.ErrUnknownGateway},
		{name: "workload waypoint for workload-addressed traffic", src: "client", dst: "10.0.0.30:8080",
			want: want{hbone: true, dst: "10.0.0.50:15008", authority: "10.0.0.30:8080",
				sans: []string{id("app", "waypoint"), id("app", "waypoint-alt")}, workload: "waypoint-1"}},
		{name: "sandwich: the waypoint itself goes direct", src: "waypoint-1", dst: "10.0.0.30:8080",
			want: want{hbone: true, dst: "10.0.0.30:15008", authority: "10.0.0.30:8080", sans: []string{id("app", "guarded")}, workload: "guarded"}},
		{name: "waypoint identity from another address is no sandwich", src: "waypoint-1", client: "10.0.0.99", dst: "10.0.0.30:8080",
			want: want{hbone: true, dst: "10.0.0.50:15008", authority: "10.0.0.30:8080",
				sans: []string{id("app", "waypoint"), id("app", "waypoint-alt")}, workload: "waypoint-1"}},
		{name: "service-addressed traffic skips the workload waypoint", src: "client", dst: "10.96.0.30:80",
			want: want{hbone: true, dst: "10.0.0.30:15008", authority: "10.0.0.30:8080", sans: []string{id("app", "guarded")}, workload: "guarded", service: "app/guarded.app.svc"}},
		{name: "shared VIP: client namespace", src: "shared-b", dst: "10.96.0.40:80",
			want: want{hbone: true, dst: "10.0.0.41:15008", authority: "10.0.0.41:8080", sans: []string{id("team-b", "b")}, workload: "shared-b", service: "team-b/shared.example.com"}},
		{name: "shared VIP: first by key", src: "client", dst: "10.96.0.40:80",
			want: want{hbone: true, dst: "10.0.0.40:15008", authority: "10.0.0.40:8080", sans: []string{id("team-a", "a")}, workload: "shared-a", service: "team-a/shared.example.com"}},
		{name: "shared VIP: preferred namespace", src: "client", dst: "10.96.0.40:80", preferred: "team-b",
			want: want{hbone: true, dst: "10.0.0.41:15008", authority: "10.0.0.41:8080", sans: []string{id("team-b", "b")}, workload: "shared-b", service: "team-b/shared.example.com"}},
		{name: "namespace-visible service hidden from others", src: "client", dst: "10.96.0.45:80",
			want: want{dst: "10.96.0.45:80"}},
		{name: "CIDR VIP", src: "client", dst: "10.97.3.4:80",
			want: want{hbone: true, dst: "10.0.0.60:15008", authority: "10.0.0.60:8080", sans: []string{id("app", "range")}, workload: "range-1", service: "app/range.app.svc"}},
		{name: "same family as the original destination", src: "client", dst: "[fd96::10]:80",
			want: want{hbone: true, dst: "[fd00::10]:15008", authority: "[fd00::10]:9090",
				sans: []string{id("app", "web"), id("app", "web-alt")}, workload: "web-1", service: "app/web.app.svc"}},
		{name: "service ip families override the original family", src: "client", dst: "[fd96::60]:80",
			want: want{hbone: true, dst: "10.0.0.61:15008", authority: "10.0.0.61:8080", sans: []string{id("app", "dual")}, workload: "dual-1", service: "app/v4.app.svc"}},
		{name: "hostname-only endpoint resolved by DNS, same family", src: "client", dst: "[fd96::70]:80",
			want: want{dst: "[2001:db8::7]:8080", workload: "vm-1", service: "app/ext.app.svc"}},
		{name: "hostname-only endpoint resolved by DNS, v4", src: "client", dst: "10.96.0.70:80",
			want: want{dst: "198.51.100.7:8080", workload: "vm-1", service: "app/ext.app.svc"}},
		{name: "endpoint on another network behind an unknown network gateway", src: "client", dst: "10.96.0.80:80", wantErr: state.ErrUnknownGateway},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res := &fakeResolver{answers: map[string][]netip.Addr{
				"vm.example.com": {netip.MustParseAddr("198.51.100.7"), netip.MustParseAddr("2001:db8::7")},
			}}
			rt := newRouter(&Config{Resolver: res, PreferredServiceNamespace: tc.preferred})
			rt.rnd = func(n uint64) uint64 {
				if tc.rnd >= n {
					t.Fatalf("test rnd %d out of range %d", tc.rnd, n)
				}
				return tc.rnd
			}
			src := snap.WorkloadByUID(tc.src)
			client := src.Addresses[0]
			if tc.client != "" {
				client = netip.MustParseAddr(tc.client)
			}
			r, err := rt.routeOutbound(context.Background(), snap, src, netip.AddrPortFrom(client, 40000), netip.MustParseAddrPort(tc.dst))
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("err = %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := want{hbone: r.hbone, dst: r.dst.String(), authority: r.authority, sans: r.sans}
			if r.workload != nil {
				got.workload = r.workload.UID
			}
			if r.service != nil {
				got.service = r.service.Key()
			}
			if got.hbone != tc.want.hbone || got.dst != tc.want.dst || got.authority != tc.want.authority ||
				!slices.Equal(got.sans, tc.want.sans) || got.workload != tc.want.workload || got.service != tc.want.service {
				t.Errorf("route\n got %+v\nwant %+v", got, tc.want)
			}
			if strings.HasPrefix(tc.name, "hostname-only") && len(res.asked) != 1 {
				t.Errorf("DNS lookups %v, want one", res.asked)
			}
		})
	}
}

// TestRouteOutboundDNSMetric checks that an on-demand lookup is counted in
// istio_on_demand_dns_total with the source and the hostname.
func TestRouteOutboundDNSMetric(t *testing.T) {
	snap := routeMesh(t)
	m := metrics.New(metrics.Config{})
	res := &fakeResolver{answers: map[string][]netip.Addr{"vm.example.com": {netip.MustParseAddr("198.51.100.7")}}}
	rt := newRouter(&Config{Resolver: res, Metrics: m})
	src := snap.WorkloadByUID("client")
	for range 2 {
		if _, err := rt.routeOutbound(context.Background(), snap, src, netip.MustParseAddrPort("10.0.0.1:4000"), netip.MustParseAddrPort("10.96.0.70:80")); err != nil {
			t.Fatal(err)
		}
	}
	// Workload-addressed traffic needs no lookup.
	if _, err := rt.routeOutbound(context.Background(), snap, src, netip.MustParseAddrPort("10.0.0.1:4000"), netip.MustParseAddrPort("10.0.0.20:80")); err != nil {
		t.Fatal(err)
	}
	families, err := m.Gatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var got float64
	for _, f := range families {
		if f.GetName() != "istio_on_demand_dns_total" {
			continue
		}
		for _, mt := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range mt.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["hostname"] == "vm.example.com" && labels["source_workload_namespace"] == "app" {
				got += mt.GetCounter().GetValue()
			}
		}
	}
	if got != 2 {
		t.Errorf("istio_on_demand_dns_total = %v, want 2", got)
	}
}

func TestRouteOutboundDNSFailure(t *testing.T) {
	snap := routeMesh(t)
	rt := newRouter(&Config{Resolver: &fakeResolver{}})
	_, err := rt.routeOutbound(context.Background(), snap, snap.WorkloadByUID("client"), netip.MustParseAddrPort("10.0.0.1:4000"), netip.MustParseAddrPort("10.96.0.70:80"))
	if err == nil || !strings.Contains(err.Error(), "vm.example.com") {
		t.Fatalf("err = %v, want a DNS failure naming the host", err)
	}
}

func TestPickResolved(t *testing.T) {
	v4a, v4b, v6 := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2"), netip.MustParseAddr("2001:db8::1")
	tests := []struct {
		name  string
		addrs []netip.Addr
		want  netip.Addr
		rnd   uint64
		out   netip.Addr
		ok    bool
	}{
		{"same family first", []netip.Addr{v6, v4a, v4b}, v4a, 0, v4a, true},
		{"same family second", []netip.Addr{v6, v4a, v4b}, v4a, 1, v4b, true},
		{"v6 wanted", []netip.Addr{v4a, v6}, v6, 0, v6, true},
		{"other family when alone", []netip.Addr{v6}, v4a, 0, v6, true},
		{"mapped answers are unmapped", []netip.Addr{netip.AddrFrom16(v4a.As16())}, v4b, 0, v4a, true},
		{"empty answer", nil, v4a, 0, netip.Addr{}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := pickResolved(tc.addrs, tc.want, func(uint64) uint64 { return tc.rnd })
			if got != tc.out || ok != tc.ok {
				t.Errorf("got %v %v, want %v %v", got, ok, tc.out, tc.ok)
			}
		})
	}
}

func TestValidateDestination(t *testing.T) {
	snap := routeMesh(t)
	tunneled := *snap.WorkloadByUID("behind-1")
	tunneled.Extra = &state.WorkloadExtra{ApplicationTunnel: &state.ApplicationTunnel{Protocol: state.AppTunnelProxy}}
	tests := []struct {
		name   string
		local  *state.Workload
		target string
		conn   string
		ok     bool
	}{
		{"authority is the connection's address", snap.WorkloadByUID("web-1"), "10.0.0.10:9090", "10.0.0.10:15008", true},
		{"another address", snap.WorkloadByUID("web-1"), "10.0.0.11:8080", "10.0.0.10:15008", false},
		{"application tunnel accepts any target", &tunneled, "10.0.0.11:8080", "10.0.0.20:15008", true},
		{"waypoint of the target workload", snap.WorkloadByUID("waypoint-1"), "10.0.0.30:8080", "10.0.0.50:15008", true},
		{"waypoint of the target service VIP", snap.WorkloadByUID("waypoint-1"), "10.96.0.20:80", "10.0.0.50:15008", true},
		{"waypoint of another target", snap.WorkloadByUID("waypoint-1"), "10.0.0.10:8080", "10.0.0.50:15008", false},
		// ztunnel looks [::ffff:10.0.0.30] up as written and finds nothing.
		{"waypoint of the target's IPv4-mapped spelling", snap.WorkloadByUID("waypoint-1"), "[::ffff:10.0.0.30]:8080", "10.0.0.50:15008", false},
		{"mapped spelling of the connection's address", snap.WorkloadByUID("web-1"), "[::ffff:10.0.0.10]:9090", "10.0.0.10:15008", false},
		{"waypoint by address with another local address", snap.WorkloadByUID("waypoint-2"), "10.96.0.23:80", "10.0.0.99:15008", false},
		{"weighted waypoint by address", snap.WorkloadByUID("waypoint-2"), "10.96.0.23:80", "10.0.0.51:15008", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rt := newRouter(&Config{})
			_, err := rt.validateDestination(context.Background(), snap, tc.local, netip.MustParseAddrPort(tc.target), netip.MustParseAddrPort(tc.conn))
			if tc.ok != (err == nil) {
				t.Fatalf("err = %v, want ok=%v", err, tc.ok)
			}
			var ie *inboundError
			if err != nil && (!errors.As(err, &ie) || ie.status != http.StatusBadRequest) {
				t.Errorf("err = %v, want a 400", err)
			}
		})
	}
}
