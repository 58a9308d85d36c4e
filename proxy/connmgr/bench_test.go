package connmgr

import (
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ztunnel-go/ztunnel/state"
)

// BenchmarkTrack measures Track+Untrack of one connection, serially and
// from all Ps at once, against a single mutex-protected map for comparison.
func BenchmarkTrack(b *testing.B) {
	s0 := snapshot(b)
	closeFn := func(string) {}
	b.Run("serial", func(b *testing.B) {
		m := New(Config{Store: state.NewStore(s0)})
		c := conn("sleep", 40001)
		b.ReportAllocs()
		for b.Loop() {
			m.Track(s0, c, closeFn).Untrack()
		}
	})
	b.Run("parallel", func(b *testing.B) {
		m := New(Config{Store: state.NewStore(s0)})
		var port atomic.Uint32
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			// Each goroutine keeps a few connections open, as a proxy does.
			c := conn("sleep", uint16(port.Add(1)*7919))
			var open [8]*Tracked
			i := 0
			for pb.Next() {
				c.Src = netip.AddrPortFrom(c.Src.Addr(), c.Src.Port()+1)
				open[i%8].Untrack()
				open[i%8] = m.Track(s0, c, closeFn)
				i++
			}
			for _, t := range open {
				t.Untrack()
			}
		})
	})
	b.Run("parallel-one-mutex-map", func(b *testing.B) {
		var mu sync.Mutex
		conns := map[*Tracked]struct{}{}
		var port atomic.Uint32
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			c := conn("sleep", uint16(port.Add(1)*7919))
			var open [8]*Tracked
			i := 0
			for pb.Next() {
				c.Src = netip.AddrPortFrom(c.Src.Addr(), c.Src.Port()+1)
				if t := open[i%8]; t != nil {
					mu.Lock()
					delete(conns, t)
					mu.Unlock()
				}
				f := &funcConn{conn: c, closeFn: closeFn}
				t := &f.t
				t.c = f
				t.gen.Store(s0.PolicyGeneration())
				mu.Lock()
				conns[t] = struct{}{}
				mu.Unlock()
				open[i%8] = t
				i++
			}
		})
	})
}

// BenchmarkRecheck10k measures a re-check of 10,000 tracked connections
// that all stay allowed (every one is evaluated; none is closed), with the
// 5 policies a typical workload has and with 10,000 policies of ztunnel's
// benchmark shape.
func BenchmarkRecheck10k(b *testing.B) {
	for _, bc := range []struct {
		name     string
		policies func() []*state.Policy
	}{
		{"5-policies", typicalPolicies},
		{"10k-policies", func() []*state.Policy { return manyPolicies(10000) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			// Two generations of the same policies: each Recheck sees a
			// new one, so it evaluates every connection.
			gens := [2]*state.Snapshot{snapshot(b, bc.policies()...), snapshot(b, bc.policies()...)}
			m := New(Config{})
			for i := range 10000 {
				c := conn("sleep", uint16(i))
				if !gens[0].Authorize(c).Allowed {
					b.Fatal("not allowed")
				}
				m.Track(gens[0], c, func(string) { b.Fatal("closed") })
			}
			i := 0
			b.ReportAllocs()
			for b.Loop() {
				i++
				if n := m.Recheck(gens[i%2]); n != 0 {
					b.Fatal(n)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/10000, "ns/conn")
		})
	}
}

// typicalPolicies is the shape a typical workload sees: a mesh-wide STRICT
// policy, a namespace ALLOW of a few principals (client/sleep among them), a
// port DENY, another ALLOW and a dry-run policy.
func typicalPolicies() []*state.Policy {
	strict := state.Match{NotPrincipals: []state.StringMatch{{Kind: state.MatchPresence}}}
	return []*state.Policy{
		{Name: "istio_converted_static_strict", Namespace: "istio-system", Scope: state.ScopeGlobal, Action: state.ActionDeny,
			Rules: [][][]state.Match{{{strict}}}},
		{Name: "allow-frontends", Namespace: "ns1", Scope: state.ScopeNamespace, Action: state.ActionAllow,
			Rules: [][][]state.Match{{{{Principals: []state.StringMatch{
				{Kind: state.MatchExact, Value: "cluster.local/ns/web/sa/frontend"},
				{Kind: state.MatchPrefix, Value: "cluster.local/ns/batch/"},
				{Kind: state.MatchExact, Value: "cluster.local/ns/client/sa/sleep"},
			}}}}}},
		{Name: "deny-admin-port", Namespace: "ns1", Scope: state.ScopeNamespace, Action: state.ActionDeny,
			Rules: [][][]state.Match{{{{DestinationPorts: []uint16{9000, 9001}}}}}},
		{Name: "allow-lan", Namespace: "ns1", Scope: state.ScopeNamespace, Action: state.ActionAllow,
			Rules: [][][]state.Match{{{{SourceIPs: []netip.Prefix{netip.MustParsePrefix("192.168.0.0/16")}}}}}},
		{Name: "dry", Namespace: "ns1", Scope: state.ScopeNamespace, Action: state.ActionDeny, DryRun: true,
			Rules: [][][]state.Match{{{{Namespaces: []state.StringMatch{{Kind: state.MatchExact, Value: "legacy"}}}}}}},
	}
}

// manyPolicies is ztunnel's rbac benchmark set (benches/throughput.rs): n
// GLOBAL DENY policies of 10 rules that match nothing here.
func manyPolicies(n int) []*state.Policy {
	net := netip.MustParsePrefix("198.51.100.0/24")
	out := make([]*state.Policy, n)
	for i := range out {
		rules := make([][][]state.Match, 10)
		for r := range rules {
			rules[r] = [][]state.Match{{{
				Namespaces: []state.StringMatch{
					{Kind: state.MatchPrefix, Value: "random-prefix-2b123"}, {Kind: state.MatchSuffix, Value: "random-postix-2b723"}, {Kind: state.MatchExact, Value: "random-exac-2bc13"},
				},
				Principals: []state.StringMatch{
					{Kind: state.MatchPrefix, Value: "random-prefix-2b123"}, {Kind: state.MatchSuffix, Value: "random-postix-2b723"}, {Kind: state.MatchExact, Value: "random-exac-2bc13"},
				},
				SourceIPs: []netip.Prefix{net}, DestinationIPs: []netip.Prefix{net}, DestinationPorts: []uint16{0},
			}}}
		}
		out[i] = &state.Policy{Name: "policy " + strconv.Itoa(i), Namespace: "default", Scope: state.ScopeGlobal, Action: state.ActionDeny, Rules: rules}
	}
	return out
}
