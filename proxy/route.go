package proxy

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"slices"

	"github.com/ztunnel-go/ztunnel/state"
)

// routeOutbound decides where an outbound connection from client (an app of
// workload src) to dst goes, in ztunnel's order (build_request):
//
//  1. A service VIP (client namespace, canonical, PREFERED_SERVICE_NAMESPACE;
//     visibility; CIDR VIPs by longest prefix) with a waypoint (weighted
//     waypoints sampled by weight) goes over HBONE to that waypoint, with
//     the original VIP:port as authority.
//  2. A PASSTHROUGH service goes to dst as plain TCP; another service is
//     load-balanced to an endpoint, or fails with "no healthy upstream".
//  3. A workload IP is that workload; anything else passes through as
//     plain TCP to dst.
//  4. An upstream on another network goes through its network gateway.
//  5. Workload-addressed traffic to a workload with a waypoint goes to that
//     waypoint, unless src is that waypoint (the "sandwich").
//  6. Otherwise HBONE to the workload's ip:15008 with authority
//     ip:targetPort, or plain TCP to ip:targetPort.
//
// The self-call check on dst's port happens before, in handleOutbound.
func (rt *router) routeOutbound(ctx context.Context, snap *state.Snapshot, src *state.Workload, client, dst netip.AddrPort) (outboundRoute, error) {
	network := rt.network
	snap = rt.fetchDestination(ctx, snap, src, dst.Addr()) // ondemand.go
	if svc := snap.ResolveVIPPreferring(network, dst.Addr(), src.Namespace(), rt.preferredNS); svc != nil {
		if wp := state.ServiceWaypoint(svc, rt.rnd); wp != nil {
			return rt.routeWaypoint(ctx, snap, src, wp, svc, dst)
		}
		if lb := svc.LoadBalancer(); lb != nil && lb.Mode == state.LBModePassthrough {
			return outboundRoute{dst: dst}, nil
		}
		up, err := snap.PickUpstream(src, svc, dst.Port(), state.ResolveStandard, rt.rnd)
		if err != nil {
			return outboundRoute{}, fmt.Errorf("service %s: %w", svc.Key(), err)
		}
		return rt.routeUpstream(ctx, snap, src, client, dst, up)
	}
	w := snap.WorkloadByAddr(network, dst.Addr())
	if w == nil {
		// Unknown destination: passthrough, as ztunnel does.
		return outboundRoute{dst: dst}, nil
	}
	return rt.routeUpstream(ctx, snap, src, client, dst, state.Upstream{Workload: w, Port: dst.Port()})
}

// routeUpstream finishes a route to a chosen workload (steps 4 to 6).
func (rt *router) routeUpstream(ctx context.Context, snap *state.Snapshot, src *state.Workload, client, dst netip.AddrPort, up state.Upstream) (outboundRoute, error) {
	w := up.Workload
	if w.Network() != src.Network() {
		if up.Service == nil {
			// Only services cross networks; a workload on another
			// network is never found by address.
			return outboundRoute{}, fmt.Errorf("workload %s is on network %q and was not addressed through a service", w.UID, w.Network())
		}
		return rt.routeViaNetworkGateway(ctx, snap, src, up, up.Service, dst)
	}
	if up.Service == nil && w.Waypoint() != nil && !rt.fromWaypoint(snap, w, src, client.Addr()) {
		return rt.routeWaypoint(ctx, snap, src, w.Waypoint(), nil, dst)
	}
	fam := state.IPFamiliesAutomatic
	if up.Service != nil {
		fam = up.Service.IPFamilies
	}
	ip, err := rt.selectIP(ctx, src, w, dst.Addr(), fam)
	if err != nil {
		return outboundRoute{}, err
	}
	r := outboundRoute{workload: w, service: up.Service}
	if w.Protocol != state.ProtocolHBONE {
		r.dst = netip.AddrPortFrom(ip, up.Port)
		return r, nil
	}
	r.hbone = true
	r.dst = netip.AddrPortFrom(ip, InboundHBONEPort)
	r.authority = netip.AddrPortFrom(ip, up.Port).String()
	r.sans = rt.upstreamSANs(up)
	return r, nil
}

// routeWaypoint sends the connection over HBONE to a workload behind the
// waypoint g: the authority stays the original destination (the VIP:port
// for service traffic), and the server must be the waypoint workload's
// identity or one of its service's SANs. svc is the service the client
// addressed, if any.
func (rt *router) routeWaypoint(ctx context.Context, snap *state.Snapshot, src *state.Workload, g *state.GatewayAddress, svc *state.Service, dst netip.AddrPort) (outboundRoute, error) {
	up, target, err := snap.ResolveGateway(g, src, dst.Addr(), state.ResolveWaypoint, rt.rnd)
	if err != nil {
		return outboundRoute{}, fmt.Errorf("waypoint %s: %w", g.Destination(), err)
	}
	w := up.Workload
	if svc != nil && w.Network() != src.Network() {
		return rt.routeViaNetworkGateway(ctx, snap, src, up, svc, dst)
	}
	fam := state.IPFamiliesAutomatic
	if up.Service != nil {
		fam = up.Service.IPFamilies
	}
	ip, err := rt.selectIP(ctx, src, w, target, fam)
	if err != nil {
		return outboundRoute{}, fmt.Errorf("waypoint %s: %w", g.Destination(), err)
	}
	return outboundRoute{
		hbone:     true,
		dst:       netip.AddrPortFrom(ip, up.Port),
		authority: dst.String(),
		sans:      rt.upstreamSANs(up),
		workload:  w,
		service:   svc,
	}, nil
}

// routeViaNetworkGateway is the branch for an upstream on another network:
// up is the endpoint or waypoint chosen there and svc the service the
// client addressed. ztunnel sends such traffic as double HBONE: an outer
// pooled CONNECT to up.Workload's network gateway, and inside it a TLS +
// CONNECT per connection verifying the destination's identities, both with
// the authority svc.Hostname:dst.Port() and x-forwarded-network on the
// inner request. The gateway is resolved by state.ResolveGateway in
// standard mode, as ztunnel's fetch_network_gateway: a gateway service
// must list the gateway's HBONE port, and the outer tunnel verifies the
// gateway workload's identity and its service's SANs (routeViaGateway,
// gateway.go).
func (rt *router) routeViaNetworkGateway(ctx context.Context, snap *state.Snapshot, src *state.Workload, up state.Upstream, svc *state.Service, dst netip.AddrPort) (outboundRoute, error) {
	if up.Workload.NetworkGateway() == nil {
		return outboundRoute{}, fmt.Errorf("workload %s is on network %q, which has no network gateway", up.Workload.UID, up.Workload.Network())
	}
	return rt.routeViaGateway(ctx, snap, src, up.Workload, svc, dst) // gateway.go
}

// upstreamSANs returns the identities the next hop may present: the
// workload's own and, when it was chosen from a service, the service's
// subject alt names.
func (rt *router) upstreamSANs(up state.Upstream) []string {
	sans := []string{rt.identityOf(up.Workload).String()}
	if up.Service != nil {
		sans = append(sans, up.Service.SubjectAltNames()...)
	}
	return sans
}

// fromWaypoint reports whether the connection comes from dst's own
// waypoint: src has the identity of one of the waypoint's workloads and
// the client address is that workload's (ztunnel's check_from_waypoint).
// The waypoint already applied its policy; sending the traffic back to it
// would loop.
func (rt *router) fromWaypoint(snap *state.Snapshot, dst, src *state.Workload, client netip.Addr) bool {
	srcID := rt.identityOf(src)
	client = client.Unmap()
	return snap.GatewayHasWorkload(dst.Waypoint(), func(w *state.Workload) bool {
		return rt.identityOf(w) == srcID && slices.Contains(w.Addresses, client)
	})
}

// validateDestination is ztunnel's validate_destination for an inbound
// tunnel to local, which arrived on the address conn: the authority's IP
// must be conn's, so a peer cannot use this pod as a relay to elsewhere.
// Two exceptions: a local workload with an application tunnel decides
// itself what to do with the target, and a waypoint receives tunnels
// addressed to the destinations it serves (the "sandwich"). For the
// second, when the snapshot knows nothing at the target's IP it is asked
// for on demand first (ondemand.go); the snapshot returned is the one the
// check used.
//
// An IPv4-mapped target ("[::ffff:a.b.c.d]:p") is never conn's address
// (conn is unmapped) and names nothing: ztunnel's tables are keyed by the
// address as written, where ours unmap, so it is refused here before a
// lookup could find the IPv4 address's waypoint.
func (rt *router) validateDestination(ctx context.Context, snap *state.Snapshot, local *state.Workload, target, conn netip.AddrPort) (*state.Snapshot, error) {
	if target.Addr() == conn.Addr() || local.ApplicationTunnel() != nil {
		return snap, nil
	}
	if target.Addr().Is4In6() {
		return snap, &inboundError{status: http.StatusBadRequest, err: errIPMismatch(conn.Addr(), target.Addr())}
	}
	snap = rt.fetchAddress(ctx, snap, target.Addr(), func(s *state.Snapshot) bool {
		w, svc := s.FindAddress(rt.network, target.Addr())
		return w != nil || svc != nil
	})
	if snap.IsWaypointFor(rt.network, target.Addr(), local, conn.Addr()) {
		return snap, nil
	}
	return snap, &inboundError{status: http.StatusBadRequest, err: errIPMismatch(conn.Addr(), target.Addr())} // inbound.go
}
