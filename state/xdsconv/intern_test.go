package xdsconv

import (
	"hash/maphash"
	"net/netip"
	"reflect"
	"runtime"
	"slices"
	"testing"
	"unsafe"

	"google.golang.org/protobuf/proto"

	"github.com/ztunnel-go/ztunnel/api/workloadapi"
	"github.com/ztunnel-go/ztunnel/state"
)

// decodedWorkload converts a workload decoded from the wire, as a push
// delivers it: every string is its own copy until conversion interns it.
func decodedWorkload(t *testing.T, name string, services map[string]*workloadapi.PortList) *state.Workload {
	t.Helper()
	return convertDecoded(t, &workloadapi.Workload{
		Uid: "Kubernetes//Pod/ns-1/" + name, Name: name, Namespace: "ns-1", ServiceAccount: "app",
		Node: "node-7", Network: "net-1", ClusterId: "cluster-1", TrustDomain: "td.example",
		WorkloadName: "app", CanonicalName: "app", CanonicalRevision: "v1",
		Addresses:             [][]byte{netip.MustParseAddr("10.0.0.1").AsSlice()},
		AuthorizationPolicies: []string{"ns-1/allow-app"},
		Locality:              &workloadapi.Locality{Region: "r1", Zone: "z1", Subzone: "s1"},
		Services:              services,
	})
}

// convertDecoded converts m as the daemon does a pushed one: from its wire
// bytes, so that its strings are fresh copies as a decoded message's are.
func convertDecoded(t *testing.T, m *workloadapi.Workload) *state.Workload {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	var x workloadapi.Workload
	if err := proto.Unmarshal(b, &x); err != nil {
		t.Fatal(err)
	}
	w, err := ConvertWorkload(&x)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func ports(pairs ...uint32) *workloadapi.PortList {
	pl := &workloadapi.PortList{}
	for i := 0; i+1 < len(pairs); i += 2 {
		pl.Ports = append(pl.Ports, &workloadapi.Port{ServicePort: pairs[i], TargetPort: pairs[i+1]})
	}
	return pl
}

func sameString(a, b string) bool { return unsafe.StringData(a) == unsafe.StringData(b) }

// TestConvertSharesRepeats: two replicas of one deployment hold one copy of
// what they have in common (issue 36's memory per workload): the names that
// repeat across workloads, the Labels, Extra and Services; their own uid and name stay
// theirs, and a different port map or key is never shared.
func TestConvertSharesRepeats(t *testing.T) {
	svc := func() map[string]*workloadapi.PortList {
		return map[string]*workloadapi.PortList{"ns-1/app.ns-1.svc.cluster.local": ports(80, 8080, 9090, 9090)}
	}
	a, b := decodedWorkload(t, "app-1", svc()), decodedWorkload(t, "app-2", svc())
	for _, f := range []struct {
		name string
		a, b string
	}{
		{"namespace", a.Namespace(), b.Namespace()},
		{"service account", a.ServiceAccount(), b.ServiceAccount()},
		{"trust domain", a.TrustDomain(), b.TrustDomain()},
		{"network", a.Network(), b.Network()},
		{"node", a.Node(), b.Node()},
		{"cluster", a.ClusterID(), b.ClusterID()},
		{"workload name", a.WorkloadName(), b.WorkloadName()},
		{"workload type", a.WorkloadType(), b.WorkloadType()},
		{"canonical name", a.CanonicalName(), b.CanonicalName()},
		{"canonical revision", a.CanonicalRevision(), b.CanonicalRevision()},
		{"policy key", a.AuthorizationPolicies()[0], b.AuthorizationPolicies()[0]},
		{"region", a.Locality().Region, b.Locality().Region},
		{"zone", a.Locality().Zone, b.Locality().Zone},
		{"subzone", a.Locality().Subzone, b.Locality().Subzone},
	} {
		if f.a != f.b || !sameString(f.a, f.b) {
			t.Errorf("%s: %q and %q are two copies", f.name, f.a, f.b)
		}
	}
	if a.Services == nil || a.Services != b.Services {
		t.Error("the replicas' Services sets are two copies")
	}
	if a.Labels == nil || a.Labels != b.Labels {
		t.Errorf("the replicas' Labels %p and %p: want one shared value", a.Labels, b.Labels)
	}
	if a.Extra == nil || a.Extra != b.Extra {
		t.Errorf("the replicas' Extra %p and %p: want one shared value", a.Extra, b.Extra)
	}
	if a.Place == nil || a.Place != b.Place {
		t.Errorf("the replicas' Place %p and %p (one node, one locality): want one shared value", a.Place, b.Place)
	}
	if want := map[string]map[uint16]uint16{"ns-1/app.ns-1.svc.cluster.local": {80: 8080, 9090: 9090}}; !reflect.DeepEqual(a.Services.Map(), want) {
		t.Errorf("Services = %v, want %v", a.Services, want)
	}
	if a.UID == b.UID || a.Name == b.Name {
		t.Errorf("uids %q %q, names %q %q: want each its own", a.UID, b.UID, a.Name, b.Name)
	}

	for _, other := range []map[string]*workloadapi.PortList{
		{"ns-1/app.ns-1.svc.cluster.local": ports(80, 8081, 9090, 9090)},
		{"ns-1/app.ns-1.svc.cluster.local": ports(80, 8080)},
		{"ns-1/other.ns-1.svc.cluster.local": ports(80, 8080, 9090, 9090)},
		// Keys that would read alike in an encoding without lengths.
		{"ns-1/app.ns-1.svc.cluster.local2,80:8080,9090:9090;": ports()},
		{},
	} {
		c := decodedWorkload(t, "app-3", other)
		if a.Services == c.Services {
			t.Errorf("services %v share the map of %v", c.Services, a.Services)
		}
		want := map[string]map[uint16]uint16{}
		for k, pl := range other {
			want[k] = protoPortMap(pl.GetPorts())
		}
		if !reflect.DeepEqual(c.Services.Map(), want) {
			t.Errorf("Services = %v, want %v", c.Services, want)
		}
	}
}

// TestConvertSharesExtra: workloads whose rare fields (waypoint, gateway,
// application tunnel, policies, hostname) are equal share one Extra; any
// difference, or none of them set, gives each its own (or none).
func TestConvertSharesExtra(t *testing.T) {
	wp := func(host string, port uint32) *workloadapi.GatewayAddress {
		return &workloadapi.GatewayAddress{HboneMtlsPort: port, Destination: &workloadapi.GatewayAddress_Hostname{
			Hostname: &workloadapi.NamespacedHostname{Namespace: "ns-1", Hostname: host}}}
	}
	gwAddr := func(network string) *workloadapi.GatewayAddress {
		return &workloadapi.GatewayAddress{HboneMtlsPort: 15008, Destination: &workloadapi.GatewayAddress_Address{
			Address: &workloadapi.NetworkAddress{Network: network, Address: netip.MustParseAddr("192.0.2.1").AsSlice()}}}
	}
	base := func() *workloadapi.Workload {
		return &workloadapi.Workload{Uid: "u", Namespace: "ns-1", Waypoint: wp("wp", 15008), AuthorizationPolicies: []string{"ns-1/a", "ns-1/b"}}
	}
	conv := func(x *workloadapi.Workload) *state.Workload {
		b, err := proto.Marshal(x) // decoded, as a push delivers it: strings of their own
		if err != nil {
			t.Fatal(err)
		}
		var y workloadapi.Workload
		if err := proto.Unmarshal(b, &y); err != nil {
			t.Fatal(err)
		}
		w, err := ConvertWorkload(&y)
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	a, b := conv(base()), conv(base())
	if a.Labels == nil || a.Labels != b.Labels {
		t.Errorf("the replicas' Labels %p and %p: want one shared value", a.Labels, b.Labels)
	}
	if a.Extra == nil || a.Extra != b.Extra {
		t.Fatalf("equal rare fields: Extra %p and %p, want one shared value", a.Extra, b.Extra)
	}
	for _, tc := range []struct {
		name   string
		change func(x *workloadapi.Workload)
	}{
		{"another waypoint", func(x *workloadapi.Workload) { x.Waypoint = wp("wp2", 15008) }},
		{"another waypoint port", func(x *workloadapi.Workload) { x.Waypoint = wp("wp", 15009) }},
		{"a network gateway", func(x *workloadapi.Workload) { x.NetworkGateway = gwAddr("net2") }},
		{"an application tunnel", func(x *workloadapi.Workload) {
			x.ApplicationTunnel = &workloadapi.ApplicationTunnel{Protocol: workloadapi.ApplicationTunnel_PROXY}
		}},
		{"a hostname", func(x *workloadapi.Workload) { x.Hostname = "vm.example" }},
		{"one policy less", func(x *workloadapi.Workload) { x.AuthorizationPolicies = x.AuthorizationPolicies[:1] }},
		// Policies that would read alike in an encoding without lengths.
		{"policies joined", func(x *workloadapi.Workload) { x.AuthorizationPolicies = []string{"ns-1/ans-1/b"} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := base()
			tc.change(x)
			c := conv(x)
			if c.Extra == nil || c.Extra == a.Extra {
				t.Fatalf("Extra %p, shared with %p: want one of its own", c.Extra, a.Extra)
			}
			if reflect.DeepEqual(c.Extra, a.Extra) {
				t.Errorf("Extra %+v equals %+v", c.Extra, a.Extra)
			}
		})
	}
	if w := conv(&workloadapi.Workload{Uid: "u", Namespace: "ns-1"}); w.Extra != nil {
		t.Errorf("no rare field: Extra %+v, want nil", w.Extra)
	}
}

// TestWorkloadUIDSharesResourceName: a workload named by its uid (as istiod
// names them) keeps one copy of it, the resource name's, which the xDS
// client also keeps as its record of what it holds.
func TestWorkloadUIDSharesResourceName(t *testing.T) {
	x, store := newState(t, nil)
	name := "Kubernetes//Pod/ns-1/" + string([]byte("app-1")) // a copy of its own
	a := &workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: &workloadapi.Workload{
		Uid: "Kubernetes//Pod/ns-1/app-1", Name: "app-1", Namespace: "ns-1",
		Addresses: [][]byte{netip.MustParseAddr("10.0.0.1").AsSlice()},
	}}}
	if rej := applyAddrs(t, x, nil, res(t, name, a)); rej != nil {
		t.Fatal(rej)
	}
	w := store.Load().WorkloadByUID(name)
	if w == nil {
		t.Fatal("workload missing")
	}
	if !sameString(w.UID, name) {
		t.Error("the workload's uid is a second copy of its resource name")
	}
	if w.Name != "app-1" || unsafe.StringData(w.Name) != unsafe.StringData(name[len(name)-len("app-1"):]) {
		t.Errorf("the workload's name %q is not the end of its resource name", w.Name)
	}
}

// TestWorkloadNameInUID: a workload's name that ends its uid is read from
// the uid's bytes; one that does not keeps its own.
func TestWorkloadNameInUID(t *testing.T) {
	for _, tc := range []struct {
		uid, name string
		shared    bool
	}{
		{"Kubernetes//Pod/ns-1/app-1", "app-1", true},
		{"cluster//networking.istio.io/WorkloadEntry/ns-1/vm", "vm", true},
		{"Kubernetes//Pod/ns-1/app-1", "other", false},
		{"Kubernetes//Pod/ns-1/app-1", "", false},
	} {
		w, err := ConvertWorkload(&workloadapi.Workload{Uid: tc.uid, Name: tc.name})
		if err != nil {
			t.Fatal(err)
		}
		if w.Name != tc.name {
			t.Fatalf("%s: name %q, want %q", tc.uid, w.Name, tc.name)
		}
		if shared := tc.name != "" && unsafe.StringData(w.Name) == unsafe.StringData(w.UID[len(w.UID)-len(w.Name):]); shared != tc.shared {
			t.Errorf("%s, %s: name in the uid's bytes %v, want %v", tc.uid, tc.name, shared, tc.shared)
		}
	}
}

// TestWeakCacheCollision: two contents with one hash never share a value:
// the cache checks what it finds, and the later content takes the entry.
func TestWeakCacheCollision(t *testing.T) {
	var c weakCache[state.Locality]
	a, b := &state.Locality{Region: "a"}, &state.Locality{Region: "b"}
	same := func(want *state.Locality) func(*state.Locality) bool {
		return func(p *state.Locality) bool { return *p == *want }
	}
	c.putLocked(1, a)
	if got := c.getLocked(1, same(b)); got != nil {
		t.Fatalf("b found %v under a's hash", got)
	}
	if got := c.getLocked(1, same(a)); got != a {
		t.Fatalf("a not found: %v", got)
	}
	c.putLocked(1, b)
	if got := c.getLocked(1, same(b)); got != b {
		t.Fatalf("b not found after it took the entry: %v", got)
	}
	runtime.KeepAlive(a)
	runtime.KeepAlive(b)
}

// TestSamePorts: a shared set's ports are checked against a workload's as
// protoPorts reads them (the later of two entries for one port counts).
func TestSamePorts(t *testing.T) {
	m := state.PortMap{{Service: 80, Target: 8080}, {Service: 9090, Target: 9090}}
	for _, tc := range []struct {
		name  string
		ports *workloadapi.PortList
		want  bool
	}{
		{"same", ports(80, 8080, 9090, 9090), true},
		{"other order", ports(9090, 9090, 80, 8080), true},
		{"a port overridden by a later entry", ports(80, 1, 80, 8080, 9090, 9090), true},
		{"a port overriding", ports(80, 8080, 80, 1, 9090, 9090), false},
		{"another target", ports(80, 8081, 9090, 9090), false},
		{"one port less", ports(80, 8080), false},
		{"one port more", ports(80, 8080, 9090, 9090, 443, 8443), false},
		{"none", ports(), false},
	} {
		if got := samePorts(m, tc.ports.GetPorts()); got != tc.want {
			t.Errorf("%s: samePorts = %v, want %v", tc.name, got, tc.want)
		}
		if got := slices.Equal(protoPorts(tc.ports.GetPorts()), m); got != tc.want {
			t.Errorf("%s: protoPorts = %v, equal to %v: %v, want %v", tc.name, protoPorts(tc.ports.GetPorts()), m, got, tc.want)
		}
	}
}

// TestConvertServiceShares: services with the same ports share one port
// map, and a service's name that starts its hostname is read from it.
func TestConvertServiceShares(t *testing.T) {
	conv := func(name, host string, pl *workloadapi.PortList) *state.Service {
		b, err := proto.Marshal(&workloadapi.Service{Name: name, Namespace: "ns-1", Hostname: host, Ports: pl.GetPorts()})
		if err != nil {
			t.Fatal(err)
		}
		var x workloadapi.Service // decoded: strings of their own
		if err := proto.Unmarshal(b, &x); err != nil {
			t.Fatal(err)
		}
		s, err := ConvertService(&x)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	samePortsMap := func(a, b map[uint16]uint16) bool {
		return reflect.ValueOf(a).UnsafePointer() == reflect.ValueOf(b).UnsafePointer()
	}
	a := conv("a", "a.ns-1.svc.cluster.local", ports(80, 8080, 9090, 9090))
	b := conv("b", "b.ns-1.svc.cluster.local", ports(9090, 9090, 80, 8080))
	c := conv("c", "c.ns-1.svc.cluster.local", ports(80, 8081, 9090, 9090))
	if !samePortsMap(a.Ports, b.Ports) {
		t.Error("services with the same ports hold two maps")
	}
	if samePortsMap(a.Ports, c.Ports) || !reflect.DeepEqual(c.Ports, map[uint16]uint16{80: 8081, 9090: 9090}) {
		t.Errorf("another port map: %v, shared with %v", c.Ports, a.Ports)
	}
	if a.Name != "a" || unsafe.StringData(a.Name) != unsafe.StringData(a.Hostname) {
		t.Errorf("name %q is not the start of hostname %q", a.Name, a.Hostname)
	}
	for _, tc := range []struct{ name, host string }{{"a", "ab.ns-1.svc"}, {"ns-1", "a.ns-1.svc"}, {"a.x", "a.x"}} {
		if s := conv(tc.name, tc.host, nil); s.Name != tc.name || unsafe.StringData(s.Name) == unsafe.StringData(s.Hostname) {
			t.Errorf("name %q, hostname %q: read from the hostname", s.Name, s.Hostname)
		}
	}
	runtime.KeepAlive(a)
}

// TestInternKeepsStringsInUse: a workload converted after a collection
// shares the names of one converted before that is still held (issue 36:
// unique.Make's table forgot every string at the next collection, so a
// workload changed or added after one got fresh copies of its node and,
// in a new Labels value, of its namespace), and a name nothing holds any
// more leaves the table.
func TestInternKeepsStringsInUse(t *testing.T) {
	convert := func(workloadName string) *state.Workload {
		return convertDecoded(t, &workloadapi.Workload{
			Uid: "Kubernetes//Pod/ns-keep/" + workloadName, Name: workloadName, Namespace: "ns-keep",
			ServiceAccount: "sa-keep", Node: "node-keep", WorkloadName: workloadName,
		})
	}
	first := convert("first")
	runtime.GC()
	runtime.GC()
	second := convert("second")
	if first.Labels == second.Labels {
		t.Fatal("the two workloads share their Labels: the test needs a new one")
	}
	for _, f := range []struct{ name, a, b string }{
		{"node", first.Node(), second.Node()},
		{"namespace", first.Namespace(), second.Namespace()},
		{"service account", first.ServiceAccount(), second.ServiceAccount()},
	} {
		if !sameString(f.a, f.b) {
			t.Errorf("%s %q: the second workload holds a copy of its own", f.name, f.b)
		}
	}
	runtime.KeepAlive(first)

	gone := intern(string([]byte("a-name-nothing-keeps")))
	h := maphash.String(cacheSeed, gone)
	gone = ""
	runtime.GC()
	runtime.GC()
	internTable.mu.Lock()
	p := internTable.m[h].p.Value()
	internTable.mu.Unlock()
	if p != nil {
		t.Error("a name nothing holds is still in the table after a collection")
	}
	_ = gone
}
