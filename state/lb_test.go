package state

import (
	"errors"
	"net/netip"
	"testing"
)

// seq returns a random source that yields the given values in turn and
// records the bounds it was asked for.
func seq(bounds *[]uint64, vals ...uint64) func(uint64) uint64 {
	return func(n uint64) uint64 {
		*bounds = append(*bounds, n)
		v := vals[0]
		vals = vals[1:]
		return v
	}
}

func TestPickEndpointWeighted(t *testing.T) {
	web := svc("ns", "web", "/10.96.0.1")
	a := wl("a", "ns", "a", "10.0.0.1")
	a.Capacity = 1
	b := wl("b", "ns", "b", "10.0.0.2")
	b.Capacity = 3
	zero := wl("z", "ns", "z", "10.0.0.3")
	zero.Capacity = 0
	for _, w := range []*Workload{a, b, zero} {
		w.Services = ServicesOf(map[string]map[uint16]uint16{web.Key(): {80: 8080}})
	}
	s := mustSnapshot(t, []*Workload{a, b, zero}, []*Service{web}, nil)

	for r, want := range []*Workload{a, b, b, b} {
		var bounds []uint64
		got, port, err := s.PickEndpoint(nil, web, 80, seq(&bounds, uint64(r)))
		if err != nil || got != want || port != 8080 {
			t.Errorf("r=%d: got %v %d %v, want %v 8080", r, got, port, err, want.UID)
		}
		if len(bounds) != 1 || bounds[0] != 4 {
			t.Errorf("rnd called with %v, want [4] (the capacity sum)", bounds)
		}
	}
	// The default random source works too.
	if got, _, err := s.PickEndpoint(nil, web, 80, nil); err != nil || (got != a && got != b) {
		t.Errorf("default rnd: %v %v", got, err)
	}
	if _, _, err := s.PickEndpoint(nil, web, 80, func(uint64) uint64 { return 4 }); !errors.Is(err, ErrNoHealthyUpstream) {
		t.Errorf("out of range rnd: %v", err)
	}
}

func TestPickEndpointPorts(t *testing.T) {
	named := svc("ns", "named")
	named.Ports = map[uint16]uint16{80: 0, 443: 8443}
	withMap := wl("m", "ns", "m", "10.0.0.1")
	withMap.Services = ServicesOf(map[string]map[uint16]uint16{named.Key(): {80: 9080}})
	without := wl("w", "ns", "w", "10.0.0.2")
	without.Services = ServicesOf(map[string]map[uint16]uint16{named.Key(): {}})
	s := mustSnapshot(t, []*Workload{withMap, without}, []*Service{named}, nil)

	// Port 80 has target 0: only the endpoint with its own mapping qualifies.
	for r := range uint64(1) {
		got, port, err := s.PickEndpoint(nil, named, 80, func(n uint64) uint64 {
			if n != 1 {
				t.Errorf("capacity sum %d, want 1", n)
			}
			return r
		})
		if err != nil || got != withMap || port != 9080 {
			t.Errorf("port 80: %v %d %v", got, port, err)
		}
	}
	// Port 443 falls back to the service target port.
	var bounds []uint64
	got, port, err := s.PickEndpoint(nil, named, 443, seq(&bounds, 1))
	if err != nil || got != without || port != 8443 {
		t.Errorf("port 443: %v %d %v", got, port, err)
	}
	// An unknown service port has no upstream.
	if _, _, err := s.PickEndpoint(nil, named, 81, nil); !errors.Is(err, ErrNoHealthyUpstream) {
		t.Errorf("port 81: %v", err)
	}
}

func TestPickEndpointNoneUsable(t *testing.T) {
	web := svc("ns", "web")
	sick := wl("sick", "ns", "sick", "10.0.0.1")
	sick.Status = Unhealthy
	zero := wl("zero", "ns", "zero", "10.0.0.2")
	zero.Capacity = 0
	noAddr := wl("noaddr", "ns", "noaddr")
	for _, w := range []*Workload{sick, zero, noAddr} {
		w.Services = ServicesOf(map[string]map[uint16]uint16{web.Key(): {80: 8080}})
	}
	s := mustSnapshot(t, []*Workload{sick, zero, noAddr}, []*Service{web}, nil)
	if w, _, err := s.PickEndpoint(nil, web, 80, nil); !errors.Is(err, ErrNoHealthyUpstream) {
		t.Errorf("got %v, %v; want ErrNoHealthyUpstream", w, err)
	}
	if _, _, err := s.PickEndpoint(nil, svc("ns", "unknown"), 80, nil); !errors.Is(err, ErrNoHealthyUpstream) {
		t.Errorf("service outside the snapshot: %v", err)
	}
}

func TestPickEndpointNetworkGateway(t *testing.T) {
	web := svc("ns", "web")
	remote := &Workload{UID: "remote", Capacity: 1,
		Extra:    &WorkloadExtra{NetworkGateway: &GatewayAddress{Address: &NetworkAddress{"net2", netip.MustParseAddr("192.0.2.1")}, HBONEMTLSPort: 15008}},
		Services: ServicesOf(map[string]map[uint16]uint16{web.Key(): {80: 8080}}), Labels: &WorkloadLabels{Namespace: "ns", Network: "net2"}}
	s := mustSnapshot(t, []*Workload{remote}, []*Service{web}, nil)
	// From another network an address-less workload is reachable through its gateway.
	if got, _, err := s.PickEndpoint(&Workload{Labels: &WorkloadLabels{Network: "net1"}}, web, 80, nil); err != nil || got != remote {
		t.Errorf("from net1: %v %v", got, err)
	}
	// From its own network it is not.
	if _, _, err := s.PickEndpoint(&Workload{Labels: &WorkloadLabels{Network: "net2"}}, web, 80, nil); !errors.Is(err, ErrNoHealthyUpstream) {
		t.Errorf("from net2: %v", err)
	}
}

func TestPickEndpointLocality(t *testing.T) {
	src := &Workload{Labels: &WorkloadLabels{Network: "n1", ClusterID: "c1"}, Place: &Placement{Node: "node1", Locality: Locality{"r1", "z1", "s1"}}}
	mk := func(uid, network, node, region, zone string) *Workload {
		w := wl(uid, "ns", uid, "10.0.0."+uid[len(uid)-1:])
		w.Place = &Placement{Node: node, Locality: Locality{region, zone, "s1"}}
		w.EditLabels().Network, w.Labels.ClusterID = network, "c1"
		return w
	}
	sameZone := mk("w1", "n1", "node2", "r1", "z1")
	sameRegion := mk("w2", "n1", "node2", "r1", "z2")
	otherRegion := mk("w3", "n1", "node2", "r2", "z1")
	otherNet := mk("w4", "n2", "node1", "r1", "z1")
	all := []*Workload{sameZone, sameRegion, otherRegion, otherNet}

	tests := []struct {
		name  string
		lb    *LoadBalancer
		src   *Workload
		want  []*Workload // the candidates, in UID order
		noneR bool
	}{
		{name: "standard ignores locality", lb: &LoadBalancer{Mode: LBModeStandard, RoutingPreferences: []LBScope{LBScopeZone}},
			src: src, want: all},
		{name: "failover keeps the best rank", lb: &LoadBalancer{Mode: LBModeFailover, RoutingPreferences: []LBScope{LBScopeRegion, LBScopeZone}},
			src: src, want: []*Workload{sameZone, otherNet}},
		{name: "failover falls back to fewer matches", lb: &LoadBalancer{Mode: LBModeFailover, RoutingPreferences: []LBScope{LBScopeRegion, LBScopeZone}},
			src: &Workload{Place: &Placement{Locality: Locality{"r1", "z9", ""}}}, want: []*Workload{sameZone, sameRegion, otherNet}},
		{name: "strict needs every scope", lb: &LoadBalancer{Mode: LBModeStrict, RoutingPreferences: []LBScope{LBScopeRegion, LBScopeZone, LBScopeNetwork}},
			src: src, want: []*Workload{sameZone}},
		{name: "strict with no full match has no upstream", lb: &LoadBalancer{Mode: LBModeStrict, RoutingPreferences: []LBScope{LBScopeNode}},
			src: &Workload{Place: &Placement{Node: "node9"}}, noneR: true},
		{name: "leading network outranks everything", lb: &LoadBalancer{Mode: LBModeFailover, RoutingPreferences: []LBScope{LBScopeNetwork, LBScopeRegion, LBScopeZone}},
			src: &Workload{Labels: &WorkloadLabels{Network: "n2"}, Place: &Placement{Locality: Locality{"r2", "z1", ""}}}, want: []*Workload{otherNet}},
		{name: "leading network mismatch ranks by the rest", lb: &LoadBalancer{Mode: LBModeFailover, RoutingPreferences: []LBScope{LBScopeNetwork, LBScopeRegion, LBScopeZone}},
			src: &Workload{Labels: &WorkloadLabels{Network: "n9"}, Place: &Placement{Locality: Locality{"r2", "z1", ""}}}, want: []*Workload{otherRegion}},
		{name: "node and cluster scopes", lb: &LoadBalancer{Mode: LBModeFailover, RoutingPreferences: []LBScope{LBScopeCluster, LBScopeNode}},
			src: src, want: []*Workload{otherNet}},
		{name: "subzone scope", lb: &LoadBalancer{Mode: LBModeStrict, RoutingPreferences: []LBScope{LBScopeSubzone}},
			src: src, want: all},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			web := svc("ns", "web")
			web.EditExtra().LoadBalancer = tc.lb
			for _, w := range all {
				w.Services = ServicesOf(map[string]map[uint16]uint16{web.Key(): {80: 8080}})
			}
			s := mustSnapshot(t, all, []*Service{web}, nil)
			if tc.noneR {
				if _, _, err := s.PickEndpoint(tc.src, web, 80, nil); !errors.Is(err, ErrNoHealthyUpstream) {
					t.Fatalf("err = %v", err)
				}
				return
			}
			for r, want := range tc.want {
				got, _, err := s.PickEndpoint(tc.src, web, 80, func(n uint64) uint64 {
					if n != uint64(len(tc.want)) {
						t.Errorf("candidate weight %d, want %d", n, len(tc.want))
					}
					return uint64(r)
				})
				if err != nil || got != want {
					t.Errorf("r=%d: got %v %v, want %s", r, got, err, want.UID)
				}
			}
		})
	}
}
