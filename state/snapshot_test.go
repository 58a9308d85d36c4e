package state

import (
	"errors"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func addrs(s ...string) []netip.Addr {
	out := make([]netip.Addr, len(s))
	for i, a := range s {
		out[i] = netip.MustParseAddr(a)
	}
	return out
}

func wl(uid, ns, name string, ips ...string) *Workload {
	return &Workload{UID: uid, Name: name, Addresses: addrs(ips...), Protocol: ProtocolHBONE, Capacity: 1, Labels: &WorkloadLabels{Namespace: ns}}
}

func svc(ns, host string, vips ...string) *Service {
	s := &Service{Name: strings.Split(host, ".")[0], Namespace: ns, Hostname: host, Ports: map[uint16]uint16{80: 8080}}
	for _, v := range vips {
		network, ip, _ := strings.Cut(v, "/")
		s.VIPs = append(s.VIPs, NetworkAddress{network, netip.MustParseAddr(ip)})
	}
	return s
}

func mustSnapshot(t testing.TB, ws []*Workload, ss []*Service, ps []*Policy) *Snapshot {
	t.Helper()
	s, err := NewSnapshot(ws, ss, ps)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestNewSnapshotErrors(t *testing.T) {
	tests := []struct {
		name      string
		workloads []*Workload
		services  []*Service
		policies  []*Policy
		want      []string // substrings of the error
	}{
		{name: "duplicate uid", workloads: []*Workload{wl("a", "ns", "a", "10.0.0.1"), wl("a", "ns", "b", "10.0.0.2")},
			want: []string{`workload "a": duplicate uid`}},
		{name: "empty uid", workloads: []*Workload{wl("", "ns", "a", "10.0.0.1")}, want: []string{"uid is empty"}},
		{name: "duplicate address on one network names both", workloads: []*Workload{wl("a", "ns", "a", "10.0.0.1"), wl("b", "ns", "b", "10.0.0.1")},
			want: []string{`address /10.0.0.1 is used by two workloads: "a" and "b"`}},
		{name: "duplicate IPv4-mapped address", workloads: []*Workload{wl("a", "ns", "a", "10.0.0.1"), wl("b", "ns", "b", "::ffff:10.0.0.1")},
			want: []string{`"a" and "b"`}},
		{name: "invalid address", workloads: []*Workload{{UID: "a", Addresses: []netip.Addr{{}}}}, want: []string{`workload "a": invalid address`}},
		{name: "address with zone", workloads: []*Workload{wl("a", "ns", "a", "fe80::1%eth0")}, want: []string{"invalid address"}},
		{name: "bad protocol", workloads: []*Workload{{UID: "a", Protocol: 7}}, want: []string{"invalid protocol 7"}},
		{name: "bad status", workloads: []*Workload{{UID: "a", Status: 3}}, want: []string{"invalid status 3"}},
		{name: "bad service key", workloads: []*Workload{{UID: "a", Services: ServicesOf(map[string]map[uint16]uint16{"nohost": nil})}},
			want: []string{`service key "nohost" is not namespace/hostname`}},
		{name: "gateway with both destinations", workloads: []*Workload{{UID: "a", Extra: &WorkloadExtra{Waypoint: &GatewayAddress{
			Hostname: &NamespacedHostname{"ns", "wp"}, Address: &NetworkAddress{"", netip.MustParseAddr("10.0.0.1")}}}}},
			want: []string{"waypoint: exactly one of address and hostname"}},
		{name: "gateway with neither", workloads: []*Workload{{UID: "a", Extra: &WorkloadExtra{NetworkGateway: &GatewayAddress{}}}},
			want: []string{"network gateway: exactly one"}},
		{name: "duplicate service", services: []*Service{svc("ns", "a.ns"), svc("ns", "a.ns")}, want: []string{"service ns/a.ns: duplicate service key"}},
		{name: "service without hostname", services: []*Service{svc("ns", "")}, want: []string{"hostname is empty"}},
		{name: "bad VIP", services: []*Service{{Namespace: "ns", Hostname: "h", VIPs: []NetworkAddress{{}}}}, want: []string{"invalid VIP"}},
		{name: "bad lb mode", services: []*Service{{Namespace: "ns", Hostname: "h", Extra: &ServiceExtra{LoadBalancer: &LoadBalancer{Mode: 9}}}}, want: []string{"invalid load balancer mode 9"}},
		{name: "duplicate policy", policies: []*Policy{allowNS("p"), allowNS("p")}, want: []string{"policy ns1/p: duplicate policy key"}},
		{name: "policy without name", policies: []*Policy{{Namespace: "ns"}}, want: []string{"name is empty"}},
		{name: "bad scope", policies: []*Policy{{Name: "p", Namespace: "ns", Scope: 5}}, want: []string{"invalid scope 5"}},
		{name: "bad action", policies: []*Policy{{Name: "p", Namespace: "ns", Action: 5}}, want: []string{"invalid action 5"}},
		{name: "namespace scope without namespace", policies: []*Policy{{Name: "p", Scope: ScopeNamespace}}, want: []string{"has no namespace"}},
		{name: "bad cidr", policies: []*Policy{allowNS("p", Match{SourceIPs: []netip.Prefix{{}}})}, want: []string{"rules[0][0][0]: invalid CIDR"}},
		{name: "bad string match", policies: []*Policy{allowNS("p", Match{Principals: []StringMatch{{Kind: 9}}})}, want: []string{"invalid string match kind 9"}},
		{name: "several problems are all reported", workloads: []*Workload{{UID: "a", Protocol: 7, Status: 7}},
			want: []string{"invalid protocol", "invalid status"}},
		{name: "nil entries", workloads: []*Workload{nil}, services: []*Service{nil}, policies: []*Policy{nil},
			want: []string{"workload 0 is nil", "service 0 is nil", "policy 0 is nil"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := NewSnapshot(tc.workloads, tc.services, tc.policies)
			if err == nil || s != nil {
				t.Fatalf("NewSnapshot = %v, %v; want an error", s, err)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("error %v does not wrap ErrInvalid", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

func TestNewSnapshotManyErrorsAreBounded(t *testing.T) {
	var ws []*Workload
	for i := 0; i < 100; i++ {
		ws = append(ws, &Workload{UID: "x"})
	}
	_, err := NewSnapshot(ws, nil, nil)
	if err == nil || !strings.Contains(err.Error(), "too many errors") || strings.Count(err.Error(), "\n") > maxErrors+1 {
		t.Fatalf("error: %v", err)
	}
}

func TestAddressesPerNetwork(t *testing.T) {
	a := wl("a", "ns", "a", "10.0.0.1", "fd00::1")
	b := wl("b", "ns", "b", "10.0.0.1", "fd00::1")
	b.EditLabels().Network = "net2"
	host1 := wl("h1", "ns", "h1", "192.168.1.1")
	host1.NetworkMode = NetworkModeHostNetwork
	host2 := wl("h2", "ns", "h2", "192.168.1.1")
	host2.NetworkMode = NetworkModeHostNetwork
	s := mustSnapshot(t, []*Workload{b, host2, a, host1}, nil, nil)

	for _, tc := range []struct {
		network, ip string
		want        *Workload
	}{
		{"", "10.0.0.1", a},
		{"", "::ffff:10.0.0.1", a},
		{"", "fd00::1", a},
		{"net2", "10.0.0.1", b},
		{"net2", "fd00::1", b},
		{"net2", "::ffff:10.0.0.1", b},
		{"net3", "10.0.0.1", nil},
		{"", "fd00::1%eth0", nil}, // no indexed address has a zone
		{"", "", nil},
		{"", "10.0.0.2", nil},
		{"", "192.168.1.1", nil}, // host network workloads are not indexed
	} {
		ip, _ := netip.ParseAddr(tc.ip) // "": the zero Addr
		if got := s.WorkloadByAddr(tc.network, ip); got != tc.want {
			t.Errorf("WorkloadByAddr(%q, %s) = %v, want %v", tc.network, tc.ip, got, tc.want)
		}
	}
	var uids []string
	for _, w := range s.Workloads() {
		uids = append(uids, w.UID)
	}
	if !slices.Equal(uids, []string{"a", "b", "h1", "h2"}) {
		t.Errorf("Workloads not sorted by UID: %q", uids)
	}
	if s.WorkloadByUID("h2") != host2 || s.WorkloadByUID("zz") != nil {
		t.Error("WorkloadByUID")
	}
}

func TestSortedLists(t *testing.T) {
	// Keys sort as strings: "a-b/x" < "a/x" because '-' < '/'.
	s := mustSnapshot(t, nil,
		[]*Service{svc("a", "x"), svc("a-b", "x"), svc("a", "w")},
		[]*Policy{pol(ActionAllow, ScopeGlobal, "a", "p"), pol(ActionAllow, ScopeGlobal, "a-b", "p")})
	var keys []string
	for _, v := range s.Services() {
		keys = append(keys, v.Key())
	}
	if !slices.Equal(keys, []string{"a-b/x", "a/w", "a/x"}) {
		t.Errorf("Services: %q", keys)
	}
	keys = keys[:0]
	for _, p := range s.Policies() {
		keys = append(keys, p.Key())
	}
	if !slices.Equal(keys, []string{"a-b/p", "a/p"}) {
		t.Errorf("Policies: %q", keys)
	}
}

func TestServiceLookups(t *testing.T) {
	shared1 := svc("ns1", "shared.example.com", "/10.96.0.1")
	shared2 := svc("ns2", "shared.example.com", "/10.96.0.1")
	canon := svc("ns3", "canon.example.com", "/10.96.0.1")
	canon.Canonical = true
	private := svc("ns4", "private.example.com", "/10.96.0.1")
	private.Visibility = VisibilityNamespace
	wide := svc("ns1", "wide", "/10.96.9.9")
	wide.EditExtra().CIDRVIPs = []NetworkPrefix{{"", netip.MustParsePrefix("10.97.0.0/16")}}
	narrow := svc("ns2", "narrow")
	narrow.EditExtra().CIDRVIPs = []NetworkPrefix{{"", netip.MustParsePrefix("10.97.1.0/24")}}
	other := svc("ns9", "othernet", "net2/10.96.0.1")
	s := mustSnapshot(t, nil, []*Service{shared1, shared2, canon, private, wide, narrow, other}, nil)

	if got := s.ServiceByKey("ns2/shared.example.com"); got != shared2 {
		t.Errorf("ServiceByKey = %v", got)
	}
	if s.ServiceByKey("nokey") != nil || s.ServiceByKey("ns5/shared.example.com") != nil {
		t.Error("ServiceByKey found a missing key")
	}
	if got := s.ServicesByHostname("shared.example.com"); !slices.Equal(got, []*Service{shared1, shared2}) {
		t.Errorf("ServicesByHostname = %v", got)
	}
	vip := netip.MustParseAddr("10.96.0.1")
	if got := s.ServiceByVIP("", vip); got != canon {
		t.Errorf("ServiceByVIP prefers canonical: got %v", got.Key())
	}
	if got := s.ServiceByVIP("net2", vip); got != other {
		t.Errorf("ServiceByVIP on net2: got %v", got)
	}
	if got := s.ServiceByVIP("", netip.MustParseAddr("10.97.1.1")); got != nil {
		t.Errorf("ServiceByVIP must be exact, got %v", got.Key())
	}
	for _, tc := range []struct {
		ip, clientNS string
		want         *Service
	}{
		{"10.96.0.1", "ns2", shared2},  // the client's namespace wins
		{"10.96.0.1", "ns4", private},  // visible in its own namespace
		{"10.96.0.1", "ns7", canon},    // then canonical
		{"10.97.1.1", "ns7", narrow},   // CIDR: longest prefix
		{"10.97.1.1", "ns1", wide},     // CIDR: namespace beats prefix length
		{"10.97.2.1", "ns7", wide},     // CIDR: only the wide one contains it
		{"10.98.0.1", "ns7", nil},      // nothing
		{"10.96.9.9", "ns7", wide},     // exact VIP
		{"::ffff:10.96.9.9", "", wide}, // mapped form
	} {
		if got := s.ResolveVIP("", netip.MustParseAddr(tc.ip), tc.clientNS); got != tc.want {
			t.Errorf("ResolveVIP(%s, %s) = %v, want %v", tc.ip, tc.clientNS, got, tc.want)
		}
	}
	// A namespace-visible service alone is hidden from other namespaces.
	s2 := mustSnapshot(t, nil, []*Service{private}, nil)
	if got := s2.ResolveVIP("", vip, "ns1"); got != nil {
		t.Errorf("private service visible to ns1")
	}
	if got := s2.ServiceByVIP("", vip); got != private {
		t.Errorf("ServiceByVIP ignores visibility, got %v", got)
	}
}

func TestEndpoints(t *testing.T) {
	web := svc("ns", "web.ns.svc.cluster.local", "/10.96.0.10")
	all := svc("ns", "all.ns.svc.cluster.local")
	all.EditExtra().LoadBalancer = &LoadBalancer{HealthPolicy: LBAllowAll}
	w1 := wl("w1", "ns", "w1", "10.0.0.1")
	w2 := wl("w2", "ns", "w2", "10.0.0.2")
	w2.Status = Unhealthy
	w3 := wl("w3", "ns", "w3", "10.0.0.3")
	for _, w := range []*Workload{w1, w2, w3} {
		w.Services = ServicesOf(map[string]map[uint16]uint16{
			web.Key(): {80: 8080}, all.Key(): {}, "ns/missing.ns.svc.cluster.local": {80: 1},
		})
	}
	w3.Services = ServicesOf(map[string]map[uint16]uint16{
		web.Key(): {80: 9090}, all.Key(): {}, "ns/missing.ns.svc.cluster.local": {80: 1},
	})
	s := mustSnapshot(t, []*Workload{w3, w2, w1}, []*Service{web, all}, nil)

	eps := s.Endpoints(web)
	if len(eps) != 2 || eps[0].Workload != w1 || eps[1].Workload != w3 || !slices.Equal(eps[1].Ports(), PortMap{{80, 9090}}) {
		t.Errorf("web endpoints = %+v", eps)
	}
	if eps := s.Endpoints(all); len(eps) != 3 {
		t.Errorf("AllowAll keeps unhealthy endpoints: %+v", eps)
	}
	if eps := s.Endpoints(svc("ns", "missing.ns.svc.cluster.local")); len(eps) != 0 {
		t.Errorf("endpoints of a service not in the snapshot: %+v", eps)
	}
}

func TestFindWorkload(t *testing.T) {
	a := wl("a", "ns", "pod", "10.0.0.1")
	a.EditPlace().Node = "node1"
	b := wl("b", "ns", "pod", "10.0.0.2")
	b.EditPlace().Node = "node2"
	b.EditLabels().ServiceAccount = "web"
	c := wl("c", "ns", "pod", "10.0.0.3")
	c.EditPlace().Node = "node2"
	c.EditLabels().ClusterID = "east"
	// d is c's twin in another cluster, on a node of the same name.
	d := wl("0-d", "ns", "pod", "10.0.0.4")
	d.EditPlace().Node = "node2"
	d.EditLabels().ClusterID = "west"
	s := mustSnapshot(t, []*Workload{c, b, a, d}, nil, nil)
	for _, tc := range []struct {
		info WorkloadInfo
		want *Workload
	}{
		{WorkloadInfo{Namespace: "ns", Name: "pod", ServiceAccount: "default"}, d},                // lowest UID
		{WorkloadInfo{Namespace: "ns", Name: "pod"}, d},                                           // "" means default
		{WorkloadInfo{Namespace: "ns", Name: "pod", ServiceAccount: "default", Node: "node2"}, d}, // lowest UID
		{WorkloadInfo{Namespace: "ns", Name: "pod", ServiceAccount: "default", Node: "node2", Cluster: "east"}, c},
		{WorkloadInfo{Namespace: "ns", Name: "pod", ServiceAccount: "default", Node: "node2", Cluster: "west"}, d},
		{WorkloadInfo{Namespace: "ns", Name: "pod", ServiceAccount: "default", Node: "node1", Cluster: "east"}, a}, // a has no cluster ID
		{WorkloadInfo{Namespace: "ns", Name: "pod", ServiceAccount: "web"}, b},
		{WorkloadInfo{Namespace: "ns", Name: "pod", ServiceAccount: "web", Node: "node1"}, nil},
		{WorkloadInfo{Namespace: "other", Name: "pod"}, nil},
	} {
		if got := s.FindWorkload(tc.info); got != tc.want {
			t.Errorf("FindWorkload(%+v) = %v, want %v", tc.info, got, tc.want)
		}
	}
}

func TestIdentityDefaults(t *testing.T) {
	w := &Workload{Labels: &WorkloadLabels{Namespace: "ns"}}
	if got := w.Identity().String(); got != "spiffe://cluster.local/ns/ns/sa/default" {
		t.Errorf("Identity = %q", got)
	}
	w.EditLabels().TrustDomain, w.Labels.ServiceAccount = "example.org", "web"
	if got := w.Identity().String(); got != "spiffe://example.org/ns/ns/sa/web" {
		t.Errorf("Identity = %q", got)
	}
}

func TestStrings(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{ProtocolTCP.String(), "TCP"},
		{ProtocolHBONE.String(), "HBONE"},
		{Protocol(9).String(), "Protocol(9)"},
		{Unhealthy.String(), "Unhealthy"},
		{NetworkAddress{"net", netip.MustParseAddr("fd00::1")}.String(), "net/fd00::1"},
		{NetworkAddress{"", netip.MustParseAddr("10.0.0.1")}.String(), "/10.0.0.1"},
		{NamespacedHostname{"ns", "h"}.String(), "ns/h"},
		{(&GatewayAddress{Hostname: &NamespacedHostname{"ns", "wp"}}).Destination(), "ns/wp"},
		{(&GatewayAddress{Address: &NetworkAddress{"n", netip.MustParseAddr("10.0.0.1")}}).Destination(), "n/10.0.0.1"},
		{ScopeWorkloadSelector.String(), "WorkloadSelector"},
		{ActionDeny.String(), "Deny"},
		{MatchPresence.String(), "Presence"},
		{(&Policy{Namespace: "ns", Name: "p"}).Key(), "ns/p"},
		{(&Service{Namespace: "ns", Hostname: "h"}).Key(), "ns/h"},
		// Every enum value, and one no name is known for.
		{ProtocolTCP.String(), "TCP"},
		{ProtocolHBONE.String(), "HBONE"},
		{Protocol(200).String(), "Protocol(200)"},
		{Healthy.String(), "Healthy"},
		{Unhealthy.String(), "Unhealthy"},
		{HealthStatus(200).String(), "HealthStatus(200)"},
		{NetworkModeStandard.String(), "Standard"},
		{NetworkModeHostNetwork.String(), "HostNetwork"},
		{NetworkMode(200).String(), "NetworkMode(200)"},
		{AppTunnelNone.String(), "NONE"},
		{AppTunnelProxy.String(), "PROXY"},
		{AppTunnelProtocol(200).String(), "AppTunnelProtocol(200)"},
		{IPFamiliesAutomatic.String(), ""},
		{IPFamiliesIPv4.String(), "IPv4"},
		{IPFamiliesIPv6.String(), "IPv6"},
		{IPFamiliesDual.String(), "Dual"},
		{IPFamilies(200).String(), "IPFamilies(200)"},
		{VisibilityPublic.String(), "Public"},
		{VisibilityNamespace.String(), "Namespace"},
		{Visibility(200).String(), "Visibility(200)"},
		{LBScopeRegion.String(), "Region"},
		{LBScopeZone.String(), "Zone"},
		{LBScopeSubzone.String(), "Subzone"},
		{LBScopeNode.String(), "Node"},
		{LBScopeCluster.String(), "Cluster"},
		{LBScopeNetwork.String(), "Network"},
		{LBScope(200).String(), "LBScope(200)"},
		{LBModeStandard.String(), "Standard"},
		{LBModeStrict.String(), "Strict"},
		{LBModeFailover.String(), "Failover"},
		{LBModePassthrough.String(), "Passthrough"},
		{LBMode(200).String(), "LBMode(200)"},
		{LBOnlyHealthy.String(), "OnlyHealthy"},
		{LBAllowAll.String(), "AllowAll"},
		{LBHealthPolicy(200).String(), "LBHealthPolicy(200)"},
		{ScopeGlobal.String(), "Global"},
		{ScopeNamespace.String(), "Namespace"},
		{ScopeWorkloadSelector.String(), "WorkloadSelector"},
		{Scope(200).String(), "Scope(200)"},
		{ActionAllow.String(), "Allow"},
		{ActionDeny.String(), "Deny"},
		{Action(200).String(), "Action(200)"},
		{MatchExact.String(), "Exact"},
		{MatchPrefix.String(), "Prefix"},
		{MatchSuffix.String(), "Suffix"},
		{MatchPresence.String(), "Presence"},
		{MatchKind(200).String(), "MatchKind(200)"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

func TestWorkloadByAddrNoAllocs(t *testing.T) {
	s := benchSnapshot(t, 1000)
	ip := netip.MustParseAddr("10.0.1.44")
	if s.WorkloadByAddr("", ip) == nil {
		t.Fatal("not found")
	}
	if n := testing.AllocsPerRun(100, func() { s.WorkloadByAddr("", ip) }); n != 0 {
		t.Errorf("WorkloadByAddr allocates %v times", n)
	}
	if n := testing.AllocsPerRun(100, func() { s.ServiceByKey("ns/svc-7.ns.svc.cluster.local") }); n != 0 {
		t.Errorf("ServiceByKey allocates %v times", n)
	}
}

func benchSnapshot(t testing.TB, n int) *Snapshot {
	ws, ss := benchInput(n)
	return mustSnapshot(t, ws, ss, nil)
}

func benchInput(n int) ([]*Workload, []*Service) {
	ws := make([]*Workload, n)
	ss := make([]*Service, 0, n/10)
	for i := range ss[:cap(ss)] {
		ss = append(ss, svc("ns", "svc-"+itoa(i)+".ns.svc.cluster.local", "/10.96."+itoa(i/250)+"."+itoa(i%250+1)))
	}
	for i := range ws {
		ws[i] = wl("uid-"+itoa(i), "ns", "pod-"+itoa(i), "10.0."+itoa(i/250)+"."+itoa(i%250+1))
		ws[i].Services = ServicesOf(map[string]map[uint16]uint16{ss[i%len(ss)].Key(): {80: 8080}})
	}
	return ws, ss
}

func itoa(i int) string { return strconv.Itoa(i) }

func BenchmarkWorkloadByAddr(b *testing.B) {
	s := benchSnapshot(b, 10000)
	ip := netip.MustParseAddr("10.0.17.44")
	b.ReportAllocs()
	for b.Loop() {
		if s.WorkloadByAddr("", ip) == nil {
			b.Fatal("not found")
		}
	}
}

func BenchmarkNewSnapshot10k(b *testing.B) {
	ws, ss := benchInput(10000)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := NewSnapshot(ws, ss, nil); err != nil {
			b.Fatal(err)
		}
	}
}
