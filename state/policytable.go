package state

import (
	"encoding/binary"
	"hash/maphash"
	"net/netip"
	"slices"
	"sync/atomic"
)

// policyGenerations numbers compiled policy tables. Generation 0 is reserved
// for the empty table, which every snapshot without policies shares.
var policyGenerations atomic.Uint64

// policyTable is the compiled form of a snapshot's policies. It is built once
// by NewSnapshot and shared, unchanged, by every snapshot derived with
// WithWorkloads, so its generation identifies the policy set.
//
// Evaluation visits, in this order: the destination namespace's NAMESPACE
// policies (sorted by key), the GLOBAL policies (sorted by key), then the
// policies the workload lists, in its order. The first match decides, so
// this order fixes which policy a Decision names when several match.
type policyTable struct {
	gen      uint64
	policies []*Policy       // sorted by key
	members  map[*Policy]int // index in policies
	byKey    map[string]*compiledPolicy
	global   policyView
	byNS     map[string]*policyView
	ar       arena
}

// policyView holds the policies one scope (GLOBAL, or one namespace)
// contributes, split by what evaluation does with them.
type policyView struct {
	deny, allow       policyList // enforced; policies that can never match are left out
	dryDeny, dryAllow policyList
	// hasAllow reports whether an enforced ALLOW policy exists here, even one
	// that can never match: its presence alone turns "no allow policies" into
	// "none allowed".
	hasAllow bool
}

// indexMin is the list length from which a policyList indexes its policies
// by destination port. Shorter lists are scanned: a scan of a few policies,
// each rejected by its own port filter, is cheaper than a map lookup. Tests
// lower it to check the indexed path against the reference on small sets.
var indexMin = 8

// policyList is an ordered list of policies. Long lists are indexed by the
// destination ports a policy can match; policies that can match any port
// stay in the unindexed part, and evaluation merges the two by position.
type policyList struct {
	any    []*compiledPolicy // all policies when byPort is nil
	byPort map[uint16][]*compiledPolicy
}

// compiledPolicy is one policy ready for evaluation.
type compiledPolicy struct {
	p           *Policy
	key         string
	denyReason  string
	allowReason string
	pos         int32 // position in its policyList, for merging
	enforced    bool  // not dry-run
	// always is set when some rule has no clause that can fail.
	always bool
	// ports is a necessary condition: a connection whose port is not in it
	// cannot match (portsAny: no condition).
	portsAny bool
	ports    []uint16 // sorted, deduplicated
	// dst and src are necessary conditions on the addresses, like ports:
	// when set (not nil), an address no prefix of which contains cannot
	// match.
	dst, src []pfx
	rules    []span // each indexes arena.clauses
	ar       *arena
}

// span is a half-open range [lo, hi) of an arena slice.
type span struct{ lo, hi uint32 }

// arena holds the compiled rules of every policy of a table in a few
// slices, most sized before they are filled, so that compiling 10,000
// policies costs few allocations and evaluation walks contiguous memory.
type arena struct {
	clauses []span // each indexes matches
	matches []span // each indexes checks; never empty
	checks  []check
	ports   []uint16
	pfx     []pfx
	sas     []ServiceAccountMatch
	strs    []StringMatch
}

// check is one field of a Match: the field passes when some value matches
// (or, for a not_* field, when none does). A match passes when all its
// checks pass; compiler.match orders them cheapest first.
type check struct {
	kind checkKind
	neg  bool
	// a and b are the span [a, b) of the arena slice of the kind, or for
	// the inline kinds the value itself.
	a, b uint32
}

type checkKind uint8

const (
	ckPort1     checkKind = iota // a is the one port
	ckPorts                      // ports[a:b]
	ckDst4                       // the one IPv4 prefix: a is the network, b the mask
	ckSrc4                       // same, for the source
	ckDst                        // pfx[a:b]
	ckSrc                        // pfx[a:b]
	ckSA                         // sas[a:b]
	ckNS                         // strs[a:b]
	ckPrincipal                  // strs[a:b]
)

// pfx is a CIDR as a 128-bit network and mask. IPv4 prefixes hold the
// address in the low 32 bits and only match IPv4 addresses, as
// netip.Prefix.Contains does.
type pfx struct {
	hi, lo, mhi, mlo uint64
	is4              bool
}

// addr is a connection address in the form pfx compares against; valid is
// false for the zero address, which no prefix contains.
type addr struct {
	hi, lo uint64
	is4    bool
	valid  bool
}

func toAddr(a netip.Addr) addr {
	// ztunnel's addresses carry no IPv6 zone and IPv4-mapped addresses are
	// canonical IPv4 after capture; normalize the same way.
	a = a.Unmap().WithZone("")
	switch {
	case a.Is4():
		b := a.As4()
		return addr{lo: uint64(binary.BigEndian.Uint32(b[:])), is4: true, valid: true}
	case a.Is6():
		b := a.As16()
		return addr{hi: binary.BigEndian.Uint64(b[:8]), lo: binary.BigEndian.Uint64(b[8:]), valid: true}
	}
	return addr{}
}

func toPfx(p netip.Prefix) pfx {
	bits := p.Bits()
	a := toAddr(p.Addr())
	if p.Addr().Is4() {
		var m uint64
		if bits > 0 {
			m = (^uint64(0) << (32 - bits)) & 0xffffffff
		}
		return pfx{lo: a.lo & m, mlo: m, is4: true}
	}
	// IPv4-mapped IPv6 prefixes stay IPv6: they never contain the (unmapped)
	// addresses of a connection, as in netip.
	b := p.Addr().As16()
	hi, lo := binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])
	var mhi, mlo uint64
	switch {
	case bits >= 64:
		mhi = ^uint64(0)
		if bits > 64 {
			mlo = ^uint64(0) << (128 - bits)
		}
	case bits > 0:
		mhi = ^uint64(0) << (64 - bits)
	}
	return pfx{hi: hi & mhi, lo: lo & mlo, mhi: mhi, mlo: mlo}
}

func (p *pfx) contains(a *addr) bool {
	return a.valid && a.is4 == p.is4 && a.hi&p.mhi == p.hi && a.lo&p.mlo == p.lo
}

// emptyTable is shared by every snapshot without policies.
var emptyTable = &policyTable{}

// lastTable is the most recently compiled table. NewSnapshot given the very
// same policies again (a converter that keeps its Policy values between
// updates and rebuilds on a workload-only one) reuses it, and with it its
// generation.
var lastTable atomic.Pointer[policyTable]

// compilePolicies builds the table of policies, which NewSnapshot has
// validated and deduplicated. It takes ownership of the slice.
func compilePolicies(policies []*Policy) *policyTable {
	if len(policies) == 0 {
		return emptyTable
	}
	sortByKey(policies, (*Policy).Key)
	t := &policyTable{
		gen:      policyGenerations.Add(1),
		policies: policies,
		members:  make(map[*Policy]int, len(policies)),
		byKey:    make(map[string]*compiledPolicy, len(policies)),
		byNS:     make(map[string]*policyView),
	}
	for i, p := range policies {
		t.members[p] = i
	}
	defer lastTable.Store(t)
	c := compiler{ar: &t.ar, strSeed: maphash.MakeSeed(), strIndex: map[uint64][]span{}}
	c.size(policies)
	cps := make([]compiledPolicy, len(policies))
	// Rule spans and port filters of all policies share two slices, cut up
	// once they no longer grow.
	var ruleSpans []span
	var portStore []uint16
	var guardStore []pfx
	type offsets struct{ rules, ports, dst, src span }
	offs := make([]offsets, len(policies))
	for i, p := range policies {
		cp := &cps[i]
		cp.p = p
		// One allocation for the key and both reasons.
		const denyPrefix, allowPrefix = "explicitly denied by: ", "allowed by: "
		key := p.Key()
		all := denyPrefix + key + allowPrefix + key
		cp.denyReason = all[:len(denyPrefix)+len(key)]
		cp.key = cp.denyReason[len(denyPrefix):]
		cp.allowReason = all[len(cp.denyReason):]
		cp.enforced = !p.DryRun
		cp.ar = &t.ar
		rlo, plo := len(ruleSpans), len(portStore)
		ruleSpans, portStore = c.policy(cp, p.Rules, ruleSpans, portStore)
		o := offsets{rules: span{uint32(rlo), uint32(len(ruleSpans))}, ports: span{uint32(plo), uint32(len(portStore))}}
		if !cp.always {
			o.dst, guardStore = addressGuard(p.Rules, guardStore, func(m *Match) []netip.Prefix { return m.DestinationIPs })
			o.src, guardStore = addressGuard(p.Rules, guardStore, func(m *Match) []netip.Prefix { return m.SourceIPs })
		}
		offs[i] = o
		t.byKey[key] = cp
	}

	// Group by scope; policies are sorted by key, so every list is too.
	var global listBuilder
	byNS := map[string]*listBuilder{}
	for i := range cps {
		cp, o := &cps[i], offs[i]
		cp.rules = ruleSpans[o.rules.lo:o.rules.hi:o.rules.hi]
		cp.ports = portStore[o.ports.lo:o.ports.hi:o.ports.hi]
		if o.dst.hi > 0 {
			cp.dst = guardStore[o.dst.lo:o.dst.hi:o.dst.hi]
		}
		if o.src.hi > 0 {
			cp.src = guardStore[o.src.lo:o.src.hi:o.src.hi]
		}
		switch cp.p.Scope {
		case ScopeGlobal:
			global.add(cp)
		case ScopeNamespace:
			lb := byNS[cp.p.Namespace]
			if lb == nil {
				lb = &listBuilder{}
				byNS[cp.p.Namespace] = lb
			}
			lb.add(cp)
		}
	}
	t.global = global.build()
	for ns, lb := range byNS {
		v := lb.build()
		t.byNS[ns] = &v
	}
	return t
}

// reusableTable returns the last compiled table if policies are the very
// Policy values it was compiled from, in any order, or nil. Policy values
// are immutable once in a snapshot, so the same pointers mean the same,
// already validated, policies.
func reusableTable(policies []*Policy) *policyTable {
	if t := lastTable.Load(); t != nil && len(policies) > 0 && t.holdsExactly(policies) {
		return t
	}
	return nil
}

// holdsExactly reports whether t was compiled from exactly these policies
// (in any order).
func (t *policyTable) holdsExactly(policies []*Policy) bool {
	if len(policies) != len(t.policies) {
		return false
	}
	seen := make([]bool, len(policies))
	for _, p := range policies {
		i, ok := t.members[p]
		if !ok || seen[i] {
			return false
		}
		seen[i] = true
	}
	return true
}

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

// portOK reports whether cp can match a connection to port.
func (cp *compiledPolicy) portOK(port uint16) bool {
	if cp.portsAny {
		return true
	}
	if len(cp.ports) <= 8 {
		return slices.Contains(cp.ports, port)
	}
	_, found := slices.BinarySearch(cp.ports, port)
	return found
}

// never reports whether cp can match no connection at all.
func (cp *compiledPolicy) never() bool { return !cp.portsAny && len(cp.ports) == 0 }

// listBuilder sorts one scope's policies into a policyView.
type listBuilder struct {
	deny, allow, dryDeny, dryAllow []*compiledPolicy
	hasAllow                       bool
}

func (lb *listBuilder) add(cp *compiledPolicy) {
	if cp.enforced && cp.p.Action == ActionAllow {
		lb.hasAllow = true
	}
	if cp.never() {
		return
	}
	switch {
	case cp.enforced && cp.p.Action == ActionDeny:
		lb.deny = append(lb.deny, cp)
	case cp.enforced:
		lb.allow = append(lb.allow, cp)
	case cp.p.Action == ActionDeny:
		lb.dryDeny = append(lb.dryDeny, cp)
	default:
		lb.dryAllow = append(lb.dryAllow, cp)
	}
}

func (lb *listBuilder) build() policyView {
	return policyView{
		deny: newPolicyList(lb.deny), allow: newPolicyList(lb.allow),
		dryDeny: newPolicyList(lb.dryDeny), dryAllow: newPolicyList(lb.dryAllow),
		hasAllow: lb.hasAllow,
	}
}

func newPolicyList(cps []*compiledPolicy) policyList {
	for i, cp := range cps {
		cp.pos = int32(i)
	}
	if len(cps) < indexMin {
		return policyList{any: cps}
	}
	l := policyList{byPort: map[uint16][]*compiledPolicy{}}
	for _, cp := range cps {
		if cp.portsAny {
			l.any = append(l.any, cp)
			continue
		}
		for _, port := range cp.ports {
			l.byPort[port] = append(l.byPort[port], cp)
		}
	}
	return l
}
