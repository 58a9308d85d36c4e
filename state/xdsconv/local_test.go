package xdsconv

import (
	"errors"
	"net/netip"
	"os"
	"reflect"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/internal/fuzzseed"
	"github.com/ztunnel-go/ztunnel/state"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func readFixture(t testing.TB, name string) []byte {
	t.Helper()
	data, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func mustLocal(t testing.TB, data []byte) *state.Snapshot {
	t.Helper()
	s, err := LocalSnapshot(data)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestLocalhostFixture(t *testing.T) {
	s := mustLocal(t, readFixture(t, "localhost.yaml"))
	if n := len(s.Workloads()); n != 2 {
		t.Fatalf("%d workloads", n)
	}
	hb := s.WorkloadByAddr("", netip.MustParseAddr("127.0.0.1"))
	tcp := s.WorkloadByAddr("", netip.MustParseAddr("127.0.0.2"))
	if hb == nil || hb.Protocol != state.ProtocolHBONE || tcp == nil || tcp.Protocol != state.ProtocolTCP {
		t.Fatalf("workloads: %+v %+v", hb, tcp)
	}
	first := s.ServiceByVIP("", netip.MustParseAddr("127.10.0.1"))
	second := s.ServiceByVIP("remote", netip.MustParseAddr("127.10.0.2"))
	if first == nil || first.Key() != "default/first.example" || second == nil || second.Key() != "default/second.example" {
		t.Fatalf("services: %v %v", first, second)
	}
	if eps := s.Endpoints(first); len(eps) != 2 {
		t.Fatalf("endpoints: %+v", eps)
	}
	// The namespace ALLOW with notDestinationPorts [9999] refuses only 9999.
	conn := state.Conn{Src: netip.MustParseAddrPort("127.0.0.2:5000"), DstWorkload: hb}
	for port, want := range map[uint16]bool{8080: true, 9999: false} {
		conn.Dst = netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port)
		if d := s.Authorize(conn); d.Allowed != want {
			t.Errorf("port %d: %+v", port, d)
		}
	}
}

func TestExampleFixture(t *testing.T) {
	s := mustLocal(t, readFixture(t, "example.yaml"))
	if len(s.Workloads()) != 5 || len(s.Services()) != 1 || len(s.Policies()) != 2 {
		t.Fatalf("counts: %d workloads, %d services, %d policies", len(s.Workloads()), len(s.Services()), len(s.Policies()))
	}
	if w := s.Warnings(); len(w) != 0 {
		t.Fatalf("warnings: %q", w)
	}
	nodes := map[string]int{}
	for _, w := range s.Workloads() {
		nodes[w.Node()]++
	}
	if nodes["node1"] != 2 || nodes["node2"] != 3 {
		t.Fatalf("nodes: %v", nodes)
	}
	echo := s.ServiceByVIP("", netip.MustParseAddr("10.96.0.10"))
	if echo == nil || len(s.Endpoints(echo)) != 2 {
		t.Fatalf("echo service: %v", echo)
	}
	if db := s.WorkloadByAddr("", netip.MustParseAddr("10.244.2.20")); db == nil || db.Protocol != state.ProtocolTCP {
		t.Fatalf("db: %+v", db)
	}
	server := s.FindWorkload(state.WorkloadInfo{Namespace: "demo", Name: "server-b", ServiceAccount: "server"})
	if server == nil {
		t.Fatal("server-b not found")
	}
	for _, tc := range []struct {
		from   string
		port   uint16
		reason string
	}{
		{"client-a", 8080, "allowed by: demo/allow-client"},
		{"client-b", 8080, state.ReasonNoAllowMatched},
		{"client-a", 9999, "explicitly denied by: demo/deny-admin-port"},
	} {
		src := s.FindWorkload(state.WorkloadInfo{Namespace: "demo", Name: tc.from, ServiceAccount: map[string]string{"client-a": "client", "client-b": "intruder"}[tc.from]})
		if src == nil {
			t.Fatalf("%s not found", tc.from)
		}
		d := s.Authorize(state.Conn{
			Src:         netip.AddrPortFrom(src.Addresses[0], 40000),
			Dst:         netip.AddrPortFrom(server.Addresses[0], tc.port),
			SrcIdentity: src.Identity(),
			DstWorkload: server,
		})
		if d.Reason != tc.reason {
			t.Errorf("%s -> server-b:%d: %+v, want %q", tc.from, tc.port, d, tc.reason)
		}
	}
}

func addr(s string) netip.Addr { return netip.MustParseAddr(s) }

// TestAllFields checks that every field of the file lands in state.
func TestAllFields(t *testing.T) {
	cfg, err := ParseLocalConfig(readFixture(t, "allfields.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	wantWorkloads := []*state.Workload{
		{
			UID: "c1//v1/Pod/ns1/full", Name: "full",
			Labels: &state.WorkloadLabels{Namespace: "ns1", ServiceAccount: "sa1", Network: "net1", WorkloadName: "full-deploy", WorkloadType: "deployment", CanonicalName: "full-app", CanonicalRevision: "v2",
				TrustDomain: "example.org", ClusterID: "c1"},
			Addresses:   []netip.Addr{addr("10.0.0.1"), addr("fd00::1")},
			Protocol:    state.ProtocolHBONE,
			Status:      state.Unhealthy,
			NetworkMode: state.NetworkModeHostNetwork,
			Extra: &state.WorkloadExtra{
				Hostname: "full.example",
				Waypoint: &state.GatewayAddress{
					Hostname: &state.NamespacedHostname{Namespace: "ns1", Hostname: "waypoint.ns1.svc.cluster.local"}, HBONEMTLSPort: 15008,
				},
				NetworkGateway: &state.GatewayAddress{
					Address: &state.NetworkAddress{Network: "net2", Addr: addr("192.0.2.1")}, HBONEMTLSPort: 15009,
				},
				ApplicationTunnel:     &state.ApplicationTunnel{Protocol: state.AppTunnelProxy, Port: 15088},
				AuthorizationPolicies: []string{"ns1/sel", "ns1/missing"},
			},
			NativeTunnel: true,
			Services:     state.ServicesOf(map[string]map[uint16]uint16{"ns1/svc.ns1.svc.cluster.local": {80: 8080, 443: 8443}}),
			Capacity:     7,
			Place:        &state.Placement{Node: "node1", Locality: state.Locality{Region: "r1", Zone: "z1", Subzone: "s1"}},
		},
		{
			UID: "c1//v1/Pod/ns1/minimal", Addresses: []netip.Addr{}, Capacity: 1,
			// Folded in from the service's inline endpoints.
			Services: state.ServicesOf(map[string]map[uint16]uint16{"ns1/svc.ns1.svc.cluster.local": {80: 9090}}),
			Labels:   &state.WorkloadLabels{Namespace: "ns1"},
		},
	}
	wantServices := []*state.Service{{
		Name: "svc", Namespace: "ns1", Hostname: "svc.ns1.svc.cluster.local",
		VIPs:  []state.NetworkAddress{{Network: "", Addr: addr("10.96.0.1")}, {Network: "net1", Addr: addr("fd00:96::1")}},
		Ports: map[uint16]uint16{80: 8080, 443: 0},
		Waypoint: &state.GatewayAddress{
			Address: &state.NetworkAddress{Network: "", Addr: addr("10.0.0.99")}, HBONEMTLSPort: 15008,
		},
		IPFamilies: state.IPFamiliesDual,
		Canonical:  true,
		Visibility: state.VisibilityNamespace,
		Extra: &state.ServiceExtra{CIDRVIPs: []state.NetworkPrefix{{Network: "net1", Prefix: netip.MustParsePrefix("10.97.0.0/16")}}, SubjectAltNames: []string{"spiffe://example.org/ns/ns1/sa/sa1"}, WeightedWaypoints: []state.WeightedWaypoint{{
			Destination: state.GatewayAddress{Hostname: &state.NamespacedHostname{Namespace: "ns1", Hostname: "wp-canary"}, HBONEMTLSPort: 15008},
			Weight:      10,
		}}, LoadBalancer: &state.LoadBalancer{
			RoutingPreferences: []state.LBScope{state.LBScopeNetwork, state.LBScopeRegion, state.LBScopeZone, state.LBScopeSubzone, state.LBScopeNode, state.LBScopeCluster},
			Mode:               state.LBModeFailover,
			HealthPolicy:       state.LBAllowAll,
		}},
	}}
	presence := state.StringMatch{Kind: state.MatchPresence}
	wantPolicies := []*state.Policy{
		{
			Name: "sel", Namespace: "ns1", Scope: state.ScopeWorkloadSelector, Action: state.ActionDeny, DryRun: true,
			Rules: [][][]state.Match{
				{
					{
						{
							Namespaces:          []state.StringMatch{{Kind: state.MatchExact, Value: "ns2"}, {Kind: state.MatchPrefix, Value: "team-"}},
							NotNamespaces:       []state.StringMatch{{Kind: state.MatchSuffix, Value: "-test"}},
							Principals:          []state.StringMatch{presence, {Kind: state.MatchExact, Value: "example.org/ns/ns2/sa/a"}},
							NotPrincipals:       []state.StringMatch{presence, presence, presence},
							ServiceAccounts:     []state.ServiceAccountMatch{{Namespace: "ns2", ServiceAccount: "a"}},
							NotServiceAccounts:  []state.ServiceAccountMatch{{Namespace: "ns3", ServiceAccount: "b"}},
							SourceIPs:           []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16"), netip.MustParsePrefix("10.2.0.1/32")},
							NotSourceIPs:        []netip.Prefix{netip.MustParsePrefix("fd00:1::/64")},
							DestinationIPs:      []netip.Prefix{netip.MustParsePrefix("10.0.0.1/32")},
							NotDestinationIPs:   []netip.Prefix{netip.MustParsePrefix("::1/128")},
							DestinationPorts:    []uint16{8080, 8080},
							NotDestinationPorts: []uint16{9999},
						},
						{},
					},
					{},
				},
				{},
			},
		},
		{Name: "global", Namespace: "istio-system", Scope: state.ScopeGlobal, Action: state.ActionAllow, Rules: [][][]state.Match{}},
	}
	check := func(what string, got, want any) {
		t.Helper()
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s:\n got %#v\nwant %#v", what, got, want)
		}
	}
	for i := range wantWorkloads {
		check("workload "+wantWorkloads[i].UID, cfg.Workloads[i], wantWorkloads[i])
	}
	check("services", cfg.Services, wantServices)
	for i := range wantPolicies {
		check("policy "+wantPolicies[i].Name, cfg.Policies[i], wantPolicies[i])
	}

	s, err := cfg.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if w := s.Warnings(); len(w) != 1 || !strings.Contains(w[0], "ns1/missing") {
		t.Errorf("warnings: %q", w)
	}
	if got := s.WorkloadByUID("c1//v1/Pod/ns1/full").Identity(); got != (identity.Identity{TrustDomain: "example.org", Namespace: "ns1", ServiceAccount: "sa1"}) {
		t.Errorf("identity %v", got)
	}
	svc := s.ServiceByKey("ns1/svc.ns1.svc.cluster.local")
	if eps := s.Endpoints(svc); len(eps) != 2 {
		t.Errorf("AllowAll service should keep the unhealthy endpoint: %+v", eps)
	}
	// Service port 443 maps to target 0: only "full" names its own target.
	if w, port, err := s.PickEndpoint(nil, svc, 443, nil); err != nil || w.Name != "full" || port != 8443 {
		t.Errorf("PickEndpoint 443: %v %d %v", w, port, err)
	}
}

func TestEmptyConfigs(t *testing.T) {
	for _, in := range []string{"", "\n# only a comment\n", "~", "workloads:\npolicies: []\nservices: ~\n", "---\n"} {
		cfg, err := ParseLocalConfig([]byte(in))
		if err != nil {
			t.Errorf("%q: %v", in, err)
			continue
		}
		if len(cfg.Workloads)+len(cfg.Services)+len(cfg.Policies) != 0 {
			t.Errorf("%q: not empty: %+v", in, cfg)
		}
		if _, err := cfg.Snapshot(); err != nil {
			t.Errorf("%q: %v", in, err)
		}
	}
}

const goodWorkload = `workloads:
- uid: a
  namespace: ns
  workloadIps: ["10.0.0.1"]
  services: {}
`

func TestErrors(t *testing.T) {
	tests := []struct {
		name string
		in   string
		line int    // expected ConfigError line; 0 to skip
		want string // substring of the message
	}{
		{name: "unknown top-level field", in: "workloads: []\nfooBar: 1\n", line: 2,
			want: "local config: line 2: field fooBar not found in local config"},
		{name: "unknown workload field", in: goodWorkload + "  fooBar: x\n", line: 6,
			want: "local config: line 6: workloads[0]: field fooBar not found in workload"},
		{name: "unknown match field", in: "policies:\n- name: p\n  namespace: ns\n  scope: Global\n  action: Allow\n  dryRun: false\n  rules:\n  - - - principal: [{Exact: x}]\n", line: 8,
			want: "policies[0].rules[0][0][0]: field principal not found in match"},
		{name: "unknown locality field", in: goodWorkload + "  locality: {region: r, zone: z, subzone: s, planet: earth}\n", line: 6,
			want: "field planet not found in locality"},
		{name: "field set twice", in: goodWorkload + "  uid: b\n", line: 6, want: "field uid is set twice"},
		{name: "missing required field", in: "workloads:\n- uid: a\n  workloadIps: []\n  services: {}\n", line: 2,
			want: "workloads[0]: missing field namespace in workload"},
		{name: "missing uid", in: "workloads:\n- namespace: ns\n  workloadIps: []\n  services: {}\n", line: 2, want: "missing field uid"},
		{name: "bad protocol enum", in: goodWorkload + "  protocol: hbone\n", line: 6,
			want: `workloads[0].protocol: invalid protocol "hbone": want one of TCP, HBONE`},
		{name: "legacy istio mtls is not a protocol", in: goodWorkload + "  protocol: LEGACY_ISTIO_MTLS\n", line: 6, want: "invalid protocol"},
		{name: "bad status", in: goodWorkload + "  status: Sick\n", line: 6, want: `invalid status "Sick"`},
		{name: "bad scope", in: "policies:\n- {name: p, namespace: ns, scope: Cluster, action: Allow, rules: [], dryRun: false}\n", line: 2,
			want: `policies[0].scope: invalid scope "Cluster": want one of Global, Namespace, WorkloadSelector`},
		{name: "bad action", in: "policies:\n- {name: p, namespace: ns, scope: Global, action: Audit, rules: [], dryRun: false}\n", line: 2,
			want: `invalid action "Audit"`},
		{name: "bad ip family", in: "services:\n- {name: s, namespace: ns, hostname: h, vips: [], ports: {}, ipFamilies: \"\"}\n", line: 2,
			want: "invalid ip families"},
		{name: "bad IP", in: "workloads:\n- uid: a\n  namespace: ns\n  workloadIps: [\"10.0.0.1\", \"10.0.0.300\"]\n  services: {}\n", line: 4,
			want: `workloads[0].workloadIps[1]: invalid IP address "10.0.0.300"`},
		{name: "IP with zone", in: "workloads:\n- uid: a\n  namespace: ns\n  workloadIps: [\"fe80::1%eth0\"]\n  services: {}\n", line: 4, want: "invalid IP address"},
		{name: "port out of range", in: "workloads:\n- uid: a\n  namespace: ns\n  workloadIps: []\n  services:\n    ns/h:\n      80: 70000\n", line: 7,
			want: `workloads[0].services["ns/h"]["80"]: invalid port "70000": want an integer from 0 to 65535`},
		{name: "negative port", in: "services:\n- {name: s, namespace: ns, hostname: h, vips: [], ports: {-1: 80}}\n", line: 2, want: `invalid port "-1"`},
		{name: "quoted port", in: "services:\n- {name: s, namespace: ns, hostname: h, vips: [], ports: {\"80\": 80}}\n", line: 2, want: `invalid port "80"`},
		{name: "bad policy port", in: "policies:\n- {name: p, namespace: ns, scope: Global, action: Allow, dryRun: false, rules: [[[{destinationPorts: [65536]}]]]}\n", line: 2,
			want: "destinationPorts[0]: invalid port"},
		{name: "capacity out of range", in: goodWorkload + "  capacity: 4294967296\n", line: 6, want: "invalid capacity"},
		{name: "bad VIP without network", in: "services:\n- {name: s, namespace: ns, hostname: h, vips: [\"10.0.0.1\"], ports: {}}\n", line: 2,
			want: `services[0].vips[0]: invalid network address "10.0.0.1"`},
		{name: "bad CIDR", in: "policies:\n- name: p\n  namespace: ns\n  scope: Global\n  action: Allow\n  dryRun: false\n  rules: [[[{sourceIps: [\"10.0.0.0/33\"]}]]]\n", line: 7,
			want: `invalid CIDR or IP address "10.0.0.0/33"`},
		{name: "bad string match variant", in: "policies:\n- {name: p, namespace: ns, scope: Global, action: Allow, dryRun: false, rules: [[[{principals: [{Regex: x}]}]]]}\n", line: 2,
			want: `invalid string match "Regex": want one of Exact, Prefix, Suffix, Presence`},
		{name: "string match as plain string", in: "policies:\n- {name: p, namespace: ns, scope: Global, action: Allow, dryRun: false, rules: [[[{principals: [x]}]]]}\n", line: 2,
			want: "expected a string match such as {Exact: value}"},
		{name: "presence with a value", in: "policies:\n- {name: p, namespace: ns, scope: Global, action: Allow, dryRun: false, rules: [[[{principals: [{Presence: yes}]}]]]}\n", line: 2,
			want: "Presence takes no value"},
		{name: "exact without a value", in: "policies:\n- {name: p, namespace: ns, scope: Global, action: Allow, dryRun: false, rules: [[[{principals: [{Exact: ~}]}]]]}\n", line: 2,
			want: "expected a string, got null"},
		{name: "bool expected", in: "policies:\n- {name: p, namespace: ns, scope: Global, action: Allow, dryRun: nope, rules: []}\n", line: 2,
			want: `dryRun: expected true or false, got "nope"`},
		{name: "list expected", in: "workloads: {uid: a}\n", line: 1, want: "workloads: expected a list, got a mapping"},
		{name: "mapping expected", in: "workloads: [1]\n", line: 1, want: `workloads[0]: expected a workload mapping, got "1"`},
		{name: "service key without slash", in: "workloads:\n- uid: a\n  namespace: ns\n  workloadIps: []\n  services:\n    nohost: {80: 80}\n", line: 6,
			want: `service key "nohost" is not namespace/hostname`},
		{name: "gateway without port", in: goodWorkload + "  waypoint: {destination: ns/wp}\n", line: 6, want: "missing field hboneMtlsPort in gateway address"},
		{name: "gateway destination without slash", in: goodWorkload + "  waypoint: {destination: wp, hboneMtlsPort: 15008}\n", line: 6,
			want: `invalid destination "wp"`},
		{name: "duplicate map key", in: "services:\n- {name: s, namespace: ns, hostname: h, vips: [], ports: {80: 1, 80: 2}}\n", line: 2, want: `key "80" is set twice`},
		{name: "two documents", in: "workloads: []\n---\nworkloads: []\n", line: 2, want: "more than one YAML document"},
		{name: "YAML syntax error", in: "workloads: [\n", want: "local config: yaml: line"},
		{name: "duplicate uid from state", in: goodWorkload + "- uid: a\n  namespace: ns\n  workloadIps: [\"10.0.0.2\"]\n  services: {}\n",
			want: `local config: state: invalid snapshot: workload "a": duplicate uid`},
		{name: "duplicate IP from state", in: goodWorkload + "- uid: b\n  namespace: ns\n  workloadIps: [\"10.0.0.1\"]\n  services: {}\n",
			want: `local config: state: invalid snapshot: address /10.0.0.1 is used by two workloads: "a" and "b"`},
		{name: "duplicate policy from state", in: "policies:\n- {name: p, namespace: ns, scope: Global, action: Allow, rules: [], dryRun: false}\n- {name: p, namespace: ns, scope: Global, action: Deny, rules: [], dryRun: false}\n",
			want: "duplicate policy key"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := LocalSnapshot([]byte(tc.in))
			if err == nil {
				t.Fatal("no error")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q\n lacks %q", err, tc.want)
			}
			if !strings.HasPrefix(err.Error(), "local config: ") {
				t.Errorf("error %q lacks the prefix", err)
			}
			var ce *ConfigError
			if tc.line > 0 {
				if !errors.As(err, &ce) || ce.Line != tc.line {
					t.Errorf("error %q: want a ConfigError at line %d", err, tc.line)
				}
			}
			if strings.Contains(tc.want, "state: invalid snapshot") && !errors.Is(err, state.ErrInvalid) {
				t.Errorf("error %q does not wrap state.ErrInvalid", err)
			}
		})
	}
}

func TestAliases(t *testing.T) {
	in := `
base: &w
  uid: a
  namespace: ns
  workloadIps: ["10.0.0.1"]
  services: {}
`
	// An unknown top-level key is rejected even when it only holds an anchor.
	if _, err := ParseLocalConfig([]byte(in)); err == nil || !strings.Contains(err.Error(), "field base not found") {
		t.Fatalf("anchor holder: %v", err)
	}
	in = `
workloads:
- &w
  uid: a
  namespace: ns
  workloadIps: &ips ["10.0.0.1"]
  services: &svcs {"ns/h": {80: 8080}}
- uid: b
  namespace: ns
  workloadIps: ["10.0.0.2"]
  services: *svcs
`
	cfg, err := ParseLocalConfig([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Workloads) != 2 || cfg.Workloads[1].Services.Map()["ns/h"][80] != 8080 {
		t.Fatalf("aliased services: %+v", cfg.Workloads[1])
	}
}

// TestAliasBomb makes sure a few lines of aliases cannot expand into an
// unbounded amount of work: 100 rules x 100 clauses x 100 matches x 100
// ports from a few kilobytes.
func TestAliasBomb(t *testing.T) {
	hundred := func(first, alias string) string {
		return "[" + first + strings.Repeat(", "+alias, 99) + "]"
	}
	ports := "&p [" + strings.TrimSuffix(strings.Repeat("1, ", 100), ", ") + "]"
	match := "&m {destinationPorts: " + ports + "}"
	clause := "&c " + hundred(match, "*m")
	rule := "&r " + hundred(clause, "*c")
	in := "policies:\n- {name: p, namespace: ns, scope: Global, action: Allow, dryRun: false, rules: " + hundred(rule, "*r") + "}\n"
	if len(in) > 4096 {
		t.Fatalf("bomb is %d bytes", len(in))
	}
	_, err := ParseLocalConfig([]byte(in))
	if err == nil || !strings.Contains(err.Error(), "expands to too many nodes") {
		t.Fatalf("err = %v", err)
	}
}

func FuzzParseLocalConfig(f *testing.F) {
	for _, name := range []string{"localhost.yaml", "example.yaml", "allfields.yaml"} {
		fuzzseed.Add(f, readFixture(f, name))
	}
	fuzzseed.Add(f, []byte(goodWorkload))
	fuzzseed.Add(f, []byte("policies:\n- {name: p, namespace: ns, scope: Global, action: Allow, dryRun: false, rules: [[[{principals: [!Exact x, {Presence: []}]}]]]}\n"))
	fuzzseed.Add(f, []byte("a: &a [*a]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := ParseLocalConfig(data)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "local config: ") {
				t.Fatalf("error without prefix: %v", err)
			}
			return
		}
		s, err := cfg.Snapshot()
		if err != nil {
			return
		}
		// Whatever parsed must be usable.
		for _, w := range s.Workloads() {
			s.Authorize(state.Conn{DstWorkload: w})
			for _, sp := range w.Services.List() {
				if svc := s.ServiceByKey(sp.Key); svc != nil {
					for p := range svc.Ports {
						s.PickEndpoint(w, svc, p, nil)
					}
				}
			}
		}
	})
}

func BenchmarkLocalSnapshot(b *testing.B) {
	data := readFixture(b, "example.yaml")
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := LocalSnapshot(data); err != nil {
			b.Fatal(err)
		}
	}
}
