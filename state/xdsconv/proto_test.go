package xdsconv

import (
	"errors"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ztunnel-go/ztunnel/api/securityapi"
	"github.com/ztunnel-go/ztunnel/api/workloadapi"
	"github.com/ztunnel-go/ztunnel/state"
)

func ip4(s string) []byte  { a := netip.MustParseAddr(s).As4(); return a[:] }
func ip16(s string) []byte { a := netip.MustParseAddr(s).As16(); return a[:] }

func TestConvertWorkloadAllFields(t *testing.T) {
	in := &workloadapi.Workload{
		Uid: "c1//v1/Pod/ns/p1", Name: "p1", Namespace: "ns",
		Addresses: [][]byte{ip4("10.0.0.1"), ip16("fd00::1")},
		Hostname:  "h.example", Network: "net1",
		TunnelProtocol: workloadapi.TunnelProtocol_HBONE,
		TrustDomain:    "td", ServiceAccount: "sa",
		Waypoint: &workloadapi.GatewayAddress{
			Destination:   &workloadapi.GatewayAddress_Hostname{Hostname: &workloadapi.NamespacedHostname{Namespace: "ns", Hostname: "wp.ns.svc"}},
			HboneMtlsPort: 15008,
		},
		NetworkGateway: &workloadapi.GatewayAddress{
			Destination:   &workloadapi.GatewayAddress_Address{Address: &workloadapi.NetworkAddress{Network: "net2", Address: ip4("192.0.2.1")}},
			HboneMtlsPort: 15009,
		},
		Node: "n1", CanonicalName: "app", CanonicalRevision: "v1",
		WorkloadType: workloadapi.WorkloadType_CRONJOB, WorkloadName: "job",
		NativeTunnel:      true,
		ApplicationTunnel: &workloadapi.ApplicationTunnel{Protocol: workloadapi.ApplicationTunnel_PROXY, Port: 15088},
		Services: map[string]*workloadapi.PortList{
			"ns/svc.ns.svc": {Ports: []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}, {ServicePort: 70000 + 443, TargetPort: 8443}}},
		},
		AuthorizationPolicies: []string{"ns/sel"},
		Status:                workloadapi.WorkloadStatus_UNHEALTHY,
		ClusterId:             "c1",
		Locality:              &workloadapi.Locality{Region: "r", Zone: "z", Subzone: "s"},
		NetworkMode:           workloadapi.NetworkMode_HOST_NETWORK,
		Capacity:              wrapperspb.UInt32(0),
	}
	want := &state.Workload{
		UID: "c1//v1/Pod/ns/p1", Name: "p1",
		Labels: &state.WorkloadLabels{Namespace: "ns", ServiceAccount: "sa", Network: "net1", WorkloadName: "job", WorkloadType: "cronjob", CanonicalName: "app", CanonicalRevision: "v1",
			TrustDomain: "td", ClusterID: "c1"},
		Addresses:   []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd00::1")},
		Protocol:    state.ProtocolHBONE,
		Status:      state.Unhealthy,
		NetworkMode: state.NetworkModeHostNetwork,
		Extra: &state.WorkloadExtra{
			Hostname: "h.example",
			Waypoint: &state.GatewayAddress{
				Hostname: &state.NamespacedHostname{Namespace: "ns", Hostname: "wp.ns.svc"}, HBONEMTLSPort: 15008,
			},
			NetworkGateway: &state.GatewayAddress{
				Address: &state.NetworkAddress{Network: "net2", Addr: netip.MustParseAddr("192.0.2.1")}, HBONEMTLSPort: 15009,
			},
			ApplicationTunnel:     &state.ApplicationTunnel{Protocol: state.AppTunnelProxy, Port: 15088},
			AuthorizationPolicies: []string{"ns/sel"},
		},
		NativeTunnel: true,
		// 70443 truncates to 4907, as ztunnel's "as u16" does.
		Services: state.ServicesOf(map[string]map[uint16]uint16{"ns/svc.ns.svc": {80: 8080, 4907: 8443}}),
		Capacity: 0,
		Place:    &state.Placement{Node: "n1", Locality: state.Locality{Region: "r", Zone: "z", Subzone: "s"}},
	}
	got, err := ConvertWorkload(in)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
}

func TestConvertWorkloadDefaults(t *testing.T) {
	got, err := ConvertWorkload(&workloadapi.Workload{Uid: "u", Namespace: "ns", WorkloadType: 99})
	if err != nil {
		t.Fatal(err)
	}
	want := &state.Workload{
		UID:    "u",
		Labels: &state.WorkloadLabels{Namespace: "ns", ServiceAccount: "default", WorkloadType: "deployment", TrustDomain: "cluster.local", ClusterID: "Kubernetes"}, Capacity: 1, Services: state.ServicesOf(map[string]map[uint16]uint16{}),
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
	if id := got.Identity().String(); id != "spiffe://cluster.local/ns/ns/sa/default" {
		t.Errorf("identity %s", id)
	}
}

func TestConvertServiceAllFields(t *testing.T) {
	length := func(n uint32) *uint32 { return &n }
	in := &workloadapi.Service{
		Name: "svc", Namespace: "ns", Hostname: "svc.ns.svc.cluster.local",
		Addresses: []*workloadapi.NetworkAddress{
			{Network: "", Address: ip4("10.96.0.1")},
			{Network: "", Address: ip4("10.96.0.2"), Length: length(32)}, // host length: a plain VIP
			{Network: "n2", Address: ip4("10.97.0.0"), Length: length(16)},
			{Network: "", Address: ip16("fd00::10")},
		},
		Ports:           []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}, {ServicePort: 81}},
		SubjectAltNames: []string{"spiffe://td/ns/ns/sa/x"},
		Waypoint: &workloadapi.GatewayAddress{
			Destination: &workloadapi.GatewayAddress_Address{Address: &workloadapi.NetworkAddress{Address: ip4("10.0.0.9")}}, HboneMtlsPort: 15008,
		},
		LoadBalancing: &workloadapi.LoadBalancing{
			RoutingPreference: []workloadapi.LoadBalancing_Scope{workloadapi.LoadBalancing_REGION, workloadapi.LoadBalancing_NETWORK},
			Mode:              workloadapi.LoadBalancing_FAILOVER,
			HealthPolicy:      workloadapi.LoadBalancing_ALLOW_ALL,
		},
		IpFamilies:         workloadapi.IPFamilies_DUAL,
		Canonical:          true,
		IngressUseWaypoint: true,
		WeightedWaypoints: []*workloadapi.WeightedWaypoint{{
			Destination: &workloadapi.GatewayAddress{Destination: &workloadapi.GatewayAddress_Hostname{Hostname: &workloadapi.NamespacedHostname{Namespace: "ns", Hostname: "wp2"}}},
			Weight:      3,
		}},
		Visibility: 7, // unknown: public
	}
	want := &state.Service{
		Name: "svc", Namespace: "ns", Hostname: "svc.ns.svc.cluster.local",
		VIPs: []state.NetworkAddress{
			{Addr: netip.MustParseAddr("10.96.0.1")}, {Addr: netip.MustParseAddr("10.96.0.2")}, {Addr: netip.MustParseAddr("fd00::10")},
		},
		Ports:      map[uint16]uint16{80: 8080, 81: 0},
		Waypoint:   &state.GatewayAddress{Address: &state.NetworkAddress{Addr: netip.MustParseAddr("10.0.0.9")}, HBONEMTLSPort: 15008},
		IPFamilies: state.IPFamiliesDual,
		Canonical:  true,
		Visibility: state.VisibilityPublic,
		Extra: &state.ServiceExtra{CIDRVIPs: []state.NetworkPrefix{{Network: "n2", Prefix: netip.MustParsePrefix("10.97.0.0/16")}}, SubjectAltNames: []string{"spiffe://td/ns/ns/sa/x"}, WeightedWaypoints: []state.WeightedWaypoint{{
			Destination: state.GatewayAddress{Hostname: &state.NamespacedHostname{Namespace: "ns", Hostname: "wp2"}}, Weight: 3,
		}}, LoadBalancer: &state.LoadBalancer{
			RoutingPreferences: []state.LBScope{state.LBScopeRegion, state.LBScopeNetwork},
			Mode:               state.LBModeFailover, HealthPolicy: state.LBAllowAll,
		}},
	}
	got, err := ConvertService(in)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
	in.Visibility = workloadapi.Service_NAMESPACE
	if got, _ := ConvertService(in); got.Visibility != state.VisibilityNamespace {
		t.Errorf("visibility %v", got.Visibility)
	}
}

func TestConvertAuthorization(t *testing.T) {
	exact := func(s string) *securityapi.StringMatch {
		return &securityapi.StringMatch{MatchType: &securityapi.StringMatch_Exact{Exact: s}}
	}
	in := &securityapi.Authorization{
		Name: "p", Namespace: "ns", Scope: securityapi.Scope_WORKLOAD_SELECTOR, Action: securityapi.Action_DENY, DryRun: true,
		Rules: []*securityapi.Rule{{Clauses: []*securityapi.Clause{{Matches: []*securityapi.Match{{
			Namespaces:      []*securityapi.StringMatch{exact("a"), {}}, // no variant: dropped
			NotNamespaces:   []*securityapi.StringMatch{{MatchType: &securityapi.StringMatch_Prefix{Prefix: "kube-"}}},
			Principals:      []*securityapi.StringMatch{{MatchType: &securityapi.StringMatch_Suffix{Suffix: "/sa/x"}}},
			NotPrincipals:   []*securityapi.StringMatch{{MatchType: &securityapi.StringMatch_Presence{Presence: &emptypb.Empty{}}}},
			ServiceAccounts: []*securityapi.ServiceAccountMatch{{Namespace: "ns", ServiceAccount: "sa"}},
			SourceIps: []*securityapi.Address{
				{Address: ip4("10.0.0.0"), Length: 8},
				{Address: []byte{1, 2, 3}, Length: 8},  // bad address: dropped
				{Address: ip4("10.0.0.0"), Length: 33}, // too long: dropped
			},
			NotSourceIps:        []*securityapi.Address{{Address: ip16("fd00::"), Length: 8}},
			DestinationIps:      []*securityapi.Address{{Address: ip4("192.0.2.1"), Length: 32}},
			NotDestinationIps:   []*securityapi.Address{{Address: ip4("192.0.2.2"), Length: 256 + 32}}, // truncates to 32
			DestinationPorts:    []uint32{80, 65536 + 443},
			NotDestinationPorts: []uint32{9999},
		}, {
			SourceIps: []*securityapi.Address{{Address: []byte{1}}}, // nothing left: never matches
		}}}}}, {}},
	}
	want := &state.Policy{
		Name: "p", Namespace: "ns", Scope: state.ScopeWorkloadSelector, Action: state.ActionDeny, DryRun: true,
		Rules: [][][]state.Match{{{{
			Namespaces:          []state.StringMatch{{Kind: state.MatchExact, Value: "a"}},
			NotNamespaces:       []state.StringMatch{{Kind: state.MatchPrefix, Value: "kube-"}},
			Principals:          []state.StringMatch{{Kind: state.MatchSuffix, Value: "/sa/x"}},
			NotPrincipals:       []state.StringMatch{{Kind: state.MatchPresence}},
			ServiceAccounts:     []state.ServiceAccountMatch{{Namespace: "ns", ServiceAccount: "sa"}},
			SourceIPs:           []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
			NotSourceIPs:        []netip.Prefix{netip.MustParsePrefix("fd00::/8")},
			DestinationIPs:      []netip.Prefix{netip.MustParsePrefix("192.0.2.1/32")},
			NotDestinationIPs:   []netip.Prefix{netip.MustParsePrefix("192.0.2.2/32")},
			DestinationPorts:    []uint16{80, 443},
			NotDestinationPorts: []uint16{9999},
		}, {}}}, {}},
	}
	got, err := ConvertAuthorization(in)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
	if !got.Rules[0][0][1].IsEmpty() {
		t.Error("a match whose only values were dropped is not empty")
	}
}

func TestConvertRejects(t *testing.T) {
	wl := func(mod func(*workloadapi.Workload)) *workloadapi.Address {
		w := &workloadapi.Workload{Uid: "u", Namespace: "ns", Addresses: [][]byte{ip4("10.0.0.1")}}
		mod(w)
		return &workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: w}}
	}
	svc := func(mod func(*workloadapi.Service)) *workloadapi.Address {
		s := &workloadapi.Service{Name: "s", Namespace: "ns", Hostname: "s.ns.svc"}
		mod(s)
		return &workloadapi.Address{Type: &workloadapi.Address_Service{Service: s}}
	}
	pol := func(mod func(*securityapi.Authorization)) *securityapi.Authorization {
		p := &securityapi.Authorization{Name: "p", Namespace: "ns"}
		mod(p)
		return p
	}
	length := uint32(40)
	for _, tc := range []struct {
		name string
		msg  proto.Message
		want string
	}{
		{"legacy istio mtls", wl(func(w *workloadapi.Workload) { w.TunnelProtocol = workloadapi.TunnelProtocol_LEGACY_ISTIO_MTLS }), "legacy istio mtls"},
		{"unknown tunnel protocol", wl(func(w *workloadapi.Workload) { w.TunnelProtocol = 3 }), "tunnel protocol"},
		{"unknown status", wl(func(w *workloadapi.Workload) { w.Status = 2 }), "status"},
		{"unknown network mode", wl(func(w *workloadapi.Workload) { w.NetworkMode = 2 }), "network mode"},
		{"unknown app tunnel", wl(func(w *workloadapi.Workload) {
			w.ApplicationTunnel = &workloadapi.ApplicationTunnel{Protocol: 5}
		}), "application tunnel"},
		{"bad address", wl(func(w *workloadapi.Workload) { w.Addresses = [][]byte{{1, 2, 3, 4, 5}} }), "5 bytes"},
		{"empty uid", wl(func(w *workloadapi.Workload) { w.Uid = "" }), "uid is empty"},
		{"service key", wl(func(w *workloadapi.Workload) { w.Services = map[string]*workloadapi.PortList{"nohost": {}} }), "namespace/hostname"},
		{"waypoint without destination", wl(func(w *workloadapi.Workload) { w.Waypoint = &workloadapi.GatewayAddress{} }), "no destination"},
		{"gateway bad address", wl(func(w *workloadapi.Workload) {
			w.NetworkGateway = &workloadapi.GatewayAddress{Destination: &workloadapi.GatewayAddress_Address{Address: &workloadapi.NetworkAddress{}}}
		}), "0 bytes"},
		{"no address type", &workloadapi.Address{}, "unknown address type"},
		{"empty hostname", svc(func(s *workloadapi.Service) { s.Hostname = "" }), "hostname is empty"},
		{"cidr too long", svc(func(s *workloadapi.Service) {
			s.Addresses = []*workloadapi.NetworkAddress{{Address: ip4("10.0.0.0"), Length: &length}}
		}), "too long"},
		{"unspecified scope", svc(func(s *workloadapi.Service) {
			s.LoadBalancing = &workloadapi.LoadBalancing{RoutingPreference: []workloadapi.LoadBalancing_Scope{0}}
		}), "routing preference"},
		{"unknown lb mode", svc(func(s *workloadapi.Service) { s.LoadBalancing = &workloadapi.LoadBalancing{Mode: 9} }), "mode"},
		{"unknown health policy", svc(func(s *workloadapi.Service) { s.LoadBalancing = &workloadapi.LoadBalancing{HealthPolicy: 9} }), "health policy"},
		{"unknown ip families", svc(func(s *workloadapi.Service) { s.IpFamilies = 9 }), "ip families"},
		{"weighted waypoint without destination", svc(func(s *workloadapi.Service) {
			s.WeightedWaypoints = []*workloadapi.WeightedWaypoint{{Weight: 1}}
		}), "no destination"},
		{"policy without name", pol(func(p *securityapi.Authorization) { p.Name = "" }), "name is empty"},
		{"namespace scope without namespace", pol(func(p *securityapi.Authorization) {
			p.Namespace, p.Scope = "", securityapi.Scope_NAMESPACE
		}), "no namespace"},
		{"unknown scope", pol(func(p *securityapi.Authorization) { p.Scope = 3 }), "scope"},
		{"unknown action", pol(func(p *securityapi.Authorization) { p.Action = 2 }), "action"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			switch m := tc.msg.(type) {
			case *workloadapi.Address:
				_, _, err = ConvertAddress(m)
			case *securityapi.Authorization:
				_, err = ConvertAuthorization(m)
			}
			if !errors.Is(err, ErrInvalidResource) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want ErrInvalidResource mentioning %q", err, tc.want)
			}
		})
	}
	if _, _, err := ConvertAddress(wl(func(w *workloadapi.Workload) { w.TunnelProtocol = 2 })); !errors.Is(err, ErrLegacyIstioMTLS) {
		t.Errorf("legacy: %v, want ErrLegacyIstioMTLS", err)
	}
}
