package state

import (
	"cmp"
	"slices"
)

// PortPair maps a service port to the port a workload serves it on.
type PortPair struct {
	Service, Target uint16
}

// PortMap is a workload's port map for one service, service port -> target
// port, sorted by service port with no port twice. A workload lists few
// ports, so a lookup scans.
type PortMap []PortPair

// NewPortMap returns the port map of pairs (nil when empty), taking
// ownership of pairs; of two pairs for one service port, the later is
// kept, as a map's assignment would.
func NewPortMap(pairs []PortPair) PortMap {
	if len(pairs) == 0 {
		return nil
	}
	return lastByKey(pairs, func(p PortPair) uint16 { return p.Service })
}

// lastByKey sorts list by key and keeps, of the entries with one key, the
// last one given (as a map's assignment would), in list's own array.
func lastByKey[T any, K cmp.Ordered](list []T, key func(T) K) []T {
	slices.SortStableFunc(list, func(a, b T) int { return cmp.Compare(key(a), key(b)) })
	out := list[:0]
	for i, v := range list {
		if i+1 < len(list) && key(list[i+1]) == key(v) {
			continue
		}
		out = append(out, v)
	}
	return slices.Clip(out)
}

// MakePortMap returns m as a PortMap (nil for an empty m).
func MakePortMap(m map[uint16]uint16) PortMap {
	if len(m) == 0 {
		return nil
	}
	out := make(PortMap, 0, len(m))
	for s, t := range m {
		out = append(out, PortPair{s, t})
	}
	slices.SortFunc(out, func(a, b PortPair) int { return cmp.Compare(a.Service, b.Service) })
	return out
}

// Target returns the target port of service port p, and whether the map
// names p.
func (m PortMap) Target(p uint16) (uint16, bool) {
	for _, pp := range m {
		if pp.Service == p {
			return pp.Target, true
		}
	}
	return 0, false
}

// Map returns the port map as a Go map (a new one).
func (m PortMap) Map() map[uint16]uint16 {
	out := make(map[uint16]uint16, len(m))
	for _, pp := range m {
		out[pp.Service] = pp.Target
	}
	return out
}

// ServicePorts is one service a workload is an endpoint of, by key
// ("namespace/hostname"), with the workload's port map for it.
type ServicePorts struct {
	Key   string
	Ports PortMap
}

// ServiceSet lists the services a workload is an endpoint of, sorted by
// key. It is immutable once made, so that the replicas of a deployment
// share one (issue 36: a map of maps per distinct set was ~300 bytes, a
// set of one service with two ports is 80). A nil *ServiceSet is empty.
type ServiceSet struct {
	list []ServicePorts
}

// NewServiceSet returns the set of list's services (nil when list is
// empty), taking ownership of list. Of two entries with one key, the later
// one is kept.
func NewServiceSet(list []ServicePorts) *ServiceSet {
	if len(list) == 0 {
		return nil
	}
	return &ServiceSet{list: lastByKey(list, func(sp ServicePorts) string { return sp.Key })}
}

// ServicesOf returns the set of m's services, m mapping service keys to
// port maps (nil when m is empty).
func ServicesOf(m map[string]map[uint16]uint16) *ServiceSet {
	list := make([]ServicePorts, 0, len(m))
	for k, ports := range m {
		list = append(list, ServicePorts{Key: k, Ports: MakePortMap(ports)})
	}
	return NewServiceSet(list)
}

// Len returns the number of services.
func (s *ServiceSet) Len() int {
	if s == nil {
		return 0
	}
	return len(s.list)
}

// List returns the services, sorted by key; the slice is shared and must
// not be modified.
func (s *ServiceSet) List() []ServicePorts {
	if s == nil {
		return nil
	}
	return s.list
}

// Ports returns the port map for the service under key, and whether the
// set holds that service.
func (s *ServiceSet) Ports(key string) (PortMap, bool) {
	if s == nil {
		return nil, false
	}
	i, ok := s.find(key)
	if !ok {
		return nil, false
	}
	return s.list[i].Ports, true
}

// Has reports whether the set holds the service under key.
func (s *ServiceSet) Has(key string) bool {
	_, ok := s.Ports(key)
	return ok
}

// Map returns the set as a map of service keys to port maps (new maps).
func (s *ServiceSet) Map() map[string]map[uint16]uint16 {
	out := make(map[string]map[uint16]uint16, s.Len())
	for _, sp := range s.List() {
		out[sp.Key] = sp.Ports.Map()
	}
	return out
}

func (s *ServiceSet) find(key string) (int, bool) {
	if len(s.list) <= 4 {
		for i := range s.list {
			if s.list[i].Key == key {
				return i, true
			}
		}
		return 0, false
	}
	return slices.BinarySearchFunc(s.list, key, func(sp ServicePorts, k string) int { return cmp.Compare(sp.Key, k) })
}
