package state

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/internal/fuzzseed"
)

// TestAuthorizeMatchesReference generates random policy sets and random
// connections and checks that the compiled evaluator (Authorize,
// DryRunMatches) agrees with the reference evaluator on every one: the
// decision, the deciding policy and the reason.
//
// The generators draw from small vocabularies so that matches, near misses,
// duplicate keys, shared prefixes and lists long enough to be port-indexed
// all occur often.
func TestAuthorizeMatchesReference(t *testing.T) {
	// Once as built, and once with every list indexed by port.
	for _, min := range []int{indexMin, 1} {
		t.Run(fmt.Sprintf("indexMin=%d", min), func(t *testing.T) {
			defer func(saved int) { indexMin = saved }(indexMin)
			indexMin = min
			compareWithReference(t, rand.New(rand.NewPCG(7, uint64(min))))
		})
	}
}

func compareWithReference(t *testing.T, r *rand.Rand) {
	const (
		sets        = 500
		connsPerSet = 60
	)
	var cases, allowedN, deniedByPolicy, dryHits, indexed int
	for set := range sets {
		g := &policyGen{r: r}
		policies := g.policies()
		keys := make([]string, 0, len(policies))
		for _, p := range policies {
			keys = append(keys, p.Key())
		}
		workloads := make([]*Workload, 4)
		for i := range workloads {
			workloads[i] = g.workload(i, keys)
		}
		s, err := NewSnapshot(slices.Clone(workloads), nil, slices.Clone(policies))
		if err != nil {
			t.Fatalf("set %d: %v", set, err)
		}
		if s.pol.global.deny.byPort != nil || s.pol.global.allow.byPort != nil {
			indexed++
		}
		// A snapshot derived with WithWorkloads evaluates the same way.
		derived, err := s.WithWorkloads(nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		applied := appliedPolicies(t, workloads, policies)
		for range connsPerSet {
			c := g.conn()
			if r.IntN(40) != 0 {
				c.DstWorkload = workloads[r.IntN(len(workloads))]
			}
			cases++
			want := refAuthorize(policies, c)
			for _, snap := range []*Snapshot{s, derived, applied} {
				if got := snap.Authorize(c); got != want {
					t.Fatalf("set %d: Authorize = %+v, reference = %+v\n%s", set, got, want, describe(policies, c))
				}
			}
			switch {
			case want.Allowed:
				allowedN++
			case want.Policy != "":
				deniedByPolicy++
			}
			gotDry, wantDry := s.DryRunMatches(c), refDryRunMatches(policies, c)
			if !slices.Equal(gotDry, wantDry) {
				t.Fatalf("set %d: DryRunMatches = %v, reference = %v\n%s", set, keysOf(gotDry), keysOf(wantDry), describe(policies, c))
			}
			dryHits += len(wantDry)
		}
	}
	t.Logf("%d cases: %d allowed, %d denied by a DENY policy, %d dry-run matches; %d of %d sets with an indexed global list",
		cases, allowedN, deniedByPolicy, dryHits, indexed, sets)
	// The generator must exercise every outcome, or the comparison proves
	// little.
	if indexed == 0 || indexMin == 1 && indexed < sets/4 || allowedN < cases/10 || deniedByPolicy < cases/10 || cases-allowedN-deniedByPolicy < cases/20 || dryHits < cases/20 {
		t.Fatalf("generator is lopsided: %d cases, %d allowed, %d denied by policy, %d dry-run matches", cases, allowedN, deniedByPolicy, dryHits)
	}
}

// appliedPolicies returns a snapshot of workloads and policies reached by
// Apply: from a snapshot holding the second half of policies and a decoy
// of each policy of the first half (same rules, another name and the other
// action), a delta gives the first half and removes the decoys. It fails
// unless the result took over the second half's compiled rules from the
// snapshot it was applied to rather than compiling them again.
func appliedPolicies(t *testing.T, workloads []*Workload, policies []*Policy) *Snapshot {
	t.Helper()
	half := len(policies) / 2
	var decoys []*Policy
	var decoyKeys []string
	for _, p := range policies[:half] {
		d := *p
		d.Name += "-decoy"
		d.Action = ActionDeny
		if p.Action == ActionDeny {
			d.Action = ActionAllow
		}
		decoys = append(decoys, &d)
		decoyKeys = append(decoyKeys, d.Key())
	}
	base, err := NewSnapshot(slices.Clone(workloads), nil, append(slices.Clone(policies[half:]), decoys...))
	if err != nil {
		t.Fatal(err)
	}
	applied, err := base.Apply(Delta{Policies: slices.Clone(policies[:half]), RemovedPolicies: decoyKeys})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range policies[half:] {
		if got := applied.pol.lookup(p.Key()).ar; got != base.pol.lookup(p.Key()).ar {
			t.Fatalf("policy %s was compiled again by a delta that did not change it", p.Key())
		}
	}
	return applied
}

// FuzzAuthorizeMatchesReference runs the comparison on policy sets and
// connections generated from fuzzed seeds.
func FuzzAuthorizeMatchesReference(f *testing.F) {
	fuzzseed.Add(f, uint64(1), uint64(2), uint8(8))
	fuzzseed.Add(f, uint64(7), uint64(2026), uint8(1))
	f.Fuzz(func(t *testing.T, seed1, seed2 uint64, min uint8) {
		defer func(saved int) { indexMin = saved }(indexMin)
		indexMin = 1 + int(min%16)
		r := rand.New(rand.NewPCG(seed1, seed2))
		g := &policyGen{r: r}
		policies := g.policies()
		var keys []string
		for _, p := range policies {
			keys = append(keys, p.Key())
		}
		w := g.workload(0, keys)
		s, err := NewSnapshot([]*Workload{w}, nil, slices.Clone(policies))
		if err != nil {
			t.Fatal(err)
		}
		for range 20 {
			c := g.conn()
			c.DstWorkload = w
			if got, want := s.Authorize(c), refAuthorize(policies, c); got != want {
				t.Fatalf("Authorize = %+v, reference = %+v\n%s", got, want, describe(policies, c))
			}
			if got, want := s.DryRunMatches(c), refDryRunMatches(policies, c); !slices.Equal(got, want) {
				t.Fatalf("DryRunMatches = %v, reference = %v\n%s", keysOf(got), keysOf(want), describe(policies, c))
			}
		}
	})
}

func keysOf(ps []*Policy) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Key())
	}
	return out
}

func describe(policies []*Policy, c Conn) string {
	s := fmt.Sprintf("conn: src=%v dst=%v id=%+v", c.Src, c.Dst, c.SrcIdentity)
	if c.DstWorkload != nil {
		s += fmt.Sprintf(" workload ns=%q listed=%q", c.DstWorkload.Namespace(), c.DstWorkload.AuthorizationPolicies())
	}
	for _, p := range policies {
		s += fmt.Sprintf("\n  %s %v %v dry=%v rules=%+v", p.Key(), p.Scope, p.Action, p.DryRun, p.Rules)
	}
	return s
}

type policyGen struct{ r *rand.Rand }

func (g *policyGen) pick(options ...string) string { return options[g.r.IntN(len(options))] }

func (g *policyGen) chance(n int) bool { return g.r.IntN(n) == 0 }

var (
	genNamespaces = []string{"", "a", "b", "ab", "ns1", "ns2"}
	genAccounts   = []string{"", "x", "sa", "xy"}
	genDomains    = []string{"", "td", "cluster.local"}
	genAddrs      = []string{
		"10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.1.7", "10.1.0.1", "192.168.0.1", "0.0.0.0", "255.255.255.255",
		"2001:db8::1", "2001:db8::2", "2001:db8:0:1::1", "fe80::1", "::", "::1", "::ffff:10.0.0.1",
	}
	genPorts = []uint16{0, 80, 8080, 9090, 15008, 65535}
)

// policies returns up to ~40 policies with distinct keys, most of them in
// ns1 or global so that lists reach the indexed size.
func (g *policyGen) policies() []*Policy {
	n := g.r.IntN(8)
	if g.chance(3) {
		n = g.r.IntN(41)
	}
	seen := map[string]bool{}
	var out []*Policy
	for range n {
		p := &Policy{
			Name:   g.pick("p", "q", "r", "s", "t", "u", "v", "w", "x", "y", "z") + g.pick("", "1", "2", "3", "4", "5"),
			Scope:  Scope(g.r.IntN(3)),
			Action: Action(g.r.IntN(3) / 2), // one in three is a DENY
			DryRun: g.chance(4),
		}
		switch p.Scope {
		case ScopeNamespace:
			p.Namespace = g.pick("ns1", "ns1", "ns2", "a")
		default:
			p.Namespace = g.pick("", "ns1", "ns2", "istio-system")
		}
		if seen[p.Key()] {
			continue
		}
		seen[p.Key()] = true
		if !g.chance(8) { // else no rules: the policy never matches
			p.Rules = make([][][]Match, 1+g.r.IntN(3))
			for i := range p.Rules {
				p.Rules[i] = g.rule()
			}
		}
		out = append(out, p)
	}
	return out
}

func (g *policyGen) rule() [][]Match {
	if g.chance(10) {
		return nil // a rule without clauses matches everything
	}
	rule := make([][]Match, 1+g.r.IntN(3))
	for i := range rule {
		if g.chance(10) {
			continue // an empty clause is true
		}
		clause := make([]Match, 1+g.r.IntN(3))
		for j := range clause {
			clause[j] = g.match()
		}
		rule[i] = clause
	}
	return rule
}

func (g *policyGen) match() Match {
	var m Match
	if g.chance(12) {
		return m // an empty match never matches
	}
	// Few fields per match, so that matches are neither always nor never
	// true; ports are common, to exercise the port index.
	const p = 6
	if g.chance(p) {
		m.Namespaces = g.strMatches(g.namespaceValue)
	}
	if g.chance(p * 2) {
		m.NotNamespaces = g.strMatches(g.namespaceValue)
	}
	if g.chance(p) {
		m.Principals = g.strMatches(g.principalValue)
	}
	if g.chance(p * 2) {
		m.NotPrincipals = g.strMatches(g.principalValue)
	}
	if g.chance(p) {
		m.ServiceAccounts = g.saMatches()
	}
	if g.chance(p * 2) {
		m.NotServiceAccounts = g.saMatches()
	}
	if g.chance(p) {
		m.SourceIPs = g.prefixes()
	}
	if g.chance(p * 2) {
		m.NotSourceIPs = g.prefixes()
	}
	if g.chance(p) {
		m.DestinationIPs = g.prefixes()
	}
	if g.chance(p * 2) {
		m.NotDestinationIPs = g.prefixes()
	}
	if g.chance(3) {
		m.DestinationPorts = g.ports()
	}
	if g.chance(p) {
		m.NotDestinationPorts = g.ports()
	}
	return m
}

func (g *policyGen) count() int { return 1 + g.r.IntN(3) }

func (g *policyGen) strMatches(value func() string) []StringMatch {
	out := make([]StringMatch, g.count())
	for i := range out {
		out[i] = StringMatch{Kind: MatchKind(g.r.IntN(4)), Value: value()}
	}
	return out
}

func (g *policyGen) namespaceValue() string {
	ns := g.pick(genNamespaces...)
	switch g.r.IntN(4) {
	case 0:
		return ns[:g.r.IntN(len(ns)+1)]
	case 1:
		return ns[g.r.IntN(len(ns)+1):]
	}
	return ns
}

// principalValue returns a principal, a piece of one, or one with the
// scheme, so that exact, prefix and suffix matches hit and miss.
func (g *policyGen) principalValue() string {
	full := g.identity().Principal()
	switch g.r.IntN(6) {
	case 0:
		return full[:g.r.IntN(len(full)+1)]
	case 1:
		return full[g.r.IntN(len(full)+1):]
	case 2:
		return "spiffe://" + full
	case 3:
		return g.pick("", "/", "td/", "/sa/x", "/ns/", "cluster.local/ns/a/sa/x")
	}
	return full
}

func (g *policyGen) saMatches() []ServiceAccountMatch {
	out := make([]ServiceAccountMatch, g.count())
	for i := range out {
		out[i] = ServiceAccountMatch{Namespace: g.pick(genNamespaces...), ServiceAccount: g.pick(genAccounts...)}
	}
	return out
}

func (g *policyGen) prefixes() []netip.Prefix {
	out := make([]netip.Prefix, g.count())
	for i := range out {
		a := netip.MustParseAddr(g.pick(genAddrs...))
		maxBits := a.BitLen()
		var bits int
		switch g.r.IntN(4) {
		case 0:
			bits = maxBits
		case 1:
			bits = 0
		default:
			bits = g.r.IntN(maxBits + 1)
		}
		out[i] = netip.PrefixFrom(a, bits) // host bits are kept on purpose
	}
	return out
}

func (g *policyGen) ports() []uint16 {
	out := make([]uint16, g.count())
	for i := range out {
		out[i] = genPorts[g.r.IntN(len(genPorts))]
	}
	return out
}

func (g *policyGen) identity() identity.Identity {
	return identity.Identity{
		TrustDomain:    g.pick(genDomains...),
		Namespace:      g.pick(genNamespaces...),
		ServiceAccount: g.pick(genAccounts...),
	}
}

// workload returns a destination listing a few of keys and of missing keys,
// duplicates included.
func (g *policyGen) workload(i int, keys []string) *Workload {
	w := &Workload{
		UID: fmt.Sprintf("uid%d", i), Name: "w",
		Capacity: 1,
		Labels:   &WorkloadLabels{Namespace: g.pick("ns1", "ns1", "ns2", "a", "")},
	}
	// Up to 7 keys: Authorize remembers 4 listed ALLOW policies and looks
	// the rest up again.
	for range g.r.IntN(8) {
		if len(keys) > 0 && !g.chance(4) {
			w.editExtra(func(x *WorkloadExtra) {
				x.AuthorizationPolicies = append(x.AuthorizationPolicies, keys[g.r.IntN(len(keys))])
			})
		} else {
			w.editExtra(func(x *WorkloadExtra) {
				x.AuthorizationPolicies = append(x.AuthorizationPolicies, g.pick("ns1/missing", "/p", "ns1"))
			})
		}
	}
	return w
}

func (g *policyGen) addr() netip.Addr {
	switch g.r.IntN(12) {
	case 0:
		return netip.Addr{}
	case 1:
		return netip.MustParseAddr("fe80::1%eth0")
	}
	return netip.MustParseAddr(g.pick(genAddrs...))
}

func (g *policyGen) conn() Conn {
	c := Conn{
		Src: netip.AddrPortFrom(g.addr(), uint16(g.r.IntN(65536))),
		Dst: netip.AddrPortFrom(g.addr(), genPorts[g.r.IntN(len(genPorts))]),
	}
	if g.chance(20) {
		c.Dst = netip.AddrPortFrom(c.Dst.Addr(), uint16(g.r.IntN(65536)))
	}
	if !g.chance(3) {
		c.SrcIdentity = g.identity()
	}
	return c
}

// TestPolicyArenasBounded changes the policies of a snapshot by deltas:
// every table takes the unchanged policies' compiled rules over from the
// last, and the arenas a table keeps alive that way hold rules for at most
// about twice the policies it has (beyond that it compiles everything
// again), whatever the pattern of changes.
func TestPolicyArenasBounded(t *testing.T) {
	const n, steps = 200, 100
	policy := func(i, version int) *Policy {
		return &Policy{Name: fmt.Sprintf("p%d", i), Namespace: "ns", Scope: ScopeNamespace, Action: ActionAllow,
			Rules: [][][]Match{{{{DestinationPorts: []uint16{uint16(1000 + version)}}}}}}
	}
	for _, tc := range []struct {
		name string
		// changed returns the indexes of the policies step replaces.
		changed    func(step int) []int
		recompiles bool // whether the pattern must make full compiles
	}{
		// One by one: a replaced policy's old arena dies with its last
		// live policy, so taking over never holds much.
		{"one by one", func(step int) []int { return []int{step % n} }, false},
		// All but a growing prefix: each step leaves one more live policy
		// in an otherwise dead arena of ~n policies.
		{"all but a growing prefix", func(step int) []int {
			var idx []int
			for i := 1 + step%(n/2); i < n; i++ {
				idx = append(idx, i)
			}
			return idx
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			policies := make([]*Policy, n)
			for i := range policies {
				policies[i] = policy(i, 0)
			}
			s, err := NewSnapshot(nil, nil, slices.Clone(policies))
			if err != nil {
				t.Fatal(err)
			}
			recompiled := 0
			for step := range steps {
				prev := s.pol
				var d Delta
				changed := map[int]bool{}
				for _, i := range tc.changed(step) {
					d.Policies = append(d.Policies, policy(i, step+1))
					changed[i] = true
				}
				if s, err = s.Apply(d); err != nil {
					t.Fatal(err)
				}
				held := map[*arena]bool{}
				total := 0
				s.pol.byKey.all(func(_ string, cp *compiledPolicy) {
					if !held[cp.ar] {
						held[cp.ar] = true
						total += cp.ar.policies
					}
				})
				if total > 2*n+64 {
					t.Fatalf("step %d: the table holds arenas compiled for %d policies, it has %d", step, total, n)
				}
				if len(held) == 1 && total == n {
					recompiled++
					continue
				}
				for i := range n {
					key := fmt.Sprintf("ns/p%d", i)
					reused := s.pol.lookup(key).ar == prev.lookup(key).ar
					if reused == changed[i] {
						t.Fatalf("step %d: policy %s changed %v, compiled rules taken over %v", step, key, changed[i], reused)
					}
				}
			}
			if (recompiled > 0) != tc.recompiles {
				t.Errorf("%d full compiles in %d steps", recompiled, steps)
			}
		})
	}
}
