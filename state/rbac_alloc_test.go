package state

import (
	"fmt"
	"testing"
)

// fivePolicies is the shape a typical workload sees: a STRICT mesh policy, a
// namespace ALLOW with a few principals, a port DENY, a selector ALLOW and a
// dry-run policy.
func fivePolicies() (*Workload, []*Policy) {
	dst := rbacDst("ns1/sel")
	return dst, []*Policy{
		pol(ActionDeny, ScopeGlobal, "istio-system", "istio_converted_static_strict", [][]Match{{strictDeny}}),
		allowNS("allow-frontends", Match{Principals: []StringMatch{
			exact("cluster.local/ns/web/sa/frontend"), prefix("cluster.local/ns/batch/"), exact("cluster.local/ns/client/sa/sleep"),
		}}),
		denyNS("deny-admin-port", Match{DestinationPorts: []uint16{9000, 9001}}),
		pol(ActionAllow, ScopeWorkloadSelector, "ns1", "sel", [][]Match{{Match{SourceIPs: cidrs("192.168.0.0/16")}}}),
		dryRun(denyNS("dry", Match{Namespaces: []StringMatch{exact("legacy")}})),
	}
}

func TestAuthorizeNoAllocs(t *testing.T) {
	dst, policies := fivePolicies()
	s, err := NewSnapshot([]*Workload{dst}, nil, policies)
	if err != nil {
		t.Fatal(err)
	}
	c := mtls()
	c.DstWorkload = dst
	if d := s.Authorize(c); d != allowedBy("ns1/allow-frontends") {
		t.Fatalf("decision %+v", d)
	}
	for _, c := range []Conn{c, func() Conn { p := plaintext(); p.DstWorkload = dst; return p }()} {
		if n := testing.AllocsPerRun(100, func() { s.Authorize(c) }); n != 0 {
			t.Errorf("Authorize allocates %v times", n)
		}
		if n := testing.AllocsPerRun(100, func() { s.DryRunMatches(c) }); n != 0 {
			t.Errorf("DryRunMatches allocates %v times", n)
		}
	}
}

// TestAuthorizeNoAllocsIndexed covers the other paths: port-indexed lists
// and more listed ALLOW policies than Authorize remembers.
func TestAuthorizeNoAllocsIndexed(t *testing.T) {
	policies := manyPortPolicies(20, 8080)
	var listed []string
	for i := range 6 {
		name := fmt.Sprintf("sel%d", i)
		policies = append(policies, pol(ActionAllow, ScopeWorkloadSelector, "ns1", name, [][]Match{{nsOther}}))
		listed = append(listed, "ns1/"+name)
	}
	dst := rbacDst(listed...)
	s, err := NewSnapshot([]*Workload{dst}, nil, policies)
	if err != nil {
		t.Fatal(err)
	}
	c := mtlsTo(7070)
	c.DstWorkload = dst
	if d := s.Authorize(c); d != notAllowed {
		t.Fatalf("decision %+v", d)
	}
	if n := testing.AllocsPerRun(100, func() { s.Authorize(c) }); n != 0 {
		t.Errorf("Authorize allocates %v times", n)
	}
}

func BenchmarkAuthorize(b *testing.B) {
	dst, policies := fivePolicies()
	s, err := NewSnapshot([]*Workload{dst}, nil, policies)
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name string
		conn Conn
	}{
		{"allowed", mtls()},
		{"denied-plaintext", plaintext()},
		{"not-allowed", func() Conn {
			c := mtls()
			c.SrcIdentity.Namespace = "stranger"
			return c
		}()},
	} {
		b.Run(bc.name, func(b *testing.B) {
			c := bc.conn
			c.DstWorkload = dst
			b.ReportAllocs()
			for b.Loop() {
				s.Authorize(c)
			}
		})
	}
}
