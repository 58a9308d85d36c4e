package state

import (
	"net/netip"
	"strconv"
	"testing"
)

// ztunnelBenchPolicies builds the policy set of ztunnel's own rbac benchmark
// (benches/throughput.rs): n GLOBAL DENY policies of 10 rules, each rule one
// clause of one match with three namespace and three principal matchers
// (prefix, suffix, exact), a source and a destination CIDR, and one
// destination port. port is that destination port (ztunnel uses 0).
func ztunnelBenchPolicies(n int, port uint16) []*Policy {
	net := netip.MustParsePrefix("198.51.100.0/24")
	policies := make([]*Policy, n)
	for i := range policies {
		rules := make([][][]Match, 10)
		for r := range rules {
			rules[r] = [][]Match{{{
				Namespaces: []StringMatch{
					{MatchPrefix, "random-prefix-2b123"}, {MatchSuffix, "random-postix-2b723"}, {MatchExact, "random-exac-2bc13"},
				},
				Principals: []StringMatch{
					{MatchPrefix, "random-prefix-2b123"}, {MatchSuffix, "random-postix-2b723"}, {MatchExact, "random-exac-2bc13"},
				},
				SourceIPs:        []netip.Prefix{net},
				DestinationIPs:   []netip.Prefix{net},
				DestinationPorts: []uint16{port},
			}}}
		}
		policies[i] = &Policy{
			Name: "policy " + strconv.Itoa(i), Namespace: "default",
			Scope: ScopeGlobal, Action: ActionDeny, Rules: rules,
		}
	}
	return policies
}

// ztunnelBenchWorkload is ztunnel's test_default_workload: 127.0.0.1, no
// namespace, no selector policies.
func ztunnelBenchWorkload() *Workload {
	return &Workload{
		UID: "bench", Addresses: []netip.Addr{netip.MustParseAddr("127.0.0.1")},
		Labels: &WorkloadLabels{ServiceAccount: "default", TrustDomain: "cluster.local"}, Capacity: 1,
	}
}

// BenchmarkAuthorize10k measures evaluation against 10,000 policies x 10
// rules (all denying nothing). "ztunnel" is ztunnel's exact shape: the
// connection's port is not the policies' port, so the port index skips every
// policy. "port-hit" puts the connection on the policies' port, so every
// policy is visited and rejected by its destination-address guard; "-mtls"
// adds a source identity. "all-rules" also puts both addresses in the
// policies' CIDR, so that every match of every rule is evaluated down to
// its namespace and principal matchers: the worst case for this shape.
func BenchmarkAuthorize10k(b *testing.B) {
	for _, bc := range []struct {
		name     string
		port     uint16
		withID   bool
		src, dst string
	}{
		{"ztunnel", 0, false, "127.0.0.1", "127.0.0.2"},
		{"port-hit", 12345, false, "127.0.0.1", "127.0.0.2"},
		{"port-hit-mtls", 12345, true, "127.0.0.1", "127.0.0.2"},
		{"all-rules", 12345, false, "198.51.100.1", "198.51.100.2"},
		{"all-rules-mtls", 12345, true, "198.51.100.1", "198.51.100.2"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			w := ztunnelBenchWorkload()
			s, err := NewSnapshot([]*Workload{w}, nil, ztunnelBenchPolicies(10000, bc.port))
			if err != nil {
				b.Fatal(err)
			}
			c := Conn{
				Src:         netip.AddrPortFrom(netip.MustParseAddr(bc.src), 12345),
				Dst:         netip.AddrPortFrom(netip.MustParseAddr(bc.dst), 12345),
				DstWorkload: w,
			}
			if bc.withID {
				c.SrcIdentity = clientID
			}
			if d := s.Authorize(c); d != allowed {
				b.Fatalf("decision %+v", d)
			}
			b.ReportAllocs()
			for b.Loop() {
				s.Authorize(c)
			}
		})
	}
}

// BenchmarkCompile10k measures NewSnapshot with 10,000 policies x 10 rules
// and no workloads: the cost of validating and compiling the policy table.
// "reuse" passes the same Policy values again, which reuses the table.
func BenchmarkCompile10k(b *testing.B) {
	// Two sets of distinct values, alternated, so that every call compiles.
	sets := [2][]*Policy{ztunnelBenchPolicies(10000, 0), ztunnelBenchPolicies(10000, 0)}
	b.Run("compile", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			i++
			if _, err := NewSnapshot(nil, nil, sets[i%2]); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("reuse", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := NewSnapshot(nil, nil, sets[0]); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkAuthorizeMesh: the scale test's policy shape, 2,000 policies over
// 1,000 namespaces (a quarter namespace-scoped, the rest selecting
// workloads), and a connection to a workload of a namespace with a
// NAMESPACE policy that lists its selector policy: the lookups by
// namespace and by key that a mesh's connections pay.
func BenchmarkAuthorizeMesh(b *testing.B) {
	var policies []*Policy
	for i := range 2000 {
		ns := "ns-" + strconv.Itoa(i%1000)
		scope := ScopeWorkloadSelector
		if i%4 == 3 {
			scope = ScopeNamespace
		}
		policies = append(policies, &Policy{Name: "p" + strconv.Itoa(i), Namespace: ns, Scope: scope, Action: ActionAllow,
			Rules: [][][]Match{{{{Principals: []StringMatch{{MatchExact, "cluster.local/ns/" + ns + "/sa/a"}, {MatchPrefix, "cluster.local/ns/" + ns + "/"}}}}}}})
	}
	// The destination's namespace has a NAMESPACE policy, and it lists its
	// selector policy.
	policies = append(policies,
		&Policy{Name: "nsp", Namespace: "ns1", Scope: ScopeNamespace, Action: ActionAllow,
			Rules: [][][]Match{{{{Principals: []StringMatch{{MatchPrefix, "cluster.local/ns/ns1/"}}}}}}},
		&Policy{Name: "sel", Namespace: "ns1", Scope: ScopeWorkloadSelector, Action: ActionAllow,
			Rules: [][][]Match{{{{Principals: []StringMatch{{MatchExact, "cluster.local/ns/ns1/sa/a"}}}}}}})
	w := rbacDst("ns1/sel")
	s, err := NewSnapshot([]*Workload{w}, nil, policies)
	if err != nil {
		b.Fatal(err)
	}
	c := Conn{
		Src: netip.AddrPortFrom(netip.MustParseAddr("10.0.0.1"), 12345), Dst: netip.AddrPortFrom(netip.MustParseAddr("10.0.0.2"), 8080),
		DstWorkload: w, SrcIdentity: clientID,
	}
	if d := s.Authorize(c); d.Allowed {
		b.Fatalf("decision %+v", d)
	}
	b.ReportAllocs()
	for b.Loop() {
		s.Authorize(c)
	}
}
