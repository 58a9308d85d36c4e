package state

import (
	"errors"
	"math/rand/v2"
	"net/netip"
	"testing"
)

func TestResolveVIPPreferring(t *testing.T) {
	vip := "/10.96.0.1"
	a := svc("ns-a", "a.example.com", vip)
	b := svc("ns-b", "b.example.com", vip)
	pref := svc("ns-pref", "p.example.com", vip)
	canon := svc("ns-c", "c.example.com", vip)
	canon.Canonical = true
	hidden := svc("ns-h", "h.example.com", vip)
	hidden.Visibility = VisibilityNamespace
	onlyHidden := svc("ns-h", "h2.example.com", "/10.96.0.2")
	onlyHidden.Visibility = VisibilityNamespace
	cidr := svc("ns-a", "cidr.example.com")
	cidr.EditExtra().CIDRVIPs = []NetworkPrefix{{"", netip.MustParsePrefix("10.96.0.0/16")}}

	tests := []struct {
		name                 string
		services             []*Service
		ip, clientNS, prefNS string
		want                 *Service
	}{
		{name: "client namespace first", services: []*Service{a, b, pref, canon}, ip: "10.96.0.1", clientNS: "ns-b", prefNS: "ns-pref", want: b},
		{name: "canonical before preferred", services: []*Service{a, b, pref, canon}, ip: "10.96.0.1", clientNS: "ns-x", prefNS: "ns-pref", want: canon},
		{name: "preferred before first", services: []*Service{a, b, pref}, ip: "10.96.0.1", clientNS: "ns-x", prefNS: "ns-pref", want: pref},
		{name: "first by key without preference", services: []*Service{b, pref, a}, ip: "10.96.0.1", clientNS: "ns-x", want: a},
		{name: "preferred namespace without a service there", services: []*Service{b, a}, ip: "10.96.0.1", clientNS: "ns-x", prefNS: "ns-none", want: a},
		{name: "namespace visibility hides from others", services: []*Service{hidden}, ip: "10.96.0.1", clientNS: "ns-x", want: nil},
		{name: "namespace visibility shows in its namespace", services: []*Service{hidden, a}, ip: "10.96.0.1", clientNS: "ns-h", want: hidden},
		{name: "hidden exact VIP falls through to CIDR", services: []*Service{onlyHidden, cidr}, ip: "10.96.0.2", clientNS: "ns-x", want: cidr},
		{name: "unknown address", services: []*Service{a}, ip: "10.1.1.1", clientNS: "ns-a", want: nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := mustSnapshot(t, nil, tc.services, nil)
			if got := s.ResolveVIPPreferring("", netip.MustParseAddr(tc.ip), tc.clientNS, tc.prefNS); got != tc.want {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestHostnameAndAddressLookups(t *testing.T) {
	s1 := svc("ns1", "db.example.com", "/10.96.0.1")
	s2 := svc("ns2", "db.example.com")
	s2.Visibility = VisibilityNamespace
	s3 := svc("ns3", "db.example.com")
	hostWL := &Workload{UID: "h", Name: "h", Extra: &WorkloadExtra{Hostname: "vm.example.com"}, Capacity: 1, Labels: &WorkloadLabels{Namespace: "ns1"}}
	ipWL := wl("ip", "ns1", "ip", "10.0.0.1")
	s := mustSnapshot(t, []*Workload{hostWL, ipWL}, []*Service{s1, s2, s3}, nil)

	for _, tc := range []struct {
		name, clientNS, prefNS string
		want                   *Service
	}{
		{"own namespace", "ns2", "", s2},
		{"not visible from elsewhere: first visible", "ns9", "", s1},
		{"preferred namespace", "ns9", "ns3", s3},
	} {
		t.Run("ServiceByHostname/"+tc.name, func(t *testing.T) {
			if got := s.ServiceByHostname("db.example.com", tc.clientNS, tc.prefNS); got != tc.want {
				t.Errorf("got %v, want %v", got.Key(), tc.want.Key())
			}
		})
	}
	for _, tc := range []struct {
		name    string
		nh      NamespacedHostname
		wantSvc *Service
		wantWL  *Workload
	}{
		{"service by key", NamespacedHostname{"ns3", "db.example.com"}, s3, nil},
		{"hostname workload", NamespacedHostname{"ns1", "vm.example.com"}, nil, hostWL},
		{"hostname workload in another namespace", NamespacedHostname{"ns2", "vm.example.com"}, nil, nil},
	} {
		t.Run("FindHostname/"+tc.name, func(t *testing.T) {
			gs, gw := s.FindHostname(tc.nh)
			if gs != tc.wantSvc || gw != tc.wantWL {
				t.Errorf("got %v %v", gs, gw)
			}
		})
	}
	for _, tc := range []struct {
		name    string
		ip      string
		wantWL  *Workload
		wantSvc *Service
	}{
		{"workload", "10.0.0.1", ipWL, nil},
		{"service VIP", "10.96.0.1", nil, s1},
		{"nothing", "10.9.9.9", nil, nil},
	} {
		t.Run("FindAddress/"+tc.name, func(t *testing.T) {
			gw, gs := s.FindAddress("", netip.MustParseAddr(tc.ip))
			if gs != tc.wantSvc || gw != tc.wantWL {
				t.Errorf("got %v %v", gw, gs)
			}
		})
	}
}

func gwHost(ns, host string, port uint16) *GatewayAddress {
	return &GatewayAddress{Hostname: &NamespacedHostname{ns, host}, HBONEMTLSPort: port}
}

func gwAddr(ip string, port uint16) *GatewayAddress {
	return &GatewayAddress{Address: &NetworkAddress{"", netip.MustParseAddr(ip)}, HBONEMTLSPort: port}
}

func TestServiceWaypoint(t *testing.T) {
	single := gwHost("ns", "wp", 0)
	tests := []struct {
		name     string
		weighted []uint32
		waypoint *GatewayAddress
		// counts[i] is how often weighted waypoint i must be chosen over
		// every rnd value; nil means the single waypoint is returned.
		counts []int
	}{
		{name: "no waypoint", counts: nil},
		{name: "single waypoint", waypoint: single},
		{name: "weighted by weight", weighted: []uint32{1, 3, 0, 2}, waypoint: single, counts: []int{1, 3, 0, 2}},
		{name: "all weights zero fall back", weighted: []uint32{0, 0}, waypoint: single},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sv := svc("ns", "web")
			sv.Waypoint = tc.waypoint
			for i, w := range tc.weighted {
				sv.EditExtra().WeightedWaypoints = append(sv.WeightedWaypoints(), WeightedWaypoint{Destination: *gwHost("ns", "wp"+string(rune('a'+i)), 0), Weight: w})
			}
			if tc.counts == nil {
				if got := ServiceWaypoint(sv, func(uint64) uint64 { t.Fatal("rnd called"); return 0 }); got != tc.waypoint {
					t.Errorf("got %v, want %v", got, tc.waypoint)
				}
				return
			}
			var total uint64
			for _, c := range tc.counts {
				total += uint64(c)
			}
			got := make([]int, len(tc.counts))
			for r := range total {
				g := ServiceWaypoint(sv, func(n uint64) uint64 {
					if n != total {
						t.Fatalf("rnd bound %d, want %d", n, total)
					}
					return r
				})
				for i := range sv.WeightedWaypoints() {
					if g == &sv.WeightedWaypoints()[i].Destination {
						got[i]++
					}
				}
			}
			for i := range got {
				if got[i] != tc.counts[i] {
					t.Errorf("counts %v, want %v", got, tc.counts)
					break
				}
			}
		})
	}
}

func TestResolveGateway(t *testing.T) {
	// A waypoint service (VIP 10.96.0.50, HBONE port 15008 -> 15008) with one
	// endpoint, a waypoint workload addressed directly, an app-tunnel
	// waypoint service without the port, and a hostname-only workload.
	wpSvc := svc("ns", "wp.ns.svc", "/10.96.0.50")
	wpSvc.Ports = map[uint16]uint16{15008: 15008}
	wpSvc.EditExtra().SubjectAltNames = []string{"spiffe://cluster.local/ns/ns/sa/wp-alt"}
	wpPod := wl("wp-pod", "ns", "wp-pod", "10.0.0.50", "fd00::50")
	wpPod.Services = ServicesOf(map[string]map[uint16]uint16{wpSvc.Key(): {}})

	tunSvc := svc("ns", "tun.ns.svc", "/10.96.0.60")
	tunSvc.Ports = map[uint16]uint16{}
	tunPod := wl("tun-pod", "ns", "tun-pod", "10.0.0.60")
	tunPod.Extra = &WorkloadExtra{ApplicationTunnel: &ApplicationTunnel{Protocol: AppTunnelProxy, Port: 15088}}
	tunPod.Services = ServicesOf(map[string]map[uint16]uint16{tunSvc.Key(): {}})
	plainPod := wl("plain-pod", "ns", "plain-pod", "10.0.0.61")
	plainPod.Services = ServicesOf(map[string]map[uint16]uint16{tunSvc.Key(): {}})

	passSvc := svc("ns", "pass.ns.svc", "/10.96.0.70")
	passSvc.EditExtra().LoadBalancer = &LoadBalancer{Mode: LBModePassthrough}

	direct := wl("direct", "ns", "direct", "10.0.0.80")
	vm := &Workload{UID: "vm", Name: "vm", Extra: &WorkloadExtra{Hostname: "vm.example.com"}, Capacity: 1, Labels: &WorkloadLabels{Namespace: "ns"}}

	s := mustSnapshot(t, []*Workload{wpPod, tunPod, plainPod, direct, vm}, []*Service{wpSvc, tunSvc, passSvc}, nil)
	src := wl("src", "ns", "src", "10.0.0.1")
	dst4, dst6 := netip.MustParseAddr("10.96.1.1"), netip.MustParseAddr("fd00::1")

	tests := []struct {
		name       string
		g          *GatewayAddress
		mode       Resolution
		dst        netip.Addr
		want       Upstream
		wantTarget netip.Addr
		wantErr    error
	}{
		{name: "hostname names a service", g: gwHost("ns", "wp.ns.svc", 15008), mode: ResolveWaypoint, dst: dst6,
			want: Upstream{wpPod, 15008, wpSvc}, wantTarget: dst6},
		{name: "hostname with the default port", g: gwHost("ns", "wp.ns.svc", 0), mode: ResolveWaypoint, dst: dst4,
			want: Upstream{wpPod, 15008, wpSvc}, wantTarget: dst4},
		{name: "address names a service VIP", g: gwAddr("10.96.0.50", 15008), mode: ResolveWaypoint, dst: dst6,
			want: Upstream{wpPod, 15008, wpSvc}, wantTarget: netip.MustParseAddr("10.96.0.50")},
		{name: "address names a workload", g: gwAddr("10.0.0.80", 15009), mode: ResolveWaypoint, dst: dst4,
			want: Upstream{direct, 15009, nil}, wantTarget: netip.MustParseAddr("10.0.0.80")},
		{name: "hostname names a hostname workload", g: gwHost("ns", "vm.example.com", 0), mode: ResolveWaypoint, dst: dst4,
			want: Upstream{vm, 15008, nil}, wantTarget: dst4},
		{name: "app tunnel serves a port the service lacks", g: gwHost("ns", "tun.ns.svc", 15008), mode: ResolveWaypoint, dst: dst4,
			want: Upstream{tunPod, 15008, tunSvc}, wantTarget: dst4},
		{name: "standard mode needs the port", g: gwHost("ns", "tun.ns.svc", 15008), mode: ResolveStandard, dst: dst4,
			wantErr: ErrNoHealthyUpstream},
		{name: "service port without a target", g: gwHost("ns", "wp.ns.svc", 15009), mode: ResolveWaypoint, dst: dst4,
			wantErr: ErrNoHealthyUpstream},
		{name: "passthrough service is no gateway", g: gwAddr("10.96.0.70", 0), mode: ResolveWaypoint, dst: dst4,
			wantErr: ErrUnknownGateway},
		{name: "unknown hostname", g: gwHost("ns", "nope", 0), mode: ResolveWaypoint, dst: dst4, wantErr: ErrUnknownGateway},
		{name: "unknown address", g: gwAddr("10.9.9.9", 0), mode: ResolveWaypoint, dst: dst4, wantErr: ErrUnknownGateway},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, target, err := s.ResolveGateway(tc.g, src, tc.dst, tc.mode, func(uint64) uint64 { return 0 })
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("err = %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want || target != tc.wantTarget {
				t.Errorf("got %+v %v %v, want %+v %v", got, target, err, tc.want, tc.wantTarget)
			}
		})
	}
}

func TestWaypointMembership(t *testing.T) {
	wpSvc := svc("ns", "wp.ns.svc", "/10.96.0.50")
	wpSvc.Ports = map[uint16]uint16{15008: 15008}
	wp := wl("wp", "ns", "wp", "10.0.0.50")
	wp.EditLabels().ServiceAccount = "waypoint"
	wp.Services = ServicesOf(map[string]map[uint16]uint16{wpSvc.Key(): {}})
	wpDirect := wl("wp2", "ns", "wp2", "10.0.0.51")
	other := wl("other", "ns", "other", "10.0.0.52")

	app := wl("app", "ns", "app", "10.0.0.10") // workload waypoint: the service
	app.Extra = &WorkloadExtra{Waypoint: gwHost("ns", "wp.ns.svc", 15008)}
	app2 := wl("app2", "ns", "app2", "10.0.0.11") // workload waypoint by address
	app2.Extra = &WorkloadExtra{Waypoint: gwAddr("10.0.0.51", 15008)}
	plain := wl("plain", "ns", "plain", "10.0.0.12")
	web := svc("ns", "web.ns.svc", "/10.96.0.10")
	web.Waypoint = gwAddr("10.96.0.50", 15008)
	canary := svc("ns", "canary.ns.svc", "/10.96.0.11")
	canary.EditExtra().WeightedWaypoints = []WeightedWaypoint{{Destination: *gwAddr("10.0.0.51", 15008), Weight: 1}}

	s := mustSnapshot(t, []*Workload{wp, wpDirect, other, app, app2, plain}, []*Service{wpSvc, web, canary}, nil)
	ip := netip.MustParseAddr

	t.Run("IsWaypointFor", func(t *testing.T) {
		for _, tc := range []struct {
			name    string
			target  string
			local   *Workload
			localIP string
			want    bool
		}{
			{"workload target, waypoint service has local", "10.0.0.10", wp, "10.0.0.50", true},
			{"workload target, another local", "10.0.0.10", other, "10.0.0.52", false},
			{"workload target, waypoint workload by IP", "10.0.0.11", wpDirect, "10.0.0.51", true},
			{"workload target, waypoint workload other IP", "10.0.0.11", wpDirect, "10.0.0.99", false},
			{"service target, waypoint by VIP", "10.96.0.10", wp, "10.0.0.50", true},
			{"service target, weighted waypoint", "10.96.0.11", wpDirect, "10.0.0.51", true},
			{"target without waypoint", "10.0.0.12", wp, "10.0.0.50", false},
			{"unknown target", "10.9.9.9", wp, "10.0.0.50", false},
		} {
			t.Run(tc.name, func(t *testing.T) {
				if got := s.IsWaypointFor("", ip(tc.target), tc.local, ip(tc.localIP)); got != tc.want {
					t.Errorf("got %v, want %v", got, tc.want)
				}
			})
		}
	})
	t.Run("GatewayHasWorkload", func(t *testing.T) {
		isWP := func(w *Workload) bool { return w == wp }
		for _, tc := range []struct {
			name string
			g    *GatewayAddress
			want bool
		}{
			{"service hostname with the workload", gwHost("ns", "wp.ns.svc", 0), true},
			{"service VIP with the workload", gwAddr("10.96.0.50", 0), true},
			{"workload address", gwAddr("10.0.0.50", 0), true},
			{"another workload", gwAddr("10.0.0.51", 0), false},
			{"unknown", gwHost("ns", "nope", 0), false},
			{"nil", nil, false},
		} {
			t.Run(tc.name, func(t *testing.T) {
				if got := s.GatewayHasWorkload(tc.g, isWP); got != tc.want {
					t.Errorf("got %v, want %v", got, tc.want)
				}
			})
		}
	})
}

func TestSelectAddress(t *testing.T) {
	dual := wl("d", "ns", "d", "10.0.0.1", "fd00::1")
	v6first := wl("v6", "ns", "v6", "fd00::2", "10.0.0.2")
	only4 := wl("o4", "ns", "o4", "10.0.0.3")
	none := &Workload{UID: "h", Extra: &WorkloadExtra{Hostname: "vm.example.com"}}
	tests := []struct {
		name   string
		w      *Workload
		want   string
		fam    IPFamilies
		wantIP string // "" means not ok
	}{
		{"requested address is kept", dual, "fd00::1", IPFamiliesIPv4, "fd00::1"},
		{"same family as requested", dual, "fd00::99", IPFamiliesAutomatic, "fd00::1"},
		{"same family, v4", v6first, "10.96.0.1", IPFamiliesAutomatic, "10.0.0.2"},
		{"mapped request is unmapped", v6first, "::ffff:10.96.0.1", IPFamiliesAutomatic, "10.0.0.2"},
		{"service restricts to IPv6", dual, "10.96.0.1", IPFamiliesIPv6, "fd00::1"},
		{"service restricts to IPv4", v6first, "fd00::99", IPFamiliesIPv4, "10.0.0.2"},
		{"dual allows both", dual, "fd00::99", IPFamiliesDual, "fd00::1"},
		{"other family when that is all", only4, "fd00::99", IPFamiliesAutomatic, "10.0.0.3"},
		{"restriction leaves nothing", only4, "10.96.0.1", IPFamiliesIPv6, ""},
		{"hostname-only workload", none, "10.96.0.1", IPFamiliesAutomatic, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := SelectAddress(tc.w, netip.MustParseAddr(tc.want), tc.fam)
			if tc.wantIP == "" {
				if ok {
					t.Errorf("got %v, want none", got)
				}
				return
			}
			if !ok || got != netip.MustParseAddr(tc.wantIP) {
				t.Errorf("got %v %v, want %s", got, ok, tc.wantIP)
			}
		})
	}
}

// TestCapacityDistribution checks that endpoints are chosen in proportion
// to their capacity: exactly, over every value of the random source, and
// within a tolerance with a seeded generator.
func TestCapacityDistribution(t *testing.T) {
	web := svc("ns", "web", "/10.96.0.1")
	caps := []uint32{1, 2, 3, 0, 10}
	var ws []*Workload
	for i, c := range caps {
		w := wl(string(rune('a'+i)), "ns", "w", "10.0.0."+string(rune('1'+i)))
		w.Capacity = c
		w.Services = ServicesOf(map[string]map[uint16]uint16{web.Key(): {80: 8080}})
		ws = append(ws, w)
	}
	s := mustSnapshot(t, ws, []*Service{web}, nil)
	index := map[*Workload]int{}
	for i, w := range ws {
		index[w] = i
	}

	t.Run("exact over every rnd value", func(t *testing.T) {
		counts := make([]uint32, len(caps))
		for r := range uint64(16) {
			w, _, err := s.PickEndpoint(nil, web, 80, func(n uint64) uint64 {
				if n != 16 {
					t.Fatalf("bound %d, want 16", n)
				}
				return r
			})
			if err != nil {
				t.Fatal(err)
			}
			counts[index[w]]++
		}
		for i := range caps {
			if counts[i] != caps[i] {
				t.Fatalf("counts %v, want %v", counts, caps)
			}
		}
	})
	t.Run("seeded generator within tolerance", func(t *testing.T) {
		rng := rand.New(rand.NewPCG(1, 2))
		const n = 16000
		counts := make([]int, len(caps))
		for range n {
			w, _, err := s.PickEndpoint(nil, web, 80, rng.Uint64N)
			if err != nil {
				t.Fatal(err)
			}
			counts[index[w]]++
		}
		for i, c := range caps {
			want := n * int(c) / 16
			// ±5% of n is many standard deviations for these shares.
			if d := counts[i] - want; d > n/20 || d < -n/20 {
				t.Errorf("endpoint %d (capacity %d): %d of %d, want about %d", i, c, counts[i], n, want)
			}
		}
		if counts[3] != 0 {
			t.Errorf("capacity 0 endpoint chosen %d times", counts[3])
		}
	})
}

func TestPickUpstreamHealthPolicy(t *testing.T) {
	tests := []struct {
		name     string
		lb       *LoadBalancer
		wantSick bool
	}{
		{"default drops unhealthy", nil, false},
		{"only healthy drops unhealthy", &LoadBalancer{HealthPolicy: LBOnlyHealthy}, false},
		{"allow all keeps unhealthy", &LoadBalancer{HealthPolicy: LBAllowAll}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			web := svc("ns", "web", "/10.96.0.1")
			web.EditExtra().LoadBalancer = tc.lb
			sick := wl("sick", "ns", "sick", "10.0.0.1")
			sick.Status = Unhealthy
			sick.Services = ServicesOf(map[string]map[uint16]uint16{web.Key(): {}})
			s := mustSnapshot(t, []*Workload{sick}, []*Service{web}, nil)
			w, _, err := s.PickEndpoint(nil, web, 80, nil)
			if tc.wantSick != (w == sick) || tc.wantSick != (err == nil) {
				t.Errorf("got %v %v", w, err)
			}
			if !tc.wantSick && !errors.Is(err, ErrNoHealthyUpstream) {
				t.Errorf("err = %v, want ErrNoHealthyUpstream", err)
			}
		})
	}
}
