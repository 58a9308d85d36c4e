package state

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
)

// TestPolicyDeltasMatchReference applies random sequences of policy deltas
// (new keys, new versions of held keys, a scope or namespace changed under
// the same name, removals, removals of keys never held, a key both put and
// removed, the very same values put again) and checks after every step that
// the snapshot decides as the reference does on its policy set, that
// Policies lists that set, and that the snapshot it was applied to still
// decides as before (a derived table shares that one's compiled policies).
func TestPolicyDeltasMatchReference(t *testing.T) {
	for _, min := range []int{indexMin, 1} {
		t.Run(fmt.Sprintf("indexMin=%d", min), func(t *testing.T) {
			defer func(saved int) { indexMin = saved }(indexMin)
			indexMin = min
			r := rand.New(rand.NewPCG(11, uint64(min)))
			for seq := range 60 {
				policyDeltaSequence(t, r, seq)
			}
		})
	}
}

func policyDeltaSequence(t *testing.T, r *rand.Rand, seq int) {
	g := &policyGen{r: r}
	model := map[string]*Policy{}
	for _, p := range g.policies() {
		model[p.Key()] = p
	}
	sorted := func(m map[string]*Policy) []*Policy {
		return slices.SortedFunc(maps.Values(m), func(a, b *Policy) int { return cmpString(a.Key(), b.Key()) })
	}
	keysNow := func() []string { return slices.Sorted(maps.Keys(model)) }
	workloads := make([]*Workload, 4)
	for i := range workloads {
		workloads[i] = g.workload(i, keysNow())
	}
	s, err := NewSnapshot(slices.Clone(workloads), nil, sorted(model))
	if err != nil {
		t.Fatal(err)
	}
	check := func(step int, snap *Snapshot, want []*Policy) {
		t.Helper()
		if got := snap.Policies(); !slices.Equal(got, want) && len(got)+len(want) > 0 {
			t.Fatalf("seq %d step %d: Policies = %v, want %v", seq, step, keysOf(got), keysOf(want))
		}
		for range 30 {
			c := g.conn()
			c.DstWorkload = workloads[r.IntN(len(workloads))]
			if got, ref := snap.Authorize(c), refAuthorize(want, c); got != ref {
				t.Fatalf("seq %d step %d: Authorize = %+v, reference = %+v\n%s", seq, step, got, ref, describe(want, c))
			}
			if got, ref := snap.DryRunMatches(c), refDryRunMatches(want, c); !slices.Equal(got, ref) {
				t.Fatalf("seq %d step %d: DryRunMatches = %v, reference = %v\n%s", seq, step, keysOf(got), keysOf(ref), describe(want, c))
			}
		}
	}
	for step := range 25 {
		prev, prevSet := s, sorted(model)
		next := maps.Clone(model)
		var d Delta
		for _, k := range slices.Sorted(maps.Keys(model)) {
			switch r.IntN(8) {
			case 0:
				d.RemovedPolicies = append(d.RemovedPolicies, k)
				delete(next, k)
			case 1: // a new version, maybe of another scope or action
				p := *model[k]
				np := g.policies()
				if len(np) > 0 {
					p.Scope, p.Action, p.DryRun, p.Rules = np[0].Scope, np[0].Action, np[0].DryRun, np[0].Rules
				}
				if p.Scope == ScopeNamespace && p.Namespace == "" {
					p.Scope = ScopeGlobal
				}
				d.Policies = append(d.Policies, &p)
				next[k] = &p
			case 2: // the very same value again
				d.Policies = append(d.Policies, model[k])
			case 3: // put and removed in one delta: put wins
				p := *model[k]
				p.DryRun = !p.DryRun
				d.Policies = append(d.Policies, &p)
				d.RemovedPolicies = append(d.RemovedPolicies, k)
				next[k] = &p
			}
		}
		for _, p := range g.policies() {
			if _, held := next[p.Key()]; held || r.IntN(3) != 0 {
				continue
			}
			if slices.ContainsFunc(d.Policies, func(q *Policy) bool { return q.Key() == p.Key() }) {
				continue
			}
			d.Policies = append(d.Policies, p)
			next[p.Key()] = p
		}
		if r.IntN(4) == 0 {
			d.RemovedPolicies = append(d.RemovedPolicies, "ns1/never-held")
		}
		if s, err = s.Apply(d); err != nil {
			t.Fatalf("seq %d step %d: %v", seq, step, err)
		}
		model = next
		check(step, s, sorted(model))
		check(step, prev, prevSet)
	}
}

// TestPolicyDeltaCost: at 2,000 policies over 1,000 namespaces (the scale
// test's mesh), a delta that puts or removes one NAMESPACE policy allocates
// for its namespace, not for the whole table (issue 36: ~1 MB per change,
// which at the scale test's rate of Authorization probes kept the
// collector running and held the change latency's tail).
func TestPolicyDeltaCost(t *testing.T) {
	var policies []*Policy
	for i := range 2000 {
		ns := fmt.Sprintf("ns-%d", i%1000)
		scope := ScopeWorkloadSelector
		if i%4 == 3 {
			scope = ScopeNamespace
		}
		policies = append(policies, pol(ActionAllow, scope, ns, fmt.Sprintf("p%d", i), [][]Match{
			{{Principals: []StringMatch{exact("cluster.local/ns/" + ns + "/sa/a"), prefix("cluster.local/ns/" + ns + "/")}}},
			{{DestinationPorts: []uint16{8080, 9090}}},
		}))
	}
	s, err := NewSnapshot(nil, nil, policies)
	if err != nil {
		t.Fatal(err)
	}
	deny := pol(ActionDeny, ScopeNamespace, "ns-7", "deny", [][]Match{{{Principals: []StringMatch{exact("cluster.local/ns/default/sa/client")}}}})
	const limit = 64 << 10
	for i := range 200 {
		d := Delta{Policies: []*Policy{deny}}
		if i%2 == 1 {
			d = Delta{RemovedPolicies: []string{deny.Key()}}
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		next, err := s.Apply(d)
		runtime.ReadMemStats(&after)
		if err != nil {
			t.Fatal(err)
		}
		if n := after.TotalAlloc - before.TotalAlloc; n > limit {
			t.Fatalf("change %d allocated %d bytes, want at most %d", i, n, limit)
		}
		if want := 2000 + (1 - i%2); len(next.Policies()) != want {
			t.Fatalf("change %d: %d policies, want %d", i, len(next.Policies()), want)
		}
		s = next
	}
}
