package xdsconv

import (
	"hash/maphash"
	"slices"
	"strings"
	"sync"
	"unsafe"
	"weak"

	"github.com/ztunnel-go/ztunnel/api/workloadapi"
	"github.com/ztunnel-go/ztunnel/state"
)

// What repeats across workloads is held once (issue 36: at 100,000
// workloads each decoded copy of a namespace, service account, node or
// port map was a few hundred bytes per workload). Strings go through
// intern's table, which holds them weakly: a name no snapshot uses any
// more is collected. What a deployment's replicas have in common (their
// Labels, Extra and Services) and services' port maps are shared through
// weak caches (weakCache).

// internTable is intern's table: by a 64-bit hash of a string's bytes, a
// weak pointer to the bytes of its canonical copy and their length. A
// string's data pointer keeps its allocation alive, so the entry finds the
// copy while any value holds it; once none does it is collected, and the
// entry dropped at the next sweep (as weakCache's). Two strings with one
// hash are never confused: a lookup compares the bytes, and the later
// replaces the earlier in the table. unique.Make, used before, held
// weakly the box of each handle it made rather than the bytes: nothing
// kept the boxes, so its table forgot every string at the next
// collection, and a workload converted after one got fresh copies of its
// names (and paid a new weak handle for each).
var internTable = struct {
	mu        sync.Mutex // guards the following fields
	m         map[uint64]internEntry
	lastSweep int
}{m: map[uint64]internEntry{}}

// internEntry is a canonical string: its bytes, held weakly, and length.
type internEntry struct {
	p weak.Pointer[byte]
	n int
}

// intern returns the canonical copy of s.
func intern(s string) string {
	if s == "" {
		return ""
	}
	h := maphash.String(cacheSeed, s)
	t := &internTable
	t.mu.Lock()
	defer t.mu.Unlock()
	if e := t.m[h]; e.n == len(s) {
		if p := e.p.Value(); p != nil {
			if c := unsafe.String(p, e.n); c == s {
				return c
			}
		}
	}
	c := strings.Clone(s)
	t.m[h] = internEntry{weak.Make(unsafe.StringData(c)), len(c)}
	if len(t.m) >= 2*max(t.lastSweep, 1024) {
		for k, e := range t.m {
			if e.p.Value() == nil {
				delete(t.m, k)
			}
		}
		t.lastSweep = len(t.m)
	}
	return c
}

// internAll interns every element of list in place (list belongs to a
// decoded message the caller owns).
func internAll(list []string) []string {
	for i, s := range list {
		list[i] = intern(s)
	}
	return list
}

// weakCache shares values by content. It maps a 64-bit hash of the
// content to a value, held weakly: a value no snapshot uses any more is
// collected, and its entry is dropped at the next sweep, once the cache
// has doubled since the last (and holds at least minSweep). A lookup
// checks the value it finds against the one sought, so that two contents
// with one hash are never confused: the later replaces the earlier in the
// cache, and each keeps its own value (issue 36: keyed by an encoding of
// the content, the caches cost ~40 bytes per workload).
type weakCache[V any] struct {
	mu        sync.Mutex // guards the following fields
	m         map[uint64]weak.Pointer[V]
	lastSweep int
	minSweep  int
}

// cacheSeed seeds the caches' hashes.
var cacheSeed = maphash.MakeSeed()

// getLocked returns the value under hash h if same reports it equal to the
// one sought, or nil. The caller holds c.mu.
func (c *weakCache[V]) getLocked(h uint64, same func(*V) bool) *V {
	if p := c.m[h].Value(); p != nil && same(p) {
		return p
	}
	return nil
}

// putLocked puts v under hash h. The caller holds c.mu.
func (c *weakCache[V]) putLocked(h uint64, v *V) {
	if c.m == nil {
		c.m = map[uint64]weak.Pointer[V]{}
	}
	c.m[h] = weak.Make(v)
	if len(c.m) >= 2*max(c.lastSweep, c.minSweep) {
		for k, wp := range c.m {
			if wp.Value() == nil {
				delete(c.m, k)
			}
		}
		c.lastSweep = len(c.m)
	}
}

// places shares the workloads' Place values: one per node (and
// locality).
var places = weakCache[state.Placement]{minSweep: 64}

// internPlace returns the shared value equal to p, its strings interned
// (nil for the zero Placement, which means neither node nor locality).
func internPlace(p state.Placement) *state.Placement {
	return shareEqual(&places, p, func(p state.Placement) state.Placement {
		l := p.Locality
		return state.Placement{
			Node:     intern(p.Node),
			Locality: state.Locality{Region: intern(l.Region), Zone: intern(l.Zone), Subzone: intern(l.Subzone)},
		}
	})
}

// labelSets shares the workloads' Labels values: one per deployment (and
// revision).
var labelSets = weakCache[state.WorkloadLabels]{minSweep: 1024}

// internLabels returns the shared value equal to l, its strings interned
// (nil for the zero WorkloadLabels).
func internLabels(l state.WorkloadLabels) *state.WorkloadLabels {
	return shareEqual(&labelSets, l, func(l state.WorkloadLabels) state.WorkloadLabels {
		return state.WorkloadLabels{
			Namespace: intern(l.Namespace), ServiceAccount: intern(l.ServiceAccount), Network: intern(l.Network),
			WorkloadName: intern(l.WorkloadName), WorkloadType: intern(l.WorkloadType),
			CanonicalName: intern(l.CanonicalName), CanonicalRevision: intern(l.CanonicalRevision),
			TrustDomain: intern(l.TrustDomain), ClusterID: intern(l.ClusterID),
		}
	})
}

// shareEqual returns c's value equal to v, or stores and returns a new one
// made by fresh (v with its strings interned); nil for the zero value. It
// is the cache's lookup for a value type Go compares and hashes itself.
func shareEqual[T comparable](c *weakCache[T], v T, fresh func(T) T) *T {
	var zero T
	if v == zero {
		return nil
	}
	h := maphash.Comparable(cacheSeed, v)
	c.mu.Lock()
	defer c.mu.Unlock()
	if p := c.getLocked(h, func(p *T) bool { return *p == v }); p != nil {
		return p
	}
	p := new(T)
	*p = fresh(v)
	c.putLocked(h, p)
	return p
}

// extras shares the workloads' Extra values: the replicas of a deployment
// have the same waypoint and policies (issue 36: 64 bytes of each record
// before they moved to Extra).
var extras = weakCache[state.WorkloadExtra]{minSweep: 1024}

// internExtra sets w.Extra to the shared value equal to x, or to nil when
// x is empty. x's strings are interned already.
func internExtra(w *state.Workload, x state.WorkloadExtra) {
	if x.IsZero() {
		w.Extra = nil
		return
	}
	h := extraHash(&x)
	c := &extras
	c.mu.Lock()
	defer c.mu.Unlock()
	if p := c.getLocked(h, func(p *state.WorkloadExtra) bool { return sameExtra(p, &x) }); p != nil {
		w.Extra = p
		return
	}
	// A copy, so that x stays on the stack: most workloads find theirs
	// shared, and an allocation made before the lookup was garbage
	// between the records a push keeps (see decodeBatch).
	p := new(state.WorkloadExtra)
	*p = x
	w.Extra = p
	c.putLocked(h, p)
}

// extraHash hashes x's content.
func extraHash(x *state.WorkloadExtra) uint64 {
	var h maphash.Hash
	h.SetSeed(cacheSeed)
	str := func(s string) {
		maphash.WriteComparable(&h, len(s))
		h.WriteString(s)
	}
	gw := func(g *state.GatewayAddress) {
		switch {
		case g == nil:
			h.WriteByte('-')
			return
		case g.Address != nil:
			h.WriteByte('a')
			str(g.Address.Network)
			maphash.WriteComparable(&h, g.Address.Addr)
		case g.Hostname != nil:
			h.WriteByte('h')
			str(g.Hostname.Namespace)
			str(g.Hostname.Hostname)
		}
		maphash.WriteComparable(&h, g.HBONEMTLSPort)
	}
	str(x.Hostname)
	gw(x.Waypoint)
	gw(x.NetworkGateway)
	if t := x.ApplicationTunnel; t != nil {
		maphash.WriteComparable(&h, *t)
	}
	for _, p := range x.AuthorizationPolicies {
		str(p)
	}
	return h.Sum64()
}

// sameExtra reports whether a and b have the same content.
func sameExtra(a, b *state.WorkloadExtra) bool {
	return a.Hostname == b.Hostname && sameGateway(a.Waypoint, b.Waypoint) &&
		sameGateway(a.NetworkGateway, b.NetworkGateway) &&
		(a.ApplicationTunnel == nil) == (b.ApplicationTunnel == nil) &&
		(a.ApplicationTunnel == nil || *a.ApplicationTunnel == *b.ApplicationTunnel) &&
		slices.Equal(a.AuthorizationPolicies, b.AuthorizationPolicies)
}

func sameGateway(a, b *state.GatewayAddress) bool {
	switch {
	case a == nil || b == nil:
		return a == b
	case a.HBONEMTLSPort != b.HBONEMTLSPort || (a.Address == nil) != (b.Address == nil) || (a.Hostname == nil) != (b.Hostname == nil):
		return false
	case a.Address != nil && *a.Address != *b.Address:
		return false
	}
	return a.Hostname == nil || *a.Hostname == *b.Hostname
}

// nameInHostname points s's name into its hostname when the hostname
// starts with it followed by a dot, as a Kubernetes service's
// ("name.namespace.svc.cluster.local"): the name then costs no string of
// its own.
func nameInHostname(s *state.Service) {
	if n := len(s.Name); n > 0 && len(s.Hostname) > n && s.Hostname[n] == '.' && strings.HasPrefix(s.Hostname, s.Name) {
		s.Name = s.Hostname[:n]
	}
}

// portMaps shares the services' port maps: most services of a mesh map
// the same few ports (issue 36: a map of two ports is ~100 bytes, ~20 per
// workload at 5 replicas per service). It holds, weakly, a service with
// such a map: one replaced or removed does not stay alive for its sake.
var portMaps = weakCache[state.Service]{minSweep: 1024}

// sharePorts converts ports into s.Ports, reusing the map of a live
// service with the same ones.
func sharePorts(s *state.Service, ports []*workloadapi.Port) {
	pm := protoPorts(ports)
	var h maphash.Hash
	h.SetSeed(cacheSeed)
	for _, p := range pm {
		maphash.WriteComparable(&h, p)
	}
	sum := h.Sum64()
	c := &portMaps
	c.mu.Lock()
	defer c.mu.Unlock()
	if o := c.getLocked(sum, func(o *state.Service) bool { return samePortMap(o.Ports, pm) }); o != nil {
		s.Ports = o.Ports
		return
	}
	s.Ports = pm.Map()
	c.putLocked(sum, s)
}

// samePortMap reports whether m maps exactly pm's ports.
func samePortMap(m map[uint16]uint16, pm state.PortMap) bool {
	if len(m) != len(pm) {
		return false
	}
	for _, p := range pm {
		if t, ok := m[p.Service]; !ok || t != p.Target {
			return false
		}
	}
	return true
}

// nameInUID points w's name into its uid when the uid ends with it, as
// istiod's do ("cluster//Pod/namespace/name"): the name then costs no
// string of its own (issue 36: ~32 B per workload).
func nameInUID(w *state.Workload) {
	if n := len(w.Name); n > 0 && strings.HasSuffix(w.UID, w.Name) {
		w.Name = w.UID[len(w.UID)-n:]
	}
}

// workloadTypes are the lower-case kind names, made once rather than per
// workload.
var workloadTypes = func() map[workloadapi.WorkloadType]string {
	m := make(map[workloadapi.WorkloadType]string, len(workloadapi.WorkloadType_name))
	for v, name := range workloadapi.WorkloadType_name {
		m[workloadapi.WorkloadType(v)] = strings.ToLower(name)
	}
	return m
}()

// servicesCache shares workloads' Services sets (snapshot values are never
// modified, so equal sets can be one).
var servicesCache = weakCache[state.ServiceSet]{minSweep: 1024}

// sharedServices converts x's Services into w.Services, reusing the set of
// a live workload with the same services and ports.
func sharedServices(w *state.Workload, x map[string]*workloadapi.PortList) error {
	if len(x) == 0 {
		return nil
	}
	keys := make([]string, 0, len(x))
	for k := range x {
		if !strings.Contains(k, "/") {
			return invalid("service key %q is not namespace/hostname", k)
		}
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var h maphash.Hash
	h.SetSeed(cacheSeed)
	for _, k := range keys {
		maphash.WriteComparable(&h, len(k))
		h.WriteString(k)
		ports := x[k].GetPorts()
		maphash.WriteComparable(&h, len(ports))
		for _, p := range ports {
			maphash.WriteComparable(&h, [2]uint16{uint16(p.GetServicePort()), uint16(p.GetTargetPort())})
		}
	}
	sum := h.Sum64()
	c := &servicesCache
	c.mu.Lock()
	defer c.mu.Unlock()
	if set := c.getLocked(sum, func(set *state.ServiceSet) bool { return sameServices(set, keys, x) }); set != nil {
		w.Services = set
		return nil
	}
	list := make([]state.ServicePorts, len(keys))
	for i, k := range keys {
		list[i] = state.ServicePorts{Key: intern(k), Ports: protoPorts(x[k].GetPorts())}
	}
	w.Services = state.NewServiceSet(list)
	c.putLocked(sum, w.Services)
	return nil
}

// sameServices reports whether set holds exactly the services of x, whose
// keys are sorted in keys, with their ports.
func sameServices(set *state.ServiceSet, keys []string, x map[string]*workloadapi.PortList) bool {
	list := set.List()
	if len(list) != len(keys) {
		return false
	}
	for i, k := range keys {
		if list[i].Key != k || !samePorts(list[i].Ports, x[k].GetPorts()) {
			return false
		}
	}
	return true
}

// samePorts reports whether m is the port map of ports (where of two
// entries for one service port the later counts, as protoPorts takes it).
func samePorts(m state.PortMap, ports []*workloadapi.Port) bool {
	n := 0
	for i, p := range ports {
		sp := uint16(p.GetServicePort())
		if slices.ContainsFunc(ports[i+1:], func(q *workloadapi.Port) bool { return uint16(q.GetServicePort()) == sp }) {
			continue // a later entry overrides this one
		}
		if tp, ok := m.Target(sp); !ok || tp != uint16(p.GetTargetPort()) {
			return false
		}
		n++
	}
	return n == len(m)
}
