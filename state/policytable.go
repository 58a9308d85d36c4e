package state

import (
	"encoding/binary"
	"hash/maphash"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
)

// policyGenerations numbers compiled policy tables. Generation 0 is reserved
// for the empty table, which every snapshot without policies shares.
var policyGenerations atomic.Uint64

// policyTable is the compiled form of a snapshot's policies. It is built by
// NewSnapshot, or derived from the previous table by Apply, and shared,
// unchanged, by every snapshot derived without a policy change, so its
// generation identifies the policy set.
//
// Evaluation visits, in this order: the destination namespace's NAMESPACE
// policies (sorted by key), the GLOBAL policies (sorted by key), then the
// policies the workload lists, in its order. The first match decides, so
// this order fixes which policy a Decision names when several match.
//
// Its indexes are shardMaps, as a snapshot's are, so that a table derived by
// a delta (with) shares every shard the delta does not touch: a change to
// one policy compiles that policy, regroups only its scope (its namespace,
// or the GLOBAL policies) and copies a few shards (issue 36: regrouping and
// re-keying every policy cost ~1 MB of garbage per Authorization change at
// 2,000 policies, which at the scale test's probe rate kept the collector
// running).
type policyTable struct {
	gen   uint64
	n     int                               // policies held
	byKey shardMap[string, *compiledPolicy] // every policy, by key
	// byNS holds the view of each namespace that has NAMESPACE policies.
	byNS   shardMap[string, *policyView]
	global policyView
	// held bounds the policies the arenas this table's policies point into
	// were compiled for (it counts every arena a table derived by with took
	// over or added since the last full compile, live or not): past
	// 2n+64, with compiles everything again, so that a mesh whose policies
	// change one by one does not keep every replaced policy's rules alive.
	held   int
	sorted lazyList[*Policy] // Policies(), sorted by key
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
	// scoped is every policy of the scope, sorted by key, those that can
	// never match too: what a change to the scope rebuilds the view from.
	scoped []*compiledPolicy
}

// lookup returns the policy with the given key, or nil.
func (t *policyTable) lookup(key string) *compiledPolicy {
	if t.byKey.n == 0 {
		return nil
	}
	return t.byKey.get(hashString(key), key)
}

// nsView returns the view of namespace ns, or nil when it has no
// NAMESPACE policy.
func (t *policyTable) nsView(ns string) *policyView {
	if t.byNS.n == 0 {
		return nil
	}
	return t.byNS.get(hashString(ns), ns)
}

// list returns every policy of the table, sorted by key (computed on the
// first call for a table derived by with).
func (t *policyTable) list() []*Policy {
	if t.n == 0 {
		return nil
	}
	return t.sorted.get(func() []*Policy {
		list := make([]*Policy, 0, t.n)
		t.byKey.all(func(_ string, cp *compiledPolicy) { list = append(list, cp.p) })
		sortByKey(list, (*Policy).Key)
		return list
	})
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
// validated and deduplicated, compiling every one. It takes ownership of the
// slice.
func compilePolicies(policies []*Policy) *policyTable {
	if len(policies) == 0 {
		return emptyTable
	}
	sortByKey(policies, (*Policy).Key)
	t := &policyTable{gen: policyGenerations.Add(1), n: len(policies), held: len(policies)}
	cps := compileArena(policies)
	keys := newShardEdit(&t.byKey, hashString, true, len(cps))
	var global listBuilder
	byNS := map[string]*listBuilder{}
	for i := range cps {
		cp := &cps[i]
		keys.set(cp.key, cp)
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
	views := newShardEdit(&t.byNS, hashString, true, len(byNS))
	for ns, lb := range byNS {
		v := lb.build()
		views.set(ns, &v)
	}
	t.sorted.set(policies)
	lastTable.Store(t)
	return t
}

// compileArena compiles policies into one new arena and returns them
// compiled, in their order.
func compileArena(policies []*Policy) []compiledPolicy {
	ar := &arena{}
	c := compiler{ar: ar, strSeed: maphash.MakeSeed(), strIndex: map[uint64][]span{}}
	c.size(policies)
	ar.policies = len(policies)
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
		cp.ar = ar
		rlo, plo := len(ruleSpans), len(portStore)
		ruleSpans, portStore = c.policy(cp, p.Rules, ruleSpans, portStore)
		o := offsets{rules: span{uint32(rlo), uint32(len(ruleSpans))}, ports: span{uint32(plo), uint32(len(portStore))}}
		if !cp.always {
			o.dst, guardStore = addressGuard(p.Rules, guardStore, func(m *Match) []netip.Prefix { return m.DestinationIPs })
			o.src, guardStore = addressGuard(p.Rules, guardStore, func(m *Match) []netip.Prefix { return m.SourceIPs })
		}
		offs[i] = o
	}
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
	}
	return cps
}

// with returns the table of t's policies with puts (validated, distinct
// keys) put in place of those with their keys and the policies under
// removed keys gone (a key both put and removed ends up put), or t itself
// when that changes nothing (the very same Policy values: policies are
// immutable once in a snapshot). It compiles only the policies put; the
// others keep their compiled rules, in the arenas they were compiled into.
// Only the scopes the change touches (its namespaces' views, the GLOBAL
// view) are regrouped, and their policies copied so that positions can be
// renumbered without touching t; every other shard of the indexes is shared
// with t. It compiles everything when the arenas held would exceed held's
// bound.
func (t *policyTable) with(puts []*Policy, removed []string) *policyTable {
	// gone maps every key whose policy leaves t (removed, or replaced by
	// another value) to it; fresh are the values to compile.
	gone := make(map[string]*compiledPolicy, len(puts)+len(removed))
	putKeys := make(map[string]struct{}, len(puts))
	fresh := make([]*Policy, 0, len(puts))
	n := t.n
	for _, p := range puts {
		k := p.Key()
		putKeys[k] = struct{}{}
		switch old := t.lookup(k); {
		case old == nil:
			n++
		case old.p == p:
			continue
		default:
			gone[k] = old
		}
		fresh = append(fresh, p)
	}
	for _, k := range removed {
		if _, put := putKeys[k]; put {
			continue
		}
		if _, dup := gone[k]; dup {
			continue
		}
		if old := t.lookup(k); old != nil {
			gone[k] = old
			n--
		}
	}
	switch {
	case len(fresh) == 0 && len(gone) == 0:
		return t
	case n == 0:
		return emptyTable
	case t.n == 0 || t.held+len(fresh) > 2*n+64:
		list := make([]*Policy, 0, n)
		t.byKey.all(func(k string, cp *compiledPolicy) {
			if _, g := gone[k]; !g {
				list = append(list, cp.p)
			}
		})
		return compilePolicies(append(list, fresh...))
	}

	nt := &policyTable{gen: policyGenerations.Add(1), n: n, held: t.held + len(fresh),
		byKey: t.byKey, byNS: t.byNS, global: t.global}
	defer lastTable.Store(nt)
	cps := compileArena(fresh)
	keys := newShardEdit(&nt.byKey, hashString, false, 0)
	global := false
	var namespaces []string
	touch := func(p *Policy) {
		switch p.Scope {
		case ScopeGlobal:
			global = true
		case ScopeNamespace:
			if !slices.Contains(namespaces, p.Namespace) {
				namespaces = append(namespaces, p.Namespace)
			}
		}
	}
	for k, old := range gone {
		if old != nil {
			touch(old.p)
			keys.del(k)
		}
	}
	added := make([]*compiledPolicy, len(cps))
	for i := range cps {
		added[i] = &cps[i]
		touch(cps[i].p)
		keys.set(cps[i].key, &cps[i])
	}
	// regroup returns the view of a scope that held old (nil: none) and
	// gains the policies of added in it (in reports whether a policy is).
	regroup := func(old *policyView, in func(*Policy) bool) policyView {
		var kept []compiledPolicy
		if old != nil {
			kept = make([]compiledPolicy, 0, len(old.scoped))
			for _, cp := range old.scoped {
				if _, g := gone[cp.key]; !g {
					kept = append(kept, *cp)
				}
			}
		}
		scoped := make([]*compiledPolicy, 0, len(kept)+len(added))
		for i := range kept {
			scoped = append(scoped, &kept[i])
			keys.set(kept[i].key, &kept[i])
		}
		for _, cp := range added {
			if in(cp.p) {
				scoped = append(scoped, cp)
			}
		}
		slices.SortFunc(scoped, func(a, b *compiledPolicy) int { return strings.Compare(a.key, b.key) })
		var lb listBuilder
		for _, cp := range scoped {
			lb.add(cp)
		}
		return lb.build()
	}
	if global {
		nt.global = regroup(&t.global, func(p *Policy) bool { return p.Scope == ScopeGlobal })
	}
	if len(namespaces) > 0 {
		views := newShardEdit(&nt.byNS, hashString, false, 0)
		for _, ns := range namespaces {
			v := regroup(t.nsView(ns), func(p *Policy) bool { return p.Scope == ScopeNamespace && p.Namespace == ns })
			if len(v.scoped) == 0 {
				views.del(ns)
				continue
			}
			views.set(ns, &v)
		}
		views.finish()
	}
	keys.finish()
	return nt
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

// holdsExactly reports whether t holds exactly these policies (in any
// order).
func (t *policyTable) holdsExactly(policies []*Policy) bool {
	if len(policies) != t.n {
		return false
	}
	seen := make(map[*Policy]struct{}, len(policies))
	for _, p := range policies {
		if p == nil {
			return false
		}
		if cp := t.lookup(p.Key()); cp == nil || cp.p != p {
			return false
		}
		if _, dup := seen[p]; dup {
			return false
		}
		seen[p] = struct{}{}
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
	deny, allow, dryDeny, dryAllow, scoped []*compiledPolicy
	hasAllow                               bool
}

// add adds cp, which sorts after every policy added before it.
func (lb *listBuilder) add(cp *compiledPolicy) {
	lb.scoped = append(lb.scoped, cp)
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
		hasAllow: lb.hasAllow, scoped: lb.scoped,
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
