package state

import (
	"errors"
	"fmt"
	"math/rand/v2"
)

// ErrNoHealthyUpstream means a service has no endpoint that can take a
// connection on the requested port (ztunnel's "no healthy upstream").
var ErrNoHealthyUpstream = errors.New("state: no healthy upstream")

// Resolution says what a service is being resolved for: the two differ in
// which endpoints may serve a port the service does not list.
type Resolution uint8

const (
	// ResolveStandard is a client addressing the service: the port must be
	// one of the service's ports.
	ResolveStandard Resolution = iota
	// ResolveWaypoint is ztunnel finding a waypoint (or gateway) behind a
	// service by its HBONE port: an endpoint with an application tunnel
	// serves any port, since the tunnel carries the real target.
	ResolveWaypoint
)

// Upstream is a chosen next hop: a workload, the port to reach it on, and
// the service it was chosen from (nil when the workload was addressed
// directly).
type Upstream struct {
	Workload *Workload
	Port     uint16
	Service  *Service
}

// PickEndpoint chooses the endpoint of svc that serves service port svcPort
// for a client workload src, as ztunnel's standard resolution does, and
// returns the endpoint's workload and the target port to dial. It is
// PickUpstream with ResolveStandard.
func (s *Snapshot) PickEndpoint(src *Workload, svc *Service, svcPort uint16, rnd func(n uint64) uint64) (*Workload, uint16, error) {
	up, err := s.PickUpstream(src, svc, svcPort, ResolveStandard, rnd)
	return up.Workload, up.Port, err
}

// PickUpstream chooses the endpoint of svc that serves service port svcPort
// for a client workload src, as ztunnel's load_balance does:
//
//   - With ResolveStandard the port must be one of svc.Ports; with
//     ResolveWaypoint a port the service lacks is served only by endpoints
//     with an application tunnel.
//   - Endpoints whose workload has no address (and no hostname) are skipped
//     unless they are on another network and have a network gateway.
//   - With ResolveStandard, if the service's target port for svcPort is 0,
//     endpoints without their own mapping for svcPort are skipped.
//   - With a load balancer in a mode other than Standard, endpoints are ranked
//     by how many leading routing preferences they share with src (a leading
//     Network preference counts as all of them); Strict keeps only full
//     matches; the best rank wins.
//   - Among the remaining endpoints one is picked at random, weighted by
//     Capacity. rnd(n) must return a uniform value in [0, n); nil means
//     math/rand/v2.Uint64N.
//
// The target port is the endpoint's own mapping for svcPort, else the
// service's target port, else (for an endpoint with an application tunnel
// on a port of its own) svcPort itself; otherwise there is no upstream.
// Unhealthy workloads are not endpoints unless the service's health policy
// is LBAllowAll (the snapshot filters them when it is built). A nil src
// stands for a client on the default network ("") with no locality. Errors
// wrap ErrNoHealthyUpstream.
func (s *Snapshot) PickUpstream(src *Workload, svc *Service, svcPort uint16, mode Resolution, rnd func(n uint64) uint64) (Upstream, error) {
	svcTarget, hasPort := svc.Ports[svcPort]
	if !hasPort && mode == ResolveStandard {
		return Upstream{}, fmt.Errorf("%w: service %s has no port %d", ErrNoHealthyUpstream, svc.Key(), svcPort)
	}
	if src == nil {
		src = &Workload{}
	}
	f := endpointFilter{src: src, svcPort: svcPort, svcTarget: svcTarget, hasPort: hasPort, mode: mode, lb: svc.LoadBalancer()}
	f.ranked = f.lb != nil && f.lb.Mode != LBModeStandard
	eps := s.Endpoints(svc)

	// Pass 1: the best rank among eligible endpoints.
	best := -1
	for i := range eps {
		best = max(best, f.rank(&eps[i]))
	}
	// Pass 2: total weight at that rank. Pass 3: the weighted pick.
	var total uint64
	if best >= 0 {
		for i := range eps {
			if f.rank(&eps[i]) == best {
				total += uint64(eps[i].Workload.Capacity)
			}
		}
	}
	if total == 0 {
		return Upstream{}, fmt.Errorf("%w: service %s has no usable endpoint for port %d", ErrNoHealthyUpstream, svc.Key(), svcPort)
	}
	if rnd == nil {
		rnd = rand.Uint64N
	}
	r := rnd(total)
	var ep *Endpoint
	for i := range eps {
		if f.rank(&eps[i]) != best {
			continue
		}
		c := uint64(eps[i].Workload.Capacity)
		if r < c {
			ep = &eps[i]
			break
		}
		r -= c
	}
	if ep == nil { // rnd returned a value out of range
		return Upstream{}, fmt.Errorf("%w: random source returned a value out of range", ErrNoHealthyUpstream)
	}

	up := Upstream{Workload: ep.Workload, Service: svc}
	switch p, ok := ep.Ports().Target(svcPort); {
	case ok:
		up.Port = p
	case svcTarget > 0:
		up.Port = svcTarget
	case ep.Workload.ApplicationTunnel() != nil && ep.Workload.ApplicationTunnel().Port != 0:
		// The tunnel carries the real target; ztunnel on the far side
		// resolves it.
		up.Port = svcPort
	default:
		return Upstream{}, fmt.Errorf("%w: service %s: endpoint %s has no target for port %d", ErrNoHealthyUpstream, svc.Key(), ep.Workload.UID, svcPort)
	}
	return up, nil
}

// endpointFilter holds what ranking one service's endpoints needs.
type endpointFilter struct {
	src                *Workload
	svcPort, svcTarget uint16
	hasPort            bool
	mode               Resolution
	lb                 *LoadBalancer
	ranked             bool
}

// rank returns -1 if ep cannot serve the port, else its locality rank
// (always 0 when the service does not rank endpoints).
func (f *endpointFilter) rank(ep *Endpoint) int {
	w, src := ep.Workload, f.src
	if len(w.Addresses) == 0 && w.Hostname() == "" {
		// Reachable only through a network gateway, which is never used
		// within one network.
		if w.Network() == src.Network() || w.NetworkGateway() == nil {
			return -1
		}
	}
	switch f.mode {
	case ResolveStandard:
		if f.svcTarget == 0 {
			if _, ok := ep.Ports().Target(f.svcPort); !ok {
				return -1
			}
		}
	case ResolveWaypoint:
		if !f.hasPort && w.ApplicationTunnel() == nil {
			return -1
		}
	}
	if !f.ranked {
		return 0
	}
	prefs := f.lb.RoutingPreferences
	networkFirst := len(prefs) > 0 && prefs[0] == LBScopeNetwork
	rank, adjust := 0, 0
	for _, scope := range prefs {
		var match bool
		switch scope {
		case LBScopeRegion:
			match = src.Locality().Region == w.Locality().Region
		case LBScopeZone:
			match = src.Locality().Zone == w.Locality().Zone
		case LBScopeSubzone:
			match = src.Locality().Subzone == w.Locality().Subzone
		case LBScopeNode:
			match = src.Node() == w.Node()
		case LBScopeCluster:
			match = src.ClusterID() == w.ClusterID()
		case LBScopeNetwork:
			match = src.Network() == w.Network()
			if networkFirst {
				if !match {
					continue // rank by the other scopes
				}
				adjust = len(prefs) - 1
			}
		}
		if !match {
			break
		}
		rank++
	}
	if f.lb.Mode == LBModeStrict && rank != len(prefs) {
		return -1
	}
	return rank + adjust
}
