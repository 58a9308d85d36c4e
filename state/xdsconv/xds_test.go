package xdsconv

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/ztunnel-go/ztunnel/api/securityapi"
	"github.com/ztunnel-go/ztunnel/api/workloadapi"
	"github.com/ztunnel-go/ztunnel/state"
	"github.com/ztunnel-go/ztunnel/xdsclient"
)

// res wraps a message as an xdsclient resource.
func res(t testing.TB, name string, m proto.Message) xdsclient.Resource {
	t.Helper()
	a, err := anypb.New(m)
	if err != nil {
		t.Fatal(err)
	}
	return xdsclient.Resource{Name: name, Version: "1", Value: a}
}

func wlAddr(uid, ip string, mod ...func(*workloadapi.Workload)) *workloadapi.Address {
	w := &workloadapi.Workload{
		Uid: uid, Name: uid, Namespace: "ns", TunnelProtocol: workloadapi.TunnelProtocol_HBONE,
	}
	if ip != "" {
		w.Addresses = [][]byte{netip.MustParseAddr(ip).AsSlice()}
	}
	for _, m := range mod {
		m(w)
	}
	return &workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: w}}
}

func withServices(keys ...string) func(*workloadapi.Workload) {
	return func(w *workloadapi.Workload) {
		w.Services = map[string]*workloadapi.PortList{}
		for _, k := range keys {
			w.Services[k] = &workloadapi.PortList{Ports: []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}}}
		}
	}
}

func svcAddr(name, vip string) *workloadapi.Address {
	return &workloadapi.Address{Type: &workloadapi.Address_Service{Service: &workloadapi.Service{
		Name: name, Namespace: "ns", Hostname: name + ".ns.svc.cluster.local",
		Addresses: []*workloadapi.NetworkAddress{{Address: netip.MustParseAddr(vip).AsSlice()}},
		Ports:     []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}},
	}}}
}

func newState(t testing.TB, static *LocalConfig) (*XDSState, *state.Store) {
	t.Helper()
	store := state.NewStore(nil)
	x, err := NewXDSState(store, static, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	return x, store
}

func applyAddrs(t testing.TB, x *XDSState, removed []string, rs ...xdsclient.Resource) []xdsclient.Rejection {
	t.Helper()
	return x.HandleAddresses(&xdsclient.Update{TypeURL: AddressType, Resources: rs, Removed: removed})
}

func endpointUIDs(s *state.Snapshot, key string) []string {
	svc := s.ServiceByKey(key)
	if svc == nil {
		return nil
	}
	var out []string
	for _, e := range s.Endpoints(svc) {
		out = append(out, e.Workload.UID)
	}
	return out
}

func TestStagedEndpoints(t *testing.T) {
	x, store := newState(t, nil)
	const key = "ns/web.ns.svc.cluster.local"
	// The workload arrives before its service.
	if rej := applyAddrs(t, x, nil, res(t, "w1", wlAddr("w1", "10.0.0.1", withServices(key)))); rej != nil {
		t.Fatal(rej)
	}
	if store.Load().ServiceByKey(key) != nil {
		t.Fatal("service exists before it arrived")
	}
	applyAddrs(t, x, nil, res(t, key, svcAddr("web", "10.96.0.1")))
	if got := endpointUIDs(store.Load(), key); !slices.Equal(got, []string{"w1"}) {
		t.Errorf("endpoints %v, want the staged w1", got)
	}
	// A replaced service keeps its endpoints.
	applyAddrs(t, x, nil, res(t, key, svcAddr("web", "10.96.0.2")))
	if got := endpointUIDs(store.Load(), key); !slices.Equal(got, []string{"w1"}) {
		t.Errorf("after service update endpoints %v", got)
	}
	if s := store.Load().ServiceByVIP("", netip.MustParseAddr("10.96.0.2")); s == nil {
		t.Error("new VIP not found")
	}
	// The service goes and comes back: the endpoint is still staged.
	applyAddrs(t, x, []string{key})
	applyAddrs(t, x, nil, res(t, key, svcAddr("web", "10.96.0.1")))
	if got := endpointUIDs(store.Load(), key); !slices.Equal(got, []string{"w1"}) {
		t.Errorf("after service re-add endpoints %v", got)
	}
	// Removing the workload removes the endpoint.
	applyAddrs(t, x, []string{"w1"})
	if got := endpointUIDs(store.Load(), key); len(got) != 0 {
		t.Errorf("after workload removal endpoints %v", got)
	}
}

func TestPartialApply(t *testing.T) {
	x, store := newState(t, nil)
	applyAddrs(t, x, nil, res(t, "w2", wlAddr("w2", "10.0.0.2")))
	rej := applyAddrs(t, x, nil,
		res(t, "w1", wlAddr("w1", "10.0.0.1")),
		res(t, "w2", wlAddr("w2", "10.0.0.20", func(w *workloadapi.Workload) {
			w.TunnelProtocol = workloadapi.TunnelProtocol_LEGACY_ISTIO_MTLS
		})),
		xdsclient.Resource{Name: "junk", Value: &anypb.Any{Value: []byte{0xff, 0xff}}},
	)
	if len(rej) != 2 || rej[0].Name != "w2" || !errors.Is(rej[0].Err, ErrLegacyIstioMTLS) || rej[1].Name != "junk" {
		t.Fatalf("rejections %v", rej)
	}
	s := store.Load()
	if s.WorkloadByUID("w1") == nil {
		t.Error("the valid resource was not applied")
	}
	// The rejected update leaves the previous version in place.
	if w := s.WorkloadByAddr("", netip.MustParseAddr("10.0.0.2")); w == nil || w.UID != "w2" {
		t.Errorf("previous w2 gone: %v", w)
	}
}

func TestRemovalNames(t *testing.T) {
	x, store := newState(t, nil)
	applyAddrs(t, x, nil,
		res(t, "c1/apps/Deployment/ns/x", wlAddr("c1/apps/Deployment/ns/x", "10.0.0.1")),
		res(t, "ns/web.ns.svc.cluster.local", svcAddr("web", "10.96.0.1")),
	)
	// A uid with slashes is not mistaken for a service, and vice versa.
	applyAddrs(t, x, []string{"ns/web.ns.svc.cluster.local", "unknown", "ns/a/b"})
	s := store.Load()
	if s.WorkloadByUID("c1/apps/Deployment/ns/x") == nil || len(s.Services()) != 0 {
		t.Errorf("after removing the service: %d workloads, %d services", len(s.Workloads()), len(s.Services()))
	}
	applyAddrs(t, x, []string{"c1/apps/Deployment/ns/x"})
	if n := len(store.Load().Workloads()); n != 0 {
		t.Errorf("%d workloads left", n)
	}
}

func TestDuplicateAddresses(t *testing.T) {
	tcp := func(w *workloadapi.Workload) { w.TunnelProtocol = workloadapi.TunnelProtocol_NONE }
	ip := netip.MustParseAddr("10.0.0.7")
	for _, tc := range []struct {
		name   string
		first  *workloadapi.Address
		second *workloadapi.Address
		winner string
	}{
		{"pod beats workload entry", wlAddr("Kubernetes//Pod/ns/p", "10.0.0.7", tcp), wlAddr("c1/networking.istio.io/WorkloadEntry/ns/we", "10.0.0.7"), "Kubernetes//Pod/ns/p"},
		{"hbone beats tcp", wlAddr("a", "10.0.0.7"), wlAddr("b", "10.0.0.7", tcp), "a"},
		{"latest wins a tie", wlAddr("a", "10.0.0.7"), wlAddr("b", "10.0.0.7"), "b"},
		{"mapped v6 is the same address", wlAddr("a", "10.0.0.7"), wlAddr("b", "::ffff:10.0.0.7"), "b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x, store := newState(t, nil)
			fn := func(a *workloadapi.Address) string { return a.GetWorkload().GetUid() }
			if rej := applyAddrs(t, x, nil, res(t, fn(tc.first), tc.first)); rej != nil {
				t.Fatal(rej)
			}
			if rej := applyAddrs(t, x, nil, res(t, fn(tc.second), tc.second)); rej != nil {
				t.Fatal(rej)
			}
			s := store.Load()
			if w := s.WorkloadByAddr("", ip); w == nil || w.UID != tc.winner {
				t.Fatalf("address resolves to %v, want %s", w, tc.winner)
			}
			if len(s.Workloads()) != 2 {
				t.Fatalf("%d workloads, want both kept", len(s.Workloads()))
			}
			// The loser keeps its address (ztunnel's workload_ips: a
			// service's endpoint is dialled on it), which resolves to the
			// winner; removing the winner gives the address back.
			loser := fn(tc.first)
			if loser == tc.winner {
				loser = fn(tc.second)
			}
			if w := s.WorkloadByUID(loser); w == nil || len(w.Addresses) != 1 || w.Addresses[0].Unmap() != ip {
				t.Fatalf("loser %v", w)
			}
			applyAddrs(t, x, []string{tc.winner})
			if w := store.Load().WorkloadByAddr("", ip); w == nil || w.UID != loser {
				t.Errorf("after removing the winner the address resolves to %v, want %s", w, loser)
			}
		})
	}
}

// TestServiceEntryEndpointOnAPodAddress: what istiod sends for a
// ServiceEntry whose inline endpoint is a pod's address (the Istio lab's
// A8 case): the pod's workload and the ServiceEntry's, both on that
// address. The address resolves to the pod, and the ServiceEntry's VIP to
// its own workload, dialled on that address at the target port; before,
// the ServiceEntry's workload lost the address and the service had "no
// usable endpoint".
func TestServiceEntryEndpointOnAPodAddress(t *testing.T) {
	const podIP, key = "10.244.2.6", "outside/inline.example.com"
	tcp := func(w *workloadapi.Workload) { w.TunnelProtocol = workloadapi.TunnelProtocol_NONE }
	se := &workloadapi.Address{Type: &workloadapi.Address_Service{Service: &workloadapi.Service{
		Name: "inline", Namespace: "outside", Hostname: "inline.example.com",
		Addresses: []*workloadapi.NetworkAddress{{Address: netip.MustParseAddr("240.240.0.1").AsSlice()}},
		Ports:     []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}},
	}}}
	seUID := "Kubernetes/networking.istio.io/ServiceEntry/outside/inline/" + podIP
	x, store := newState(t, nil)
	rej := applyAddrs(t, x, nil,
		res(t, "Kubernetes//Pod/outside/plain", wlAddr("Kubernetes//Pod/outside/plain", podIP, tcp)),
		res(t, key, se),
		res(t, seUID, wlAddr(seUID, podIP, tcp, func(w *workloadapi.Workload) {
			w.Services = map[string]*workloadapi.PortList{key: {Ports: []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}}}}
		})))
	if rej != nil {
		t.Fatal(rej)
	}
	s := store.Load()
	if w := s.WorkloadByAddr("", netip.MustParseAddr(podIP)); w == nil || w.UID != "Kubernetes//Pod/outside/plain" {
		t.Fatalf("%s resolves to %v, want the pod", podIP, w)
	}
	svc := s.ServiceByVIP("", netip.MustParseAddr("240.240.0.1"))
	if svc == nil {
		t.Fatal("no service on the VIP")
	}
	w, port, err := s.PickEndpoint(nil, svc, 80, nil)
	if err != nil || w.UID != seUID || port != 8080 {
		t.Fatalf("endpoint %v:%d (%v), want %s:8080", w, port, err, seUID)
	}
	if ip, ok := state.SelectAddress(w, netip.Addr{}, state.IPFamiliesAutomatic); !ok || ip != netip.MustParseAddr(podIP) {
		t.Fatalf("dialled on %v (%v), want %s", ip, ok, podIP)
	}
}

func TestAuthorizations(t *testing.T) {
	x, store := newState(t, nil)
	pol := func(name string) *securityapi.Authorization {
		return &securityapi.Authorization{Name: name, Namespace: "ns", Scope: securityapi.Scope_NAMESPACE}
	}
	rej := x.HandleAuthorizations(&xdsclient.Update{TypeURL: AuthorizationType, Resources: []xdsclient.Resource{
		res(t, "ns/a", pol("a")),
		res(t, "ns/b", pol("b")),
		res(t, "other-name-for-a", pol("a")), // same namespace/name as ns/a
		res(t, "ns/bad", &securityapi.Authorization{Name: "bad", Namespace: "ns", Action: 7}),
	}})
	var names []string
	for _, r := range rej {
		names = append(names, r.Name)
	}
	if !slices.Equal(names, []string{"other-name-for-a", "ns/bad"}) {
		t.Errorf("rejected %v", rej)
	}
	if n := len(store.Load().Policies()); n != 2 {
		t.Errorf("%d policies, want 2", n)
	}
	x.HandleAuthorizations(&xdsclient.Update{TypeURL: AuthorizationType, Removed: []string{"ns/a"}})
	if ps := store.Load().Policies(); len(ps) != 1 || ps[0].Name != "b" {
		t.Errorf("after removal %v", ps)
	}
}

func TestStaticConfigCombined(t *testing.T) {
	lc, err := ParseLocalConfig(readFixture(t, "localhost.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	x, store := newState(t, lc)
	s := store.Load()
	if len(s.Workloads()) != 2 {
		t.Fatalf("static snapshot has %d workloads", len(s.Workloads()))
	}
	const uid = "cluster1//v1/Pod/default/loop-tcp"
	// xDS replaces a static entry with the same key, and removes it.
	applyAddrs(t, x, nil, res(t, uid, wlAddr(uid, "127.0.0.9")))
	if w := store.Load().WorkloadByUID(uid); w == nil || w.Addresses[0] != netip.MustParseAddr("127.0.0.9") {
		t.Errorf("xDS did not replace the static workload: %v", w)
	}
	applyAddrs(t, x, []string{uid})
	if store.Load().WorkloadByUID(uid) != nil || len(store.Load().Workloads()) != 1 {
		t.Error("xDS removal kept the static workload")
	}

	bad := &LocalConfig{Workloads: []*state.Workload{{UID: "a"}, {UID: "a"}}}
	if _, err := NewXDSState(state.NewStore(nil), bad, nil); err == nil || !strings.Contains(err.Error(), "duplicate") {
		t.Errorf("invalid static config: %v", err)
	}
}
