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
	policies []*Policy        // sorted by key
	members  map[*Policy]int  // index in policies
	compiled []compiledPolicy // policies[i] compiled
	byKey    map[string]*compiledPolicy
	global   policyView
	byNS     map[string]*policyView
	// ar holds the rules of the policies this table compiled; those it took
	// over from an earlier table stay in that table's arena (each
	// compiledPolicy points to its own).
	ar *arena
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
	// policies is how many policies were compiled into the arena, live or
	// not: what a table holding on to it keeps alive (reuseFrom's bound).
	policies int

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
func compilePolicies(policies []*Policy) *policyTable { return compilePoliciesFrom(nil, policies) }

// compilePoliciesFrom is compilePolicies taking over from prev (nil: none)
// the compiled rules of every policy prev holds (the very Policy value:
// policies are immutable once in a snapshot), so that a push changing one
// policy of thousands compiles that one (issue 36: compiling 2,000
// policies took ~2.5 ms of each Authorization change). Only the grouping
// by scope and the port indexes, which are cheap, are built again. It
// compiles everything when taking over would keep more than twice the
// arenas' worth of rules alive (reuseFrom).
func compilePoliciesFrom(prev *policyTable, policies []*Policy) *policyTable {
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
		ar:       &arena{},
	}
	for i, p := range policies {
		t.members[p] = i
	}
	defer lastTable.Store(t)
	old := reuseFrom(prev, policies)
	var fresh []*Policy
	if old != nil {
		fresh = make([]*Policy, 0, len(policies)-len(old))
		for _, p := range policies {
			if old[p] == nil {
				fresh = append(fresh, p)
			}
		}
	} else {
		fresh = policies
	}
	c := compiler{ar: t.ar, strSeed: maphash.MakeSeed(), strIndex: map[uint64][]span{}}
	c.size(fresh)
	t.ar.policies = len(fresh)
	cps := make([]compiledPolicy, len(policies))
	t.compiled = cps
	// Rule spans and port filters of all policies share two slices, cut up
	// once they no longer grow.
	var ruleSpans []span
	var portStore []uint16
	var guardStore []pfx
	type offsets struct {
		rules, ports, dst, src span
		reused                 bool
	}
	offs := make([]offsets, len(policies))
	for i, p := range policies {
		cp := &cps[i]
		if o := old[p]; o != nil {
			*cp = *o // pos is set again when the lists are built
			offs[i].reused = true
			t.byKey[cp.key] = cp
			continue
		}
		cp.p = p
		// One allocation for the key and both reasons.
		const denyPrefix, allowPrefix = "explicitly denied by: ", "allowed by: "
		key := p.Key()
		all := denyPrefix + key + allowPrefix + key
		cp.denyReason = all[:len(denyPrefix)+len(key)]
		cp.key = cp.denyReason[len(denyPrefix):]
		cp.allowReason = all[len(cp.denyReason):]
		cp.enforced = !p.DryRun
		cp.ar = t.ar
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
		if o.reused {
			groupByScope(cp, &global, byNS)
			continue
		}
		cp.rules = ruleSpans[o.rules.lo:o.rules.hi:o.rules.hi]
		cp.ports = portStore[o.ports.lo:o.ports.hi:o.ports.hi]
		if o.dst.hi > 0 {
			cp.dst = guardStore[o.dst.lo:o.dst.hi:o.dst.hi]
		}
		if o.src.hi > 0 {
			cp.src = guardStore[o.src.lo:o.src.hi:o.src.hi]
		}
		groupByScope(cp, &global, byNS)
	}
	t.global = global.build()
	for ns, lb := range byNS {
		v := lb.build()
		t.byNS[ns] = &v
	}
	return t
}

// groupByScope adds cp to the list of its scope: global's or its
// namespace's in byNS; a WORKLOAD_SELECTOR policy is in neither (the
// workloads list it).
func groupByScope(cp *compiledPolicy, global *listBuilder, byNS map[string]*listBuilder) {
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

// reuseFrom returns the compiled form in prev of each of policies that
// prev holds, or nil when prev is nil or empty, or when taking them over
// would leave the new table holding arenas compiled for more than twice
// as many policies as it has (plus a slack of 64): a table keeps alive
// every arena one of its policies points into, and a mesh whose policies
// change one by one would otherwise keep every replaced policy's rules.
func reuseFrom(prev *policyTable, policies []*Policy) map[*Policy]*compiledPolicy {
	if prev == nil || len(prev.policies) == 0 {
		return nil
	}
	old := make(map[*Policy]*compiledPolicy, len(policies))
	arenas := map[*arena]struct{}{}
	held := 0
	for _, p := range policies {
		i, ok := prev.members[p]
		if !ok {
			continue
		}
		cp := &prev.compiled[i]
		old[p] = cp
		if _, seen := arenas[cp.ar]; !seen {
			arenas[cp.ar] = struct{}{}
			held += cp.ar.policies
		}
	}
	if held+len(policies)-len(old) > 2*len(policies)+64 {
		return nil
	}
	return old
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
