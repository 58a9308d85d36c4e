package state

import (
	"hash/maphash"
	"net/netip"
	"slices"
)

// compiler fills one table's arena. Its port buffers are scratch space
// reused from one clause, rule and policy to the next.
type compiler struct {
	ar                          *arena
	clausePorts, rulePorts, pol []uint16
	// strIndex finds string lists already in the arena: istiod repeats the
	// same principal and namespace lists across rules and policies, and
	// sharing them keeps the table small.
	strSeed  maphash.Seed
	strIndex map[uint64][]span
}

// size allocates the arena's slices at their final capacity (an upper
// bound), so that filling them never copies.
func (c *compiler) size(policies []*Policy) {
	var n struct{ clauses, matches, checks, ports, pfx, sas int }
	for _, p := range policies {
		for _, rule := range p.Rules {
			n.clauses += len(rule)
			for _, clause := range rule {
				n.matches += len(clause)
				for i := range clause {
					m := &clause[i]
					for _, l := range [...]int{
						len(m.Namespaces), len(m.NotNamespaces), len(m.Principals), len(m.NotPrincipals),
						len(m.ServiceAccounts), len(m.NotServiceAccounts), len(m.SourceIPs), len(m.NotSourceIPs),
						len(m.DestinationIPs), len(m.NotDestinationIPs), len(m.DestinationPorts), len(m.NotDestinationPorts),
					} {
						if l > 0 {
							n.checks++
						}
					}
					n.ports += len(m.DestinationPorts) + len(m.NotDestinationPorts)
					for _, ps := range [...][]netip.Prefix{m.SourceIPs, m.NotSourceIPs, m.DestinationIPs, m.NotDestinationIPs} {
						if len(ps) > 1 || len(ps) == 1 && !ps[0].Addr().Is4() {
							n.pfx += len(ps) // not inlined in the check
						}
					}
					n.sas += len(m.ServiceAccounts) + len(m.NotServiceAccounts)
				}
			}
		}
	}
	*c.ar = arena{
		clauses: make([]span, 0, n.clauses),
		matches: make([]span, 0, n.matches),
		checks:  make([]check, 0, n.checks),
		ports:   make([]uint16, 0, n.ports),
		pfx:     make([]pfx, 0, n.pfx),
		sas:     make([]ServiceAccountMatch, 0, n.sas),
	}
}

// policy compiles rules into the arena, appends the policy's rule spans to
// ruleSpans and its port filter to portStore, and sets cp.always and
// cp.portsAny. It simplifies as it goes, keeping the semantics: an empty
// clause is true and is dropped; an empty match is false and is dropped; a
// clause left with no match is false, so its rule is dropped; a rule left
// with no clause is true, so the policy always matches.
//
// The port filter is a necessary condition: the union over rules of the
// intersection over clauses of the union over matches of the match's
// destination ports (any port when a match or clause does not restrict it).
func (c *compiler) policy(cp *compiledPolicy, rules [][][]Match, ruleSpans []span, portStore []uint16) ([]span, []uint16) {
	ar := c.ar
	polAny := false
	c.pol = c.pol[:0]
	for _, rule := range rules {
		clauseLo := len(ar.clauses)
		ruleAny := true
		dead := false
		for _, clause := range rule {
			if len(clause) == 0 {
				continue
			}
			matchLo := len(ar.matches)
			clauseAny := false
			c.clausePorts = c.clausePorts[:0]
			for i := range clause {
				m := &clause[i]
				if m.IsEmpty() {
					continue
				}
				ar.matches = append(ar.matches, c.match(m))
				if len(m.DestinationPorts) == 0 {
					clauseAny = true
				}
				c.clausePorts = append(c.clausePorts, m.DestinationPorts...)
			}
			if len(ar.matches) == matchLo {
				dead = true
				break
			}
			ar.clauses = append(ar.clauses, span{uint32(matchLo), uint32(len(ar.matches))})
			switch {
			case clauseAny:
			case ruleAny:
				ruleAny = false
				c.rulePorts = append(c.rulePorts[:0], c.clausePorts...)
				slices.Sort(c.rulePorts)
			default:
				slices.Sort(c.clausePorts)
				c.rulePorts = slices.DeleteFunc(c.rulePorts, func(p uint16) bool {
					_, found := slices.BinarySearch(c.clausePorts, p)
					return !found
				})
			}
		}
		if dead {
			// What the dead clause's siblings appended stays in the arena,
			// unreferenced: rules this odd are rare.
			ar.clauses = ar.clauses[:clauseLo]
			continue
		}
		if len(ar.clauses) == clauseLo {
			cp.always = true
		}
		ruleSpans = append(ruleSpans, span{uint32(clauseLo), uint32(len(ar.clauses))})
		if ruleAny {
			polAny = true
		} else {
			c.pol = append(c.pol, c.rulePorts...)
		}
	}
	cp.portsAny = polAny || cp.always
	if !cp.portsAny {
		slices.Sort(c.pol)
		portStore = append(portStore, slices.Compact(c.pol)...)
	}
	return ruleSpans, portStore
}

// maxGuard bounds the prefixes of an address guard: past it, checking the
// guard costs more than it saves.
const maxGuard = 8

// addressGuard computes a necessary condition on one address of a
// connection for a policy with the given rules to match, and appends its
// prefixes to store. A rule constrains the address when one of its clauses
// has only matches that list prefixes for it (the matched address must be
// in one of them); the policy's guard is the union over its rules. It
// returns an empty span for no condition: a rule does not constrain the
// address, or the union is too large to be worth checking.
func addressGuard(rules [][][]Match, store []pfx, field func(*Match) []netip.Prefix) (span, []pfx) {
	lo := len(store)
	none := func() (span, []pfx) { return span{}, store[:lo] }
	for _, rule := range rules {
		if !ruleCanMatch(rule) {
			continue
		}
		guard := -1 // the first clause that constrains the address
		for ci, clause := range rule {
			constrained := false
			for i := range clause {
				m := &clause[i]
				if m.IsEmpty() {
					continue
				}
				if len(field(m)) == 0 {
					constrained = false
					break
				}
				constrained = true
			}
			if constrained {
				guard = ci
				break
			}
		}
		if guard < 0 {
			return none()
		}
		for i := range rule[guard] {
			m := &rule[guard][i]
			for _, p := range field(m) {
				x := toPfx(p)
				if !slices.Contains(store[lo:], x) {
					if len(store)-lo == maxGuard {
						return none()
					}
					store = append(store, x)
				}
			}
		}
	}
	return span{uint32(lo), uint32(len(store))}, store
}

// ruleCanMatch reports whether no clause of rule is made only of empty
// matches (compile drops such rules; guards must ignore them too).
func ruleCanMatch(rule [][]Match) bool {
	for _, clause := range rule {
		if len(clause) > 0 && !slices.ContainsFunc(clause, func(m Match) bool { return !m.IsEmpty() }) {
			return false
		}
	}
	return true
}

// match compiles the non-empty m into checks, cheapest first, and returns
// their span.
func (c *compiler) match(m *Match) span {
	ar := c.ar
	lo := len(ar.checks)
	c.ports(m.DestinationPorts, false)
	c.ports(m.NotDestinationPorts, true)
	c.prefixes(m.DestinationIPs, false, ckDst4, ckDst)
	c.prefixes(m.NotDestinationIPs, true, ckDst4, ckDst)
	c.prefixes(m.SourceIPs, false, ckSrc4, ckSrc)
	c.prefixes(m.NotSourceIPs, true, ckSrc4, ckSrc)
	for _, f := range [...]struct {
		sas []ServiceAccountMatch
		neg bool
	}{{m.ServiceAccounts, false}, {m.NotServiceAccounts, true}} {
		if len(f.sas) > 0 {
			a := len(ar.sas)
			ar.sas = append(ar.sas, f.sas...)
			ar.checks = append(ar.checks, check{ckSA, f.neg, uint32(a), uint32(len(ar.sas))})
		}
	}
	for _, f := range [...]struct {
		sms  []StringMatch
		kind checkKind
		neg  bool
	}{
		{m.Namespaces, ckNS, false}, {m.NotNamespaces, ckNS, true},
		{m.Principals, ckPrincipal, false}, {m.NotPrincipals, ckPrincipal, true},
	} {
		if len(f.sms) > 0 {
			sp := c.internStrs(f.sms)
			ar.checks = append(ar.checks, check{f.kind, f.neg, sp.lo, sp.hi})
		}
	}
	// Ports and inline IPv4 prefixes were appended first; keep those
	// before the spans of prefixes, which cost a memory access more.
	cs := ar.checks[lo:]
	slices.SortStableFunc(cs, func(x, y check) int { return int(x.kind) - int(y.kind) })
	return span{uint32(lo), uint32(len(ar.checks))}
}

// internStrs returns the span of a list equal to sms in the arena, adding
// it if there is none.
func (c *compiler) internStrs(sms []StringMatch) span {
	var h maphash.Hash
	h.SetSeed(c.strSeed)
	for _, sm := range sms {
		h.WriteByte(byte(sm.Kind))
		h.WriteString(sm.Value)
		h.WriteByte(0)
	}
	sum := h.Sum64()
	for _, sp := range c.strIndex[sum] {
		if slices.Equal(c.ar.strs[sp.lo:sp.hi], sms) {
			return sp
		}
	}
	lo := len(c.ar.strs)
	c.ar.strs = append(c.ar.strs, sms...)
	sp := span{uint32(lo), uint32(len(c.ar.strs))}
	c.strIndex[sum] = append(c.strIndex[sum], sp)
	return sp
}

func (c *compiler) ports(ports []uint16, neg bool) {
	ar := c.ar
	switch len(ports) {
	case 0:
	case 1:
		ar.checks = append(ar.checks, check{ckPort1, neg, uint32(ports[0]), 0})
	default:
		a := len(ar.ports)
		ar.ports = append(ar.ports, ports...)
		ar.checks = append(ar.checks, check{ckPorts, neg, uint32(a), uint32(len(ar.ports))})
	}
}

func (c *compiler) prefixes(ps []netip.Prefix, neg bool, inline, spanned checkKind) {
	ar := c.ar
	switch {
	case len(ps) == 0:
	case len(ps) == 1 && ps[0].Addr().Is4():
		p := toPfx(ps[0])
		ar.checks = append(ar.checks, check{inline, neg, uint32(p.lo), uint32(p.mlo)})
	default:
		a := len(ar.pfx)
		for _, p := range ps {
			ar.pfx = append(ar.pfx, toPfx(p))
		}
		ar.checks = append(ar.checks, check{spanned, neg, uint32(a), uint32(len(ar.pfx))})
	}
}
