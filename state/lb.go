package state

import (
	"errors"
	"fmt"
	"math/rand/v2"
)

// ErrNoHealthyUpstream means a service has no endpoint that can take a
// connection on the requested port (ztunnel's "no healthy upstream").
var ErrNoHealthyUpstream = errors.New("state: no healthy upstream")

// PickEndpoint chooses the endpoint of svc that serves service port svcPort
// for a client workload src, as ztunnel's standard resolution does, and
// returns the endpoint's workload and the target port to dial.
//
//   - The port must be one of svc.Ports.
//   - Endpoints whose workload has no address (and no hostname) are skipped
//     unless they are on another network and have a network gateway.
//   - If the service's target port for svcPort is 0, endpoints without their
//     own mapping for svcPort are skipped.
//   - With a load balancer in a mode other than Standard, endpoints are ranked
//     by how many leading routing preferences they share with src (a leading
//     Network preference counts as all of them); Strict keeps only full
//     matches; the best rank wins.
//   - Among the remaining endpoints one is picked at random, weighted by
//     Capacity. rnd(n) must return a uniform value in [0, n); nil means
//     math/rand/v2.Uint64N.
//
// The target port is the endpoint's own mapping for svcPort, else the
// service's target port. (ztunnel's third fallback, svcPort for workloads
// with an application tunnel, only applies when resolving waypoints.) A nil src stands for a client on the default network ("") with
// no locality. Errors wrap ErrNoHealthyUpstream.
func (s *Snapshot) PickEndpoint(src *Workload, svc *Service, svcPort uint16, rnd func(n uint64) uint64) (*Workload, uint16, error) {
	svcTarget, ok := svc.Ports[svcPort]
	if !ok {
		return nil, 0, fmt.Errorf("%w: service %s has no port %d", ErrNoHealthyUpstream, svc.Key(), svcPort)
	}
	if src == nil {
		src = &Workload{}
	}
	eps := s.endpoints[NamespacedHostname{svc.Namespace, svc.Hostname}]
	lb := svc.LoadBalancer
	ranked := lb != nil && lb.Mode != LBModeStandard

	// Pass 1: the best rank among eligible endpoints.
	best := -1
	for i := range eps {
		if r := endpointRank(src, &eps[i], svcTarget, svcPort, lb, ranked); r > best {
			best = r
		}
	}
	// Pass 2: total weight at that rank. Pass 3: the weighted pick.
	var total uint64
	if best >= 0 {
		for i := range eps {
			if endpointRank(src, &eps[i], svcTarget, svcPort, lb, ranked) == best {
				total += uint64(eps[i].Workload.Capacity)
			}
		}
	}
	if total == 0 {
		return nil, 0, fmt.Errorf("%w: service %s has no usable endpoint for port %d", ErrNoHealthyUpstream, svc.Key(), svcPort)
	}
	if rnd == nil {
		rnd = rand.Uint64N
	}
	r := rnd(total)
	var ep *Endpoint
	for i := range eps {
		if endpointRank(src, &eps[i], svcTarget, svcPort, lb, ranked) != best {
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
		return nil, 0, fmt.Errorf("%w: random source returned a value out of range", ErrNoHealthyUpstream)
	}

	if p, ok := ep.Ports[svcPort]; ok {
		return ep.Workload, p, nil
	}
	return ep.Workload, svcTarget, nil // non-zero: endpointRank checked
}

// endpointRank returns -1 if ep cannot serve the port, else its locality rank
// (always 0 when the service does not rank endpoints).
func endpointRank(src *Workload, ep *Endpoint, svcTarget, svcPort uint16, lb *LoadBalancer, ranked bool) int {
	w := ep.Workload
	if len(w.Addresses) == 0 && w.Hostname == "" {
		// Reachable only through a network gateway, which is never used
		// within one network.
		if w.Network == src.Network || w.NetworkGateway == nil {
			return -1
		}
	}
	if svcTarget == 0 {
		if _, ok := ep.Ports[svcPort]; !ok {
			return -1
		}
	}
	if !ranked {
		return 0
	}
	prefs := lb.RoutingPreferences
	networkFirst := len(prefs) > 0 && prefs[0] == LBScopeNetwork
	rank, adjust := 0, 0
	for _, scope := range prefs {
		var match bool
		switch scope {
		case LBScopeRegion:
			match = src.Locality.Region == w.Locality.Region
		case LBScopeZone:
			match = src.Locality.Zone == w.Locality.Zone
		case LBScopeSubzone:
			match = src.Locality.Subzone == w.Locality.Subzone
		case LBScopeNode:
			match = src.Node == w.Node
		case LBScopeCluster:
			match = src.ClusterID == w.ClusterID
		case LBScopeNetwork:
			match = src.Network == w.Network
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
	if lb.Mode == LBModeStrict && rank != len(prefs) {
		return -1
	}
	return rank + adjust
}
