package xdsconv

import (
	"fmt"
	"net/netip"
	"runtime"
	"strconv"
	"sync"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/ztunnel-go/ztunnel/api/securityapi"
	"github.com/ztunnel-go/ztunnel/api/workloadapi"
	"github.com/ztunnel-go/ztunnel/state"
	"github.com/ztunnel-go/ztunnel/xdsclient"
)

// The mesh the benchmarks push: 100,000 workloads (10 per service), 10,000
// services and 10,000 policies over 1,000 namespaces.
const (
	benchWorkloads  = 100_000
	benchServices   = 10_000
	benchPolicies   = 10_000
	benchNamespaces = 1_000
)

type benchMesh struct {
	addresses, policies []xdsclient.Resource
	ips                 []netip.Addr
}

var (
	benchOnce sync.Once
	benchData *benchMesh
)

func anyOf(tb testing.TB, m proto.Message) *anypb.Any {
	a, err := anypb.New(m)
	if err != nil {
		tb.Fatal(err)
	}
	return a
}

func benchWorkload(i int, version string) *workloadapi.Address {
	ns := fmt.Sprintf("ns-%d", i%benchNamespaces)
	svc := i % benchServices
	ip := netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
	return &workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: &workloadapi.Workload{
		Uid:            fmt.Sprintf("Kubernetes//Pod/%s/pod-%d", ns, i),
		Name:           fmt.Sprintf("pod-%d", i),
		Namespace:      ns,
		Addresses:      [][]byte{ip.AsSlice()},
		Network:        "",
		TunnelProtocol: workloadapi.TunnelProtocol_HBONE,
		ServiceAccount: fmt.Sprintf("sa-%d", svc),
		Node:           fmt.Sprintf("node-%d", i%500),
		CanonicalName:  fmt.Sprintf("app-%d", svc), CanonicalRevision: version,
		WorkloadType: workloadapi.WorkloadType_POD, WorkloadName: fmt.Sprintf("app-%d", svc),
		ClusterId: "Kubernetes",
		Services: map[string]*workloadapi.PortList{
			fmt.Sprintf("ns-%d/svc-%d.ns-%d.svc.cluster.local", svc%benchNamespaces, svc, svc%benchNamespaces): {
				Ports: []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}},
			},
		},
		AuthorizationPolicies: []string{fmt.Sprintf("%s/sel-%d", ns, i%benchPolicies)},
		Locality:              &workloadapi.Locality{Region: "r1", Zone: fmt.Sprintf("z%d", i%3)},
	}}}
}

func loadBenchMesh(tb testing.TB) *benchMesh {
	benchOnce.Do(func() {
		m := &benchMesh{}
		for i := range benchWorkloads {
			a := benchWorkload(i, "v1")
			m.addresses = append(m.addresses, xdsclient.Resource{Name: a.GetWorkload().GetUid(), Version: "1", Value: anyOf(tb, a)})
			m.ips = append(m.ips, netip.AddrFrom4([4]byte(a.GetWorkload().GetAddresses()[0])))
		}
		for i := range benchServices {
			ns := fmt.Sprintf("ns-%d", i%benchNamespaces)
			s := &workloadapi.Service{
				Name: fmt.Sprintf("svc-%d", i), Namespace: ns,
				Hostname:  fmt.Sprintf("svc-%d.%s.svc.cluster.local", i, ns),
				Addresses: []*workloadapi.NetworkAddress{{Address: netip.AddrFrom4([4]byte{172, 16, byte(i >> 8), byte(i)}).AsSlice()}},
				Ports:     []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}},
			}
			m.addresses = append(m.addresses, xdsclient.Resource{Name: ns + "/" + s.Hostname, Version: "1",
				Value: anyOf(tb, &workloadapi.Address{Type: &workloadapi.Address_Service{Service: s}})})
		}
		for i := range benchPolicies {
			ns := fmt.Sprintf("ns-%d", i%benchNamespaces)
			p := &securityapi.Authorization{
				Name: fmt.Sprintf("sel-%d", i), Namespace: ns, Scope: securityapi.Scope(i % 3), Action: securityapi.Action(i % 2),
				Rules: []*securityapi.Rule{{Clauses: []*securityapi.Clause{{Matches: []*securityapi.Match{{
					Principals:       []*securityapi.StringMatch{{MatchType: &securityapi.StringMatch_Exact{Exact: "cluster.local/ns/" + ns + "/sa/client"}}},
					DestinationPorts: []uint32{8080},
				}}}}}},
			}
			m.policies = append(m.policies, xdsclient.Resource{Name: ns + "/" + p.Name, Version: "1", Value: anyOf(tb, p)})
		}
		benchData = m
	})
	return benchData
}

// fullPush applies the whole mesh to a new XDSState.
func fullPush(tb testing.TB, m *benchMesh) (*XDSState, *state.Store) {
	store := state.NewStore(nil)
	x, err := NewXDSState(store, nil, nil)
	if err != nil {
		tb.Fatal(err)
	}
	if rej := x.HandleAddresses(&xdsclient.Update{TypeURL: AddressType, Resources: m.addresses}); rej != nil {
		tb.Fatal(rej[0])
	}
	if rej := x.HandleAuthorizations(&xdsclient.Update{TypeURL: AuthorizationType, Resources: m.policies}); rej != nil {
		tb.Fatal(rej[0])
	}
	return x, store
}

// BenchmarkApplyFullPush: the first push of a large mesh, from raw resources
// to a published snapshot (decode, convert, index). Reports the heap the
// result retains (XDSState tables plus the snapshot) as retained-MB, and
// the growth of the heap's spans in use as inuse-MB.
func BenchmarkApplyFullPush(b *testing.B) {
	m := loadBenchMesh(b)
	b.ReportAllocs()
	for b.Loop() {
		fullPush(b, m)
	}
	b.StopTimer()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	x, store := fullPush(b, m)
	runtime.GC()
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/(1<<20), "retained-MB")
	// The spans holding it: above retained-MB by the free slots among
	// what the push kept (issue 36: what the daemon's RSS counts).
	b.ReportMetric(float64(after.HeapInuse-before.HeapInuse)/(1<<20), "inuse-MB")
	runtime.KeepAlive(x)
	runtime.KeepAlive(store)
}

// BenchmarkApplyOneWorkload: an incremental push changing one workload of
// the large mesh (the snapshot is derived from the last by a delta).
func BenchmarkApplyOneWorkload(b *testing.B) {
	m := loadBenchMesh(b)
	x, store := fullPush(b, m)
	versions := [2]*anypb.Any{anyOf(b, benchWorkload(4242, "v2")), anyOf(b, benchWorkload(4242, "v3"))}
	name := m.addresses[4242].Name
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		u := &xdsclient.Update{TypeURL: AddressType, Resources: []xdsclient.Resource{{Name: name, Version: "x", Value: versions[i%2]}}}
		if rej := x.HandleAddresses(u); rej != nil {
			b.Fatal(rej[0])
		}
	}
	if store.Load().WorkloadByUID(name) == nil {
		b.Fatal("workload lost")
	}
}

// BenchmarkApplyOnePolicy: an incremental push changing one policy of the
// large mesh's 10,000 (a DENY policy pushed and removed in turn, as
// TestMeshScale's Authorization probe does).
func BenchmarkApplyOnePolicy(b *testing.B) {
	m := loadBenchMesh(b)
	x, store := fullPush(b, m)
	const name = "ns-0/bench-deny"
	deny := anyOf(b, &securityapi.Authorization{
		Name: "bench-deny", Namespace: "ns-0", Scope: securityapi.Scope_NAMESPACE, Action: securityapi.Action_DENY,
		Rules: []*securityapi.Rule{{Clauses: []*securityapi.Clause{{Matches: []*securityapi.Match{{
			Principals: []*securityapi.StringMatch{{MatchType: &securityapi.StringMatch_Exact{Exact: "cluster.local/ns/ns-0/sa/client"}}},
		}}}}}},
	})
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		u := &xdsclient.Update{TypeURL: AuthorizationType}
		if i%2 == 1 {
			u.Resources = []xdsclient.Resource{{Name: name, Version: strconv.Itoa(i), Value: deny}}
		} else {
			u.Removed = []string{name}
		}
		if rej := x.HandleAuthorizations(u); rej != nil {
			b.Fatal(rej[0])
		}
	}
	if len(store.Load().Policies()) < benchPolicies {
		b.Fatal("policies lost")
	}
}

// BenchmarkLookupByIP: the data path's workload lookup in the large mesh.
func BenchmarkLookupByIP(b *testing.B) {
	m := loadBenchMesh(b)
	_, store := fullPush(b, m)
	ips := m.ips
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if store.Load().WorkloadByAddr("", ips[i%len(ips)]) == nil {
			b.Fatal("not found")
		}
		i += 7919
	}
}

func TestLookupByIPDoesNotAllocate(t *testing.T) {
	x, store := newState(t, nil)
	for i := range 100 {
		a := benchWorkload(i, "v1")
		applyAddrs(t, x, nil, res(t, a.GetWorkload().GetUid(), a))
	}
	ip := netip.AddrFrom4([4]byte{10, 0, 0, 42})
	if n := testing.AllocsPerRun(100, func() {
		if store.Load().WorkloadByAddr("", ip) == nil {
			t.Fatal("not found")
		}
	}); n != 0 {
		t.Errorf("%v allocations per lookup", n)
	}
}
