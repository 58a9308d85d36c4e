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

// localities shares the workloads' Locality values: one per locality,
// held weakly (a locality no workload has any more is dropped at the next
// sweep, once the cache has doubled since the last).
var localities = struct {
	mu        sync.Mutex // guards the following fields
	m         map[state.Locality]weak.Pointer[state.Locality]
	lastSweep int
}{m: map[state.Locality]weak.Pointer[state.Locality]{}}

// internLocality returns the shared value equal to l (nil for the zero
// Locality, which means none).
func internLocality(l state.Locality) *state.Locality {
	if l == (state.Locality{}) {
		return nil
	}
	c := &localities
	c.mu.Lock()
	defer c.mu.Unlock()
	if p := c.m[l].Value(); p != nil {
		return p
	}
	p := &state.Locality{Region: intern(l.Region), Zone: intern(l.Zone), Subzone: intern(l.Subzone)}
	c.m[*p] = weak.Make(p)
	if len(c.m) >= 2*max(c.lastSweep, 64) {
		for k, wp := range c.m {
			if wp.Value() == nil {
				delete(c.m, k)
			}
		}
		c.lastSweep = len(c.m)
	}
	return p
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

// servicesCache shares workloads' Services maps (snapshot values are never
// modified, so equal maps can be one map). It maps an encoding of the
// map's content to a workload holding such a map, weakly: a workload
// replaced or removed does not stay alive for the cache's sake, and its
// entry is swept once the cache has doubled since the last sweep.
var servicesCache = struct {
	mu        sync.Mutex // guards the following fields
	m         map[string]weak.Pointer[state.Workload]
	lastSweep int
}{m: map[string]weak.Pointer[state.Workload]{}}

// sharedServices converts x's Services into w.Services, reusing the map of
// a live workload with the same services and ports.
func sharedServices(w *state.Workload, x map[string]*workloadapi.PortList) error {
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
	if other := c.m[string(b)].Value(); other != nil {
		w.Services = other.Services
		return nil
	}
	w.Services = make(map[string]map[uint16]uint16, len(x))
	for _, k := range keys {
		w.Services[intern(k)] = protoPortMap(x[k].GetPorts())
	}
	c.m[string(b)] = weak.Make(w)
	if len(c.m) >= 2*max(c.lastSweep, 1024) {
		for k, p := range c.m {
			if p.Value() == nil {
				delete(c.m, k)
			}
		}
		c.lastSweep = len(c.m)
	}
	return nil
}
