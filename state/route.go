package state

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
)

// DefaultHBONEPort is the HBONE port of a gateway address that names none.
const DefaultHBONEPort = 15008

// ErrUnknownGateway means a waypoint or network gateway address names
// nothing the snapshot can route to.
var ErrUnknownGateway = errors.New("state: gateway not found")

// Port returns the gateway's HBONE mTLS port, DefaultHBONEPort when unset.
func (g *GatewayAddress) Port() uint16 {
	if g.HBONEMTLSPort == 0 {
		return DefaultHBONEPort
	}
	return g.HBONEMTLSPort
}

// ServiceByHostname returns the service with hostname host that a client in
// namespace clientNS resolves, ranked as ResolveVIPPreferring ranks a VIP's
// services (client namespace, canonical, preferredNS, first by key), among
// those visible to the client; nil if none.
func (s *Snapshot) ServiceByHostname(host, clientNS, preferredNS string) *Service {
	return bestService(s.ServicesByHostname(host), clientNS, preferredNS, true, nil)
}

// ServiceByHostnameWhere is ServiceByHostname among the services keep
// accepts (the DNS proxy answers only for services it can give addresses
// for), so a refused service never takes the rank of one that answers.
func (s *Snapshot) ServiceByHostnameWhere(host, clientNS, preferredNS string, keep func(*Service) bool) *Service {
	return bestService(s.ServicesByHostname(host), clientNS, preferredNS, true, keep)
}

// FindHostname returns what a namespaced hostname names, as ztunnel's
// find_hostname: the service with that key, else a workload of that
// namespace with that hostname. At most one of the results is non-nil.
func (s *Snapshot) FindHostname(nh NamespacedHostname) (*Service, *Workload) {
	if svc := serviceByKey(&s.svcByKey, nh); svc != nil {
		return svc, nil
	}
	if ws := s.byHost.get(hashNH(nh), nh); len(ws) > 0 {
		return nil, ws[0]
	}
	return nil, nil
}

// FindAddress returns what ip names on network with no client to rank
// services for, as ztunnel's find_address: the workload owning it, else the
// best service by VIP (canonical first; CIDR VIPs by longest prefix). At
// most one of the results is non-nil.
func (s *Snapshot) FindAddress(network string, ip netip.Addr) (*Workload, *Service) {
	if w := s.WorkloadByAddr(network, ip); w != nil {
		return w, nil
	}
	return nil, s.resolveVIP(network, ip, "", "", false)
}

// ServiceWaypoint returns the waypoint traffic to svc goes through: one of
// its weighted waypoints sampled by weight, else its waypoint, else nil
// (a weighted set whose weights are all 0 counts as absent, as in ztunnel).
// rnd(n) must return a uniform value in [0, n); nil means math/rand/v2.
func ServiceWaypoint(svc *Service, rnd func(n uint64) uint64) *GatewayAddress {
	var total uint64
	for i := range svc.WeightedWaypoints() {
		total += uint64(svc.WeightedWaypoints()[i].Weight)
	}
	if total == 0 {
		return svc.Waypoint
	}
	r := randN(rnd, total)
	for i := range svc.WeightedWaypoints() {
		ww := &svc.WeightedWaypoints()[i]
		if r < uint64(ww.Weight) {
			return &ww.Destination
		}
		r -= uint64(ww.Weight)
	}
	return svc.Waypoint // rnd out of range
}

// ResolveGateway finds the workload behind a waypoint or network gateway
// address for a client src, as ztunnel's fetch_waypoint and
// fetch_network_gateway do (mode ResolveWaypoint and ResolveStandard):
//
//   - An address names a service by VIP (load-balanced on the gateway's
//     HBONE port) or a workload (on the HBONE port); the connection then
//     goes to that address's family, and target is the gateway address.
//   - A hostname names a service (load-balanced likewise) or a hostname
//     workload; target is then dst, so the connection keeps the original
//     destination's family.
//
// target is what SelectAddress should be given. Errors wrap
// ErrUnknownGateway or ErrNoHealthyUpstream.
func (s *Snapshot) ResolveGateway(g *GatewayAddress, src *Workload, dst netip.Addr, mode Resolution, rnd func(n uint64) uint64) (up Upstream, target netip.Addr, err error) {
	port := g.Port()
	if src == nil {
		src = &Workload{}
	}
	switch {
	case g.Address != nil:
		target = g.Address.Addr.Unmap()
		if svc := s.ResolveVIP(g.Address.Network, target, src.Namespace()); svc != nil {
			if svc.LoadBalancer() != nil && svc.LoadBalancer().Mode == LBModePassthrough {
				return Upstream{}, target, fmt.Errorf("%w: %s is a passthrough service", ErrUnknownGateway, g.Destination())
			}
			up, err = s.PickUpstream(src, svc, port, mode, rnd)
			return up, target, err
		}
		if w := s.WorkloadByAddr(g.Address.Network, target); w != nil {
			return Upstream{Workload: w, Port: port}, target, nil
		}
	case g.Hostname != nil:
		svc, w := s.FindHostname(*g.Hostname)
		if svc != nil {
			up, err = s.PickUpstream(src, svc, port, mode, rnd)
			return up, dst, err
		}
		if w != nil {
			return Upstream{Workload: w, Port: port}, dst, nil
		}
	}
	return Upstream{}, target, fmt.Errorf("%w: %s", ErrUnknownGateway, g.Destination())
}

// GatewayHasWorkload reports whether match accepts one of the workloads a
// gateway address stands for: the workload it names, or an endpoint of the
// service it names (ztunnel's check_gateway_address).
func (s *Snapshot) GatewayHasWorkload(g *GatewayAddress, match func(*Workload) bool) bool {
	if g == nil {
		return false
	}
	w, svc := s.gatewayTarget(g)
	if w != nil {
		return match(w)
	}
	if svc != nil {
		for _, ep := range s.Endpoints(svc) {
			if match(ep.Workload) {
				return true
			}
		}
	}
	return false
}

// gatewayTarget returns what g names (FindAddress for an address,
// FindHostname for a hostname): at most one of the results is non-nil.
func (s *Snapshot) gatewayTarget(g *GatewayAddress) (*Workload, *Service) {
	switch {
	case g.Address != nil:
		return s.FindAddress(g.Address.Network, g.Address.Addr)
	case g.Hostname != nil:
		svc, w := s.FindHostname(*g.Hostname)
		return w, svc
	}
	return nil, nil
}

// IsWaypointFor reports whether local, reached at localIP, is a waypoint
// of whatever target names on network (the "sandwich": a waypoint's own
// ztunnel receives tunnels addressed to the waypoint's destinations). The
// target's waypoint (or one of its weighted waypoints) must name local: a
// service having local as an endpoint, or a workload owning localIP.
//
// ztunnel checks the single waypoint field only; the weighted waypoints
// are checked too, since each of them receives such tunnels.
func (s *Snapshot) IsWaypointFor(network string, target netip.Addr, local *Workload, localIP netip.Addr) bool {
	w, svc := s.FindAddress(network, target)
	var (
		wp       *GatewayAddress
		weighted []WeightedWaypoint
	)
	switch {
	case w != nil:
		wp = w.Waypoint()
	case svc != nil:
		wp, weighted = svc.Waypoint, svc.WeightedWaypoints()
	default:
		return false
	}
	localIP = localIP.Unmap()
	isLocal := func(g *GatewayAddress) bool {
		gw, gsvc := s.gatewayTarget(g)
		switch {
		case gw != nil:
			return slices.Contains(gw.Addresses, localIP)
		case gsvc != nil:
			for _, ep := range s.Endpoints(gsvc) {
				if ep.Workload.UID == local.UID {
					return true
				}
			}
		}
		return false
	}
	if wp != nil && isLocal(wp) {
		return true
	}
	for i := range weighted {
		if isLocal(&weighted[i].Destination) {
			return true
		}
	}
	return false
}

// SelectAddress picks the address to dial w on, as ztunnel's
// pick_workload_destination: want itself when it is one of w's addresses;
// else, among the addresses fam allows, the first of want's family, else
// the first. ok is false when none qualifies: the caller then resolves
// w.Hostname(), goes through w's network gateway, or fails.
func SelectAddress(w *Workload, want netip.Addr, fam IPFamilies) (ip netip.Addr, ok bool) {
	want = want.Unmap()
	if slices.Contains(w.Addresses, want) {
		return want, true
	}
	for _, a := range w.Addresses {
		if !fam.Allows(a) {
			continue
		}
		if a.Is6() == want.Is6() {
			return a, true
		}
		if !ok {
			ip, ok = a, true
		}
	}
	return ip, ok
}

// Allows reports whether the family restriction admits ip (Automatic and
// Dual admit every address).
func (f IPFamilies) Allows(ip netip.Addr) bool {
	switch f {
	case IPFamiliesIPv4:
		return ip.Unmap().Is4()
	case IPFamiliesIPv6:
		return ip.Unmap().Is6()
	}
	return true
}

// randN returns rnd(n), with math/rand/v2 when rnd is nil.
func randN(rnd func(uint64) uint64, n uint64) uint64 {
	if rnd == nil {
		return rand.Uint64N(n)
	}
	return rnd(n)
}
