package state

import (
	"net/netip"
)

// Scope says which workloads a policy applies to (istio.security.Scope).
type Scope uint8

const (
	// ScopeGlobal policies apply to every workload.
	ScopeGlobal Scope = iota
	// ScopeNamespace policies apply to every workload in the policy's namespace.
	ScopeNamespace
	// ScopeWorkloadSelector policies apply to the workloads that list the
	// policy's key in Workload.AuthorizationPolicies.
	ScopeWorkloadSelector
)

// String returns ztunnel's spelling: "Global", "Namespace", "WorkloadSelector".
func (s Scope) String() string {
	return enumName(s, "Scope", "Global", "Namespace", "WorkloadSelector")
}

// Action is what a matching policy does (istio.security.Action).
type Action uint8

const (
	// ActionAllow policies admit matching connections; once any enforced
	// ALLOW policy selects a workload, connections that match none are denied.
	ActionAllow Action = iota
	// ActionDeny policies refuse matching connections.
	ActionDeny
)

// String returns "Allow" or "Deny".
func (a Action) String() string {
	return enumName(a, "Action", "Allow", "Deny")
}

// Policy is one L4 authorization policy. Values reachable from a Snapshot are
// shared and must not be modified.
type Policy struct {
	Name      string
	Namespace string
	Scope     Scope
	Action    Action
	// Rules are OR-ed; each rule is a list of clauses that are AND-ed; each
	// clause is a list of matches that are OR-ed. A policy with no rules
	// never matches.
	Rules [][][]Match
	// DryRun policies never affect decisions; their matches are only reported.
	DryRun bool
}

// Key returns the policy's key, "namespace/name".
func (p *Policy) Key() string { return p.Namespace + "/" + p.Name }

// Match is one set of conditions on a connection. Set fields are AND-ed; the
// values of one field are OR-ed; a Not* field fails if any of its values
// matches. A Match with no field set never matches.
type Match struct {
	Namespaces, NotNamespaces           []StringMatch
	Principals, NotPrincipals           []StringMatch
	ServiceAccounts, NotServiceAccounts []ServiceAccountMatch
	SourceIPs, NotSourceIPs             []netip.Prefix
	DestinationIPs, NotDestinationIPs   []netip.Prefix
	DestinationPorts                    []uint16
	NotDestinationPorts                 []uint16
}

// IsEmpty reports whether no field of m is set (such a match never matches).
func (m *Match) IsEmpty() bool {
	return len(m.Namespaces) == 0 && len(m.NotNamespaces) == 0 &&
		len(m.Principals) == 0 && len(m.NotPrincipals) == 0 &&
		len(m.ServiceAccounts) == 0 && len(m.NotServiceAccounts) == 0 &&
		len(m.SourceIPs) == 0 && len(m.NotSourceIPs) == 0 &&
		len(m.DestinationIPs) == 0 && len(m.NotDestinationIPs) == 0 &&
		len(m.DestinationPorts) == 0 && len(m.NotDestinationPorts) == 0
}

// MatchKind is the comparison a StringMatch makes.
type MatchKind uint8

const (
	// MatchExact matches the whole string.
	MatchExact MatchKind = iota
	// MatchPrefix matches strings that start with Value.
	MatchPrefix
	// MatchSuffix matches strings that end with Value.
	MatchSuffix
	// MatchPresence matches any non-empty string; Value is unused.
	MatchPresence
)

// String returns ztunnel's variant name: "Exact", "Prefix", "Suffix", "Presence".
func (k MatchKind) String() string {
	return enumName(k, "MatchKind", "Exact", "Prefix", "Suffix", "Presence")
}

// StringMatch matches a namespace or a principal.
type StringMatch struct {
	Kind  MatchKind
	Value string
}

// ServiceAccountMatch matches a source identity's exact (namespace, service
// account) pair; the trust domain is not compared.
type ServiceAccountMatch struct {
	Namespace, ServiceAccount string
}
