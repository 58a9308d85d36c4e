package state

import (
	"slices"
	"testing"
)

func TestDryRunMatches(t *testing.T) {
	dst := rbacDst("ns1/sel")
	policies := []*Policy{
		dryRun(allowNS("allow-match", nsClient)),
		dryRun(allowNS("allow-nomatch", nsOther)),
		dryRun(denyNS("deny-match", port8080)),
		denyNS("enforced-deny", port9090),
		dryRun(pol(ActionDeny, ScopeWorkloadSelector, "ns1", "sel", [][]Match{{nsClient}})),
		dryRun(pol(ActionDeny, ScopeNamespace, "ns2", "other-ns", [][]Match{{nsClient}})),
	}
	s, err := NewSnapshot([]*Workload{dst}, nil, policies)
	if err != nil {
		t.Fatal(err)
	}
	c := mtls()
	c.DstWorkload = dst
	var keys []string
	for _, p := range s.DryRunMatches(c) {
		keys = append(keys, p.Key())
	}
	want := []string{"ns1/deny-match", "ns1/sel", "ns1/allow-match"}
	if !slices.Equal(keys, want) {
		t.Fatalf("DryRunMatches = %q, want %q", keys, want)
	}
	if d := s.Authorize(c); d != allowed {
		t.Fatalf("dry-run policies changed the decision: %+v", d)
	}
}

// TestPrincipalPieces checks the piecewise principal comparison against the
// TestDryRunWouldDeny: ztunnel's "dry-run: no allow policies match" is
// logged only when no enforced ALLOW applies, a dry-run ALLOW does, and no
// dry-run ALLOW matches.
func TestDryRunWouldDeny(t *testing.T) {
	for _, tc := range []struct {
		name     string
		policies []*Policy
		want     bool
	}{
		{"no policies", nil, false},
		{"dry-run allow that does not match", []*Policy{dryRun(allowNS("a", nsOther))}, true},
		{"dry-run allow that matches", []*Policy{dryRun(allowNS("a", nsOther)), dryRun(allowNS("b", nsClient))}, false},
		{"an enforced allow applies", []*Policy{dryRun(allowNS("a", nsOther)), allowNS("b", nsClient)}, false},
		{"only a dry-run deny", []*Policy{dryRun(denyNS("d", nsClient))}, false},
		{"dry-run allow of another namespace", []*Policy{dryRun(pol(ActionAllow, ScopeNamespace, "ns2", "a", [][]Match{{nsOther}}))}, false},
		{"listed dry-run allow", []*Policy{dryRun(pol(ActionAllow, ScopeWorkloadSelector, "ns1", "sel", [][]Match{{nsOther}}))}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst := rbacDst("ns1/sel")
			s, err := NewSnapshot([]*Workload{dst}, nil, tc.policies)
			if err != nil {
				t.Fatal(err)
			}
			c := mtls()
			c.DstWorkload = dst
			if got := s.DryRunWouldDeny(c, s.DryRunMatches(c)); got != tc.want {
				t.Errorf("DryRunWouldDeny = %v, want %v", got, tc.want)
			}
			if d := s.Authorize(c); !d.Allowed {
				t.Errorf("dry-run policies changed the decision: %+v", d)
			}
		})
	}
}
