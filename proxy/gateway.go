package proxy

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"

	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/state"
)

// Double HBONE (multi-network). An endpoint on another network is reached
// through its network's east-west gateway: an outer HBONE CONNECT to the
// gateway (pooled like any tunnel, verified against the gateway's
// identities) carries a second TLS session and CONNECT to the destination
// itself (verified against the destination's identities, with
// x-forwarded-network naming our network). Both authorities are
// "svc-hostname:port": the gateway routes by service, not by pod address,
// and the destination maps the service port to its target port.

// headerForwardedNetwork names the client's network on the inner CONNECT of
// double HBONE; the destination then knows the peer address is the gateway's.
const headerForwardedNetwork = "X-Forwarded-Network"

// doubleHBONE is the inner tunnel of a route through a network gateway; the
// route's own fields describe the outer tunnel to the gateway.
type doubleHBONE struct {
	authority string   // svc-hostname:port
	sans      []string // the destination's identities: workload identity + service SANs
	// pool lets inner connections carry many streams (Config.PoolInnerHBONE).
	pool bool
	// key groups interchangeable inner connections (when pool).
	key tunnelKey
	// peerID is the identity the inner TLS peer proved, set by the dial
	// of this connection's inner tunnel (the derived destination's
	// principal); a pooled inner connection dialled earlier leaves the
	// one the destination was verified against.
	peerID identity.Identity
}

// routeViaGateway routes to w, an endpoint on another network with a
// network gateway, by double HBONE. It needs the service the client
// addressed: the gateway only understands service authorities.
//
// The gateway is resolved as ztunnel's fetch_network_gateway does, by
// state.ResolveGateway in standard mode: a gateway service must list the
// gateway's HBONE port among its ports, and the outer tunnel goes to the
// chosen gateway workload on the port that maps to (its target port for
// the HBONE port), verifying the workload's identity or the gateway
// service's SANs. A gateway given by address is dialed on that address
// (when it is the workload's); by hostname, on the workload address of the
// original destination's family.
func (rt *router) routeViaGateway(ctx context.Context, snap *state.Snapshot, src, w *state.Workload, svc *state.Service, dst netip.AddrPort) (outboundRoute, error) {
	if svc == nil {
		return outboundRoute{}, fmt.Errorf("workload %s is on network %q and reachable only through its network gateway, which needs a service address (svc-hostname:port); address a service of the workload instead", w.UID, w.Network())
	}
	g := w.NetworkGateway()
	up, target, err := snap.ResolveGateway(g, src, dst.Addr(), state.ResolveStandard, rt.rnd)
	if err != nil {
		return outboundRoute{}, fmt.Errorf("workload %s on network %q: network gateway %s: %w", w.UID, w.Network(), g.Destination(), err)
	}
	fam := state.IPFamiliesAutomatic
	if up.Service != nil {
		fam = up.Service.IPFamilies
	}
	ip, err := rt.selectIP(ctx, src, up.Workload, target, fam)
	if err != nil {
		return outboundRoute{}, fmt.Errorf("workload %s on network %q: network gateway %s: %w", w.UID, w.Network(), g.Destination(), err)
	}
	gw := netip.AddrPortFrom(ip, up.Port)
	authority := net.JoinHostPort(svc.Hostname, strconv.Itoa(int(dst.Port())))
	final := append([]string{rt.identityOf(w).String()}, svc.SubjectAltNames()...)
	inner := &doubleHBONE{
		authority: authority,
		sans:      final,
		peerID:    rt.identityOf(w),
		// Only a ztunnel (or a waypoint) behind the gateway multiplexes
		// inner streams; see Config.PoolInnerHBONE.
		pool: rt.poolInner && w.Protocol == state.ProtocolHBONE,
	}
	if inner.pool {
		inner.key = tunnelKey{srcID: rt.identityOf(src), dstIDs: final, dst: gw, inner: svc.Key()}
	}
	// As ztunnel, the connection's destination workload is the gateway
	// (the next hop); its labels come from the destination's answer.
	return outboundRoute{
		hbone: true, dst: gw, authority: authority, sans: rt.upstreamSANs(up),
		workload: up.Workload, service: svc, gateway: inner,
	}, nil
}
