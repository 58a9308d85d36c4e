package state

import (
	"cmp"
	"net/netip"
	"slices"
	"strings"
)

// This file is the reference evaluator: ztunnel's RBAC semantics written as
// plainly as possible, over the raw policy list, with no index, no
// compilation and no care for allocations. The compiled evaluator must agree
// with it on every connection (TestAuthorizeMatchesReference).

// refAuthorize decides c against policies the way Authorize must.
func refAuthorize(policies []*Policy, c Conn) Decision {
	w := c.DstWorkload
	if w == nil {
		return Decision{Reason: ReasonNoWorkload}
	}
	c = refNormalize(c)
	for _, p := range refSelect(policies, w) {
		if !p.DryRun && p.Action == ActionDeny && refPolicyMatches(p, &c) {
			return Decision{Policy: p.Key(), Reason: "explicitly denied by: " + p.Key()}
		}
	}
	anyAllow := false
	for _, p := range refSelect(policies, w) {
		if !p.DryRun && p.Action == ActionAllow {
			anyAllow = true
			if refPolicyMatches(p, &c) {
				return Decision{Allowed: true, Reason: "allowed by: " + p.Key()}
			}
		}
	}
	if !anyAllow {
		return Decision{Allowed: true, Reason: ReasonNoAllow}
	}
	return Decision{Reason: ReasonNoAllowMatched}
}

// refDryRunMatches is DryRunMatches: matching dry-run DENY policies, then
// matching dry-run ALLOW policies, each in selection order, without
// duplicates.
func refDryRunMatches(policies []*Policy, c Conn) []*Policy {
	w := c.DstWorkload
	if w == nil {
		return nil
	}
	c = refNormalize(c)
	var out []*Policy
	for _, action := range []Action{ActionDeny, ActionAllow} {
		for _, p := range refSelect(policies, w) {
			if p.DryRun && p.Action == action && !slices.Contains(out, p) && refPolicyMatches(p, &c) {
				out = append(out, p)
			}
		}
	}
	return out
}

// refNormalize compares addresses as ztunnel does: IPv4-mapped as IPv4, no
// IPv6 zone.
func refNormalize(c Conn) Conn {
	c.Src = netip.AddrPortFrom(c.Src.Addr().Unmap().WithZone(""), c.Src.Port())
	c.Dst = netip.AddrPortFrom(c.Dst.Addr().Unmap().WithZone(""), c.Dst.Port())
	return c
}

// refSelect returns the policies that apply to w, in evaluation order: the
// NAMESPACE policies of w's namespace by key, the GLOBAL ones by key, then
// those w lists, in its order (missing keys skipped, duplicates kept).
func refSelect(policies []*Policy, w *Workload) []*Policy {
	sorted := slices.Clone(policies)
	slices.SortFunc(sorted, func(a, b *Policy) int { return cmp.Compare(a.Key(), b.Key()) })
	var out []*Policy
	for _, p := range sorted {
		if p.Scope == ScopeNamespace && p.Namespace == w.Namespace() {
			out = append(out, p)
		}
	}
	for _, p := range sorted {
		if p.Scope == ScopeGlobal {
			out = append(out, p)
		}
	}
	for _, k := range w.AuthorizationPolicies() {
		for _, p := range sorted {
			if p.Key() == k {
				out = append(out, p)
			}
		}
	}
	return out
}

// refPolicyMatches: rules are OR-ed, so a policy without rules never matches.
func refPolicyMatches(p *Policy, c *Conn) bool {
	for _, rule := range p.Rules {
		if refRuleMatches(rule, c) {
			return true
		}
	}
	return false
}

// refRuleMatches: clauses are AND-ed (so a rule without clauses matches);
// within a clause matches are OR-ed, and an empty clause is true.
func refRuleMatches(rule [][]Match, c *Conn) bool {
	for _, clause := range rule {
		if len(clause) == 0 {
			continue
		}
		ok := false
		for i := range clause {
			if refMatchMatches(&clause[i], c) {
				ok = true
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

// refMatchMatches: a match with no field set never matches; otherwise every
// field must pass.
func refMatchMatches(m *Match, c *Conn) bool {
	if m.IsEmpty() {
		return false
	}
	id := c.SrcIdentity
	dstIP, srcIP, dstPort := c.Dst.Addr(), c.Src.Addr(), c.Dst.Port()
	return refField(m.DestinationIPs, m.NotDestinationIPs, func(p netip.Prefix) bool { return p.Contains(dstIP) }) &&
		refField(m.SourceIPs, m.NotSourceIPs, func(p netip.Prefix) bool { return p.Contains(srcIP) }) &&
		refField(m.DestinationPorts, m.NotDestinationPorts, func(p uint16) bool { return p == dstPort }) &&
		refField(m.ServiceAccounts, m.NotServiceAccounts, func(sa ServiceAccountMatch) bool {
			// No identity matches no service account.
			return !id.IsZero() && sa.Namespace == id.Namespace && sa.ServiceAccount == id.ServiceAccount
		}) &&
		refField(m.Principals, m.NotPrincipals, func(sm StringMatch) bool {
			// ztunnel strips "spiffe://" from the identity's URI; the empty
			// string of no identity has no scheme and matches nothing.
			uri, ok := strings.CutPrefix(id.String(), "spiffe://")
			return ok && refString(sm, uri)
		}) &&
		refField(m.Namespaces, m.NotNamespaces, func(sm StringMatch) bool {
			return refString(sm, id.Namespace) // no identity: ""
		})
}

// refField: a positive list, when set, needs one value to match; a negative
// list, when set, needs none to match.
func refField[T any](pos, neg []T, match func(T) bool) bool {
	if len(pos) > 0 && !slices.ContainsFunc(pos, match) {
		return false
	}
	return len(neg) == 0 || !slices.ContainsFunc(neg, match)
}

func refString(sm StringMatch, s string) bool {
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
	panic("invalid match kind")
}
