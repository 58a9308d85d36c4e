package state

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/ztunnel-go/ztunnel/identity"
)

// deltaModel is the reference an Apply result is checked against: the sets
// a sequence of deltas leads to, built with NewSnapshot.
type deltaModel struct {
	w map[string]*Workload
	s map[string]*Service
	p map[string]*Policy
}

func newDeltaModel() deltaModel {
	return deltaModel{w: map[string]*Workload{}, s: map[string]*Service{}, p: map[string]*Policy{}}
}

// apply returns the model changed by d (removals first, as Apply does), and
// whether d is well keyed (no nil value, no key given twice).
func (m deltaModel) apply(d Delta) (deltaModel, bool) {
	ok := true
	n := deltaModel{w: maps.Clone(m.w), s: maps.Clone(m.s), p: maps.Clone(m.p)}
	for _, k := range d.RemovedWorkloads {
		delete(n.w, k)
	}
	for _, k := range d.RemovedServices {
		delete(n.s, k)
	}
	for _, k := range d.RemovedPolicies {
		delete(n.p, k)
	}
	seen := map[string]bool{}
	for _, w := range d.Workloads {
		if w == nil || seen[w.UID] {
			ok = false
			continue
		}
		seen[w.UID] = true
		n.w[w.UID] = w
	}
	for _, v := range d.Services {
		if v == nil || seen["s:"+v.Key()] {
			ok = false
			continue
		}
		seen["s:"+v.Key()] = true
		n.s[v.Key()] = v
	}
	for _, p := range d.Policies {
		if p == nil || seen["p:"+p.Key()] {
			ok = false
			continue
		}
		seen["p:"+p.Key()] = true
		n.p[p.Key()] = p
	}
	return n, ok
}

func (m deltaModel) build() (*Snapshot, error) {
	return NewSnapshot(slices.Collect(maps.Values(m.w)), slices.Collect(maps.Values(m.s)), slices.Collect(maps.Values(m.p)))
}

// Pools the random deltas draw from: small, so that keys, addresses and
// VIPs collide often.
var (
	dNamespaces = []string{"a", "b", "c"}
	dNetworks   = []string{"", "net2"}
	dHosts      = []string{"h0.svc", "h1.svc", "shared.svc"}
	dNames      = []string{"n0", "n1", "n2"}
	dSAs        = []string{"", "sa0", "sa1"}
	dPolicyKeys = []string{"a/p0", "a/p1", "b/p2", "c/p3", "b/p4"}
	dIPs        = func() []netip.Addr {
		var out []netip.Addr
		for i := range 60 {
			out = append(out, netip.AddrFrom4([4]byte{10, 0, 0, byte(i + 1)}))
		}
		for i := range 6 {
			out = append(out, netip.MustParseAddr(fmt.Sprintf("fd00::%x", i+1)))
		}
		return out
	}()
	dVIPs = []netip.Addr{
		netip.MustParseAddr("10.96.0.1"), netip.MustParseAddr("10.96.0.2"), netip.MustParseAddr("10.96.1.3"),
		netip.MustParseAddr("10.0.0.7"), netip.MustParseAddr("fd00::1"),
	}
	dCIDRs = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("10.96.0.0/24"), netip.MustParsePrefix("10.0.0.0/8")}
)

func dServiceKeys() []string {
	var out []string
	for _, ns := range dNamespaces[:2] {
		for _, h := range dHosts {
			out = append(out, ns+"/"+h)
		}
	}
	return append(out, "c/h0.svc")
}

type deltaGen struct{ r *rand.Rand }

func (g deltaGen) pick(list []string) string { return list[g.r.IntN(len(list))] }
func (g deltaGen) one(n int) bool            { return g.r.IntN(n) == 0 }

func (g deltaGen) workload(uid string) *Workload {
	w := &Workload{
		UID: uid, Name: g.pick(dNames),
		Protocol: Protocol(g.r.IntN(2)), Capacity: 1,
		Labels: &WorkloadLabels{Namespace: g.pick(dNamespaces), ServiceAccount: g.pick(dSAs), Network: g.pick(dNetworks)},
		Place:  &Placement{Node: g.pick([]string{"", "node1"})},
	}
	for range g.r.IntN(3) {
		ip := dIPs[g.r.IntN(len(dIPs))]
		if ip.Is4() && g.one(5) {
			ip = netip.AddrFrom16(ip.As16()) // IPv4-mapped: the same key
		}
		w.Addresses = append(w.Addresses, ip)
	}
	if g.one(8) {
		w.NetworkMode = NetworkModeHostNetwork
	}
	if g.one(4) {
		w.editExtra(func(x *WorkloadExtra) { x.Hostname = g.pick(dHosts) })
	}
	if g.one(4) {
		w.Status = Unhealthy
	}
	if n := g.r.IntN(3); n > 0 {
		m := map[string]map[uint16]uint16{}
		for range n {
			m[g.pick(append(dServiceKeys(), "zz/unknown.svc"))] = map[uint16]uint16{80: uint16(8080 + g.r.IntN(2))}
		}
		w.Services = ServicesOf(m)
	}
	for range g.r.IntN(3) {
		w.editExtra(func(x *WorkloadExtra) {
			x.AuthorizationPolicies = append(x.AuthorizationPolicies, g.pick(append(dPolicyKeys, "a/missing")))
		})
	}
	if g.one(60) {
		w.Protocol = 9 // invalid: both paths must reject it
	}
	return w
}

func (g deltaGen) service(key string) *Service {
	ns, host, _ := strings.Cut(key, "/")
	v := &Service{Name: strings.Split(host, ".")[0], Namespace: ns, Hostname: host, Ports: map[uint16]uint16{80: 8080},
		Canonical: g.one(3)}
	for range g.r.IntN(3) {
		v.VIPs = append(v.VIPs, NetworkAddress{g.pick(dNetworks), dVIPs[g.r.IntN(len(dVIPs))]})
	}
	if g.one(5) {
		v.EditExtra().CIDRVIPs = append(v.CIDRVIPs(), NetworkPrefix{g.pick(dNetworks), dCIDRs[g.r.IntN(len(dCIDRs))]})
		if g.one(2) {
			v.EditExtra().CIDRVIPs = append(v.CIDRVIPs(), NetworkPrefix{"", dCIDRs[g.r.IntN(len(dCIDRs))]})
		}
	}
	if g.one(5) {
		v.Visibility = VisibilityNamespace
	}
	if g.one(3) {
		v.EditExtra().LoadBalancer = &LoadBalancer{HealthPolicy: LBHealthPolicy(g.r.IntN(2))}
	}
	return v
}

func (g deltaGen) policy(key string) *Policy {
	ns, name, _ := strings.Cut(key, "/")
	p := &Policy{Name: name, Namespace: ns, Scope: Scope(g.r.IntN(3)), Action: Action(g.r.IntN(2)), DryRun: g.one(8)}
	m := Match{DestinationPorts: []uint16{uint16(8080 + g.r.IntN(2))}}
	if g.one(2) {
		m.Principals = []StringMatch{{Kind: MatchExact, Value: "cluster.local/ns/a/sa/sa0"}}
	}
	p.Rules = [][][]Match{{{m}}}
	return p
}

// delta returns a random delta against m: a few upserts and removals, now
// and then an address swap between two workloads or a malformed value.
func (g deltaGen) delta(m deltaModel) Delta {
	var d Delta
	uids := slices.Sorted(maps.Keys(m.w))
	for range 1 + g.r.IntN(4) {
		switch op := g.r.IntN(20); {
		case op < 7:
			d.Workloads = append(d.Workloads, g.workload(fmt.Sprintf("u%02d", g.r.IntN(30))))
		case op < 10:
			d.RemovedWorkloads = append(d.RemovedWorkloads, fmt.Sprintf("u%02d", g.r.IntN(30)))
		case op < 13:
			d.Services = append(d.Services, g.service(g.pick(dServiceKeys())))
		case op < 15:
			d.RemovedServices = append(d.RemovedServices, g.pick(append(dServiceKeys(), "malformed")))
		case op < 16:
			d.Policies = append(d.Policies, g.policy(g.pick(dPolicyKeys)))
		case op < 17:
			d.RemovedPolicies = append(d.RemovedPolicies, g.pick(dPolicyKeys))
		case op < 19 && len(uids) >= 2:
			a, b := m.w[uids[g.r.IntN(len(uids))]], m.w[uids[g.r.IntN(len(uids))]]
			if a != b {
				na, nb := *a, *b
				na.Addresses, nb.Addresses = b.Addresses, a.Addresses
				na.EditLabels().Network, nb.EditLabels().Network = b.Network(), a.Network()
				na.NetworkMode, nb.NetworkMode = b.NetworkMode, a.NetworkMode
				d.Workloads = append(d.Workloads, &na, &nb)
			}
		case g.one(2):
			d.Workloads = append(d.Workloads, nil)
		default:
			w := g.workload("u99")
			d.Workloads = append(d.Workloads, w, w) // duplicate uid
		}
	}
	return d
}

// hashOf returns k's hash as the lookups of an index with such keys compute
// it, to check that the builder put k where they look.
func hashOf[K comparable](k K) uint64 {
	switch k := any(k).(type) {
	case string:
		return hashString(k)
	case uint64:
		return hashAddr4(k)
	case addr6Key:
		return hashAddr6(k)
	case NamespacedHostname:
		return hashNH(k)
	case infoKey:
		return hashInfo(k)
	}
	panic("no shard hash for this key type")
}

// eachSlot calls f for every used slot of m with its shard's number and
// returns the shards' lengths added up.
func eachSlot[K comparable, V any](m *shardMap[K, V], f func(shard uint64, s slot[K, V])) (n int) {
	for i := range m.numShards() {
		sh := m.shard(uint64(i))
		n += len(sh)
		for _, s := range sh[:cap(sh)] {
			if s.h != 0 {
				f(uint64(i), s)
			}
		}
	}
	return n
}

// flatten returns the entries of m as one map, checking its count.
func flatten[K comparable, V any](t *testing.T, what string, m *shardMap[K, V]) map[K]V {
	t.Helper()
	out := map[K]V{}
	m.all(func(k K, v V) { out[k] = v })
	if len(out) != m.n {
		t.Errorf("%s: %d entries, counted %d", what, len(out), m.n)
	}
	n := eachSlot(m, func(i uint64, s slot[K, V]) {
		if h := hashOf(s.k); h != s.h || h>>m.shift != i {
			t.Errorf("%s: key %v stored with hash %#x in shard %d of %d, hashes to %#x", what, s.k, s.h, i, m.numShards(), h)
		}
	})
	if n != m.n {
		t.Errorf("%s: shard lengths add up to %d, counted %d", what, n, m.n)
	}
	for k, v := range out {
		if got := m.get(hashOf(k), k); !reflect.DeepEqual(got, v) {
			t.Errorf("%s: get(%v) = %v, stored %v", what, k, got, v)
		}
	}
	return out
}

func sameIndex[K comparable, V any](t *testing.T, what string, got, want *shardMap[K, V]) {
	t.Helper()
	if g, w := flatten(t, what, got), flatten(t, what, want); !reflect.DeepEqual(g, w) {
		t.Errorf("%s differs:\n got %v\nwant %v", what, g, w)
	}
}

// sameHashedIndex compares two indexes keyed by hash alone.
func sameHashedIndex[V any](t *testing.T, what string, got, want *shardMap[hashed, V]) {
	t.Helper()
	byHash := func(m *shardMap[hashed, V]) map[uint64]V {
		out := map[uint64]V{}
		eachSlot(m, func(i uint64, s slot[hashed, V]) {
			if s.h>>m.shift != i {
				t.Errorf("%s: hash %#x stored in shard %d of %d", what, s.h, i, m.numShards())
			}
			out[s.h] = s.v
		})
		if len(out) != m.n {
			t.Errorf("%s: %d entries, counted %d", what, len(out), m.n)
		}
		for h, v := range out {
			if got := m.get(h, hashed{}); !reflect.DeepEqual(got, v) {
				t.Errorf("%s: get(%#x) = %v, stored %v", what, h, got, v)
			}
		}
		return out
	}
	if g, w := byHash(got), byHash(want); !reflect.DeepEqual(g, w) {
		t.Errorf("%s differs:\n got %v\nwant %v", what, g, w)
	}
}

// sameKeyedIndex compares two indexes keyed by hash alone (a probe compares
// the value's own key: by UID, services by key), checking that each entry
// sits under its key's hash where get finds it.
func sameKeyedIndex[K comparable, V comparable](t *testing.T, what string, got, want *shardMap[hashed, V],
	key func(V) K, hash func(K) uint64, get func(*shardMap[hashed, V], K) V) {
	t.Helper()
	byKey := func(m *shardMap[hashed, V]) map[K]V {
		out := map[K]V{}
		n := eachSlot(m, func(i uint64, s slot[hashed, V]) {
			k := key(s.v)
			if h := hash(k); h != s.h || h>>m.shift != i {
				t.Errorf("%s: %v stored with hash %#x in shard %d of %d, hashes to %#x", what, k, s.h, i, m.numShards(), h)
			}
			out[k] = s.v
		})
		if len(out) != m.n || n != m.n {
			t.Errorf("%s: %d entries, shard lengths add up to %d, counted %d", what, len(out), n, m.n)
		}
		for k, v := range out {
			if got := get(m, k); got != v {
				t.Errorf("%s: get(%v) = %v, stored %v", what, k, got, v)
			}
		}
		return out
	}
	if g, w := byKey(got), byKey(want); !reflect.DeepEqual(g, w) {
		t.Errorf("%s differs:\n got %v\nwant %v", what, g, w)
	}
}

// sameAddrIndex compares the address indexes ix picks of two snapshots by
// network name and address: their network handles may differ.
func sameAddrIndex[V any](t *testing.T, what string, got, want *Snapshot, ix func(*Snapshot) *addrIndex[V]) {
	t.Helper()
	byName := func(s *Snapshot) map[NetworkAddress]V {
		x := ix(s)
		flatten(t, what+" (IPv4)", &x.v4)
		flatten(t, what+" (IPv6)", &x.v6)
		out := map[NetworkAddress]V{}
		x.all(s.nets, func(k NetworkAddress, v V) { out[k] = v })
		for k, v := range out {
			if id, ip, ok := s.lookupAddr(k.Network, k.Addr); !ok || !reflect.DeepEqual(x.get(id, ip), v) {
				t.Errorf("%s: get(%v) = %v, stored %v", what, k, x.get(id, ip), v)
			}
		}
		return out
	}
	if g, w := byName(got), byName(want); !reflect.DeepEqual(g, w) {
		t.Errorf("%s differs:\n got %v\nwant %v", what, g, w)
	}
}

// checkSame fails unless got answers every lookup as want does, and holds
// the same index entries.
func checkSame(t *testing.T, got, want *Snapshot) {
	t.Helper()
	sameKeyedIndex(t, "byUID", &got.byUID, &want.byUID, func(w *Workload) string { return w.UID }, hashString, workloadByUID)
	sameAddrIndex(t, "byAddr", got, want, func(s *Snapshot) *addrIndex[*Workload] { return &s.byAddr })
	sameHashedIndex(t, "byInfo", &got.byInfo, &want.byInfo)
	sameIndex(t, "byInfoMulti", &got.byInfoMulti, &want.byInfoMulti)
	sameIndex(t, "byHost", &got.byHost, &want.byHost)
	sameKeyedIndex(t, "svcByKey", &got.svcByKey, &want.svcByKey,
		func(s *Service) NamespacedHostname { return NamespacedHostname{s.Namespace, s.Hostname} }, hashNH, serviceByKey)
	sameAddrIndex(t, "svcByVIP", got, want, func(s *Snapshot) *addrIndex[[1]*Service] { return &s.svcByVIP })
	sameAddrIndex(t, "svcByVIPMany", got, want, func(s *Snapshot) *addrIndex[[]*Service] { return &s.svcByVIPMany })
	sameIndex(t, "svcByHost", &got.svcByHost, &want.svcByHost)
	sameIndex(t, "svcByHostMany", &got.svcByHostMany, &want.svcByHostMany)
	sameIndex(t, "svcEps", &got.svcEps, &want.svcEps)
	if !reflect.DeepEqual(got.cidrVIPs, want.cidrVIPs) {
		t.Errorf("cidrVIPs: got %v, want %v", got.cidrVIPs, want.cidrVIPs)
	}

	if !slices.Equal(got.Workloads(), want.Workloads()) || !slices.Equal(got.Services(), want.Services()) ||
		!slices.Equal(got.Policies(), want.Policies()) || !slices.Equal(got.Warnings(), want.Warnings()) {
		t.Errorf("lists differ: workloads %d/%d services %d/%d policies %d/%d warnings %q/%q",
			len(got.Workloads()), len(want.Workloads()), len(got.Services()), len(want.Services()),
			len(got.Policies()), len(want.Policies()), got.Warnings(), want.Warnings())
	}
	for i := range 32 {
		uid := fmt.Sprintf("u%02d", i)
		if g, w := got.WorkloadByUID(uid), want.WorkloadByUID(uid); g != w {
			t.Errorf("WorkloadByUID(%s) = %v, want %v", uid, g, w)
		}
	}
	ips := append(slices.Clone(dIPs), dVIPs...)
	ips = append(ips, netip.MustParseAddr("10.96.7.7"), netip.MustParseAddr("10.1.2.3"), netip.AddrFrom16(dIPs[3].As16()))
	for _, network := range dNetworks {
		for _, ip := range ips {
			if g, w := got.WorkloadByAddr(network, ip), want.WorkloadByAddr(network, ip); g != w {
				t.Errorf("WorkloadByAddr(%q, %s) = %v, want %v", network, ip, g, w)
			}
			gw, gs := got.FindAddress(network, ip)
			ww, ws := want.FindAddress(network, ip)
			if gw != ww || gs != ws {
				t.Errorf("FindAddress(%q, %s) differs", network, ip)
			}
			if g, w := got.ServiceByVIP(network, ip), want.ServiceByVIP(network, ip); g != w {
				t.Errorf("ServiceByVIP(%q, %s) differs", network, ip)
			}
			for _, ns := range append(dNamespaces, "") {
				if g, w := got.ResolveVIPPreferring(network, ip, ns, "b"), want.ResolveVIPPreferring(network, ip, ns, "b"); g != w {
					t.Errorf("ResolveVIPPreferring(%q, %s, %q) differs", network, ip, ns)
				}
				if g, w := got.ResolveVIP(network, ip, ns), want.ResolveVIP(network, ip, ns); g != w {
					t.Errorf("ResolveVIP(%q, %s, %q) differs", network, ip, ns)
				}
			}
		}
	}
	for _, key := range append(dServiceKeys(), "zz/unknown.svc") {
		if g, w := got.ServiceByKey(key), want.ServiceByKey(key); g != w {
			t.Errorf("ServiceByKey(%s) differs", key)
		}
		ns, host, _ := strings.Cut(key, "/")
		probe := &Service{Namespace: ns, Hostname: host}
		if g, w := got.Endpoints(probe), want.Endpoints(probe); !reflect.DeepEqual(g, w) {
			t.Errorf("Endpoints(%s) = %v, want %v", key, g, w)
		}
	}
	for _, host := range dHosts {
		if g, w := got.ServicesByHostname(host), want.ServicesByHostname(host); !slices.Equal(g, w) {
			t.Errorf("ServicesByHostname(%s) differs", host)
		}
		for _, ns := range dNamespaces {
			if g, w := got.ServiceByHostname(host, ns, "b"), want.ServiceByHostname(host, ns, "b"); g != w {
				t.Errorf("ServiceByHostname(%s, %s) differs", host, ns)
			}
			gs, gw := got.FindHostname(NamespacedHostname{ns, host})
			ws, ww := want.FindHostname(NamespacedHostname{ns, host})
			if gs != ws || gw != ww {
				t.Errorf("FindHostname(%s/%s) differs", ns, host)
			}
			for _, name := range dNames {
				for _, sa := range dSAs {
					info := WorkloadInfo{Namespace: ns, Name: name, ServiceAccount: sa}
					if g, w := got.FindWorkload(info), want.FindWorkload(info); g != w {
						t.Errorf("FindWorkload(%v) differs", info)
					}
				}
			}
		}
	}
	for _, w := range want.Workloads() {
		for _, src := range []identity.Identity{{}, identity.New("", "a", "sa0")} {
			c := Conn{Src: netip.MustParseAddrPort("10.9.9.9:4000"), Dst: netip.MustParseAddrPort("10.0.0.1:8080"), SrcIdentity: src, DstWorkload: w}
			if g, wd := got.Authorize(c), want.Authorize(c); g != wd {
				t.Errorf("Authorize(%s, %v) = %+v, want %+v", w.UID, src, g, wd)
			}
			if g, wd := got.DryRunMatches(c), want.DryRunMatches(c); !slices.Equal(g, wd) {
				t.Errorf("DryRunMatches(%s) differs", w.UID)
			}
		}
	}
}

// TestApplyEquivalence applies random delta sequences and checks every
// result against NewSnapshot of the same final sets: both fail or both
// succeed with the same lookups; a failed Apply, and a successful one, leave
// the snapshot it started from as it was.
func TestApplyEquivalence(t *testing.T) {
	seeds, steps := 20, 40
	if testing.Short() {
		seeds = 6
	}
	defer func(target, min, frac int) { shardTarget, rebuildMin, rebuildFraction = target, min, frac }(shardTarget, rebuildMin, rebuildFraction)
	for _, tc := range []struct {
		name                string
		target, rbMin, frac int
	}{
		{"incremental", 64, 1 << 30, 4},
		{"tiny-shards", 1, 1 << 30, 4}, // many shards, re-splits as indexes grow
		{"rebuild", 64, -1, 1 << 30},   // every delta rebuilds
		{"mixed", 2, 4, 2},             // large deltas rebuild, small ones edit
	} {
		t.Run(tc.name, func(t *testing.T) {
			shardTarget, rebuildMin, rebuildFraction = tc.target, tc.rbMin, tc.frac
			var applied, rejected int
			for seed := range seeds {
				g := deltaGen{rand.New(rand.NewPCG(uint64(seed), 7))}
				m := newDeltaModel()
				cur := Empty()
				for step := range steps {
					d := g.delta(m)
					next, keyed := m.apply(d)
					want, wantErr := next.build()
					if !keyed {
						wantErr = errors.New("malformed delta")
					}
					got, err := cur.Apply(d)
					if (err != nil) != (wantErr != nil) {
						t.Fatalf("seed %d step %d: Apply error %v, NewSnapshot error %v", seed, step, err, wantErr)
					}
					// The snapshot applied to is unchanged either way.
					before, _ := m.build()
					checkSame(t, cur, before)
					if err != nil {
						if !errors.Is(err, ErrInvalid) {
							t.Fatalf("seed %d step %d: %v does not wrap ErrInvalid", seed, step, err)
						}
						rejected++
						continue
					}
					checkSame(t, got, want)
					if len(d.Policies)+len(d.RemovedPolicies) == 0 && got.PolicyGeneration() != cur.PolicyGeneration() {
						t.Errorf("seed %d step %d: a delta without policies changed the generation", seed, step)
					}
					if t.Failed() {
						t.Fatalf("seed %d step %d: delta %+v", seed, step, d)
					}
					cur, m = got, next
					applied++
				}
			}
			if applied < seeds*steps/3 || rejected == 0 {
				t.Errorf("%d deltas applied, %d rejected: the generator misses a path", applied, rejected)
			}
		})
	}
}
