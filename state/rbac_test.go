package state

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/internal/fuzzseed"
)

// The destination of every RBAC case: ns1/dst on 10.0.0.2, target port 8080.
func rbacDst(policyKeys ...string) *Workload {
	return &Workload{
		UID: "cluster1//v1/Pod/ns1/dst", Name: "dst",
		Addresses: []netip.Addr{netip.MustParseAddr("10.0.0.2")},
		Protocol:  ProtocolHBONE,
		Extra:     &WorkloadExtra{AuthorizationPolicies: policyKeys},
		Capacity:  1,
		Labels:    &WorkloadLabels{Namespace: "ns1", ServiceAccount: "dst"},
	}
}

var clientID = identity.Identity{TrustDomain: "cluster.local", Namespace: "client", ServiceAccount: "sleep"}

// mtls is a connection from client/sleep at 10.0.0.1 to 10.0.0.2:8080.
func mtls() Conn {
	return Conn{
		Src:         netip.MustParseAddrPort("10.0.0.1:34567"),
		Dst:         netip.MustParseAddrPort("10.0.0.2:8080"),
		SrcIdentity: clientID,
	}
}

// plaintext is the same connection without an identity.
func plaintext() Conn { c := mtls(); c.SrcIdentity = identity.Identity{}; return c }

func pol(action Action, scope Scope, ns, name string, rules ...[][]Match) *Policy {
	if rules == nil {
		rules = [][][]Match{}
	}
	return &Policy{Name: name, Namespace: ns, Scope: scope, Action: action, Rules: rules}
}

// allowNS and denyNS build NAMESPACE policies in ns1 with one rule of one clause.
func allowNS(name string, matches ...Match) *Policy {
	return pol(ActionAllow, ScopeNamespace, "ns1", name, [][]Match{matches})
}
func denyNS(name string, matches ...Match) *Policy {
	return pol(ActionDeny, ScopeNamespace, "ns1", name, [][]Match{matches})
}
func dryRun(p *Policy) *Policy { p.DryRun = true; return p }

func exact(v string) StringMatch  { return StringMatch{Kind: MatchExact, Value: v} }
func prefix(v string) StringMatch { return StringMatch{Kind: MatchPrefix, Value: v} }
func suffix(v string) StringMatch { return StringMatch{Kind: MatchSuffix, Value: v} }

var presence = StringMatch{Kind: MatchPresence}

func cidrs(s ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(s))
	for i, c := range s {
		out[i] = netip.MustParsePrefix(c)
	}
	return out
}

var (
	port8080   = Match{DestinationPorts: []uint16{8080}}
	port9090   = Match{DestinationPorts: []uint16{9090}}
	nsClient   = Match{Namespaces: []StringMatch{exact("client")}}
	nsOther    = Match{Namespaces: []StringMatch{exact("other")}}
	strictDeny = Match{NotPrincipals: []StringMatch{presence}}
)

func mtlsTo(port uint16) Conn {
	c := mtls()
	c.Dst = netip.AddrPortFrom(c.Dst.Addr(), port)
	return c
}

func plaintextTo(port uint16) Conn { c := mtlsTo(port); c.SrcIdentity = identity.Identity{}; return c }

// paStrictPermissivePort is what istiod sends for a workload PeerAuthentication
// in STRICT mode with port 9090 PERMISSIVE: one rule, two clauses.
func paStrictPermissivePort() *Policy {
	return pol(ActionDeny, ScopeWorkloadSelector, "ns1", "converted_peer_authentication_pa",
		[][]Match{{strictDeny}, {{NotDestinationPorts: []uint16{9090}}}})
}

// paStrictPorts is what istiod sends for a PERMISSIVE (or unset) workload
// PeerAuthentication with STRICT ports: one rule per port.
func paStrictPorts(ports ...uint16) *Policy {
	var rules [][][]Match
	for _, port := range ports {
		rules = append(rules, [][]Match{{{DestinationPorts: []uint16{port}, NotPrincipals: []StringMatch{presence}}}})
	}
	return pol(ActionDeny, ScopeWorkloadSelector, "ns1", "pa", rules...)
}

// manyPortPolicies returns n GLOBAL DENY policies, one per port from
// 8080-n/2: enough for the list to be indexed by port.
func manyPortPolicies(n int, around uint16) []*Policy {
	var out []*Policy
	for i := range n {
		port := around - uint16(n/2) + uint16(i)
		out = append(out, pol(ActionDeny, ScopeGlobal, "istio-system", fmt.Sprintf("port-%d", port), [][]Match{{{DestinationPorts: []uint16{port}}}}))
	}
	return out
}

var (
	allowed        = Decision{Allowed: true, Reason: ReasonNoAllow}
	notAllowed     = Decision{Reason: ReasonNoAllowMatched}
	allowedBy      = func(key string) Decision { return Decision{Allowed: true, Reason: "allowed by: " + key} }
	deniedBy       = func(key string) Decision { return Decision{Policy: key, Reason: "explicitly denied by: " + key} }
	noWorkloadDeny = Decision{Reason: ReasonNoWorkload}
)

func TestAuthorize(t *testing.T) {
	tests := []struct {
		name     string
		policies []*Policy
		listed   []string // the destination's AuthorizationPolicies
		conn     Conn     // DstWorkload is filled in
		noDst    bool
		want     Decision
	}{
		// Policy selection.
		{name: "no policies allow", conn: mtls(), want: allowed},
		{name: "global policy applies", conn: mtls(),
			policies: []*Policy{pol(ActionAllow, ScopeGlobal, "istio-system", "g", [][]Match{{nsOther}})}, want: notAllowed},
		{name: "namespace policy applies in its namespace", conn: mtls(),
			policies: []*Policy{allowNS("p", nsOther)}, want: notAllowed},
		{name: "namespace policy of another namespace is ignored", conn: mtls(),
			policies: []*Policy{pol(ActionAllow, ScopeNamespace, "ns2", "p", [][]Match{{nsOther}})}, want: allowed},
		{name: "workload selector policy applies when listed", conn: mtls(), listed: []string{"ns1/sel"},
			policies: []*Policy{pol(ActionAllow, ScopeWorkloadSelector, "ns1", "sel", [][]Match{{nsOther}})}, want: notAllowed},
		{name: "workload selector policy not listed is ignored", conn: mtls(),
			policies: []*Policy{pol(ActionAllow, ScopeWorkloadSelector, "ns1", "sel", [][]Match{{nsOther}})}, want: allowed},
		{name: "listed key is found whatever its namespace", conn: mtls(), listed: []string{"other/sel"},
			policies: []*Policy{pol(ActionDeny, ScopeWorkloadSelector, "other", "sel", [][]Match{{nsClient}})}, want: deniedBy("other/sel")},
		{name: "listed but missing key is skipped", conn: mtls(), listed: []string{"ns1/missing", "ns1/sel"},
			policies: []*Policy{pol(ActionAllow, ScopeWorkloadSelector, "ns1", "sel", [][]Match{{nsClient}})}, want: allowedBy("ns1/sel")},
		{name: "a missing key alone means no allow policies", conn: mtls(), listed: []string{"ns1/missing"},
			policies: []*Policy{pol(ActionAllow, ScopeNamespace, "ns2", "elsewhere", [][]Match{{nsOther}})}, want: allowed},
		{name: "nil destination workload is denied", conn: mtls(), noDst: true, want: noWorkloadDeny},

		// Evaluation order.
		{name: "deny beats allow", conn: mtls(),
			policies: []*Policy{allowNS("a", nsClient), denyNS("d", nsClient)}, want: deniedBy("ns1/d")},
		{name: "deny not matching then allow matching allows", conn: mtls(),
			policies: []*Policy{allowNS("a", nsClient), denyNS("d", nsOther)}, want: allowedBy("ns1/a")},
		{name: "dry-run deny is ignored", conn: mtls(),
			policies: []*Policy{dryRun(denyNS("d", nsClient))}, want: allowed},
		{name: "dry-run allow is not an allow policy", conn: mtls(),
			policies: []*Policy{dryRun(allowNS("a", nsOther))}, want: allowed},
		{name: "dry-run allow matching does not rescue", conn: mtls(),
			policies: []*Policy{allowNS("a", nsOther), dryRun(allowNS("b", nsClient))}, want: notAllowed},
		{name: "no allow policies allows", conn: mtls(),
			policies: []*Policy{denyNS("d", nsOther)}, want: allowed},
		{name: "allow policies none matched denies", conn: mtls(),
			policies: []*Policy{allowNS("a", nsOther), allowNS("b", port9090)}, want: notAllowed},
		{name: "any allow matching allows", conn: mtls(),
			policies: []*Policy{allowNS("a", nsOther), allowNS("b", port8080)}, want: allowedBy("ns1/b")},
		{name: "global deny applies with namespace allow", conn: mtls(),
			policies: []*Policy{allowNS("a", nsClient), pol(ActionDeny, ScopeGlobal, "istio-system", "g", [][]Match{{port8080}})},
			want:     deniedBy("istio-system/g")},

		// Match algebra.
		{name: "rules are ORed", conn: mtls(),
			policies: []*Policy{pol(ActionAllow, ScopeNamespace, "ns1", "p", [][]Match{{nsOther}}, [][]Match{{port8080}})}, want: allowedBy("ns1/p")},
		{name: "clauses are ANDed", conn: mtls(),
			policies: []*Policy{pol(ActionAllow, ScopeNamespace, "ns1", "p", [][]Match{{nsClient}, {port9090}})}, want: notAllowed},
		{name: "clauses all matching match", conn: mtls(),
			policies: []*Policy{pol(ActionAllow, ScopeNamespace, "ns1", "p", [][]Match{{nsClient}, {port8080}})}, want: allowedBy("ns1/p")},
		{name: "empty clause is true", conn: mtls(),
			policies: []*Policy{pol(ActionAllow, ScopeNamespace, "ns1", "p", [][]Match{{}, {port8080}})}, want: allowedBy("ns1/p")},
		{name: "rule without clauses matches everything", conn: plaintext(),
			policies: []*Policy{pol(ActionDeny, ScopeNamespace, "ns1", "p", [][]Match{})}, want: deniedBy("ns1/p")},
		{name: "matches in a clause are ORed", conn: mtls(),
			policies: []*Policy{allowNS("p", nsOther, port8080)}, want: allowedBy("ns1/p")},
		{name: "match with no fields never matches", conn: mtls(),
			policies: []*Policy{allowNS("p", Match{})}, want: notAllowed},
		{name: "match with no fields in deny is a no-op", conn: mtls(),
			policies: []*Policy{denyNS("p", Match{})}, want: allowed},
		{name: "empty match is skipped, sibling still counts", conn: mtls(),
			policies: []*Policy{allowNS("p", Match{}, port8080)}, want: allowedBy("ns1/p")},
		{name: "fields are ANDed", conn: mtls(),
			policies: []*Policy{allowNS("p", Match{DestinationPorts: []uint16{8080}, Namespaces: []StringMatch{exact("other")}})}, want: notAllowed},
		{name: "fields all matching match", conn: mtls(),
			policies: []*Policy{allowNS("p", Match{DestinationPorts: []uint16{8080}, Namespaces: []StringMatch{exact("client")}})}, want: allowedBy("ns1/p")},
		{name: "values are ORed", conn: mtls(),
			policies: []*Policy{allowNS("p", Match{DestinationPorts: []uint16{80, 8080}})}, want: allowedBy("ns1/p")},
		{name: "not field fails if any value matches", conn: mtls(),
			policies: []*Policy{allowNS("p", Match{NotDestinationPorts: []uint16{80, 8080}})}, want: notAllowed},
		{name: "not field passes if no value matches", conn: mtls(),
			policies: []*Policy{allowNS("p", Match{NotDestinationPorts: []uint16{80, 9090}})}, want: allowedBy("ns1/p")},
		{name: "positive and negative of one field both apply", conn: mtls(),
			policies: []*Policy{allowNS("p", Match{Namespaces: []StringMatch{prefix("cl")}, NotNamespaces: []StringMatch{exact("client")}})}, want: notAllowed},

		// Policies without rules.
		{name: "allow without rules denies all", conn: mtls(),
			policies: []*Policy{pol(ActionAllow, ScopeNamespace, "ns1", "p")}, want: notAllowed},
		{name: "deny without rules is a no-op", conn: mtls(),
			policies: []*Policy{pol(ActionDeny, ScopeNamespace, "ns1", "p")}, want: allowed},

		// Principals: td/ns/N/sa/S without spiffe://.
		{name: "principal exact", conn: mtls(),
			policies: []*Policy{allowNS("p", Match{Principals: []StringMatch{exact("cluster.local/ns/client/sa/sleep")}})}, want: allowedBy("ns1/p")},
		{name: "principal exact with scheme does not match", conn: mtls(),
			policies: []*Policy{allowNS("p", Match{Principals: []StringMatch{exact("spiffe://cluster.local/ns/client/sa/sleep")}})}, want: notAllowed},
		{name: "principal exact other sa", conn: mtls(),
			policies: []*Policy{allowNS("p", Match{Principals: []StringMatch{exact("cluster.local/ns/client/sa/other")}})}, want: notAllowed},
		{name: "principal prefix", conn: mtls(),
			policies: []*Policy{allowNS("p", Match{Principals: []StringMatch{prefix("cluster.local/ns/client/")}})}, want: allowedBy("ns1/p")},
		{name: "principal prefix mismatch", conn: mtls(),
			policies: []*Policy{allowNS("p", Match{Principals: []StringMatch{prefix("cluster.local/ns/clients/")}})}, want: notAllowed},
		{name: "principal suffix", conn: mtls(),
			policies: []*Policy{allowNS("p", Match{Principals: []StringMatch{suffix("/sa/sleep")}})}, want: allowedBy("ns1/p")},
		{name: "principal suffix mismatch", conn: mtls(),
			policies: []*Policy{allowNS("p", Match{Principals: []StringMatch{suffix("/sa/sleepy")}})}, want: notAllowed},
		{name: "principal presence", conn: mtls(),
			policies: []*Policy{allowNS("p", Match{Principals: []StringMatch{presence}})}, want: allowedBy("ns1/p")},

		// Namespaces: the source identity's namespace.
		{name: "namespace exact", conn: mtls(),
			policies: []*Policy{allowNS("p", nsClient)}, want: allowedBy("ns1/p")},
		{name: "namespace prefix", conn: mtls(),
			policies: []*Policy{allowNS("p", Match{Namespaces: []StringMatch{prefix("cli")}})}, want: allowedBy("ns1/p")},
		{name: "namespace suffix", conn: mtls(),
			policies: []*Policy{allowNS("p", Match{Namespaces: []StringMatch{suffix("ent")}})}, want: allowedBy("ns1/p")},
		{name: "namespace presence", conn: mtls(),
			policies: []*Policy{allowNS("p", Match{Namespaces: []StringMatch{presence}})}, want: allowedBy("ns1/p")},

		// No identity.
		{name: "no identity fails principal presence", conn: plaintext(),
			policies: []*Policy{allowNS("p", Match{Principals: []StringMatch{presence}})}, want: notAllowed},
		{name: "no identity fails even an empty principal prefix", conn: plaintext(),
			policies: []*Policy{allowNS("p", Match{Principals: []StringMatch{prefix("")}})}, want: notAllowed},
		{name: "STRICT not_principals presence denies plaintext", conn: plaintext(),
			policies: []*Policy{pol(ActionDeny, ScopeGlobal, "istio-system", "istio_converted_static_strict", [][]Match{{strictDeny}})},
			want:     deniedBy("istio-system/istio_converted_static_strict")},
		{name: "STRICT not_principals presence allows mTLS", conn: mtls(),
			policies: []*Policy{pol(ActionDeny, ScopeGlobal, "istio-system", "istio_converted_static_strict", [][]Match{{strictDeny}})}, want: allowed},
		{name: "STRICT with permissive port allows plaintext to that port", conn: func() Conn {
			c := plaintext()
			c.Dst = netip.MustParseAddrPort("10.0.0.2:9090")
			return c
		}(),
			policies: []*Policy{denyNS("strict", Match{NotPrincipals: []StringMatch{presence}, NotDestinationPorts: []uint16{9090}})}, want: allowed},
		{name: "STRICT with permissive port denies plaintext to other ports", conn: plaintext(),
			policies: []*Policy{denyNS("strict", Match{NotPrincipals: []StringMatch{presence}, NotDestinationPorts: []uint16{9090}})}, want: deniedBy("ns1/strict")},
		{name: "no identity has the empty namespace", conn: plaintext(),
			policies: []*Policy{allowNS("p", Match{Namespaces: []StringMatch{exact("")}})}, want: allowedBy("ns1/p")},
		{name: "no identity fails namespace presence", conn: plaintext(),
			policies: []*Policy{allowNS("p", Match{Namespaces: []StringMatch{presence}})}, want: notAllowed},
		{name: "no identity fails service accounts", conn: plaintext(),
			policies: []*Policy{allowNS("p", Match{ServiceAccounts: []ServiceAccountMatch{{"", ""}}})}, want: notAllowed},
		{name: "no identity passes not service accounts", conn: plaintext(),
			policies: []*Policy{allowNS("p", Match{NotServiceAccounts: []ServiceAccountMatch{{"", ""}}})}, want: allowedBy("ns1/p")},

		// Service accounts: the exact (namespace, service account) pair.
		{name: "service account pair matches", conn: mtls(),
			policies: []*Policy{allowNS("p", Match{ServiceAccounts: []ServiceAccountMatch{{"client", "sleep"}}})}, want: allowedBy("ns1/p")},
		{name: "service account namespace mismatch", conn: mtls(),
			policies: []*Policy{allowNS("p", Match{ServiceAccounts: []ServiceAccountMatch{{"other", "sleep"}}})}, want: notAllowed},
		{name: "service account name mismatch", conn: mtls(),
			policies: []*Policy{allowNS("p", Match{ServiceAccounts: []ServiceAccountMatch{{"client", "other"}}})}, want: notAllowed},
		{name: "service account ignores trust domain", conn: func() Conn {
			c := mtls()
			c.SrcIdentity.TrustDomain = "example.org"
			return c
		}(),
			policies: []*Policy{allowNS("p", Match{ServiceAccounts: []ServiceAccountMatch{{"client", "sleep"}}})}, want: allowedBy("ns1/p")},
		{name: "not service accounts denies the pair", conn: mtls(),
			policies: []*Policy{allowNS("p", Match{NotServiceAccounts: []ServiceAccountMatch{{"client", "sleep"}}})}, want: notAllowed},

		// Addresses.
		{name: "source CIDR contains", conn: mtls(),
			policies: []*Policy{allowNS("p", Match{SourceIPs: cidrs("10.0.0.0/24")})}, want: allowedBy("ns1/p")},
		{name: "source CIDR does not contain", conn: mtls(),
			policies: []*Policy{allowNS("p", Match{SourceIPs: cidrs("10.1.0.0/16")})}, want: notAllowed},
		{name: "source host prefix", conn: mtls(),
			policies: []*Policy{allowNS("p", Match{SourceIPs: cidrs("10.0.0.1/32")})}, want: allowedBy("ns1/p")},
		{name: "not source CIDR", conn: mtls(),
			policies: []*Policy{allowNS("p", Match{NotSourceIPs: cidrs("10.0.0.0/8")})}, want: notAllowed},
		{name: "destination CIDR contains", conn: mtls(),
			policies: []*Policy{allowNS("p", Match{DestinationIPs: cidrs("10.0.0.2/32")})}, want: allowedBy("ns1/p")},
		{name: "destination CIDR does not contain", conn: mtls(),
			policies: []*Policy{allowNS("p", Match{DestinationIPs: cidrs("10.0.0.3/32")})}, want: notAllowed},
		{name: "not destination CIDR", conn: mtls(),
			policies: []*Policy{denyNS("p", Match{NotDestinationIPs: cidrs("10.0.0.2/32")})}, want: allowed},
		{name: "IPv6 prefix does not contain IPv4", conn: mtls(),
			policies: []*Policy{allowNS("p", Match{SourceIPs: cidrs("::/0")})}, want: notAllowed},
		{name: "IPv4-mapped source is matched as IPv4", conn: func() Conn {
			c := mtls()
			c.Src = netip.MustParseAddrPort("[::ffff:10.0.0.1]:34567")
			return c
		}(),
			policies: []*Policy{allowNS("p", Match{SourceIPs: cidrs("10.0.0.0/24")})}, want: allowedBy("ns1/p")},
		{name: "CIDR with host bits still matches its network", conn: mtls(),
			policies: []*Policy{allowNS("p", Match{SourceIPs: cidrs("10.0.0.77/24")})}, want: allowedBy("ns1/p")},

		// PeerAuthentication as istiod converts it (istio/istio
		// pilot/pkg/serviceregistry/kube/controller/ambient/testdata/peer-authn-*.yaml):
		// STRICT with a PERMISSIVE port is one rule of two clauses.
		{name: "PA STRICT+PERMISSIVE port (istiod shape) refuses plaintext", conn: plaintext(), listed: []string{"ns1/converted_peer_authentication_pa"},
			policies: []*Policy{paStrictPermissivePort()}, want: deniedBy("ns1/converted_peer_authentication_pa")},
		{name: "PA STRICT+PERMISSIVE port (istiod shape) allows mTLS", conn: mtls(), listed: []string{"ns1/converted_peer_authentication_pa"},
			policies: []*Policy{paStrictPermissivePort()}, want: allowed},
		{name: "PA STRICT+PERMISSIVE port (istiod shape) allows plaintext to the excepted port", conn: plaintextTo(9090), listed: []string{"ns1/converted_peer_authentication_pa"},
			policies: []*Policy{paStrictPermissivePort()}, want: allowed},
		{name: "PA STRICT+PERMISSIVE port (istiod shape) allows mTLS to the excepted port", conn: mtlsTo(9090), listed: []string{"ns1/converted_peer_authentication_pa"},
			policies: []*Policy{paStrictPermissivePort()}, want: allowed},
		{name: "PA STRICT+PERMISSIVE port is not applied unless listed", conn: plaintext(),
			policies: []*Policy{paStrictPermissivePort()}, want: allowed},
		{name: "PA port-level STRICT refuses plaintext to that port", conn: plaintextTo(9090), listed: []string{"ns1/pa"},
			policies: []*Policy{paStrictPorts(9090)}, want: deniedBy("ns1/pa")},
		{name: "PA port-level STRICT allows plaintext to other ports", conn: plaintext(), listed: []string{"ns1/pa"},
			policies: []*Policy{paStrictPorts(9090)}, want: allowed},
		{name: "PA port-level STRICT on two ports (one rule each) refuses the second", conn: plaintextTo(9090), listed: []string{"ns1/pa"},
			policies: []*Policy{paStrictPorts(8081, 9090)}, want: deniedBy("ns1/pa")},
		{name: "PA port-level STRICT on two ports allows mTLS to them", conn: mtlsTo(9090), listed: []string{"ns1/pa"},
			policies: []*Policy{paStrictPorts(8081, 9090)}, want: allowed},
		{name: "PA mesh STRICT with a user ALLOW: plaintext is denied before allow", conn: plaintext(),
			policies: []*Policy{
				pol(ActionDeny, ScopeGlobal, "istio-system", "istio_converted_static_strict", [][]Match{{strictDeny}}),
				allowNS("anyone", Match{NotNamespaces: []StringMatch{exact("nobody")}}),
			},
			want: deniedBy("istio-system/istio_converted_static_strict")},

		// Which policy a decision names when several match.
		{name: "namespace deny is named before global deny", conn: mtls(),
			policies: []*Policy{pol(ActionDeny, ScopeGlobal, "a", "g", [][]Match{{port8080}}), denyNS("z", port8080)}, want: deniedBy("ns1/z")},
		{name: "global deny is named before listed deny", conn: mtls(), listed: []string{"a/sel"},
			policies: []*Policy{pol(ActionDeny, ScopeWorkloadSelector, "a", "sel", [][]Match{{port8080}}), pol(ActionDeny, ScopeGlobal, "z", "g", [][]Match{{port8080}})},
			want:     deniedBy("z/g")},
		{name: "policies of one scope are named in key order", conn: mtls(),
			policies: []*Policy{allowNS("b", port8080), allowNS("a", nsClient), allowNS("c", port8080)}, want: allowedBy("ns1/a")},
		{name: "listed policies are named in listed order", conn: mtls(), listed: []string{"ns1/y", "ns1/x"},
			policies: []*Policy{pol(ActionAllow, ScopeWorkloadSelector, "ns1", "x", [][]Match{{port8080}}), pol(ActionAllow, ScopeWorkloadSelector, "ns1", "y", [][]Match{{nsClient}})},
			want:     allowedBy("ns1/y")},
		{name: "many policies on ports: the matching one among them", conn: mtls(),
			policies: manyPortPolicies(20, 8080), want: deniedBy("istio-system/port-8080")},
		{name: "many policies on ports: none on the connection's port", conn: mtlsTo(7070),
			policies: manyPortPolicies(20, 8080), want: allowed},

		// More selection edge cases.
		{name: "listed key of a namespace policy elsewhere still applies", conn: mtls(), listed: []string{"ns2/p"},
			policies: []*Policy{pol(ActionDeny, ScopeNamespace, "ns2", "p", [][]Match{{nsClient}})}, want: deniedBy("ns2/p")},
		{name: "listed key twice is harmless", conn: mtls(), listed: []string{"ns1/sel", "ns1/sel"},
			policies: []*Policy{pol(ActionAllow, ScopeWorkloadSelector, "ns1", "sel", [][]Match{{nsOther}})}, want: notAllowed},
		{name: "listed allow without rules makes allow policies exist", conn: mtls(), listed: []string{"ns1/sel"},
			policies: []*Policy{pol(ActionAllow, ScopeWorkloadSelector, "ns1", "sel")}, want: notAllowed},
		{name: "listed dry-run allow is not an allow policy", conn: mtls(), listed: []string{"ns1/sel"},
			policies: []*Policy{dryRun(pol(ActionAllow, ScopeWorkloadSelector, "ns1", "sel", [][]Match{{nsOther}}))}, want: allowed},
		{name: "listed dry-run deny is ignored", conn: mtls(), listed: []string{"ns1/sel"},
			policies: []*Policy{dryRun(pol(ActionDeny, ScopeWorkloadSelector, "ns1", "sel", [][]Match{{nsClient}}))}, want: allowed},
		{name: "clause of only empty matches never matches", conn: mtls(),
			policies: []*Policy{pol(ActionAllow, ScopeNamespace, "ns1", "p", [][]Match{{Match{}, Match{}}})}, want: notAllowed},
		{name: "one dead rule does not hide a live one", conn: mtls(),
			policies: []*Policy{pol(ActionAllow, ScopeNamespace, "ns1", "p", [][]Match{{Match{}}, {port9090}}, [][]Match{{nsClient}})}, want: allowedBy("ns1/p")},
		{name: "port condition in one clause, identity in another", conn: mtls(),
			policies: []*Policy{pol(ActionDeny, ScopeNamespace, "ns1", "p", [][]Match{{port9090, nsClient}, {port8080}})}, want: deniedBy("ns1/p")},

		// More address edge cases.
		{name: "IPv4 prefix does not contain IPv6", conn: func() Conn {
			c := mtls()
			c.Src = netip.MustParseAddrPort("[2001:db8::1]:34567")
			return c
		}(),
			policies: []*Policy{allowNS("p", Match{SourceIPs: cidrs("0.0.0.0/0")})}, want: notAllowed},
		{name: "IPv4-mapped destination is matched as IPv4", conn: func() Conn {
			c := mtls()
			c.Dst = netip.MustParseAddrPort("[::ffff:10.0.0.2]:8080")
			return c
		}(),
			policies: []*Policy{allowNS("p", Match{DestinationIPs: cidrs("10.0.0.2/32")})}, want: allowedBy("ns1/p")},
		{name: "IPv4-mapped IPv6 prefix matches no IPv4 address", conn: mtls(),
			policies: []*Policy{allowNS("p", Match{SourceIPs: cidrs("::ffff:10.0.0.0/104")})}, want: notAllowed},
		{name: "zoned IPv6 source matches its prefix", conn: func() Conn {
			c := mtls()
			c.Src = netip.MustParseAddrPort("[fe80::1%eth0]:34567")
			return c
		}(),
			policies: []*Policy{allowNS("p", Match{SourceIPs: cidrs("fe80::/10")})}, want: allowedBy("ns1/p")},
		{name: "IPv6 /64 boundary", conn: func() Conn {
			c := mtls()
			c.Src = netip.MustParseAddrPort("[2001:db8:0:1::1]:34567")
			return c
		}(),
			policies: []*Policy{allowNS("p", Match{SourceIPs: cidrs("2001:db8::/64")})}, want: notAllowed},
		{name: "missing source address matches no prefix", conn: func() Conn {
			c := mtls()
			c.Src = netip.AddrPort{}
			return c
		}(),
			policies: []*Policy{denyNS("p", Match{NotSourceIPs: cidrs("0.0.0.0/0", "::/0")})}, want: deniedBy("ns1/p")},

		// Ports: compared with the resolved target port.
		{name: "destination port is the target port", conn: mtls(),
			policies: []*Policy{allowNS("p", Match{DestinationPorts: []uint16{80}})}, want: notAllowed},
		{name: "destination port is never 15008", conn: mtls(),
			policies: []*Policy{allowNS("p", Match{DestinationPorts: []uint16{15008}})}, want: notAllowed},
		{name: "destination port matches target", conn: mtls(),
			policies: []*Policy{denyNS("p", Match{DestinationPorts: []uint16{8080}})}, want: deniedBy("ns1/p")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dst := rbacDst(tc.listed...)
			s, err := NewSnapshot([]*Workload{dst}, nil, tc.policies)
			if err != nil {
				t.Fatal(err)
			}
			c := tc.conn
			if !tc.noDst {
				c.DstWorkload = dst
			}
			if got := s.Authorize(c); got != tc.want {
				t.Errorf("Authorize = %+v, want %+v", got, tc.want)
			}
			if got := refAuthorize(tc.policies, c); got != tc.want {
				t.Errorf("reference = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestAuthorizeMissingKeyWarns(t *testing.T) {
	s, err := NewSnapshot([]*Workload{rbacDst("ns1/missing")}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	w := s.Warnings()
	if len(w) != 1 || !strings.Contains(w[0], `"ns1/missing"`) {
		t.Fatalf("warnings = %q", w)
	}
}

// obvious one on the joined string.
func TestPrincipalPieces(t *testing.T) {
	id := identity.Identity{TrustDomain: "td", Namespace: "ns", ServiceAccount: "sa"}
	full := id.Principal() // td/ns/ns/sa/sa
	var values []string
	for i := 0; i <= len(full); i++ {
		values = append(values, full[:i], full[i:], full[:i]+"x", "x"+full[i:])
	}
	values = append(values, "", full, full+"/", "spiffe://"+full)
	for _, v := range values {
		for _, kind := range []MatchKind{MatchExact, MatchPrefix, MatchSuffix, MatchPresence} {
			sm := StringMatch{Kind: kind, Value: v}
			if got, want := principalMatches(sm, &id), sm.matches(full); got != want {
				t.Errorf("%v %q: got %v, want %v", kind, v, got, want)
			}
		}
	}
}

func FuzzPrincipalMatch(f *testing.F) {
	fuzzseed.Add(f, "cluster.local", "ns", "sa", uint8(0), "cluster.local/ns/ns/sa/sa")
	fuzzseed.Add(f, "td", "a", "b", uint8(1), "td/ns/")
	fuzzseed.Add(f, "td", "a", "b", uint8(2), "/sa/b")
	f.Fuzz(func(t *testing.T, td, ns, sa string, kind uint8, v string) {
		id := identity.Identity{TrustDomain: td, Namespace: ns, ServiceAccount: sa}
		sm := StringMatch{Kind: MatchKind(kind % 4), Value: v}
		want := !id.IsZero() && sm.matches(id.Principal())
		if got := principalMatches(sm, &id); got != want {
			t.Fatalf("%v %q on %q: got %v, want %v", sm.Kind, v, id.Principal(), got, want)
		}
	})
}

func ExampleSnapshot_Authorize() {
	dst := &Workload{UID: "uid1", Name: "db", Addresses: []netip.Addr{netip.MustParseAddr("10.0.0.9")}, Labels: &WorkloadLabels{Namespace: "prod"}}
	strict := &Policy{
		Name: "strict", Namespace: "istio-system", Scope: ScopeGlobal, Action: ActionDeny,
		Rules: [][][]Match{{{{NotPrincipals: []StringMatch{{Kind: MatchPresence}}}}}},
	}
	s, _ := NewSnapshot([]*Workload{dst}, nil, []*Policy{strict})
	d := s.Authorize(Conn{
		Src:         netip.MustParseAddrPort("10.0.0.1:40000"),
		Dst:         netip.MustParseAddrPort("10.0.0.9:5432"),
		DstWorkload: dst,
	})
	fmt.Println(d.Allowed, d.Reason)
	// Output: false explicitly denied by: istio-system/strict
}

func TestPolicyGeneration(t *testing.T) {
	dst := rbacDst("ns1/sel")
	policies := func() []*Policy {
		return []*Policy{
			pol(ActionDeny, ScopeWorkloadSelector, "ns1", "sel", [][]Match{{nsClient}}),
			allowNS("a", nsOther),
		}
	}
	if g := Empty().PolicyGeneration(); g != 0 {
		t.Fatalf("empty snapshot generation %d, want 0", g)
	}
	if g := mustSnapshot(t, []*Workload{dst}, nil, nil).PolicyGeneration(); g != 0 {
		t.Fatalf("snapshot without policies has generation %d, want 0", g)
	}
	a := mustSnapshot(t, []*Workload{dst}, nil, policies())
	b := mustSnapshot(t, []*Workload{dst}, nil, policies())
	if a.PolicyGeneration() == 0 || b.PolicyGeneration() <= a.PolicyGeneration() {
		t.Fatalf("generations %d then %d: each NewSnapshot with policies needs a new, larger one", a.PolicyGeneration(), b.PolicyGeneration())
	}

	// The same Policy values again, in another order: the same table.
	same := slices.Clone(b.Policies())
	slices.Reverse(same)
	if c := mustSnapshot(t, []*Workload{dst}, nil, same); c.PolicyGeneration() != b.PolicyGeneration() {
		t.Fatalf("the same policies got generation %d, want %d", c.PolicyGeneration(), b.PolicyGeneration())
	}
	if c := mustSnapshot(t, []*Workload{dst}, nil, append(same, allowNS("more", nsClient))); c.PolicyGeneration() <= b.PolicyGeneration() {
		t.Fatal("one more policy kept the generation")
	}
	if c := mustSnapshot(t, []*Workload{dst}, nil, same[:0]); c.PolicyGeneration() != 0 {
		t.Fatal("no policies must be generation 0")
	}
	// As many values, one of them twice, are validated (and refused), not
	// taken for the same set.
	if _, err := NewSnapshot([]*Workload{dst}, nil, []*Policy{same[0], same[0]}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a repeated policy was accepted: %v", err)
	}
	if _, err := NewSnapshot([]*Workload{dst}, nil, []*Policy{same[0], nil}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a nil policy was accepted: %v", err)
	}

	// A workload-only rebuild keeps the generation and the policies.
	other := rbacDst("ns1/sel", "ns1/missing")
	other.UID, other.Addresses = "other", addrs("10.0.0.3")
	d, err := a.WithWorkloads([]*Workload{dst, other}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if d.PolicyGeneration() != a.PolicyGeneration() || !slices.Equal(d.Policies(), a.Policies()) {
		t.Fatal("WithWorkloads changed the policies")
	}
	if d.WorkloadByUID("other") == nil || len(d.Workloads()) != 2 {
		t.Fatal("WithWorkloads did not take the new workloads")
	}
	if w := d.Warnings(); len(w) != 1 || !strings.Contains(w[0], `"ns1/missing"`) {
		t.Fatalf("WithWorkloads warnings = %q", w)
	}
	c := mtls()
	c.DstWorkload = other
	if got := d.Authorize(c); got != deniedBy("ns1/sel") {
		t.Fatalf("derived snapshot: %+v", got)
	}

	// It validates like NewSnapshot.
	if _, err := a.WithWorkloads([]*Workload{dst, dst}, nil); !errors.Is(err, ErrInvalid) {
		t.Fatalf("duplicate workloads: err = %v", err)
	}
}
