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
//  1. The policies considered are the NAMESPACE ones of the destination
//     workload's namespace, the GLOBAL ones, and those whose keys the
//     workload lists in AuthorizationPolicies (keys missing from the snapshot
//     are skipped; see Warnings).
//  2. Dry-run policies never take part.
//  3. If any DENY policy matches, the connection is denied.
//  4. If there is no ALLOW policy, it is allowed.
//  5. If any ALLOW policy matches, it is allowed; otherwise it is denied.
//
// When several policies match, the Decision names the first in the order of
// step 1, each group sorted by key (the listed ones in the workload's order).
// Addresses are compared as ztunnel sees them: IPv4-mapped IPv6 as IPv4, and
// without an IPv6 zone.
//
// A nil DstWorkload is denied. Authorize reads only the compiled policy
// table (the workload's namespace and listed keys select the parts of it to
// visit) and does not allocate.
func (s *Snapshot) Authorize(c Conn) Decision {
	w := c.DstWorkload
	if w == nil {
		return Decision{Reason: ReasonNoWorkload}
	}
	t := s.pol
	if t.gen == 0 {
		return Decision{Allowed: true, Reason: ReasonNoAllow}
	}
	ec := newEvalConn(&c)
	nsv := t.nsView(w.Namespace())

	if nsv != nil {
		if cp := nsv.deny.first(&ec); cp != nil {
			return Decision{Policy: cp.key, Reason: cp.denyReason}
		}
	}
	if cp := t.global.deny.first(&ec); cp != nil {
		return Decision{Policy: cp.key, Reason: cp.denyReason}
	}
	// The listed ALLOW policies are evaluated after every DENY; remember the
	// first few so that their keys are looked up once.
	var (
		listed      [4]*compiledPolicy
		nListed     int
		listedAllow bool
	)
	for _, k := range w.AuthorizationPolicies() {
		cp := t.lookup(k)
		if cp == nil || !cp.enforced {
			continue
		}
		if cp.p.Action == ActionAllow {
			listedAllow = true
			if nListed < len(listed) {
				listed[nListed] = cp
			}
			nListed++
		} else if cp.matches(&ec) {
			return Decision{Policy: cp.key, Reason: cp.denyReason}
		}
	}

	if nsv != nil {
		if cp := nsv.allow.first(&ec); cp != nil {
			return Decision{Allowed: true, Reason: cp.allowReason}
		}
	}
	if cp := t.global.allow.first(&ec); cp != nil {
		return Decision{Allowed: true, Reason: cp.allowReason}
	}
	if nListed <= len(listed) {
		for _, cp := range listed[:nListed] {
			if cp.matches(&ec) {
				return Decision{Allowed: true, Reason: cp.allowReason}
			}
		}
	} else {
		for _, k := range w.AuthorizationPolicies() {
			if cp := t.lookup(k); cp != nil && cp.enforced && cp.p.Action == ActionAllow && cp.matches(&ec) {
				return Decision{Allowed: true, Reason: cp.allowReason}
			}
		}
	}
	if !listedAllow && !t.global.hasAllow && (nsv == nil || !nsv.hasAllow) {
		return Decision{Allowed: true, Reason: ReasonNoAllow}
	}
	return Decision{Reason: ReasonNoAllowMatched}
}

// DryRunMatches returns the dry-run policies considered for c's destination
// workload that match c, DENY policies first, each group in Authorize's
// order, for logging. It returns nil without allocating when none matches.
func (s *Snapshot) DryRunMatches(c Conn) []*Policy {
	w := c.DstWorkload
	t := s.pol
	if w == nil || t.gen == 0 {
		return nil
	}
	ec := newEvalConn(&c)
	nsv := t.nsView(w.Namespace())
	var out []*Policy
	for _, action := range [2]Action{ActionDeny, ActionAllow} {
		if nsv != nil {
			out = nsv.dryList(action).appendMatches(&ec, out)
		}
		out = t.global.dryList(action).appendMatches(&ec, out)
		for _, k := range w.AuthorizationPolicies() {
			if cp := t.lookup(k); cp != nil && !cp.enforced && cp.p.Action == action && !slices.Contains(out, cp.p) && cp.matches(&ec) {
				out = append(out, cp.p)
			}
		}
	}
	return out
}

func (v *policyView) dryList(a Action) *policyList {
	if a == ActionDeny {
		return &v.dryDeny
	}
	return &v.dryAllow
}

// evalConn is a connection in the form compiled policies compare against,
// computed once per evaluation.
type evalConn struct {
	src, dst addr
	port     uint16
	id       *identity.Identity
	hasID    bool
}

func newEvalConn(c *Conn) evalConn {
	return evalConn{
		src:   toAddr(c.Src.Addr()),
		dst:   toAddr(c.Dst.Addr()),
		port:  c.Dst.Port(),
		id:    &c.SrcIdentity,
		hasID: !c.SrcIdentity.IsZero(),
	}
}

// first returns the first policy of l that matches ec, or nil.
func (l *policyList) first(ec *evalConn) *compiledPolicy {
	if l.byPort == nil {
		for _, cp := range l.any {
			if cp.matches(ec) {
				return cp
			}
		}
		return nil
	}
	a, b := l.any, l.byPort[ec.port]
	for len(a) > 0 || len(b) > 0 {
		var cp *compiledPolicy
		cp, a, b = mergeNext(a, b)
		if cp.matchesRules(ec) {
			return cp
		}
	}
	return nil
}

// appendMatches appends to out the policies of l that match ec, in order.
func (l *policyList) appendMatches(ec *evalConn, out []*Policy) []*Policy {
	if l.byPort == nil {
		for _, cp := range l.any {
			if cp.matches(ec) {
				out = append(out, cp.p)
			}
		}
		return out
	}
	a, b := l.any, l.byPort[ec.port]
	for len(a) > 0 || len(b) > 0 {
		var cp *compiledPolicy
		cp, a, b = mergeNext(a, b)
		if cp.matchesRules(ec) {
			out = append(out, cp.p)
		}
	}
	return out
}

// mergeNext takes the policy with the lower position from the heads of a
// and b, at least one of which is not empty. It merges an indexed list's
// any-port policies with those of one port back into list order.
func mergeNext(a, b []*compiledPolicy) (*compiledPolicy, []*compiledPolicy, []*compiledPolicy) {
	if len(b) == 0 || len(a) > 0 && a[0].pos < b[0].pos {
		return a[0], a[1:], b
	}
	return b[0], a, b[1:]
}

// matches reports whether cp matches ec.
func (cp *compiledPolicy) matches(ec *evalConn) bool {
	return cp.portOK(ec.port) && cp.matchesRules(ec)
}

// matchesRules reports whether cp matches ec, its port filter having
// passed: the address guards first, then the rules (OR-ed; a rule's clauses
// AND-ed; a clause's matches OR-ed).
func (cp *compiledPolicy) matchesRules(ec *evalConn) bool {
	if cp.always {
		return true
	}
	if cp.dst != nil && !anyPrefix(cp.dst, &ec.dst) || cp.src != nil && !anyPrefix(cp.src, &ec.src) {
		return false
	}
	ar := cp.ar
	for _, r := range cp.rules {
		ok := true
		for _, cl := range ar.clauses[r.lo:r.hi] {
			if !ar.clauseMatches(cl, ec) {
				ok = false
				break
			}
		}
		if ok {
			return true
		}
	}
	return false
}

func (ar *arena) clauseMatches(cl span, ec *evalConn) bool {
	for _, m := range ar.matches[cl.lo:cl.hi] {
		if ar.matchMatches(m, ec) {
			return true
		}
	}
	return false
}

// matchMatches ANDs the checks of a match: each field passes when one of
// its values matches, or, for a not_* field, when none does.
func (ar *arena) matchMatches(m span, ec *evalConn) bool {
	for _, ck := range ar.checks[m.lo:m.hi] {
		var hit bool
		switch ck.kind {
		case ckPort1:
			hit = uint32(ec.port) == ck.a
		case ckPorts:
			hit = slices.Contains(ar.ports[ck.a:ck.b], ec.port)
		case ckDst4:
			hit = ec.dst.is4 && uint32(ec.dst.lo)&ck.b == ck.a
		case ckSrc4:
			hit = ec.src.is4 && uint32(ec.src.lo)&ck.b == ck.a
		case ckDst:
			hit = anyPrefix(ar.pfx[ck.a:ck.b], &ec.dst)
		case ckSrc:
			hit = anyPrefix(ar.pfx[ck.a:ck.b], &ec.src)
		case ckSA:
			hit = saMatches(ar.sas[ck.a:ck.b], ec)
		case ckNS:
			hit = nsMatches(ar.strs[ck.a:ck.b], ec.id.Namespace)
		case ckPrincipal:
			hit = principalsMatch(ar.strs[ck.a:ck.b], ec)
		}
		if hit == ck.neg {
			return false
		}
	}
	return true
}

func anyPrefix(ps []pfx, a *addr) bool {
	for i := range ps {
		if ps[i].contains(a) {
			return true
		}
	}
	return false
}

// saMatches reports whether the source identity is one of sas. No identity
// matches no service account.
func saMatches(sas []ServiceAccountMatch, ec *evalConn) bool {
	if !ec.hasID {
		return false
	}
	for _, sa := range sas {
		if sa.Namespace == ec.id.Namespace && sa.ServiceAccount == ec.id.ServiceAccount {
			return true
		}
	}
	return false
}

// nsMatches matches the source namespace; no identity is the empty one.
func nsMatches(sms []StringMatch, ns string) bool {
	for _, sm := range sms {
		if sm.matches(ns) {
			return true
		}
	}
	return false
}

func principalsMatch(sms []StringMatch, ec *evalConn) bool {
	if !ec.hasID {
		return false // see principalMatches
	}
	for _, sm := range sms {
		if principalOf(sm, ec.id) {
			return true
		}
	}
	return false
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
	return !id.IsZero() && principalOf(sm, id)
}

// principalOf is principalMatches for an identity known not to be zero.
func principalOf(sm StringMatch, id *identity.Identity) bool {
	v := sm.Value
	switch sm.Kind {
	case MatchExact:
		td, ns, sa := id.TrustDomain, id.Namespace, id.ServiceAccount
		if len(v) != len(td)+len(ns)+len(sa)+8 {
			return false
		}
		i := len(td)
		j := i + 4 + len(ns)
		return v[:i] == td && v[i:i+4] == "/ns/" && v[i+4:j] == ns && v[j:j+4] == "/sa/" && v[j+4:] == sa
	case MatchPrefix:
		return principalHasPrefix(id, v)
	case MatchSuffix:
		return principalHasSuffix(id, v)
	case MatchPresence:
		return true // "/ns/" alone makes the principal non-empty
	}
	return false
}

// principalPiece returns the i-th of the five pieces a principal is the
// concatenation of: td, "/ns/", ns, "/sa/", sa.
func principalPiece(id *identity.Identity, i int) string {
	switch i {
	case 0:
		return id.TrustDomain
	case 1:
		return "/ns/"
	case 2:
		return id.Namespace
	case 3:
		return "/sa/"
	}
	return id.ServiceAccount
}

// principalHasPrefix reports whether id's principal starts with v.
func principalHasPrefix(id *identity.Identity, v string) bool {
	for i := range 5 {
		p := principalPiece(id, i)
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

// principalHasSuffix reports whether id's principal ends with v.
func principalHasSuffix(id *identity.Identity, v string) bool {
	for i := 4; i >= 0; i-- {
		p := principalPiece(id, i)
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
