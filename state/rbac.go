package state

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/ztunnel-go/ztunnel/identity"
)

// Conn is what authorization sees of an inbound connection.
type Conn struct {
	// Src is the peer's address after capture.
	Src netip.AddrPort
	// Dst is the resolved upstream address: the destination workload's IP and
	// the target port (never 15008).
	Dst netip.AddrPort
	// SrcIdentity is the peer certificate's identity; zero for plaintext peers.
	SrcIdentity identity.Identity
	// DstWorkload is the local workload the connection is for.
	DstWorkload *Workload
}

// Reasons Authorize gives for decisions that no single policy made.
const (
	ReasonNoWorkload     = "workload not found"
	ReasonNoAllow        = "no allow policies"
	ReasonNoAllowMatched = "allow policies exist, but none allowed"
)

// Decision is the outcome of Authorize.
type Decision struct {
	Allowed bool
	// Policy is the "namespace/name" key of the DENY policy that refused the
	// connection, or "".
	Policy string
	// Reason explains the decision: "explicitly denied by: ns/name",
	// "allow policies exist, but none allowed", "allowed by: ns/name",
	// "no allow policies" or "workload not found".
	Reason string
}

// Authorize decides whether c may reach its destination workload, with
// ztunnel's semantics:
//
//  1. The policies considered are the GLOBAL ones, the NAMESPACE ones of the
//     destination workload's namespace, and those whose keys the workload
//     lists in AuthorizationPolicies (keys missing from the snapshot are
//     skipped; see Warnings).
//  2. Dry-run policies never take part.
//  3. If any DENY policy matches, the connection is denied.
//  4. If there is no ALLOW policy, it is allowed.
//  5. If any ALLOW policy matches, it is allowed; otherwise it is denied.
//
// A nil DstWorkload is denied. Authorize does not allocate.
func (s *Snapshot) Authorize(c Conn) Decision {
	w := c.DstWorkload
	if w == nil {
		return Decision{Reason: ReasonNoWorkload}
	}
	if !s.hasPolicies {
		return Decision{Allowed: true, Reason: ReasonNoAllow}
	}
	c.Src = netip.AddrPortFrom(c.Src.Addr().Unmap(), c.Src.Port())
	c.Dst = netip.AddrPortFrom(c.Dst.Addr().Unmap(), c.Dst.Port())

	ns, global := s.polByNS[w.Namespace], s.polGlobal
	for _, list := range [2][]*policyEntry{ns, global} {
		for _, e := range list {
			if !e.p.DryRun && e.p.Action == ActionDeny && policyMatches(e.p, &c) {
				return Decision{Policy: e.key, Reason: e.denyReason}
			}
		}
	}
	for _, k := range w.AuthorizationPolicies {
		if e := s.polByKey[k]; e != nil && !e.p.DryRun && e.p.Action == ActionDeny && policyMatches(e.p, &c) {
			return Decision{Policy: e.key, Reason: e.denyReason}
		}
	}

	anyAllow := false
	for _, list := range [2][]*policyEntry{ns, global} {
		for _, e := range list {
			if !e.p.DryRun && e.p.Action == ActionAllow {
				anyAllow = true
				if policyMatches(e.p, &c) {
					return Decision{Allowed: true, Reason: e.allowReason}
				}
			}
		}
	}
	for _, k := range w.AuthorizationPolicies {
		if e := s.polByKey[k]; e != nil && !e.p.DryRun && e.p.Action == ActionAllow {
			anyAllow = true
			if policyMatches(e.p, &c) {
				return Decision{Allowed: true, Reason: e.allowReason}
			}
		}
	}
	if !anyAllow {
		return Decision{Allowed: true, Reason: ReasonNoAllow}
	}
	return Decision{Reason: ReasonNoAllowMatched}
}

// DryRunMatches returns the dry-run policies considered for c's destination
// workload that match c, DENY policies first, for logging. It returns nil
// without allocating when none matches.
func (s *Snapshot) DryRunMatches(c Conn) []*Policy {
	w := c.DstWorkload
	if w == nil || !s.hasPolicies {
		return nil
	}
	c.Src = netip.AddrPortFrom(c.Src.Addr().Unmap(), c.Src.Port())
	c.Dst = netip.AddrPortFrom(c.Dst.Addr().Unmap(), c.Dst.Port())
	var out []*Policy
	for _, action := range [2]Action{ActionDeny, ActionAllow} {
		consider := func(e *policyEntry) {
			if e != nil && e.p.DryRun && e.p.Action == action && !slices.Contains(out, e.p) && policyMatches(e.p, &c) {
				out = append(out, e.p)
			}
		}
		for _, e := range s.polByNS[w.Namespace] {
			consider(e)
		}
		for _, e := range s.polGlobal {
			consider(e)
		}
		for _, k := range w.AuthorizationPolicies {
			consider(s.polByKey[k])
		}
	}
	return out
}

// policyMatches reports whether any rule of p matches c. A policy without
// rules never matches; a rule without clauses always does.
func policyMatches(p *Policy, c *Conn) bool {
	for _, rule := range p.Rules {
		if ruleMatches(rule, c) {
			return true
		}
	}
	return false
}

// ruleMatches ANDs the clauses; within a clause the matches are OR-ed. An
// empty clause is true; a clause whose matches are all empty is false.
func ruleMatches(rule [][]Match, c *Conn) bool {
	for _, clause := range rule {
		if len(clause) == 0 {
			continue
		}
		ok := false
		for i := range clause {
			if matchMatches(&clause[i], c) {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

// matchMatches ANDs the fields of m: each field's positive list, when set,
// needs one value to match; its negative list, when set, needs none to match.
func matchMatches(m *Match, c *Conn) bool {
	if m.IsEmpty() {
		return false
	}
	id := &c.SrcIdentity
	dstIP, srcIP, dstPort := c.Dst.Addr(), c.Src.Addr(), c.Dst.Port()
	return field(m.DestinationIPs, m.NotDestinationIPs, func(p netip.Prefix) bool { return p.Contains(dstIP) }) &&
		field(m.SourceIPs, m.NotSourceIPs, func(p netip.Prefix) bool { return p.Contains(srcIP) }) &&
		field(m.DestinationPorts, m.NotDestinationPorts, func(p uint16) bool { return p == dstPort }) &&
		field(m.ServiceAccounts, m.NotServiceAccounts, func(sa ServiceAccountMatch) bool {
			// No identity never matches a service account.
			return !id.IsZero() && sa.Namespace == id.Namespace && sa.ServiceAccount == id.ServiceAccount
		}) &&
		field(m.Principals, m.NotPrincipals, func(sm StringMatch) bool { return principalMatches(sm, id) }) &&
		field(m.Namespaces, m.NotNamespaces, func(sm StringMatch) bool {
			// No identity is the empty namespace.
			return sm.matches(id.Namespace)
		})
}

// field evaluates one field type of a Match.
func field[T any](pos, neg []T, match func(T) bool) bool {
	if len(pos) > 0 && !slices.ContainsFunc(pos, match) {
		return false
	}
	return len(neg) == 0 || !slices.ContainsFunc(neg, match)
}

func (sm StringMatch) matches(s string) bool {
	switch sm.Kind {
	case MatchExact:
		return s == sm.Value
	case MatchPrefix:
		return strings.HasPrefix(s, sm.Value)
	case MatchSuffix:
		return strings.HasSuffix(s, sm.Value)
	case MatchPresence:
		return s != ""
	}
	return false
}

// principalMatches matches sm against the principal td/ns/N/sa/S (the SPIFFE
// ID without "spiffe://"), compared piecewise so that no string is built per
// connection. Without an identity nothing matches, not even a Prefix of "":
// ztunnel strips "spiffe://" from the empty string, fails, and reports no
// match, which is what makes not_principals: [presence] deny plaintext.
func principalMatches(sm StringMatch, id *identity.Identity) bool {
	if id.IsZero() {
		return false
	}
	parts := [5]string{id.TrustDomain, "/ns/", id.Namespace, "/sa/", id.ServiceAccount}
	switch sm.Kind {
	case MatchExact:
		n := 0
		for _, p := range parts {
			n += len(p)
		}
		return n == len(sm.Value) && partsHavePrefix(parts[:], sm.Value)
	case MatchPrefix:
		return partsHavePrefix(parts[:], sm.Value)
	case MatchSuffix:
		return partsHaveSuffix(parts[:], sm.Value)
	case MatchPresence:
		return true // "/ns/" alone makes the principal non-empty
	}
	return false
}

// partsHavePrefix reports whether strings.Join(parts, "") starts with v.
func partsHavePrefix(parts []string, v string) bool {
	for _, p := range parts {
		if len(v) <= len(p) {
			return p[:len(v)] == v
		}
		if v[:len(p)] != p {
			return false
		}
		v = v[len(p):]
	}
	return v == ""
}

// partsHaveSuffix reports whether strings.Join(parts, "") ends with v.
func partsHaveSuffix(parts []string, v string) bool {
	for i := len(parts) - 1; i >= 0; i-- {
		p := parts[i]
		if len(v) <= len(p) {
			return p[len(p)-len(v):] == v
		}
		if v[len(v)-len(p):] != p {
			return false
		}
		v = v[:len(v)-len(p)]
	}
	return v == ""
}
