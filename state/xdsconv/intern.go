package xdsconv

import (
	"slices"
	"strconv"
	"strings"
	"sync"
	"unique"
	"weak"

	"github.com/ztunnel-go/ztunnel/api/workloadapi"
	"github.com/ztunnel-go/ztunnel/state"
)

// What repeats across workloads is held once (issue 36: at 100,000
// workloads each decoded copy of a namespace, service account, node or
// port map was a few hundred bytes per workload). Strings go through
// unique.Make, whose table holds them weakly: a name no snapshot uses any
// more is collected. A workload's Services map, identical for the
// replicas of one deployment, is shared through servicesCache.

// intern returns the canonical copy of s.
func intern(s string) string {
	if s == "" {
		return ""
	}
	return unique.Make(s).Value()
}

// internAll interns every element of list in place (list belongs to a
// decoded message the caller owns).
func internAll(list []string) []string {
	for i, s := range list {
		list[i] = intern(s)
	}
	return list
}

// weakCache maps a key to a shared value, held weakly: a value no snapshot
// uses any more is collected, and its entry is dropped at the next sweep,
// once the cache has doubled since the last (and holds at least minSweep).
type weakCache[K comparable, V any] struct {
	mu        sync.Mutex // guards the following fields
	m         map[K]weak.Pointer[V]
	lastSweep int
	minSweep  int
}

// getLocked returns the value under k, or nil. The caller holds c.mu.
func (c *weakCache[K, V]) getLocked(k K) *V { return c.m[k].Value() }

// putLocked puts v under k. The caller holds c.mu.
func (c *weakCache[K, V]) putLocked(k K, v *V) {
	if c.m == nil {
		c.m = map[K]weak.Pointer[V]{}
	}
	c.m[k] = weak.Make(v)
	if len(c.m) >= 2*max(c.lastSweep, c.minSweep) {
		for k, wp := range c.m {
			if wp.Value() == nil {
				delete(c.m, k)
			}
		}
		c.lastSweep = len(c.m)
	}
}

// localities shares the workloads' Locality values: one per locality.
var localities = weakCache[state.Locality, state.Locality]{minSweep: 64}

// internLocality returns the shared value equal to l (nil for the zero
// Locality, which means none).
func internLocality(l state.Locality) *state.Locality {
	if l == (state.Locality{}) {
		return nil
	}
	c := &localities
	c.mu.Lock()
	defer c.mu.Unlock()
	if p := c.getLocked(l); p != nil {
		return p
	}
	p := &state.Locality{Region: intern(l.Region), Zone: intern(l.Zone), Subzone: intern(l.Subzone)}
	c.putLocked(*p, p)
	return p
}

// labelSets shares the workloads' Labels values: one per deployment (and
// revision).
var labelSets = weakCache[state.WorkloadLabels, state.WorkloadLabels]{minSweep: 1024}

// internLabels returns the shared value equal to l, its strings interned
// (nil for the zero WorkloadLabels).
func internLabels(l state.WorkloadLabels) *state.WorkloadLabels {
	if l == (state.WorkloadLabels{}) {
		return nil
	}
	c := &labelSets
	c.mu.Lock()
	defer c.mu.Unlock()
	if p := c.getLocked(l); p != nil {
		return p
	}
	p := &state.WorkloadLabels{
		WorkloadName: intern(l.WorkloadName), WorkloadType: intern(l.WorkloadType),
		CanonicalName: intern(l.CanonicalName), CanonicalRevision: intern(l.CanonicalRevision),
	}
	c.putLocked(*p, p)
	return p
}

// extras shares the workloads' Extra values, by an encoding of their
// content (extraKey): the replicas of a deployment have the same waypoint
// and policies (issue 36: 64 bytes of each record before they moved to
// Extra).
var extras = weakCache[string, state.WorkloadExtra]{minSweep: 1024}

// internExtra sets w.Extra to the shared value equal to x, or to nil when
// x is empty. x's strings are interned already.
func internExtra(w *state.Workload, x state.WorkloadExtra) {
	if x.IsZero() {
		w.Extra = nil
		return
	}
	k := extraKey(&x)
	c := &extras
	c.mu.Lock()
	defer c.mu.Unlock()
	if p := c.getLocked(k); p != nil {
		w.Extra = p
		return
	}
	w.Extra = &x
	c.putLocked(k, w.Extra)
}

// extraKey encodes x's content; lengths precede strings, so that no two
// contents encode alike.
func extraKey(x *state.WorkloadExtra) string {
	var b []byte
	str := func(s string) {
		b = strconv.AppendUint(b, uint64(len(s)), 10)
		b = append(b, ':')
		b = append(b, s...)
	}
	gw := func(g *state.GatewayAddress) {
		switch {
		case g == nil:
			b = append(b, '-')
			return
		case g.Address != nil:
			b = append(b, 'a')
			str(g.Address.Network)
			b = g.Address.Addr.AppendTo(b)
		case g.Hostname != nil:
			b = append(b, 'h')
			str(g.Hostname.Namespace)
			str(g.Hostname.Hostname)
		}
		b = append(b, ',')
		b = strconv.AppendUint(b, uint64(g.HBONEMTLSPort), 10)
	}
	str(x.Hostname)
	gw(x.Waypoint)
	gw(x.NetworkGateway)
	if t := x.ApplicationTunnel; t != nil {
		b = append(b, 't')
		b = strconv.AppendUint(b, uint64(t.Protocol), 10)
		b = append(b, ',')
		b = strconv.AppendUint(b, uint64(t.Port), 10)
	}
	b = append(b, ';')
	for _, p := range x.AuthorizationPolicies {
		str(p)
	}
	return string(b)
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
// modified, so equal sets can be one). It maps an encoding of the set's
// content to the set, weakly: a set no workload holds any more does not
// stay alive for the cache's sake.
var servicesCache = weakCache[string, state.ServiceSet]{minSweep: 1024}

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
	// Lengths first, so that no two contents encode alike whatever bytes
	// the keys hold.
	var b []byte
	for _, k := range keys {
		ports := x[k].GetPorts()
		b = strconv.AppendUint(b, uint64(len(k)), 10)
		b = append(b, ':')
		b = append(b, k...)
		b = strconv.AppendUint(b, uint64(len(ports)), 10)
		for _, p := range ports {
			b = append(b, ',')
			b = strconv.AppendUint(b, uint64(uint16(p.GetServicePort())), 10)
			b = append(b, ':')
			b = strconv.AppendUint(b, uint64(uint16(p.GetTargetPort())), 10)
		}
		b = append(b, ';')
	}
	c := &servicesCache
	c.mu.Lock()
	defer c.mu.Unlock()
	if set := c.getLocked(string(b)); set != nil {
		w.Services = set
		return nil
	}
	list := make([]state.ServicePorts, len(keys))
	for i, k := range keys {
		list[i] = state.ServicePorts{Key: intern(k), Ports: protoPorts(x[k].GetPorts())}
	}
	w.Services = state.NewServiceSet(list)
	c.putLocked(string(b), w.Services)
	return nil
}
